"""Subagent runs: work a session hands off with `sessions_spawn` ("research X"),
done in the background by an agent loop in a sandbox of its own, and reported back
to the session that asked.

`Subagents` keeps the runs and owns their tasks: it serves the spawn tools
(spawn_tools.py) with the spawn policy, lists, kills and stops runs, and starts each
run's task. The rest has a module each:
  runs.py          the record of a run, and its report
  run_driver.py    one run from its sandbox's start to its report
  run_services.py  what a run's sandbox may ask (its model and tool calls)
  run_reports.py   how its parent hears of its end, and the runs a killed
                   supervisor lost (with run_journal.py)

Limits (OpenClaw's keys): `agents.defaults.subagents.maxSpawnDepth` (a session is
depth 0, its runs depth 1, ...), `maxChildrenPerAgent` (runs one session or run has
going at once), `tools.agentToAgent` (which other agents may be targeted). A run's
tool set is its parent's, less the session, messaging and automation tools; the
spawn tools come back only while the depth allows another level.

When a run ends, however it ends, its parent hears of it once: a depth-0 session as
a system message that starts a turn (the agent turns it into a reply), a run as a
message inserted in its own conversation. A run answers only after its children
have reported, and takes them down with it when it is stopped or fails.

Created by the gateway; `run()` owns every run's task and cancels them all when the
gateway stops.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from loguru import logger

from clawsup.sandbox.launch.launcher import Backend
from clawsup.supervisor.agents.loop_detection import LoopWatch
from clawsup.supervisor.agents.models import Models, model_name
from clawsup.supervisor.agents.run_driver import RunDriver
from clawsup.supervisor.agents.run_journal import RunJournal, origin_json
from clawsup.supervisor.agents.run_reports import RunReports, SessionInbox
from clawsup.supervisor.agents.run_services import RunServices
from clawsup.supervisor.agents.runs import Origin, Run
from clawsup.supervisor.agents.spawn_tools import SpawnArgs, SpawnRefused, SubagentsArgs, parse_args
from clawsup.supervisor.agents.tool_dispatch import ToolDispatch
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.hooks import HookObserver
from clawsup.supervisor.errors import BadToolArguments, ClawsupError
from clawsup.supervisor.messages.session_store import SessionStore
from clawsup.supervisor.sandboxes.manager import Sandboxes
from clawsup.supervisor.tools.workspace_settings import WorkspaceSettings, resolve_backend

FINISHED_KEPT = 200
"""Ended runs `status` still shows (the oldest go first)."""


class WorkspaceNames(Protocol):
    """Which workspace sandbox a session's tools use, and the settings of those
    sandboxes (supervisor/tools/workspaces.py)."""

    @property
    def settings(self) -> WorkspaceSettings: ...

    def sandbox_id(self, agent: str | None, session: str | None) -> str: ...


def run_backends(cfg: ClawsupConfig, *, source: str) -> dict[str, Backend]:
    """Agent id -> the backend its subagent runs use: the agent's own
    `sandbox.backend`, else `agents.defaults.sandbox.backend`; resolved at start, so
    that one that cannot work here is a config error then, not a failed run later."""
    default = cfg.agents.defaults.sandbox.backend
    entries = {a.id: (i, a) for i, a in enumerate(cfg.agents.entries)}
    out: dict[str, Backend] = {}
    for agent_id in cfg.agents.ids():
        i, a = entries.get(agent_id, (0, None))
        own = a.sandbox.backend if a is not None and a.sandbox is not None else None
        key = f"agents.list[{i}].sandbox.backend" if own else "agents.defaults.sandbox.backend"
        out[agent_id], _ = resolve_backend(
            own or default, key, f"agent {agent_id!r}'s subagent runs", source=source, fallback=cfg.agents.defaults.sandbox.process_fallback
        )
    return out


def build_subagents(
    cfg: ClawsupConfig,
    *,
    models: Models,
    sandboxes: Sandboxes,
    workspaces: WorkspaceNames,
    tools: ToolDispatch,
    store: SessionStore,
    sessions: SessionInbox,
    backends: Mapping[str, Backend],
    journal: RunJournal | None,
    hooks: HookObserver | None = None,
) -> Subagents:
    """`Subagents` and its parts, in dependency order: reports, driver, services.
    `hooks` hear `subagent_spawned`, `subagent_ended` and `session_end`."""
    reports = RunReports(store=store, sessions=sessions, journal=journal)
    driver = RunDriver(cfg, sandboxes=sandboxes, workspace=workspaces.settings, backends=backends, store=store, reports=reports, hooks=hooks)
    services = RunServices(cfg, tools=tools, store=store)
    return Subagents(
        cfg, models=models, backends=backends, workspaces=workspaces, driver=driver, services=services, reports=reports, journal=journal, hooks=hooks
    )


class Subagents:
    def __init__(
        self,
        cfg: ClawsupConfig,
        *,
        models: Models,
        backends: Mapping[str, Backend],
        workspaces: WorkspaceNames,
        driver: RunDriver,
        services: RunServices,
        reports: RunReports,
        journal: RunJournal | None = None,
        hooks: HookObserver | None = None,
    ) -> None:
        """`backends`: agent id -> the backend of its runs' sandboxes (`run_backends`);
        `journal` keeps sessions' runs across supervisor lives (run_journal.py)."""
        self.cfg = cfg
        self._hooks = hooks
        self.limits = cfg.agents.defaults.subagents
        self._models = models
        self._backends = backends
        self._workspaces = workspaces
        self._driver = driver
        self._services = services
        self._reports = reports
        self._journal = journal
        self.runs: dict[str, Run] = {}
        self._tg: asyncio.TaskGroup | None = None

    # -- the owner of every run ------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            await self._reports.report_lost()
            await stop.wait()
            self._reports.close()
            self._tg = None
            for r in self.runs.values():
                if r.task_handle is not None:
                    r.cancel_reason = r.cancel_reason or "the gateway is shutting down"
                    r.task_handle.cancel()

    # -- the spawn tools -------------------------------------------------------------

    async def call(self, name: str, args: dict[str, Any], origin: Origin) -> str:
        """`sessions_spawn` or `subagents`, for `origin`; the answer is the tool's
        result text. Refusals raise (the model sees the sentence)."""
        if name == "sessions_spawn":
            return json.dumps(self.spawn(parse_args(SpawnArgs, name, args), origin))
        a = parse_args(SubagentsArgs, name, args)
        if a.action == "kill":
            if not a.target:
                raise BadToolArguments(name, "target: a run id, a label or `all` is required to kill")
            return json.dumps(self.kill(origin, a.target))
        return json.dumps({"runs": [r.to_json() for r in self._own(origin)]})

    def spawn(self, a: SpawnArgs, origin: Origin) -> dict[str, Any]:
        lim = self.limits
        if origin.depth + 1 > lim.max_spawn_depth:
            raise SpawnRefused(
                f"sessions_spawn is not allowed at depth {origin.depth} (agents.defaults.subagents.maxSpawnDepth is {lim.max_spawn_depth})"
            )
        target = (a.agentId or origin.agent_id).strip().lower()
        if target != origin.agent_id:
            a2a = self.cfg.tools.agent_to_agent
            if not (a2a.enabled and any(fnmatch.fnmatchcase(target, p.strip().lower()) for p in a2a.allow)):
                raise SpawnRefused(f"agentId is not allowed for sessions_spawn: {target!r} (tools.agentToAgent.enabled and .allow decide)")
        if target not in self._backends:
            raise SpawnRefused(f"agentId {target!r} is not an agent of this gateway (agents: {', '.join(self._backends)})")
        active = [r for r in self._own(origin) if r.running]
        if len(active) >= lim.max_children_per_agent:
            raise SpawnRefused(
                f"{len(active)} subagent runs of this session are still running (agents.defaults.subagents.maxChildrenPerAgent is "
                f"{lim.max_children_per_agent}); wait for one to report, or kill one with the `subagents` tool"
            )
        timeout = a.runTimeoutSeconds or lim.run_timeout_seconds
        if timeout > lim.max_run_timeout_seconds:
            raise BadToolArguments("sessions_spawn", f"runTimeoutSeconds: at most {lim.max_run_timeout_seconds:g}, got {timeout:g}")
        model = (a.model or model_name(lim.model) or self._models.model_of(target)).strip()
        provider = self._models.provider(model)  # a model that cannot be used refuses the spawn
        if self._tg is None:
            raise SpawnRefused("the gateway is shutting down")
        u = uuid.uuid4()
        run_id = u.hex[:12]
        fresh = lim.workspace == "fresh"
        if fresh:
            workspace = f"workspace-run-{run_id}"
        elif origin.run is not None:
            workspace = origin.run.workspace
        else:
            workspace = self._workspaces.sandbox_id(origin.agent_id, origin.session_key)
        run = Run(
            run_id=run_id,
            child_key=f"agent:{target}:subagent:{u}",
            label=a.label or run_id,
            task=a.task,
            agent_id=target,
            model=model,
            origin=origin,
            timeout_s=timeout,
            sandbox_id=f"subagent-{run_id}",
            workspace=workspace,
            fresh_workspace=fresh,
            provider=provider,
            loops=LoopWatch(self.cfg.agent_loop.loop_detection),
        )
        self.runs[run_id] = run
        if origin.run is not None:
            origin.run.children.append(run)
        elif self._journal is not None and origin.message is not None and origin.route is not None:
            self._journal.spawned(
                {"runId": run_id, "label": run.label, "agentId": target, "childKey": run.child_key, "ts": time.time(), "origin": origin_json(origin.message.source, origin.message.reply_to, origin.route)}
            )
        run.task_handle = self._tg.create_task(self._driver.drive(run, self._services.bind(run, self)), name=f"subagent run {run_id}")
        logger.info("{}: spawned subagent run {} ({}) for agent {} at depth {}", origin.session_key, run_id, run.label, target, run.depth)
        if self._hooks is not None:
            spawned = {"runId": run_id, "childSessionKey": run.child_key, "agentId": target, "label": run.label, "parentSessionKey": origin.session_key, "depth": run.depth}
            self._hooks.observe("subagent_spawned", spawned)
        self._prune()
        return {"status": "accepted", "runId": run_id, "childSessionKey": run.child_key, "agentId": target, "label": run.label, "runTimeoutSeconds": timeout}

    def kill(self, origin: Origin, target: str) -> dict[str, Any]:
        own = [r for r in self._own(origin) if r.running]
        hits = own if target == "all" else [r for r in own if target in (r.run_id, r.label)]
        if not hits and target != "all":
            raise ClawsupError(f"no running run {target!r} of yours; running: {', '.join(f'{r.run_id} ({r.label})' for r in own) or 'none'}")
        for r in hits:
            r.cancel(f"killed by {origin.session_key} with the subagents tool")
        return {"killed": [r.run_id for r in hits]}

    async def stop_session(self, session_key: str) -> int:
        """`/stop` in a session: its running runs are cancelled, and with them all
        they spawned. Returns how many of its own runs were running."""
        hits = [r for r in self.runs.values() if r.parent_key == session_key and r.origin.run is None and r.running]
        for r in hits:
            r.cancel("/stop in its parent session")
        return len(hits)

    # -- for operators ---------------------------------------------------------------

    async def wait(self, run_id: str, timeout: float) -> dict[str, Any]:
        """Until the run has ended and reported (for operators and tests)."""
        run = self.runs.get(run_id)
        if run is None:
            raise ClawsupError(f"no subagent run {run_id!r} (known: {', '.join(self.runs) or 'none'})")
        async with asyncio.timeout(timeout):
            await run.reported.wait()
        return run.to_json()

    def tree(self) -> list[dict[str, Any]]:
        """For `clawsup status`: each session with runs, and its runs nested."""
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.runs.values():
            if r.origin.run is None:
                out.setdefault(r.parent_key, []).append(r.to_json())
        return [{"session": k, "runs": v} for k, v in out.items()]

    def _own(self, origin: Origin) -> list[Run]:
        if origin.run is not None:
            return list(origin.run.children)
        return [r for r in self.runs.values() if r.parent_key == origin.session_key and r.origin.run is None]

    def _prune(self) -> None:
        ended = [r for r in self.runs.values() if not r.running and r.origin.run is None]
        for r in ended[: max(0, len(ended) - FINISHED_KEPT)]:
            for x in r.subtree():
                self.runs.pop(x.run_id, None)
