"""The workspace sandboxes: the children the core tools run in
(supervisor/tools/core.py), one per agent, per session or shared (the configured
scope), each created and started on first use and, under `scope: "session"`,
discarded when idle.

Which sandbox serves a call follows from who is calling (the agent, the session) and
the scope, never from the tool's arguments: the model cannot pick a workspace or an
identity. `exec` commands are screened here (supervisor/tools/exec_screen.py) before
anything is sent.

Created by the gateway after the set of sandboxes it adds its own to (the manager,
seen through `Sandboxes`, supervisor/sandboxes/manager.py); lives as long as that. `clawsup exec run` needs none of
this: it runs one workspace plan (supervisor/tools/exec_once.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from clawsup.supervisor.errors import BadToolArguments, ExecBlocked, SandboxUnavailable
from clawsup.supervisor.sandboxes.calls import CallResult, OutputSink
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.manager import Sandboxes
from clawsup.supervisor.sandboxes.plans import SandboxPlan, workspace_plan
from clawsup.supervisor.sandboxes.supervised import SETTLED, SupervisedSandbox
from clawsup.supervisor.tools.core import CORE_TOOLS, ExecArgs
from clawsup.supervisor.tools.workspace_settings import WorkspaceScope, WorkspaceSettings

DEFAULT_AGENT = "main"
IDLE_STOP_TIMEOUT_S = 10.0
"""How long the stop of an idle sandbox may take before everything it started is
killed (manager.discard). An idle host runs no command, so a healthy one is gone in
well under a second. A wedged one takes the Shutdown RPC's bound and two stop graces
(`sandbox.stopGraceSeconds`, up to 60 s): past a grace of about 4.7 s, this bound
ends the wait first (tests/test_workspace_scope.py runs one at 60 s)."""


SESSION_SANDBOX = re.compile(r"workspace-.+-s[0-9a-f]{12}")
"""The ids `workspace_sandbox_id` gives a session's own workspace sandbox."""


def workspace_sandbox_id(scope: WorkspaceScope, agent: str, session: str | None) -> str:
    if scope == "shared":
        return "workspace"
    if scope == "session" and session:
        digest = hashlib.sha256(f"{agent}\0{session}".encode()).hexdigest()[:12]
        return f"workspace-{_slug(agent)}-s{digest}"
    return f"workspace-{_slug(agent)}"


def _slug(s: str) -> str:
    """A name part for an id: one per input. A long one keeps a hash of the whole,
    so that two agents whose ids share 40 characters never share a workspace."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "_", s) or "_"
    if safe == s and len(s) <= 40:
        return s
    return f"{safe[:31]}-{hashlib.sha256(s.encode()).hexdigest()[:8]}"


class _Phase(enum.Enum):
    SERVING = "serving"
    DISCARDING = "discarding"


@dataclass(slots=True, kw_only=True)
class _Use:
    """How calls use one workspace sandbox (see `Workspaces`)."""

    phase: _Phase = _Phase.SERVING
    calls: int = 0
    """Calls in flight: a sandbox with one is never idle, however long it runs."""
    last_call: float
    """Loop time the last call ended."""
    idle_stops: bool = False
    """Reached by the scope rule (a session's own, not a subagent run's pinned
    one): the idle loop may discard it."""
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a discard is over; calls that arrived meanwhile wait for it."""


class Workspaces:
    """Routes core tool calls to the right workspace sandbox, creating and starting
    it on first use (through `sandboxes`, the manager, which supervises it like any
    sandbox).

    Under `scope: "session"` a sandbox nobody called for `idle_stop_s` is discarded:
    its supervision, log file and status row go, its workspace files stay, and the
    next call starts a fresh sandbox on them. Each sandbox in use has a `_Use`:

        (none) → serving (a call enters) → discarding (idle: no call in flight) → (none)

    Entering and marking for discard happen without an await in between, so a call
    either enters first and keeps the old sandbox, or finds it discarding, waits
    for it to go and starts a new one; no call reaches a half-discarded sandbox
    (tests/test_workspace_scope.py). Created by the gateway; `discard_idle()` runs
    in the gateway's task group until `close()`."""

    def __init__(self, sandboxes: Sandboxes, settings: WorkspaceSettings) -> None:
        self._set = sandboxes
        self.settings = settings
        self._uses: dict[str, _Use] = {}
        self._wake = asyncio.Event()
        """Set when a call ends while the idle loop has no deadline to wait for."""
        self._deadline: float | None = None
        """When the idle loop wakes next (loop time); None: only when woken."""
        self._closed = asyncio.Event()
        """Set by `close()`: `discard_idle` ends."""

    def plan_for(self, sandbox_id: str) -> SandboxPlan:
        return workspace_plan(self.settings, sandbox_id)

    def sandbox_id(self, agent: str | None, session: str | None, pinned: str | None = None) -> str:
        return pinned or workspace_sandbox_id(self.settings.scope, agent or DEFAULT_AGENT, session)

    async def sandbox(self, agent: str | None, session: str | None, start_timeout: float = 30.0, *, pinned: str | None = None) -> SupervisedSandbox:
        """The workspace sandbox of this caller (or the one the supervisor `pinned`),
        started if need be. Not held: for a caller that runs no call through it
        (scripts/bench.py); calls go through `using`."""
        async with self.using(agent, session, start_timeout, pinned=pinned) as sb:
            return sb

    @contextlib.asynccontextmanager
    async def using(self, agent: str | None, session: str | None, start_timeout: float = 30.0, *, pinned: str | None = None) -> AsyncIterator[SupervisedSandbox]:
        """The caller's workspace sandbox, started if need be, held for the block:
        it is not idle while a call runs in it."""
        sid = self.sandbox_id(agent, session, pinned)
        # By the sandbox, not the caller: a subagent run that inherits its session's
        # workspace must not make that workspace exempt from the idle discard.
        use = await self._enter(sid, start_timeout, idle_stops=self.settings.scope == "session" and SESSION_SANDBOX.fullmatch(sid) is not None)
        try:
            yield await self._started(sid, start_timeout)
        finally:
            self._leave(sid, use)

    async def _enter(self, sid: str, timeout: float, *, idle_stops: bool) -> _Use:
        while (use := self._uses.get(sid)) is not None and use.phase is _Phase.DISCARDING:
            try:
                async with asyncio.timeout(timeout):
                    await use.gone.wait()
            except TimeoutError:
                raise SandboxUnavailable(sid, sid, "stopping", f"it was idle and its stop has not ended within {timeout:g} s") from None
        if use is None:
            use = self._uses[sid] = _Use(last_call=asyncio.get_running_loop().time())
        use.calls += 1
        use.idle_stops = use.idle_stops or idle_stops
        return use

    def _leave(self, sid: str, use: _Use) -> None:
        use.calls -= 1
        if use.calls:
            return
        use.last_call = asyncio.get_running_loop().time()
        if not use.idle_stops:
            if self._uses.get(sid) is use:
                del self._uses[sid]
        elif self._deadline is None:
            # A later call never makes an earlier deadline, so the loop needs waking
            # only when it waits for none.
            self._wake.set()

    async def _started(self, sid: str, start_timeout: float) -> SupervisedSandbox:
        sb = self._set.sandboxes.get(sid)
        if sb is None:
            sb = await self._set.add_running(self.plan_for(sid))
        if sb.lc.state is SandboxState.STOPPED:
            await sb.start(start_timeout)
        elif sb.lc.state is SandboxState.STARTING:
            await sb.wait_state(SETTLED, start_timeout)
        return sb

    async def call(
        self,
        name: str,
        args: dict[str, Any] | str,
        *,
        agent: str | None,
        session: str | None,
        timeout: float | None,
        on_output: OutputSink | None,
        sandbox_id: str | None = None,
    ) -> CallResult:
        parsed = CORE_TOOLS[name].parse(args)
        if isinstance(parsed, ExecArgs):
            return await self._exec(parsed, agent=agent, session=session, pinned=sandbox_id, on_output=on_output)
        async with self.using(agent, session, pinned=sandbox_id) as sb:
            return await sb.invoke(name, parsed.model_dump_json(exclude_none=True), timeout)

    def screen(self, command: str, sandbox_id: str) -> None:
        verdict = self.settings.screen.check(command)
        if not verdict.allowed:
            assert verdict.rule is not None and verdict.segment is not None
            logger.info("exec refused by rule {!r}: {!r}", verdict.rule, verdict.segment)
            sb = self._set.sandboxes.get(sandbox_id)
            if sb is not None:
                sb.log.event(f"exec {_short(command)}: refused by rule {verdict.rule!r} ({verdict.segment!r}); nothing ran")
            raise ExecBlocked(verdict.rule, verdict.segment, verdict.explain())

    async def _exec(self, a: ExecArgs, *, agent: str | None, session: str | None, pinned: str | None, on_output: OutputSink | None) -> CallResult:
        e = self.settings.exec
        if a.timeout is not None and a.timeout > e.max_timeout_s:
            raise BadToolArguments("exec", f"timeout: at most {e.max_timeout_s:g} seconds, got {a.timeout:g}")
        self.screen(a.command, self.sandbox_id(agent, session, pinned))
        chunks: list[bytes] = []

        async def sink(data: bytes) -> None:
            chunks.append(data)
            if on_output is not None:
                await on_output(data)

        async with self.using(agent, session, pinned=pinned) as sb:
            sb.log.event(f"exec {_short(a.command)}: started")
            r = await sb.exec(
                a.command,
                workdir=a.workdir or "",
                timeout=a.timeout or e.timeout_s,
                output_cap=e.max_output_bytes,
                kill_grace=e.kill_grace_s,
                on_output=sink,
            )
            sb.log.event(f"exec {_short(a.command)}: {r.describe()}")
        if r.error:
            raise BadToolArguments("exec", r.error)
        out = {"output": b"".join(chunks).decode("utf-8", errors="replace"), **r.to_json()}
        return CallResult(text=json.dumps(out), is_json=True)

    async def discard_idle(self) -> None:
        """Discards idle sandboxes until `close()`, each in a task of its own (all at
        once, each bounded), so that one slow stop holds up no other. Sleeps until
        the first sandbox could be idle, or until a call ends while none could; no
        polling."""
        async with asyncio.TaskGroup() as tg:
            while not self._closed.is_set():
                self._deadline = self._next_idle()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(self._deadline):
                        await self._wake.wait()
                if self._closed.is_set():
                    break
                for sid, use in self._take_idle():
                    tg.create_task(self._discard(sid, use), name=f"discard idle {sid}")

    def close(self) -> None:
        """Ends `discard_idle` once the discards under way are over (they are bounded)."""
        self._closed.set()
        self._wake.set()

    def _next_idle(self) -> float | None:
        waiting = [u.last_call for u in self._uses.values() if u.idle_stops and u.calls == 0 and u.phase is _Phase.SERVING]
        return min(waiting) + self.settings.idle_stop_s if waiting else None

    def _take_idle(self) -> list[tuple[str, _Use]]:
        """The sandboxes with no call for `idle_stop_s`, marked for discard: from here
        on, a call for one waits for it to go."""
        now = asyncio.get_running_loop().time()
        idle = [(sid, u) for sid, u in self._uses.items() if u.idle_stops and u.calls == 0 and u.phase is _Phase.SERVING and now - u.last_call >= self.settings.idle_stop_s]
        for _, use in idle:
            use.phase = _Phase.DISCARDING
        return idle

    async def _discard(self, sid: str, use: _Use) -> None:
        try:
            sb = self._set.sandboxes.get(sid)
            if sb is not None:
                await self._set.discard(sb, f"idle for {self.settings.idle_stop_s:g} s", IDLE_STOP_TIMEOUT_S)
                logger.info("{}: discarded after {:g} s idle; its workspace files stay for its next call", sid, self.settings.idle_stop_s)
        except Exception:
            logger.exception("{}: discarding it after its idle time failed; its next call starts a new one", sid)
        finally:
            if self._uses.get(sid) is use:
                del self._uses[sid]
            use.gone.set()


def _short(command: str) -> str:
    one = " ".join(command.split())
    return repr(one if len(one) <= 200 else one[:200] + "…")
