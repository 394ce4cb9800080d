"""One plugin's sandbox across all its incarnations: start, watch, kill, reclaim,
restart.

Created by the `SandboxManager` for each plugin it loads; its `supervise()` task is
owned by the manager's task group and lives as long as the supervisor. Each
incarnation (one child process) is one `running` block (supervisor/sandboxes/incarnation.py)
holding a task group of its own: the bring-up, the heartbeat and the child's stream.
When the child dies the group ends; when the block ends for any reason, the child and
everything it started are killed, and nothing of that incarnation is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from loguru import logger

from clawsup.sandbox.handshake import LOAD_ERROR_EXIT, HandshakeError
from clawsup.sandbox.launch.launcher import Child, ChildUser, ExitStatus, LaunchSpec, Launcher, Limits
from clawsup.sandbox.handshake import GatePayload
from clawsup.sandbox.socket_paths import UnsafeSocket, dial_address, open_child_socket
from clawsup.sandbox.manifest import TOOL_NAME_PATTERN
from clawsup.sandbox.protected import ProtectedPathError
from clawsup.supervisor.sandboxes import child_requests
from clawsup.supervisor.errors import (
    ClawsupError,
    RegistrationRefused,
    SandboxDied,
    SandboxUnavailable,
    ToolFailed,
    ToolTimeout,
)
from clawsup.supervisor.sandboxes.host_client import CallAborted, ChildStream, ExecResult, HostClient, HostMisbehaved, HostUnreachable, UnreadableTool
from clawsup.supervisor.tools.spec import ToolSpec
from clawsup.supervisor.sandboxes.incarnation import Incarnation, running
from clawsup.supervisor.sandboxes.lifecycle import ALIVE, Lifecycle, RestartPolicy, SandboxState, Transition
from clawsup.supervisor.paths import child_dir, own_dir, workspace_tmp
from clawsup.supervisor.sandboxes.registry import Kind, Registration, Registry, with_compiled_schemas
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.disk_usage import WorkspaceDisk

S = SandboxState
T = TypeVar("T")
SETTLED = frozenset({S.READY, S.CRASHED, S.BACKOFF, S.FAILED})
DESCRIBE_TIMEOUT_S = 5.0
# The host answers TIMED_OUT itself at the call's timeout; the gRPC deadline leaves it
# this long to say so before the supervisor stops waiting.
TIMEOUT_MARGIN_S = 0.25
OVERRUN_PROBE_TIMEOUT_S = 0.5
# A transport error can reach a caller a moment before the pidfd says the child
# exited; this is how long the caller waits for the exit status to name the death.
DEATH_CONFIRM_S = 2.0
# Service requests (a subagent's model and tool calls) one child may have in flight;
# past this its stream waits, not our memory.
MAX_SERVICE_REQUESTS = 8
# A manifest declares at most 128 tools (sandbox/manifest.py); a Describe that lists
# many more is looked at this far, and its refusals are named this many times.
MAX_DESCRIBED_TOOLS = 1024
MAX_NAMED_REFUSALS = 16


@dataclass(frozen=True, kw_only=True)
class SandboxDirs:
    workspace: Path
    """The child's cwd and HOME: `<state>/sandboxes/<id>/workspace`."""
    run_dir: Path
    """The 0700 directory of the child's socket."""
    operator_workspace: bool = False
    """The workspace is a folder the operator named: not chmodded, no .tmp in it."""
    private: Path | None = None
    """`<state>/sandboxes/<id>/private`: written by the supervisor only (see
    LaunchSpec.private_dir)."""


@dataclass(frozen=True, kw_only=True)
class Timing:
    handshake_timeout_s: float = 10.0
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 1.0
    heartbeat_misses: int = 2
    stop_grace_s: float = 2.0


OutputSink = Callable[[bytes], Awaitable[None]]


@dataclass(slots=True, kw_only=True)
class ToolResult:
    text: str
    is_json: bool

    def value(self) -> Any:
        return json.loads(self.text) if self.is_json else self.text


class LaunchFailed(Exception):
    """The launcher could not start the child (it cleaned up after itself)."""


@dataclass(frozen=True)
class Ended:
    """How one incarnation ended, and what the supervision loop does next."""

    status: ExitStatus
    delay: float | None
    """Seconds until the restart; None: no restart (budget spent, or stopping)."""
    failed: str | None = None
    """Set when retrying cannot help (the plugin does not load): go to `failed` now."""


class SupervisedSandbox:
    """One plugin's sandbox: its plan, its lifecycle, its log, and the incarnation
    (child process) it is running now, if any."""

    def __init__(
        self,
        plan: SandboxPlan,
        *,
        launcher: Launcher,
        registry: Registry,
        timing: Timing,
        dirs: SandboxDirs,
        log: SandboxLog,
        env: dict[str, str],
        run_as: ChildUser | None,
    ) -> None:
        self.plan = plan
        self.id = plan.sandbox_id
        self._launcher = launcher
        self._registry = registry
        self._timing = timing
        self._dirs = dirs
        self._disk = WorkspaceDisk(dirs.workspace, plan.limits.workspace_bytes, grow_only=dirs.operator_workspace)
        self._disk_poke = asyncio.Event()
        """Set after each call, so that the workspace is measured then too."""
        self._workspace = dirs.workspace
        self._run_dir = dirs.run_dir
        self._run_as = run_as
        self.log = log
        self._env = env
        self._tokens = ("", "")
        """(supervisor token, host token) of the current incarnation: fresh for each
        child, so a token that leaked from a dead child opens nothing."""
        self.lc = Lifecycle(sandbox_id=plan.sandbox_id, policy=plan.restart)
        self.lc.listeners.append(self._on_transition)
        self.inc: Incarnation | None = None
        self._incarnations = itertools.count(1)
        self.services: dict[str, child_requests.Service] = {}
        """What this sandbox may ask beyond `log` (a subagent run's model and tool
        calls); set by whoever made it, see supervisor/sandboxes/child_requests.py."""
        self.refusals: dict[str, str] = {}
        """Tool name -> why the registry refused it, from the last Describe (for
        `clawsup plugins show`)."""
        self._start_wanted = asyncio.Event()
        self._stop_wanted = False
        self._stop_reason = ""
        self._changed = asyncio.Event()

    @property
    def workspace_dir(self) -> Path:
        return self._workspace

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    @property
    def uid(self) -> int | None:
        """The uid its children run as; None: as the supervisor."""
        return self._run_as.uid if self._run_as is not None else None

    # -- state, as others see it ---------------------------------------------------

    def _on_transition(self, t: Transition) -> None:
        self.log.event(f"{t.old.value} → {t.new.value}{f' ({t.why})' if t.why else ''}")
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_state(self, states: frozenset[SandboxState], timeout: float, *, after: int = -1) -> SandboxState:
        """Wait until the sandbox is in one of `states`, reached by a transition
        numbered above `after` (event-driven, bounded)."""
        async with asyncio.timeout(timeout):
            while True:
                if after >= 0:
                    if (hit := self.lc.first_since(after, states)) is not None:
                        return hit
                elif self.lc.state in states:
                    return self.lc.state
                await self._changed.wait()

    async def status(self) -> dict[str, Any]:
        # A container's figures come from the engine: sampled off the loop, at most
        # once a second (the launcher's contract), so a status poll never waits on it.
        # Taken first; the rest of the row is read after it, in one step, and the
        # sample dropped if it belongs to a child that has gone meanwhile.
        sampled = self.inc if self.lc.state in ALIVE else None
        container = await _quietly(sampled.child.usage(), None) if sampled else None
        now = self.lc.clock()
        inc = self.inc if self.lc.state in ALIVE else None
        if inc is not sampled:
            container = None
        return {
            "id": self.id,
            "plugin": self.plan.plugin_id,
            "backend": self.plan.backend,
            "role": self.plan.role,
            "trust": "trusted" if self.plan.trusted else "untrusted",
            "uid": self.uid,
            # What the child really has: the process backend cannot take it away.
            "network": self.plan.network or self.plan.backend == "process",
            "memory_limit_bytes": self.plan.limits.memory_bytes,
            "state": self.lc.state.value,
            "state_why": self.lc.why,
            "pid": inc.child.pid if inc else None,
            "restarts": self.lc.restarts,
            "restarts_left": self.lc.restarts_left(),
            "uptime_s": round(now - self.lc.started_at, 3) if self.lc.started_at is not None else None,
            "rss_bytes": container.get("memory_bytes") if container else (inc.child.rss_bytes() if inc else None),
            "container": container,
            "tools": [r.name for r in self._registry.owned_by(self.plan.plugin_id) if r.kind is Kind.TOOL],
            "last_exit": self.lc.last_exit.to_json() if self.lc.last_exit else None,
        }

    # -- the supervision loop --------------------------------------------------------

    def supervision_failed(self) -> None:
        """Its supervision ended on a bug (the manager logged it): say `failed`, so
        that status and callers see it down, until an operator's restart."""
        why = "its supervision failed (see supervisor.log); `clawsup restart` to try again"
        if self.lc.state in (S.STARTING, S.READY):
            self.lc.enter(S.CRASHED, why)
        if self.lc.state is S.CRASHED:
            self.lc.enter(S.FAILED, why)
        elif self.lc.state in (S.DRAINING, S.BACKOFF):
            self.lc.enter(S.STOPPED, why)

    def request_start(self) -> None:
        self._start_wanted.set()

    async def supervise(self) -> None:
        """Runs for the supervisor's whole life. Each pass of the outer loop is one
        start request (the first, or an operator's restart); the inner loop restarts
        after crashes until the budget is spent or a stop is asked for."""
        while True:
            await self._start_wanted.wait()
            self._start_wanted.clear()
            self._stop_wanted = False
            while True:
                ended = await self._run_incarnation()
                status, delay = ended.status, ended.delay
                if self._stop_wanted:
                    self.lc.enter(S.STOPPED, status.reason or "stopped")
                    break
                if ended.failed is not None:
                    # A deterministic error (the plugin does not load): retrying
                    # would fail the same way. `clawsup restart` tries again.
                    self.lc.enter(S.FAILED, f"{ended.failed}; fix it, then `clawsup restart {self.id}`")
                    break
                if delay is None:
                    self.lc.enter(S.FAILED, f"{self.plan.restart.max_restarts} restarts within {self.plan.restart.period_s:g} s; `clawsup restart {self.id}` to try again")
                    break
                self.lc.enter(S.BACKOFF, f"restarting in {delay:g} s")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._start_wanted.wait()
                self._start_wanted.clear()
                if self._stop_wanted:
                    self.lc.enter(S.STOPPED, "stopped during backoff")
                    break
                self.lc.restarts += 1

    async def _run_incarnation(self) -> Ended:
        number = next(self._incarnations)
        self.inc = None
        self.lc.enter(S.STARTING, f"incarnation {number}")
        self.log.new_incarnation()
        try:
            async with running(self.id, number, self._launch, self.log, self._timing.stop_grace_s) as inc:
                self.inc = inc
                self.log.event(f"started pid {inc.child.pid} (backend {self.plan.backend})")
                exit_future = inc.child.wait()
                try:
                    async with asyncio.TaskGroup() as tg:
                        inc.tg = tg
                        life = tg.create_task(self._life(inc), name=f"{self.id}#{number} life")
                        if self.lc.state is S.DRAINING:  # a stop arrived during the launch
                            inc.kill(self._stop_reason, polite=False)
                        raw = await asyncio.shield(exit_future)
                        life.cancel()
                        return await self._on_death(inc, raw)
                finally:
                    # From here the block's exit kills; a stop or restart meanwhile only
                    # adds its reason (Incarnation.kill), and no call is handed this child.
                    inc.tg = None
                    inc.closing = True
        except LaunchFailed as failed:  # the launch itself failed: counts as a death
            e = failed.__cause__ or failed
            status = ExitStatus(reason=f"launch failed: {e}")
            self.log.event(f"could not start the child: {e}")
            # A refusal that explains itself (a planted symlink at a protected path)
            # needs no traceback; anything else is a bug worth one.
            logger.opt(exception=None if isinstance(e, ProtectedPathError) else e).error("{}: could not start the child: {}", self.id, e)
            if self.lc.state is S.DRAINING:
                return Ended(status, None)
            delay = self.lc.record_death(status)
            self.lc.enter(S.CRASHED, status.reason)
            return Ended(status, delay)

    async def _on_death(self, inc: Incarnation, raw: ExitStatus) -> Ended:
        """The child has exited. Reclaim first, then tell the callers, then the log:
        the order is what tests/test_faults.py checks. Its descendants are swept
        after the callers know (a cgroup holding much memory empties slowly)."""
        inc.closing = True
        load = inc.output.load_error if raw.code == LOAD_ERROR_EXIT and self.lc.state is S.STARTING else None
        if load is not None:
            reason = f"could not load: {load.message}{f' (at {load.where})' if load.where else ''}"
        else:
            reason = "; ".join(r for r in (inc.kill_reason, await _quietly(inc.child.diagnose(), "")) if r)
        status = ExitStatus(code=raw.code, signal=raw.signal, reason=reason)
        gone = self._registry.reclaim(self.plan.plugin_id)
        draining = self.lc.state is S.DRAINING
        if draining:
            delay = None
        elif load is not None:
            self.lc.last_exit = status  # not a death that counts against the budget
            delay = None
        else:
            delay = self.lc.record_death(status)
        inc.declare_dead(status)
        # From the callers' news to `crashed`, no await: a caller told of the death
        # must not find the sandbox still `ready` (tests/test_log_follow.py).
        inc.output.drain()
        tools = f"; withdrew {', '.join(r.name for r in gone)}" if gone else ""
        self.log.event(f"pid {inc.child.pid} {status.describe()}{tools}")
        if draining:
            logger.info("{}: pid {} {}", self.id, inc.child.pid, status.describe())
        else:
            tail = " | ".join(list(self.log.stderr_tail)[-3:])
            logger.warning("{}: pid {} {}{}{}", self.id, inc.child.pid, status.describe(), tools, f"; last stderr: {tail}" if tail and load is None else "")
            self.lc.enter(S.CRASHED, status.describe())
        # Descendants may outlive the leader (a fork that called setsid, a grandchild
        # still writing); the group and the cgroup go with it, before any restart.
        await _quietly(inc.child.kill_all(), None)
        return Ended(status, delay, failed=reason if load is not None else None)

    def _died_error(self, status: ExitStatus) -> SandboxDied:
        return SandboxDied(
            sandbox_id=self.id,
            plugin=self.plan.plugin_id,
            status=status,
            restarts_left=self.lc.restarts_left(),
            stderr_tail=list(self.log.stderr_tail)[-5:],
        )

    def _private_dir(self) -> Path | None:
        d = self._dirs.private
        if d is None:
            return None
        own_dir(d.parent, 0o711)
        own_dir(d, 0o711)
        return d

    async def _launch(self) -> Child:
        try:
            return await self._launch_child()
        except Exception as e:
            raise LaunchFailed(str(e)) from e

    async def _launch_child(self) -> Child:
        env = dict(self._env)
        if self._dirs.operator_workspace:
            # The operator's own folder (`clawsup exec run --workspace`): used as is.
            env.update(HOME=str(self._workspace))
        else:
            # The sandbox's folder is ours (enter-only: a child running as another
            # user reaches its workspace by name); the workspace is the child's, and
            # what is in it is touched by descriptor only (supervisor/paths.py).
            own_dir(self._workspace.parent, 0o711)
            child_dir(self._workspace, 0o700)
            env.update(HOME=str(self._workspace))
            tmp, notes = workspace_tmp(self._workspace)
            for note in notes:
                self.log.event(note)
            if tmp is not None:
                env.update(TMPDIR=str(tmp))
        child_dir(self._run_dir, 0o700)
        supervisor_token, host_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self._tokens = (supervisor_token, host_token)
        spec = LaunchSpec(
            sandbox_id=self.id,
            plugin_dir=self.plan.plugin_dir,
            workspace=self._workspace,
            run_dir=self._run_dir,
            run_as=self._run_as,
            limits=self.plan.limits,
            env=env,
            network=self.plan.network,
            trusted=self.plan.trusted,
            protected_paths=self.plan.protected_paths,
            operator_workspace=self._dirs.operator_workspace,
            private_dir=self._private_dir(),
            gate=GatePayload(
                sandbox_id=self.id,
                supervisor_token=supervisor_token,
                host_token=host_token,
                plugin_id=self.plan.plugin_id,
                plugin_version=self.plan.plugin_version,
                entry=self.plan.entry,
                plugin_config=self.plan.plugin_config,
                role=self.plan.role,
                tools=self._registry.claimable(self.plan.plugin_id, Kind.TOOL, self.plan.declared_tools) if self.plan.role == "plugin" else None,
                workspace_tools=self.plan.workspace_tools,
            ),
        )
        return await self._launcher.launch(spec)

    async def _life(self, inc: Incarnation) -> None:
        """Bring-up, then heartbeat and stream, until the child dies (when the
        incarnation cancels this). A bug here must cost this child, not the
        supervisor: it is logged and the child killed."""
        try:
            await self._bring_up_and_serve(inc)
        except Exception as e:
            logger.exception("{}: supervisor error while serving pid {}", self.id, inc.child.pid)
            inc.kill(f"supervisor error: {type(e).__name__}: {e}", polite=False)

    async def _bring_up_and_serve(self, inc: Incarnation) -> None:
        t = self._timing
        try:
            async with asyncio.timeout(t.handshake_timeout_s):
                hs = await inc.output.handshake
        except TimeoutError:
            inc.kill(f"no handshake within {t.handshake_timeout_s:g} s", polite=False)
            return
        except HandshakeError as e:
            inc.kill(f"bad handshake: {e}", polite=False)
            return
        # Dial the socket we assigned, never an address the child names: plugin code
        # runs before the handshake and may print anything, including another
        # sandbox's socket. (The handshake's address matters only as a sanity check.)
        if hs.address != inc.child.socket_path:
            self.log.event(f"handshake names {hs.address}, dialling the assigned {inc.child.socket_path}")
        # The socket's folder is the child's to write: the name is opened once,
        # without following or blocking, checked, and dialled by descriptor, so that
        # no later swap of the name (a symlink to a listener of the plugin's own, that
        # would get the tokens) changes where a reconnect goes.
        try:
            inc.dial_fd = open_child_socket(inc.child.socket_path)
        except (UnsafeSocket, OSError) as e:
            inc.kill(f"refusing to dial the child's socket: {e}", polite=False)
            return
        inc.client = HostClient(dial_address(inc.dial_fd), *self._tokens)
        try:
            if not await inc.client.health(timeout=t.handshake_timeout_s):
                inc.kill("health check did not say SERVING after the handshake", polite=False)
                return
            desc = await inc.client.describe(DESCRIBE_TIMEOUT_S)
        except (HostUnreachable, HostMisbehaved, CallAborted) as e:
            inc.kill(f"bring-up failed: {e}", polite=False)
            return
        if desc.plugin_id != self.plan.plugin_id:
            inc.kill(f"host serves plugin {desc.plugin_id!r}, expected {self.plan.plugin_id!r}", polite=False)
            return
        if self.lc.state is not S.STARTING:
            return  # being stopped meanwhile: the kill is already on its way
        if self.plan.role == "plugin":
            await self._accept(desc.tools)
            if self.lc.state is not S.STARTING:
                return  # stopped while its schemas compiled
        self.lc.enter(S.READY, f"pid {inc.child.pid}, {len(self._registry.owned_by(self.plan.plugin_id))} tool(s)")
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._heartbeat(inc), name=f"{self.id}#{inc.number} heartbeat")
            tg.create_task(self._watch_disk(inc), name=f"{self.id}#{inc.number} disk")
            tg.create_task(self._serve_stream(inc), name=f"{self.id}#{inc.number} stream")

    async def _accept(self, tools: tuple[ToolSpec | UnreadableTool, ...]) -> None:
        """The supervisor is the judge: a refused tool is logged, the rest stay. A
        host that describes a flood of names it may not register gets the first few
        refusals named and the rest counted in one line, so that it cannot fill the
        logs or hold the loop (tests/test_trust.py::test_a_flood_of_refused_tools).
        The cheap checks come first, on the loop, so that names it may not hold cost
        no compile; the schemas of the rest are compiled in one batch off the loop
        (tests/test_hostile_bounds.py::test_a_plugins_registration_does_not_stall_other_callers)."""
        self.refusals = {}
        described = list(tools[:MAX_DESCRIBED_TOOLS])
        unnamed = len(tools) - len(described)
        screened = [self._screen(spec) for spec in described]
        compiled = iter(await with_compiled_schemas([r for r in screened if isinstance(r, Registration)]))
        if self.lc.state is not S.STARTING:
            return  # stopped meanwhile: its death has reclaimed; nothing may be added now
        for spec, first in zip(described, screened):
            why = first if isinstance(first, str) else self._register(next(compiled))
            if why is None:
                continue
            if len(self.refusals) >= MAX_NAMED_REFUSALS:
                unnamed += 1
                continue
            shown = repr(spec.name[:64]) + ("…" if len(spec.name) > 64 else "")
            self.refusals[spec.name[:64]] = why
            said = f"plugin {self.plan.plugin_id!r} may not register tool {shown}: {why}"
            self.log.event(f"refused: {said}")
            logger.warning("{}: {}", self.id, said)
        if unnamed:
            line = f"and {unnamed} more tool(s) it described were refused (not named one by one)"
            self.refusals["…"] = line
            self.log.event(line)
            logger.warning("{}: {}", self.id, line)

    def _screen(self, spec: ToolSpec | UnreadableTool) -> Registration | str:
        """One described tool as a registration, or why it may not be one (without
        compiling its schema)."""
        if not re.fullmatch(TOOL_NAME_PATTERN, spec.name):
            return "not a valid tool name (letters, digits, _ and -, at most 64)"
        if isinstance(spec, UnreadableTool):
            return spec.problem
        reg = Registration(
            kind=Kind.TOOL,
            name=spec.name,
            owner=self.plan.plugin_id,
            sandbox_id=self.id,
            description=spec.description,
            input_schema=spec.input_schema,
        )
        return self._registry.refusal(reg, declared=self.plan.declared_tools) or reg

    def _register(self, reg: Registration | str) -> str | None:
        """Register one tool, its schema compiled; None when accepted, else why not."""
        if isinstance(reg, str):
            return reg
        try:
            self._registry.register(reg, declared=self.plan.declared_tools)
        except RegistrationRefused as e:
            return e.reason
        return None

    async def _heartbeat(self, inc: Incarnation) -> None:
        t = self._timing
        misses = 0
        while True:
            await asyncio.sleep(t.heartbeat_interval_s)
            assert inc.client is not None
            try:
                serving = await inc.client.health(timeout=t.heartbeat_timeout_s)
            except (HostUnreachable, HostMisbehaved):
                misses += 1
                if misses >= t.heartbeat_misses:
                    inc.kill(f"hung: missed {misses} heartbeats ({t.heartbeat_timeout_s:g} s each)", polite=False)
                    return
                continue
            misses = 0
            if not serving:
                inc.kill("host reported NOT_SERVING (a handler overran its timeout and cannot be interrupted)", polite=False)
                return

    async def _watch_disk(self, inc: Incarnation) -> None:
        """Measures the workspace at READY, then every heartbeat interval and after
        each call (supervisor/sandboxes/disk_usage.py). Past its limit the child is killed at
        once, reported as a memory kill is (tests/test_sandbox_walls.py)."""
        while True:
            if (reason := await self._disk.over()) is not None:
                inc.kill(reason, polite=False)
                await inc.child.kill_all()  # no grace: a writer would go on writing
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timing.heartbeat_interval_s):
                    await self._disk_poke.wait()
            self._disk_poke.clear()

    async def _serve_stream(self, inc: Incarnation) -> None:
        """Answers the child's requests for as long as it lives. Quick ones (`log`)
        are answered inline; services (a model call) each in a task of this
        stream's group, at most MAX_SERVICE_REQUESTS at once, so a child that floods
        us waits on its own stream, not on our memory. The child's death ends the
        group, and with it every service call it still had running."""
        assert inc.client is not None
        who = child_requests.Requester(sandbox_id=self.id, plugin_id=self.plan.plugin_id, log=self.log, services=self.services)
        slots = asyncio.Semaphore(MAX_SERVICE_REQUESTS)
        stream: ChildStream | None = None

        async def serve(req: Any) -> None:
            assert stream is not None
            try:
                await stream.reply(await child_requests.answer_service(who, req))
            finally:
                slots.release()

        try:
            stream = await inc.client.connect()
            async with asyncio.TaskGroup() as tg:
                async for req in stream.requests():
                    if req.method in who.services and req.id:
                        await slots.acquire()
                        tg.create_task(serve(req), name=f"{self.id} {req.method}")
                    elif (reply := child_requests.answer(who, req)) is not None:
                        await stream.reply(reply)
        except* (HostUnreachable, HostMisbehaved, CallAborted) as eg:
            # The stream ends when the child dies; the exit watcher reports that. A
            # stream that fails while the child lives is worth a line.
            if not inc.died.done():
                self.log.event(f"child stream closed: {eg.exceptions[0]}")
        finally:
            if stream is not None:
                stream.close()

    # -- stopping and killing ------------------------------------------------------

    async def stop(self, reason: str, timeout: float, *, polite: bool = True) -> None:
        """Stop this sandbox and keep it stopped: polite Shutdown, then SIGTERM, then
        SIGKILL (`polite=False`: a short SIGTERM grace, then SIGKILL, for a child
        being killed rather than asked). Returns once it is `stopped`."""
        self._stop_wanted = True
        self._stop_reason = reason
        state = self.lc.state
        if state in (S.STARTING, S.READY):
            self.lc.enter(S.DRAINING, reason)
            if self.inc is not None:  # else the launch in progress sees DRAINING
                self.inc.kill(reason, polite=polite and state is S.READY)
        elif state in (S.BACKOFF, S.FAILED):
            if state is S.FAILED:
                self.lc.enter(S.STOPPED, reason)
            else:
                self._start_wanted.set()
        await self.wait_state(frozenset({S.STOPPED}), timeout)

    async def restart(self, timeout: float) -> SandboxState:
        """The operator's restart: stop if running, forget past deaths, start, and
        return once ready (or whatever state the first attempt ends in)."""
        if self.lc.state in (S.STARTING, S.READY, S.DRAINING, S.BACKOFF):
            await self.stop("restart requested by operator", timeout)
        self.lc.forgive()
        return await self.start(timeout)

    async def start(self, timeout: float) -> SandboxState:
        """Ask for a start and return the first settled state it leads to: `ready`,
        or `crashed`/`backoff`/`failed` if the child did not come up."""
        seq = self.lc.seq
        self.request_start()
        return await self.wait_state(SETTLED, timeout, after=seq)

    # -- calls -----------------------------------------------------------------------

    async def invoke(self, tool: str, args_json: str, timeout: float | None) -> ToolResult:
        inc = self._ready_incarnation()
        assert inc.client is not None
        limit = min(timeout, self.plan.limits.call_timeout_s) if timeout else self.plan.limits.call_timeout_s
        async with self._in_flight(inc, tool, limit):
            outcome = await inc.client.invoke(tool, args_json, inc.next_call_id(), limit, TIMEOUT_MARGIN_S)
        if outcome.ok:
            return ToolResult(text=outcome.text, is_json=outcome.is_json)
        if outcome.error_kind == "timed_out":
            raise await self._overrun(inc, tool, limit)
        if outcome.traceback:
            self.log.event(f"tool {tool!r} raised: {outcome.text}")
        raise ToolFailed(tool, self.plan.plugin_id, outcome.error_kind, outcome.text)

    async def exec(
        self, command: str, *, workdir: str, timeout: float, output_cap: int, kill_grace: float, on_output: OutputSink | None
    ) -> ExecResult:
        """Runs one (already screened) command in this workspace sandbox; output goes
        to `on_output` as it comes. The host enforces `timeout`; a death on the way
        raises SandboxDied, like a tool call."""
        inc = self._ready_incarnation()
        assert inc.client is not None
        result: ExecResult | None = None
        async with self._in_flight(inc, "exec", timeout):
            events = inc.client.exec(command, workdir, timeout, output_cap, inc.next_call_id(), kill_grace + 2 + TIMEOUT_MARGIN_S)
            # Read to the stream's end (the status follows the result at once): a
            # call left open would have to be cancelled, which costs more.
            async with contextlib.aclosing(events):
                async for item in events:
                    if isinstance(item, ExecResult):
                        result = item
                    elif on_output is not None:
                        await on_output(item)
        if result is None:
            raise ToolFailed("exec", self.plan.plugin_id, "transport", "the sandbox ended the stream without a result")
        return result

    async def run_agent(self, run_id: str, task: str, *, max_iterations: int, timeout: float) -> tuple[str, str]:
        """Runs a subagent's loop in this (subagent) sandbox: (result text, error).
        Its model and tool calls arrive meanwhile as services on the stream. A death
        on the way raises SandboxDied."""
        inc = self._ready_incarnation()
        assert inc.client is not None
        async with self._in_flight(inc, "subagent run", timeout):
            return await inc.client.run_agent(run_id, task, max_iterations, timeout)

    @contextlib.asynccontextmanager
    async def _in_flight(self, inc: Incarnation, tool: str, limit: float) -> AsyncIterator[None]:
        """One RPC to the child, whatever goes wrong turned into the error the
        caller should see. The host client ends every call of a child that died
        (CallAborted) at once, not at its deadline."""
        try:
            yield
        except CallAborted:
            # The incarnation ends every call it aborts by saying how it ended first
            # (Incarnation.declare_dead); bounded all the same.
            try:
                async with asyncio.timeout(DEATH_CONFIRM_S):
                    status = await asyncio.shield(inc.died)
            except TimeoutError:
                raise ToolFailed(tool, self.plan.plugin_id, "transport", "the sandbox went away during the call") from None
            raise self._died_error(status) from None
        except HostUnreachable as e:
            raise await self._rpc_failure(inc, tool, limit, e) from None
        except HostMisbehaved as e:
            raise ToolFailed(tool, self.plan.plugin_id, e.kind, str(e)) from None
        finally:
            self._disk_poke.set()

    def _ready_incarnation(self) -> Incarnation:
        inc = self.inc
        if self.lc.state is not S.READY or inc is None or inc.client is None or inc.closing:
            detail = f"last exit: {self.lc.last_exit.describe()}" if self.lc.last_exit else ""
            raise SandboxUnavailable(self.id, self.plan.plugin_id, self.lc.state.value, detail)
        return inc

    async def _rpc_failure(self, inc: Incarnation, tool: str, limit: float, e: HostUnreachable) -> ClawsupError:
        if e.deadline:
            return await self._overrun(inc, tool, limit)
        # Most likely the child just died and the pidfd has not been read yet.
        try:
            async with asyncio.timeout(DEATH_CONFIRM_S):
                status = await asyncio.shield(inc.died)
            return self._died_error(status)
        except TimeoutError:
            return ToolFailed(tool, self.plan.plugin_id, "transport", f"the sandbox did not answer: {e}")

    async def _overrun(self, inc: Incarnation, tool: str, limit: float) -> ToolTimeout:
        """A call outlived its timeout. If the host is still healthy (an async handler
        was cancelled in time) nothing else happens; if it is wedged or says
        NOT_SERVING, it is killed now rather than at the next heartbeat (which may
        also have got there first)."""
        if not inc.died.done() and inc.kill_reason is None:
            healthy = False
            if inc.client is not None:
                with contextlib.suppress(HostUnreachable, HostMisbehaved, CallAborted):
                    healthy = await inc.client.health(timeout=OVERRUN_PROBE_TIMEOUT_S)
            if healthy:
                return ToolTimeout(tool, self.plan.plugin_id, self.id, limit)
            inc.kill(f"tool {tool!r} overran its {limit:g} s timeout and could not be interrupted", polite=False)
        after = "the sandbox is stopping" if self._stop_wanted else "the sandbox is being restarted"
        return ToolTimeout(tool, self.plan.plugin_id, self.id, limit, f"the handler could not be interrupted, so {after}")


async def _quietly(work: Awaitable[T], fallback: T) -> T:
    """A backend's answer that may fail (an engine gone away, a cgroup file
    unreadable): logged, never allowed to turn a child's death into a supervision
    failure."""
    try:
        return await work
    except Exception as e:
        logger.opt(exception=e).warning("a sandbox backend call failed: {}", e)
        return fallback
