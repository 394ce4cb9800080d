"""The gateway process, and its composition root: config in, supervisor running, until
SIGINT/SIGTERM or `clawsup stop`.

`run_gateway` reads the config, judges it against the machine, then builds every
object in dependency order (launchers, sandbox manager, workspaces and the tool
dispatcher, the messaging side, models, subagent runs, the agent loop, the control
API), each given what it needs when it is made. Who children run as is decided in
sandbox/launch/run_as.py.

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
from clawsup.sandbox.launch.launcher import Launcher
from clawsup.sandbox.launch.process import Warden
from clawsup.sandbox.launch.run_as import RunAs, RunAsPolicy, choose_child_users
from clawsup.sandbox.launch.uids import SandboxUids, UidAllocator
from clawsup.supervisor.config import DEFAULT_CONFIG, MAX_HOOK_TIMEOUT_S, ClawsupConfig, ignored_keys, load_config
from clawsup.supervisor.control.api import ControlServer
from clawsup.supervisor.errors import ClawsupError, ConfigError
from clawsup.supervisor.hooks import Hooks
from clawsup.supervisor.sandboxes.lifecycle import Transition
from clawsup.supervisor.control.loop_watch import watch_loop_from_env
from clawsup.supervisor.agents.loop import AgentLoop
from clawsup.supervisor.sandboxes.manager import SandboxManager
from clawsup.supervisor.messages.assembly import Messaging, channels_from_config, message_bus, plugin_services, session_store
from clawsup.supervisor.messages.commands import Commands
from clawsup.supervisor.messages.owners import Owners
from clawsup.supervisor.paths import StatePaths
from clawsup.supervisor.sandboxes.mcp_plans import build_mcp_plans
from clawsup.supervisor.sandboxes.plans import SandboxPlan, build_plans, workspace_plan
from clawsup.supervisor.printable import clean_log_record
from clawsup.supervisor.sandboxes.registry import Registry
from clawsup.supervisor.agents.run_journal import RunJournal
from clawsup.supervisor.agents.models import Models
from clawsup.supervisor.agents.spawn_tools import SPAWN_TOOLS, register_spawn_tools
from clawsup.supervisor.agents.subagents import build_subagents, run_backends
from clawsup.supervisor.automation.assembly import build_cron
from clawsup.supervisor.automation.cron_tool import CRON_TOOL, register_cron_tool
from clawsup.supervisor.sandboxes.incarnation import Timing
from clawsup.supervisor.tools.core import CORE_TOOLS, register_core_tools
from clawsup.supervisor.tools.dispatch import ToolDispatcher
from clawsup.supervisor.tools.workspace_settings import settings_from_config
from clawsup.supervisor.tools.workspaces import Workspaces

START_TIMEOUT_S = 60.0


class AlreadyRunning(ClawsupError):
    code = "already_running"


@dataclass(kw_only=True)
class GatewayOptions:
    config_path: Path | None
    state_dir: Path
    extra_plugins: list[Path] = field(default_factory=list)
    on_transition: Callable[[Transition], None] | None = None
    on_ready: Callable[[SandboxManager, ToolDispatcher], Awaitable[None]] | None = None


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


async def _stop_after_hooks(asked: asyncio.Event, stop: asyncio.Event, hooks: Hooks) -> None:
    """A stop asked for: the plugins hear `gateway_stop` (each within its deadline)
    while their sandboxes still serve, then the gateway stops."""
    async with asyncio.TaskGroup() as tg:
        waits = [tg.create_task(asked.wait()), tg.create_task(stop.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    if stop.is_set():
        return  # stopped from elsewhere (a failed start): no plugin to tell
    try:
        async with asyncio.timeout(MAX_HOOK_TIMEOUT_S + 1):
            await hooks.gateway_stop()
    except TimeoutError:
        logger.warning("gateway_stop hooks overran; stopping anyway")
    finally:
        stop.set()


async def _stop_idle_workspaces(workspaces: Workspaces, run: asyncio.Task[None]) -> None:
    """Discards idle session workspaces for as long as the manager runs. The loop
    wakes for the next idle deadline or a call's end, never on a period; a stop that
    fails or overruns is logged there, never raised into the gateway's group."""
    run.add_done_callback(lambda _: workspaces.close())
    await workspaces.discard_idle()


def _core_registry(cron: bool) -> Registry:
    registry = Registry(reserved=frozenset({*CORE_TOOLS, *SPAWN_TOOLS, CRON_TOOL}))
    register_core_tools(registry)
    register_spawn_tools(registry)
    if cron:
        register_cron_tool(registry)
    return registry


def _all_plans(cfg: ClawsupConfig, cfg_path: Path, state_dir: Path, extra_plugins: list[Path]) -> list[SandboxPlan]:
    """The plugins' plans and the MCP servers', with the problems of both in one
    ConfigError. Blocking (manifests, the MCP commands' installs): run in a thread."""
    problems: list[str] = []
    plans: list[SandboxPlan] = []
    try:
        plans += build_plans(cfg, config_source=str(cfg_path), config_dir=cfg_path.parent, extra_plugins=extra_plugins)
    except ConfigError as e:
        problems += e.problems
    try:
        plans += build_mcp_plans(cfg, config_dir=cfg_path.parent, state_dir=state_dir)
    except ConfigError as e:
        problems += e.problems
    if problems:
        raise ConfigError(str(cfg_path), problems)
    return plans


def _what(plan: SandboxPlan) -> str:
    return f"MCP server {plan.mcp.server_id!r}" if plan.mcp is not None else f"plugin {plan.plugin_id!r}"


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
        plans = await asyncio.to_thread(_all_plans, cfg, cfg_path, paths.root, opts.extra_plugins)
        declared_channels = {c for p in plans for c in p.offers.declares("channel")}
        for cid, chan in cfg.channels.plugin_channels().items():
            if chan.enabled and cid not in declared_channels:
                logger.warning("channels.{}: no plugin declares this channel (contracts.channels); nothing will speak for it", cid)
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
            process_plans.append(workspace_plan(workspace, "workspace"))
        uids = SandboxUids(UidAllocator(Path(s.uids.registry), s.uids.first, s.uids.count), paths.root)
        run_as = RunAs.of(s.run_as)
        users, sockets = await asyncio.to_thread(
            choose_child_users, run_as, paths, plans=plans, process_plans=process_plans, source=str(cfg_path), uids=uids
        )
        needed = {"process", workspace.backend, *run_backend.values(), *(p.backend for p in plans)}
        for name in sorted(needed):
            if problem := await asyncio.to_thread(backend_problem, name):
                asked = [f"{_what(p)} asks for the {name} backend: {problem}" for p in plans if p.backend == name]
                raise ConfigError(str(cfg_path), asked or [f"the {name} backend: {problem}"])
        warden = await asyncio.to_thread(Warden)
        launchers: dict[str, Launcher] = {
            name: await asyncio.to_thread(make_launcher, name, cgroups=cgroups, state_dir=paths.root, warden=warden) for name in sorted(needed)
        }
        registry = await asyncio.to_thread(_core_registry, cfg.automation.cron.enabled)  # compiles the core tools' schemas
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
            user_for=RunAsPolicy(run_as, users, uids).user_for,
            release_user=uids.release,
        )
        workspaces = Workspaces(manager, workspace)
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
        bus = message_bus(cfg)
        for plan in plans:
            sb = manager.add(plan, listeners=[opts.on_transition] if opts.on_transition is not None else (), services=plugin_services(bus, manager, plan))
            for line in plan.refused:
                sb.log.event(f"the manifest asked for more than is granted: {line}")
        hooks = Hooks(manager.sandboxes, registry)
        tools = ToolDispatcher(manager, workspaces, hooks)
        # A stop is asked (`asked`), then the plugins' gateway_stop hooks run while
        # their sandboxes still serve, then everything stops (`stop`).
        stop_asked, stop = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # A second signal does not wait for the plugins' gateway_stop hooks.
            loop.add_signal_handler(sig, lambda: stop.set() if stop_asked.is_set() else stop_asked.set())
        store = session_store(cfg, paths)
        channels = channels_from_config(cfg, bus, paths, source=str(cfg_path), sandboxes=manager)
        models = Models(cfg, source=str(cfg_path))
        subagents = build_subagents(
            cfg,
            models=models,
            sandboxes=manager,
            workspaces=workspaces,
            tools=tools,
            store=store,
            sessions=bus.inbound,
            backends=run_backend,
            journal=RunJournal(paths.root / "runs.jsonl"),
            hooks=hooks,
        )
        agent_loop = AgentLoop(cfg, models=models, tools=tools, spawn=subagents, store=store, hooks=hooks)
        messaging = Messaging(cfg, bus=bus, store=store, channels=channels, agent=agent_loop, commands=Commands(manager, Owners.from_config(cfg)), hooks=hooks)
        automation = build_cron(
            cfg, paths, messaging=messaging, stop_session=agent_loop.stop_session, workspace_sandbox=workspaces.sandbox_id, source=str(cfg_path)
        )
        cron = automation[0] if automation is not None else None
        agent_loop.cron = automation[1] if automation is not None else None
        control = ControlServer(paths.control_socket, manager, tools, stop_asked.set, chat=messaging.cli, subagents=subagents, cron=cron)
        await control.start()
        servers = sum(p.role == "mcp" for p in plans)
        logger.info("clawsup supervisor pid {} on {} ({} plugin(s), {} MCP server(s))", os.getpid(), paths.root, len(plans) - servers, servers)
        ready = asyncio.Event()
        # Bounded: each stop step has its grace, and a child that outlives them all is
        # SIGKILLed; this is the outer bound on the whole shutdown.
        stop_timeout = 3 * s.stop_grace_seconds + 2
        try:
            async with _plain_errors(), asyncio.TaskGroup() as tg:
                run = tg.create_task(manager.run(ready, stop, start_timeout=START_TIMEOUT_S, stop_timeout=stop_timeout))
                tg.create_task(hooks.run(stop), name="observing hooks")
                tg.create_task(_stop_after_hooks(stop_asked, stop, hooks), name="gateway_stop hooks")
                if workspace.scope == "session":
                    tg.create_task(_stop_idle_workspaces(workspaces, run), name="idle workspaces")
                channels_up = asyncio.Event()
                tg.create_task(messaging.run(stop, channels_up), name="messaging")
                tg.create_task(subagents.run(stop), name="subagent runs")
                await ready.wait()
                await channels_up.wait()
                if cron is not None:
                    # Armed once the sandboxes and channels serve: a run missed while
                    # the gateway was down goes now, and finds its tools there.
                    tg.create_task(cron.run(stop), name="cron")
                hooks.observe("gateway_start", {"pid": os.getpid(), "plugins": sorted(p.plugin_id for p in plans if p.role == "plugin")})
                if opts.on_ready is not None:
                    await opts.on_ready(manager, tools)
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
