"""The calls into a ready sandbox (a tool call, an exec, a subagent run): one RPC each
to the host of the incarnation the driver hands over, and whatever goes wrong on
the way as the error the caller should see: the sandbox died (`SandboxDied`), the
call overran its timeout (`ToolTimeout`, after the child is killed when it cannot
be interrupted), the host misbehaved or went away (`ToolFailed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from clawsup.sandbox.exec_result import ExecResult
from clawsup.sandbox.launch.launcher import ExitStatus
from clawsup.supervisor.errors import ClawsupError, OfferFailed, SandboxDied, ToolFailed, ToolTimeout
from clawsup.supervisor.sandboxes.host_client import CallAborted, HostMisbehaved, HostUnreachable
from clawsup.supervisor.sandboxes.incarnation import Incarnation
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.plans import SandboxPlan
from clawsup.supervisor.sandboxes.restarts import RestartBudget
from clawsup.supervisor.sandboxes.watches import DiskWatch

# The host answers TIMED_OUT itself at the call's timeout; the gRPC deadline leaves it
# this long to say so before the supervisor stops waiting.
TIMEOUT_MARGIN_S = 0.25
OVERRUN_PROBE_TIMEOUT_S = 0.5
# A transport error can reach a caller a moment before the pidfd says the child
# exited; this is how long the caller waits for the exit status to name the death.
DEATH_CONFIRM_S = 2.0
# A caller whose call got its child killed waits this long, at most, for the death
# (a fault's kill escalation: SIGTERM, half a second, SIGKILL), so that it finds
# the sandbox no longer `ready` with that child.
KILL_CONFIRM_S = 5.0

OutputSink = Callable[[bytes], Awaitable[None]]


@dataclass(slots=True, kw_only=True)
class CallResult:
    text: str
    is_json: bool

    def value(self) -> Any:
        return json.loads(self.text) if self.is_json else self.text


class Calls:
    """The calls of one sandbox. Created with its SupervisedSandbox, which hands each
    call its ready incarnation; `stopping` says whether a kill now ends in a stop
    rather than a restart."""

    def __init__(self, plan: SandboxPlan, *, budget: RestartBudget, log: SandboxLog, disk: DiskWatch, stopping: Callable[[], bool]) -> None:
        self._plan = plan
        self._budget = budget
        self._log = log
        self._disk = disk
        self._stopping = stopping

    async def invoke(self, inc: Incarnation, tool: str, args_json: str, timeout: float | None) -> CallResult:
        assert inc.client is not None
        limits = self._plan.limits
        limit = min(timeout, limits.call_timeout_s) if timeout else limits.call_timeout_s
        async with self._in_flight(inc, tool, limit):
            outcome = await inc.client.invoke(tool, args_json, inc.next_call_id(), limit, TIMEOUT_MARGIN_S)
        if outcome.ok:
            return CallResult(text=outcome.text, is_json=outcome.is_json)
        if outcome.error_kind == "timed_out":
            raise await self._overrun(inc, tool, limit)
        if outcome.traceback:
            self._log.event(f"tool {tool!r} raised: {outcome.text}")
        raise ToolFailed(tool, self._plan.plugin_id, outcome.error_kind or "unknown", outcome.text)

    async def call_offer(self, inc: Incarnation, kind: str, name: str, payload_json: str, timeout: float) -> Any:
        """One call of an offer beyond tools; its answer as a JSON value. Whatever
        goes wrong is an OfferFailed saying how (a death names the exit)."""
        assert inc.client is not None
        try:
            async with self._in_flight(inc, f"{kind} {name}", timeout):
                outcome = await inc.client.call_offer(kind, name, payload_json, inc.next_call_id(), timeout, TIMEOUT_MARGIN_S)
        except SandboxDied as e:
            raise OfferFailed(kind, name, self._plan.plugin_id, "died", f"failed: its sandbox died during the call ({e.status.describe()})") from None
        except ToolTimeout:
            raise OfferFailed(kind, name, self._plan.plugin_id, "timed_out", f"did not answer within its {timeout:g} s deadline") from None
        except ToolFailed as e:
            raise OfferFailed(kind, name, self._plan.plugin_id, "failed", f"failed: {e.message}") from None
        if outcome.error_kind == "timed_out":
            # A sync handler that overran cannot be interrupted: its host says
            # NOT_SERVING, and is replaced now rather than at the next heartbeat, so
            # that the calls after this one are not each held to their deadline.
            await self._overrun(inc, f"{kind} {name}", timeout)
        if not outcome.ok:
            how = "timed_out" if outcome.error_kind == "timed_out" else "raised" if outcome.error_kind == "raised" else "failed"
            said = f"did not answer within its {timeout:g} s deadline" if how == "timed_out" else f"raised {outcome.error}" if how == "raised" else f"failed: {outcome.error}"
            raise OfferFailed(kind, name, self._plan.plugin_id, how, said)
        try:
            return json.loads(outcome.payload_json)
        except json.JSONDecodeError:
            raise OfferFailed(kind, name, self._plan.plugin_id, "failed", "answered with something that is not JSON") from None
        except RecursionError:
            raise OfferFailed(kind, name, self._plan.plugin_id, "failed", "answered with JSON nested too deeply to read") from None

    async def exec(
        self, inc: Incarnation, command: str, *, workdir: str, timeout: float, output_cap: int, kill_grace: float, on_output: OutputSink | None
    ) -> ExecResult:
        assert inc.client is not None
        result: ExecResult | None = None
        async with self._in_flight(inc, "exec", timeout):
            events = inc.client.exec(command, workdir, timeout, output_cap, inc.next_call_id(), kill_grace + 2 + TIMEOUT_MARGIN_S)
            assert isinstance(events, AsyncGenerator)  # so that it can be closed below
            # Read to the stream's end (the status follows the result at once): a
            # call left open would have to be cancelled, which costs more.
            async with contextlib.aclosing(events):
                async for item in events:
                    if isinstance(item, ExecResult):
                        result = item
                    elif on_output is not None:
                        await on_output(item)
        if result is None:
            raise ToolFailed("exec", self._plan.plugin_id, "transport", "the sandbox ended the stream without a result")
        return result

    async def run_agent(self, inc: Incarnation, run_id: str, task: str, *, max_iterations: int, timeout: float) -> tuple[str, str]:
        assert inc.client is not None
        async with self._in_flight(inc, "subagent run", timeout):
            return await inc.client.run_agent(run_id, task, max_iterations, timeout)

    def died_error(self, status: ExitStatus) -> SandboxDied:
        return SandboxDied(
            sandbox_id=self._plan.sandbox_id,
            plugin=self._plan.plugin_id,
            status=status,
            restarts_left=self._budget.left(),
            stderr_tail=list(self._log.stderr_tail)[-5:],
        )

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
            if (status := await _death(inc, DEATH_CONFIRM_S)) is None:
                raise ToolFailed(tool, self._plan.plugin_id, "transport", "the sandbox went away during the call") from None
            raise self.died_error(status) from None
        except HostUnreachable as e:
            raise await self._rpc_failure(inc, tool, limit, e) from None
        except HostMisbehaved as e:
            raise ToolFailed(tool, self._plan.plugin_id, e.kind, str(e)) from None
        finally:
            self._disk.poke()

    async def _rpc_failure(self, inc: Incarnation, tool: str, limit: float, e: HostUnreachable) -> ClawsupError:
        if e.deadline:
            return await self._overrun(inc, tool, limit)
        # Most likely the child just died and the pidfd has not been read yet.
        if (status := await _death(inc, DEATH_CONFIRM_S)) is None:
            return ToolFailed(tool, self._plan.plugin_id, "transport", f"the sandbox did not answer: {e}")
        return self.died_error(status)

    async def _overrun(self, inc: Incarnation, tool: str, limit: float) -> ToolTimeout:
        """A call outlived its timeout. If the host is still healthy (an async handler
        was cancelled in time) nothing else happens; if it is wedged or says
        NOT_SERVING, it is killed now rather than at the next heartbeat (which may
        also have got there first)."""
        plugin, sandbox_id = self._plan.plugin_id, self._plan.sandbox_id
        if not inc.died.done() and inc.kill_reason is None:
            healthy = False
            if inc.client is not None:
                with contextlib.suppress(HostUnreachable, HostMisbehaved, CallAborted):
                    healthy = await inc.client.health(timeout=OVERRUN_PROBE_TIMEOUT_S)
            if healthy:
                return ToolTimeout(tool, plugin, sandbox_id, limit)
            inc.kill(f"tool {tool!r} overran its {limit:g} s timeout and could not be interrupted", polite=False)
        said = "the handler could not be interrupted, so the sandbox is "
        if self._stopping():  # already `draining`
            return ToolTimeout(tool, plugin, sandbox_id, limit, said + "stopping")
        # A caller told its sandbox is being restarted must not find it still `ready`
        # with this child: the death's transition follows `died` with no await
        # between (SupervisedSandbox._on_death), so once `died` is set it has happened
        # (tests/test_faults.py::test_endless_loop_in_handler).
        await _death(inc, KILL_CONFIRM_S)
        return ToolTimeout(tool, plugin, sandbox_id, limit, said + "being restarted")


async def _death(inc: Incarnation, within: float) -> ExitStatus | None:
    """How the child ended, once its death is recorded (Incarnation.declare_dead),
    waiting `within` seconds at most; None if it is not by then. Shielded: the
    caller's timeout must not cancel the incarnation's own future."""
    try:
        async with asyncio.timeout(within):
            return await asyncio.shield(inc.died)
    except TimeoutError:
        return None
