"""The automation room's parts, put together for the gateway: the job store, the
runs' executor and the scheduler, with the heartbeat as a system job, and the `cron`
tool's server handed to the agent loop. None when `automation.cron.enabled` is off
(the heartbeat then does not run either: it is one of the scheduler's jobs)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from clawsup.supervisor.automation.cron_run import CronRuns, Turns
from clawsup.supervisor.automation.cron_tool import CronToolServer
from clawsup.supervisor.automation.heartbeat import heartbeat_job
from clawsup.supervisor.automation.job_store import JobStore
from clawsup.supervisor.automation.scheduler import Scheduler, Targets
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.messages.assembly import Messaging
from clawsup.supervisor.paths import StatePaths


def build_cron(
    cfg: ClawsupConfig,
    paths: StatePaths,
    *,
    messaging: Messaging,
    stop_session: Callable[[str], Awaitable[int]],
    workspace_sandbox: Callable[[str, str], str],
    source: str,
) -> tuple[Scheduler, CronToolServer] | None:
    """`workspace_sandbox(agent, session)`: the id of that turn's workspace sandbox,
    whose folder holds the heartbeat's HEARTBEAT.md."""
    a = cfg.automation
    if not a.cron.enabled:
        return None
    agents = frozenset(cfg.agents.ids())
    system = []
    if a.heartbeat.enabled:
        if a.heartbeat.agent not in agents:
            raise ConfigError(source, [f"automation.heartbeat.agent: unknown agent {a.heartbeat.agent!r} (agents: {', '.join(sorted(agents))})"])
        if a.heartbeat.channel is not None and a.heartbeat.channel not in messaging.channels:
            raise ConfigError(source, [f"automation.heartbeat.channel: {a.heartbeat.channel!r} is not a channel of this gateway (channels: {', '.join(sorted(messaging.channels))})"])
        system.append(heartbeat_job(a.heartbeat, now=time.time()))
    lanes: Turns = messaging.lanes
    runs = CronRuns(
        inbound=messaging.bus.inbound,
        outbound=messaging.bus.outbound,
        turns=lambda: lanes,
        stop_session=stop_session,
        workspace_of=lambda agent, session: paths.sandboxes / workspace_sandbox(agent, session) / "workspace",
        default_timeout_s=a.cron.default_timeout_seconds,
    )
    scheduler = Scheduler(
        JobStore(paths.root / "cron", runs_kept=a.cron.runs_kept),
        runs,
        Targets(agents=agents, channels=lambda: set(messaging.channels)),
        max_concurrent=a.cron.max_concurrent_runs,
        max_jobs=a.cron.max_jobs,
        max_jobs_per_agent=a.cron.max_jobs_per_agent,
        system_jobs=system,
    )
    return scheduler, CronToolServer(scheduler)
