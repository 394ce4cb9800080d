"""The sandbox manager: every sandbox of this supervisor (plugins', workspaces',
subagent runs') and the tasks that supervise them. A tool call finds its sandbox
here, through the dispatcher (supervisor/tools/dispatch.py).

Created by the gateway; `run()` owns one task group with a `supervise()` task per
sandbox and returns only after every child has stopped.
"""

from __future__ import annotations

import asyncio
import enum
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from loguru import logger

from clawsup.sandbox.launch.launcher import ChildUser, Launcher, MiB
from clawsup.supervisor.errors import SandboxUnavailable, UnknownSandbox
from clawsup.supervisor.sandboxes.child_requests import Service
from clawsup.supervisor.sandboxes.lifecycle import SandboxState, Transition
from clawsup.supervisor.paths import StatePaths
from clawsup.supervisor.sandboxes.offers import CONTRACT_KEYS
from clawsup.supervisor.sandboxes.registry import Kind, Registration, Registry
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.plans import SandboxPlan
from clawsup.supervisor.sandboxes.bring_up import SandboxDirs
from clawsup.supervisor.sandboxes.incarnation import Timing
from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox

S = SandboxState
DISCARD_SETTLE_S = 5.0
"""How long a discard waits for its sandbox's supervision to end once cancelled: the
kill on the way out (SIGTERM, a short grace, SIGKILL) is bounded well within it."""


def child_env(allowlist: Iterable[str]) -> dict[str, str]:
    """The only part of our environment a child sees. API keys and tokens stay here."""
    return {k: os.environ[k] for k in allowlist if k in os.environ}


class Sandboxes(Protocol):
    """The set of sandboxes as its users see it (the dispatcher, the workspaces, a
    subagent run's driver): who holds each tool name, the sandboxes by id, and adding
    and discarding one while serving. `SandboxManager` is the one there is.

    supervisor/tools/dispatch.py, supervisor/tools/workspaces.py and
    supervisor/agents/run_driver.py take it."""

    @property
    def registry(self) -> Registry: ...

    @property
    def sandboxes(self) -> Mapping[str, SupervisedSandbox]: ...

    async def add_running(self, plan: SandboxPlan, *, services: Mapping[str, Service] | None = None) -> SupervisedSandbox: ...

    async def discard(self, sb: SupervisedSandbox, reason: str, timeout: float, *, polite: bool = True, remove_files: bool = False) -> None: ...


class _Decide(enum.Enum):
    NOW = "now"


_DECIDE = _Decide.NOW
"""`add`'s default: decide who the sandbox runs as now."""


class SandboxManager:
    def __init__(
        self,
        *,
        registry: Registry,
        launchers: Mapping[str, Launcher],
        paths: StatePaths,
        timing: Timing,
        env_allowlist: Iterable[str],
        sockets: Path | None = None,
        user_for: Callable[[SandboxPlan], ChildUser | None] | None = None,
        release_user: Callable[[str], None] | None = None,
    ) -> None:
        self.registry = registry
        self._launchers = dict(launchers)
        self._tg: asyncio.TaskGroup | None = None
        self._paths = paths
        self._timing = timing
        self._env = child_env(env_allowlist)
        self._sockets = sockets or paths.host_sockets()
        self._user_for = user_for or (lambda plan: None)
        """Who a sandbox's children run as (None: as the supervisor); see gateway."""
        self._release_user = release_user
        """Gives a discarded sandbox's uid back to the machine's record (sandbox/launch/uids.py)."""
        self.sandboxes: dict[str, SupervisedSandbox] = {}
        self.warnings: list[str] = []
        """One line each, shown by `clawsup start` and `clawsup status` (such as the
        agent's commands running unconfined on the process backend)."""
        self._logs: list[SandboxLog] = []
        self._later: dict[str, asyncio.Task[None]] = {}

    async def add_running(self, plan: SandboxPlan, *, services: Mapping[str, Service] | None = None) -> SupervisedSandbox:
        """Add a sandbox while serving (a session's workspace, a subagent run's) and
        supervise it. Who it runs as is decided in a thread: a first uid takes the
        machine's lock file and may scan its processes (sandbox/launch/uids.py). Two callers
        racing for one id get the same sandbox (the first one's `services`)."""
        run_as = await asyncio.to_thread(self._user_for, plan)
        if (sb := self.sandboxes.get(plan.sandbox_id)) is not None:
            return sb
        sb = self.add(plan, run_as=run_as, services=services)
        self.supervise_later(sb)
        return sb

    def add(
        self,
        plan: SandboxPlan,
        *,
        workspace: Path | None = None,
        run_as: ChildUser | None | Literal[_Decide.NOW] = _DECIDE,
        services: Mapping[str, Service] | None = None,
        listeners: Sequence[Callable[[Transition], None]] = (),
    ) -> SupervisedSandbox:
        """Add a plugin's sandbox (not started yet). Plugins added first win contested
        tool names, command names and channel ids, so the outcome never depends on
        which child starts faster, nor on which is down when another restarts.
        `services` and `listeners`: see `SupervisedSandbox`."""
        log = SandboxLog(self._paths.sandbox_log(plan.sandbox_id))
        self._logs.append(log)
        for name, holder in self.registry.claim(plan.plugin_id, Kind.TOOL, plan.declared_tools).items():
            log.event(f"tool {name!r} will be refused: plugin {holder!r} already holds it (loaded first)")
        for kind, what in ((Kind.COMMAND, "command"), (Kind.CHANNEL, "channel")):
            for name, holder in self.registry.claim(plan.plugin_id, kind, plan.offers.declares(kind.value)).items():
                log.event(f"{what} {name!r} will be refused: plugin {holder!r} declares it too and was loaded first")
                logger.warning("{}: {} {!r} will be refused: plugin {!r} declares it too and was loaded first", plan.sandbox_id, what, name, holder)
        sb = SupervisedSandbox(
            plan,
            launcher=self._launchers[plan.backend],
            registry=self.registry,
            timing=self._timing,
            dirs=SandboxDirs(
                workspace=workspace or self._paths.sandboxes / plan.sandbox_id / "workspace",
                run_dir=self._sockets / plan.sandbox_id,
                operator_workspace=workspace is not None,
                private=self._paths.sandboxes / plan.sandbox_id / "private",
            ),
            log=log,
            env=self._env,
            run_as=self._user_for(plan) if run_as is _DECIDE else run_as,
            services=services,
            listeners=listeners,
        )
        self.sandboxes[plan.sandbox_id] = sb
        return sb

    def ended_log(self, sandbox_id: str) -> Path | None:
        """The log of a sandbox that was discarded (a finished subagent run's), so
        `clawsup logs` still finds it; None if there is none."""
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", sandbox_id):
            return None
        path = self._paths.sandbox_log(sandbox_id)
        return path if path.is_file() else None

    def get(self, sandbox_id: str) -> SupervisedSandbox:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise UnknownSandbox(sandbox_id, list(self.sandboxes)) from None

    async def run(self, ready: asyncio.Event, stop: asyncio.Event, *, start_timeout: float, stop_timeout: float) -> None:
        """Start every sandbox (in parallel), set `ready` once each has settled, and
        run until `stop` is set; then stop them all and return."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            tasks = [tg.create_task(self._guard(sb), name=f"supervise {sb.id}") for sb in self.sandboxes.values()]
            await asyncio.gather(*(self._first_start(sb, start_timeout) for sb in list(self.sandboxes.values())))
            ready.set()
            await stop.wait()
            await self.stop_all(stop_timeout)
            for t in tasks:
                t.cancel()
            self._tg = None
            for t in self._later.values():
                t.cancel()

    def supervise_later(self, sb: SupervisedSandbox) -> None:
        """Supervise a sandbox added while running (a workspace sandbox created on
        first use), under the same task group as the others."""
        if self._tg is None:
            raise SandboxUnavailable(sb.id, sb.plan.plugin_id, "stopped", "the supervisor is not running")
        self._later[sb.id] = self._tg.create_task(self._guard(sb), name=f"supervise {sb.id}")

    async def discard(self, sb: SupervisedSandbox, reason: str, timeout: float, *, polite: bool = True, remove_files: bool = False) -> None:
        """Stop a sandbox added at run time (a subagent run's, an idle session
        workspace) and forget it: its supervision ends, it leaves `status`, its log
        file is closed and stays (`ended_log`). A stop past `timeout` kills
        everything it started and is logged, never raised. Returns once nothing of
        it runs (bounded), so that a new sandbox of the same id may start.
        `remove_files`: its workspace and socket folders go too."""
        try:
            if sb.lc.state is not S.STOPPED:
                await sb.stop(reason, timeout, polite=polite)
        except TimeoutError:
            logger.error("{}: did not stop within {:g} s ({}); killing everything it started", sb.id, timeout, reason)
            sb.log.event(f"did not stop within {timeout:g} s; killing everything it started")
            if sb.inc is not None and not sb.inc.died.done():
                await sb.inc.child.kill_all()
                try:  # its supervision sees the death and logs how it ended
                    await sb.wait_state(frozenset({S.STOPPED}), DISCARD_SETTLE_S)
                except TimeoutError:
                    pass
        finally:
            task = self._later.pop(sb.id, None)
            try:
                if task is not None:
                    # Leaving its incarnation kills and reaps whatever is left
                    # (supervisor/sandboxes/incarnation.py), writing to its log on the way.
                    # Not cut short: that exit is bounded (each kill step has its
                    # grace), and a log closed under it, or a sandbox of the same id
                    # started over its cgroup, would be worse than the wait.
                    task.cancel()
                    await asyncio.wait([task])
            finally:
                self.registry.reclaim(sb.plan.plugin_id)
                if self.sandboxes.get(sb.id) is sb:
                    del self.sandboxes[sb.id]
                if sb.log in self._logs:
                    self._logs.remove(sb.log)
                sb.log.close()
            if remove_files:
                for d in (sb.workspace_dir.parent, sb.run_dir):
                    await asyncio.to_thread(shutil.rmtree, d, ignore_errors=True)
                # Its files are gone, so its uid may serve another sandbox (once no
                # process of it lives; the allocator checks that).
                if self._release_user is not None:
                    try:
                        await asyncio.to_thread(self._release_user, sb.id)
                    except Exception as e:
                        logger.warning("{}: could not release its uid: {}", sb.id, e)

    async def _first_start(self, sb: SupervisedSandbox, timeout: float) -> None:
        try:
            await sb.start(timeout)
        except TimeoutError:
            logger.error("{}: not settled {:g} s after start; it goes on in the background", sb.id, timeout)

    async def _guard(self, sb: SupervisedSandbox) -> None:
        """A bug in one sandbox's supervision must not take the others down. The
        sandbox is then `failed` until an operator's restart, which supervises it
        afresh."""
        while True:
            try:
                await sb.supervise()
                return
            except Exception:
                # Its child was killed on the way out of its incarnation's block
                # (supervisor/sandboxes/incarnation.py); what it registered goes too.
                logger.exception("{}: supervision failed; its child was killed", sb.id)
                self.registry.reclaim(sb.plan.plugin_id)
                sb.supervision_failed()

    async def stop_all(self, timeout: float) -> None:
        alive = [sb for sb in self.sandboxes.values() if sb.lc.state is not S.STOPPED]
        results = await asyncio.gather(*(sb.stop("supervisor shutting down", timeout) for sb in alive), return_exceptions=True)
        for sb, r in zip(alive, results):
            if isinstance(r, BaseException):
                logger.error("{}: did not stop within {:g} s ({}); killing everything it started", sb.id, timeout, type(r).__name__)
                if sb.inc is not None:
                    await sb.inc.child.kill_all()

    async def status(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(sb.status() for sb in list(self.sandboxes.values()))))

    def plugins(self) -> list[dict[str, Any]]:
        """For `clawsup plugins list/show`: each plugin's ask against its grant, who it
        runs as and where, its tools declared against registered, and every refusal."""
        out = []
        for sb in self.sandboxes.values():
            plan = sb.plan
            if plan.role != "plugin":
                continue
            lim = plan.limits
            registered = sorted(r.name for r in self.registry.owned_by(plan.plugin_id) if r.kind is Kind.TOOL)
            out.append({
                "id": plan.plugin_id,
                "version": plan.plugin_version,
                "folder": str(plan.plugin_dir),
                "state": sb.lc.state.value,
                "trust": "trusted" if plan.trusted else "untrusted",
                "backend": plan.backend,
                "uid": sb.uid,
                "requested": plan.requested,
                "granted": {
                    "callTimeoutSeconds": lim.call_timeout_s, "memoryMb": lim.memory_bytes // MiB, "cpuSeconds": lim.cpu_seconds,
                    "maxProcesses": lim.max_processes, "maxOpenFiles": lim.max_open_files,
                    "maxFileSizeMb": lim.max_file_size_bytes // MiB, "cpus": lim.cpus,
                    "maxWorkspaceMb": lim.workspace_bytes // MiB, "tmpMb": lim.tmp_bytes // MiB, "network": plan.network,
                    "restart": {"maxRestarts": plan.restart.max_restarts, "periodSeconds": plan.restart.period_s,
                                "backoffInitialSeconds": plan.restart.backoff_initial_s, "backoffMaxSeconds": plan.restart.backoff_max_s},
                },  # fmt: skip
                "tools": {"declared": sorted(plan.declared_tools), "registered": registered},
                "offers": {
                    key: {"declared": sorted(plan.offers.declares(kind)), "registered": [_offer_json(r) for r in self.registry.owned_by(plan.plugin_id) if r.kind.value == kind]}
                    for kind, key in CONTRACT_KEYS.items()
                },
                "services": sb.services(),
                "grants": plan.offers.to_json(),
                "refused": [
                    *plan.refused,
                    *(f"tool {name!r}: {why}" for name, why in sorted(sb.refusals.items())),
                    *(f"{what}: {why}" for what, why in sorted(sb.offer_refusals.items())),
                ],
            })
        return out

    async def aclose(self) -> None:
        for log in self._logs:
            log.close()
        for launcher in self._launchers.values():
            await launcher.aclose()


def _offer_json(r: Registration) -> dict[str, Any]:
    """One registered offer for `plugins show`: its name and what its kind adds."""
    o = r.offer
    if o is None or r.kind is Kind.SERVICE or r.kind is Kind.CHANNEL:
        return {"name": r.name}
    if r.kind is Kind.HOOK:
        return {"name": r.name, "priority": o.priority}
    if r.kind is Kind.COMMAND:
        return {"name": r.name, "description": o.description, "acceptsArgs": o.accepts_args, "ownerOnly": o.owner_only}
    return {"name": r.name, "auth": o.auth}
