"""The gateway process: config in, supervisor running, until SIGINT/SIGTERM or
`clawsup stop`.

Created by `clawsup start`; one per state directory (an flock on the pidfile keeps a
second one out).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from clawsup.sandbox.launch.cgroup import CgroupRoot
from clawsup.sandbox.launch.backends import backend_problem, make_launcher
from clawsup.sandbox.launch.launcher import ChildUser, Launcher
from clawsup.sandbox.launch.process import Warden, child_users_for, named_user
from clawsup.sandbox.launch.uids import SandboxUids, UidAllocator
from clawsup.supervisor.config import DEFAULT_CONFIG, ClawsupConfig, ignored_keys, load_config
from clawsup.supervisor.control.api import ControlServer
from clawsup.supervisor.errors import ClawsupError, ConfigError
from clawsup.supervisor.sandboxes.lifecycle import Transition
from clawsup.supervisor.control.loop_watch import watch_loop_from_env
from clawsup.supervisor.agents.loop import AgentLoop
from clawsup.supervisor.sandboxes.manager import SandboxManager
from clawsup.supervisor.messages.assembly import Messaging
from clawsup.supervisor.paths import StatePaths
from clawsup.supervisor.sandboxes.plans import SandboxPlan, build_plans
from clawsup.supervisor.printable import clean_log_record
from clawsup.supervisor.sandboxes.registry import Registry
from clawsup.supervisor.agents.run_journal import RunJournal
from clawsup.supervisor.agents.subagents import SPAWN_TOOLS, Subagents, register_spawn_tools, run_backends
from clawsup.supervisor.sandboxes.supervised import Timing
from clawsup.supervisor.tools.workspaces import CORE_TOOLS, Workspaces, register_core_tools, settings_from_config

START_TIMEOUT_S = 60.0


class AlreadyRunning(ClawsupError):
    code = "already_running"


@dataclass(kw_only=True)
class GatewayOptions:
    config_path: Path | None
    state_dir: Path
    extra_plugins: list[Path] = field(default_factory=list)
    on_transition: Callable[[Transition], None] | None = None
    on_ready: Callable[[SandboxManager], Awaitable[None]] | None = None


def setup_logging(paths: StatePaths, *, console: bool = True, transitions_shown: bool = True) -> None:
    """The supervisor's own log, with loguru. When the CLI prints lifecycle
    transitions itself, the console sink leaves them out (the file keeps them)."""
    logger.remove()
    # Messages quote children (tool names, refusal reasons, stderr tails): escaped on
    # every record, so that none can forge a line or drive a terminal.
    logger.configure(patcher=clean_log_record)
    if console:
        logger.add(
            sys.stderr,
            level="INFO",
            format="<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> {message}",
            filter=(lambda r: "transition" not in r["extra"]) if transitions_shown else None,
        )
    logger.add(paths.logs / "supervisor.log", level="DEBUG", rotation="10 MB", retention=5, enqueue=False)


def _lock_pidfile(paths: StatePaths) -> int:
    fd = os.open(paths.pidfile, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.read(fd, 32).decode().strip() or "?"
        os.close(fd)
        raise AlreadyRunning(f"a supervisor (pid {other}) already runs on {paths.root}; `clawsup stop` it first or use another --state-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _choose_child_users(run_as: str, paths: StatePaths, plans: list[SandboxPlan], source: str, uids: SandboxUids) -> tuple[dict[str, ChildUser], Path]:
    """Who each sandbox's children run as (see `child_users_for`) and where their
    sockets go. The probe runs as such a user against the very paths a child needs."""
    ids = [p.sandbox_id for p in plans]
    if os.geteuid() != 0 or run_as == "supervisor":
        users, why = child_users_for(run_as, ids, [])
        if why:
            raise ConfigError(source, [why])
        return {}, paths.host_sockets()
    paths.open_path_for_children()
    sockets = paths.host_sockets(other_uid=True)
    users, why = child_users_for(run_as, ids, sorted({p.plugin_dir for p in plans if p.plugin_dir is not None}), reach=[paths.sandboxes, sockets], own_uids=uids.users)
    if why:
        # Never a silent step down to root: a failed drop is a refusal.
        raise ConfigError(source, [
            f"sandbox.runAs: {why}. clawsup does not run them as root instead ({', '.join(ids)}). Install Python, clawsup "
            "and the plugins where other users can read them (not under a 0700 home), or use the bwrap backend (it binds "
            "them in), or set sandbox.runAs: \"supervisor\" to run this trusted code as root on purpose (untrusted code "
            "never runs as root)"
        ])  # fmt: skip
    if not users:
        for d in (paths.root, paths.sandboxes):
            os.chmod(d, 0o700)
        return {}, paths.host_sockets()
    names = ", ".join(f"{sid} as {u.name}" for sid, u in users.items())
    logger.info("sandbox children drop root: {}", names)
    return users, sockets


@contextlib.asynccontextmanager
async def _plain_errors() -> AsyncIterator[None]:
    """A ClawsupError from one of the gateway's tasks (a channel that cannot listen,
    say) reaches the CLI as itself, not wrapped in an exception group."""
    try:
        yield
    except BaseExceptionGroup as eg:
        found = eg.subgroup(lambda e: isinstance(e, ClawsupError))
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        if found is not None:
            raise found from None
        raise


async def _stop_idle_workspaces(workspaces: Workspaces, run: asyncio.Task[None]) -> None:
    """Discards idle session workspaces for as long as the manager runs. The loop
    wakes for the next idle deadline or a call's end, never on a period; a stop that
    fails or overruns is logged there, never raised into the gateway's group."""
    run.add_done_callback(lambda _: workspaces.close())
    await workspaces.discard_idle()


def _user_policy(run_as: str, process_users: dict[str, ChildUser], uids: SandboxUids) -> Callable[[SandboxPlan], ChildUser | None]:
    """Process-backend plugins run as `_choose_child_users` found workable. Under
    bwrap the runtime is bound into the sandbox with open parents, so a root
    supervisor's `auto` always gives such a sandbox its own uid (also the workspace
    sandboxes created later, one per agent or session). A root supervisor never runs
    a container as root, so docker gets its own uid under `supervisor` too; and
    `supervisor` is for trusted code: untrusted plugins, workspaces and subagent runs
    still get their own uid (as uid 0, even without capabilities, a child owns every
    root file it can see and can leave setuid-root binaries behind)."""

    def user_for(plan: SandboxPlan) -> ChildUser | None:
        if plan.backend in ("bwrap", "docker"):
            if os.geteuid() != 0 or (run_as == "supervisor" and plan.backend == "bwrap" and plan.trusted):
                return None
            if run_as in ("auto", "supervisor"):
                return uids.user(plan.sandbox_id)
            return named_user(run_as)
        if plan.sandbox_id in process_users:
            return process_users[plan.sandbox_id]
        if plan.role in ("workspace", "subagent") and process_users and run_as == "auto":
            # Own uids work here (the probe said so): one for each workspace sandbox
            # and subagent run.
            return uids.user(plan.sandbox_id)
        if plan.role in ("workspace", "subagent") and process_users:
            return next(iter(process_users.values()))
        return None

    return user_for


def _core_registry() -> Registry:
    registry = Registry(reserved=frozenset({*CORE_TOOLS, *SPAWN_TOOLS}))
    register_core_tools(registry)
    register_spawn_tools(registry)
    return registry


def _non_dumpable() -> None:
    """Processes of our own user (a plugin on the process backend, anything else the
    operator runs) must not read our memory or environment, where the API keys are:
    a non-dumpable process's /proc files belong to root and it cannot be ptraced."""
    import ctypes

    PR_SET_DUMPABLE = 4
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


async def run_gateway(opts: GatewayOptions) -> int:
    _non_dumpable()
    watch_loop_from_env()  # CLAWSUP_LOOP_DEBUG_MS, a debugging aid: supervisor/control/loop_watch.py
    paths = StatePaths(opts.state_dir)
    paths.ensure()
    lock = _lock_pidfile(paths)
    try:
        cfg_path = opts.config_path or DEFAULT_CONFIG
        # Reading the config and judging it against the machine (is bwrap usable, does
        # a docker engine answer, can another uid reach the runtime) probe the machine:
        # each in a thread, so that the loop stays free for the signals that stop us.
        cfg: ClawsupConfig = await asyncio.to_thread(load_config, cfg_path)
        if ignored := ignored_keys(cfg):
            logger.warning("config keys clawsup does not use (kept for OpenClaw compatibility): {}", ", ".join(ignored))
        plans = await asyncio.to_thread(build_plans, cfg, config_source=str(cfg_path), config_dir=cfg_path.parent, extra_plugins=opts.extra_plugins)
        cgroups = await asyncio.to_thread(CgroupRoot.create)
        if cgroups is None:
            logger.warning(
                "no writable cgroup: sandboxes get rlimits only. As root that leaves fork bombs uncontained "
                "(RLIMIT_NPROC does not bind root); give clawsup a delegated cgroup or use the bwrap/docker backends"
            )
        s = cfg.sandbox
        workspace = await asyncio.to_thread(settings_from_config, cfg, source=str(cfg_path))
        process_plans = [p for p in plans if p.backend == "process"]
        run_backend = await asyncio.to_thread(run_backends, cfg, source=str(cfg_path))
        if workspace.backend == "process" or "process" in run_backend.values():
            # Probe for the workspace sandboxes (and runs) too, even if no plugin runs on process.
            process_plans.append(Workspaces(None, workspace).plan_for("workspace"))
        uids = SandboxUids(UidAllocator(Path(s.uids.registry), s.uids.first, s.uids.count), paths.root)
        if os.geteuid() == 0 and s.run_as == "auto":
            await asyncio.to_thread(uids.users, [p.sandbox_id for p in plans])  # one visit to the machine's record for all of them
        users, sockets = await asyncio.to_thread(_choose_child_users, s.run_as, paths, process_plans, str(cfg_path), uids)
        needed = {"process", workspace.backend, *run_backend.values(), *(p.backend for p in plans)}
        for name in sorted(needed):
            if problem := await asyncio.to_thread(backend_problem, name):
                asked = [f"plugin {p.plugin_id!r} asks for the {name} backend: {problem}" for p in plans if p.backend == name]
                raise ConfigError(str(cfg_path), asked or [f"the {name} backend: {problem}"])
        warden = await asyncio.to_thread(Warden)
        launchers: dict[str, Launcher] = {
            name: await asyncio.to_thread(make_launcher, name, cgroups=cgroups, state_dir=paths.root, warden=warden) for name in sorted(needed)
        }
        registry = await asyncio.to_thread(_core_registry)  # compiles the core tools' schemas
        manager = SandboxManager(
            registry=registry,
            launchers=launchers,
            paths=paths,
            timing=Timing(
                handshake_timeout_s=s.handshake_timeout_seconds,
                heartbeat_interval_s=s.heartbeat_interval_seconds,
                heartbeat_timeout_s=s.heartbeat_timeout_seconds,
                heartbeat_misses=s.heartbeat_misses,
                stop_grace_s=s.stop_grace_seconds,
            ),
            env_allowlist=s.env_allowlist,
            sockets=sockets,
            user_for=_user_policy(s.run_as, users, uids),
            release_user=uids.release,
        )
        manager.workspaces = workspaces = Workspaces(manager, workspace)
        if workspace.unisolated:
            manager.warnings.append(
                f"the agent's commands are NOT isolated: its workspace sandboxes run on the process backend ({workspace.unisolated}); "
                "install bubblewrap (apt-get install bubblewrap) or use docker to contain them"
            )
            logger.warning("{}", manager.warnings[-1])
        if workspace.scope != "session":
            # The default agent's workspace sandbox starts with the rest, so that the
            # first exec does not pay for a cold start and `clawsup logs` finds it.
            manager.add(workspaces.plan_for(workspaces.sandbox_id(None, None)))
        for plan in plans:
            sb = manager.add(plan)
            for line in plan.refused:
                sb.log.event(f"the manifest asked for more than is granted: {line}")
            if opts.on_transition is not None:
                sb.lc.listeners.append(opts.on_transition)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        messaging = Messaging.from_config(
            cfg, paths, source=str(cfg_path), agent=lambda store: AgentLoop(cfg, manager=manager, store=store, source=str(cfg_path))
        )
        agent_loop = messaging.dispatcher.agent
        assert isinstance(agent_loop, AgentLoop)
        agent_loop.subagents = subagents = Subagents(
            cfg,
            manager=manager,
            store=messaging.store,
            bus=messaging.bus,
            provider=agent_loop.provider,
            model_of=agent_loop.model_of,
            backends=run_backend,
            journal=RunJournal(paths.root / "runs.jsonl"),
        )
        control = ControlServer(paths.control_socket, manager, stop.set, chat=messaging.cli, subagents=subagents)
        await control.start()
        logger.info("clawsup supervisor pid {} on {} ({} plugin(s))", os.getpid(), paths.root, len(plans))
        ready = asyncio.Event()
        # Bounded: each stop step has its grace, and a child that outlives them all is
        # SIGKILLed; this is the outer bound on the whole shutdown.
        stop_timeout = 3 * s.stop_grace_seconds + 2
        try:
            async with _plain_errors(), asyncio.TaskGroup() as tg:
                run = tg.create_task(manager.run(ready, stop, start_timeout=START_TIMEOUT_S, stop_timeout=stop_timeout))
                if workspace.scope == "session":
                    tg.create_task(_stop_idle_workspaces(workspaces, run), name="idle workspaces")
                channels_up = asyncio.Event()
                tg.create_task(messaging.run(stop, channels_up), name="messaging")
                tg.create_task(subagents.run(stop), name="subagent runs")
                await ready.wait()
                await channels_up.wait()
                if opts.on_ready is not None:
                    await opts.on_ready(manager)
        finally:
            await control.close()
            await messaging.aclose()
            await manager.aclose()
            await warden.aclose()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        logger.info("clawsup supervisor stopped")
        return 0
    finally:
        with contextlib.suppress(OSError):
            paths.pidfile.unlink()
        os.close(lock)
