"""One plugin's sandbox across all its incarnations: start, watch, kill, reclaim,
restart. `SupervisedSandbox` is the driver: it owns the sandbox's state and makes
every transition (through its `Lifecycle`, supervisor/sandboxes/lifecycle.py); the
work of each phase is done by a piece with one job:

- `restarts.RestartBudget`: after a death, the backoff or the verdict `failed`;
- `bring_up.BringUp`: launching a child and bringing it up to its Describe;
- `registrations.ToolAcceptance`: which described tools it may hold;
- `watches`: the heartbeat and the disk watch of a ready child;
- `child_requests.serve`: answering the child's Connect stream (for an MCP server's
  sandbox also the host's news: its tool list changed, its server ended);
- `calls.Calls`: tool calls, execs and subagent runs into a ready child.

Created by the `SandboxManager` for each plugin (or MCP server) it loads; its
`supervise()` task is owned by the manager's task group and lives as long as the
supervisor. Each incarnation (one child process) is one `running` block
(supervisor/sandboxes/incarnation.py) holding a task group of its own: the bring-up,
the heartbeat and the child's stream.
When the child dies the group ends; when the block ends for any reason, the child and
everything it started are killed, and nothing of that incarnation is left running.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from dataclasses import dataclass
from typing import Any, TypeVar

from loguru import logger

from clawsup.sandbox.exec_result import ExecResult
from clawsup.sandbox.handshake import LOAD_ERROR_EXIT, SERVICE_STATE
from clawsup.sandbox.launch.launcher import ChildUser, ExitStatus, Launcher
from clawsup.sandbox.protected import ProtectedPathError
from clawsup.supervisor.errors import OfferFailed, SandboxUnavailable
from clawsup.supervisor.sandboxes import child_requests, watches
from clawsup.supervisor.sandboxes.bring_up import DESCRIBE_TIMEOUT_S, BringUp, LaunchFailed, SandboxDirs
from clawsup.supervisor.sandboxes.calls import CallResult, Calls, OutputSink
from clawsup.supervisor.sandboxes.disk_usage import WorkspaceDisk
from clawsup.supervisor.sandboxes.host_client import CallAborted, HostMisbehaved, HostUnreachable
from clawsup.supervisor.sandboxes.incarnation import Incarnation, Timing, running
from clawsup.supervisor.sandboxes.lifecycle import ALIVE, Lifecycle, SandboxState, Transition
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.plans import SandboxPlan
from clawsup.supervisor.sandboxes.offers import OfferAcceptance
from clawsup.supervisor.sandboxes.registrations import ToolAcceptance
from clawsup.supervisor.sandboxes.registry import Kind, Registry
from clawsup.supervisor.sandboxes.restarts import MONOTONIC, Clock, RestartBudget
from clawsup.supervisor.sandboxes.watches import DiskWatch

S = SandboxState
T = TypeVar("T")
SETTLED = frozenset({S.READY, S.CRASHED, S.BACKOFF, S.FAILED})


RELIST_MIN_INTERVAL_S = 0.5
"""An MCP server's tool-list changes are taken at most this often..."""
RELIST_SPACING = 3.0
"""...and, after one that cost the supervisor t seconds, no sooner than 3t after it:
at most a quarter of a core, whatever the server sends."""


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
    (child process) it is running now, if any. `clock` is where its restarts are
    counted and its backoffs waited out (tests/test_lifecycle_model.py passes a
    virtual one)."""

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
        clock: Clock = MONOTONIC,
        services: Mapping[str, child_requests.Service] | None = None,
        listeners: Sequence[Callable[[Transition], None]] = (),
    ) -> None:
        """`services`: what this sandbox may ask beyond `log` (a subagent run's model
        and tool calls; see supervisor/sandboxes/child_requests.py). `listeners`: told
        of each transition, after the sandbox's own bookkeeping."""
        self.plan = plan
        self.id = plan.sandbox_id
        self.log = log
        self._registry = registry
        self._timing = timing
        self._dirs = dirs
        self._run_as = run_as
        self._clock = clock
        self.lc = Lifecycle(sandbox_id=plan.sandbox_id, clock=clock.now)
        self.lc.listeners.append(self._on_transition)
        self.lc.listeners.extend(listeners)
        self._budget = RestartBudget(policy=plan.restart, clock=clock.now)
        self._bring_up = BringUp(plan, launcher=launcher, registry=registry, timing=timing, dirs=dirs, log=log, env=env, run_as=run_as)
        self._tools = ToolAcceptance(plan, registry, log)
        self._offers = OfferAcceptance(plan, registry, log)
        self._service_states: dict[str, str] = {}
        """Service id -> its state in the ready child (`running`, `crashed: ...`)."""
        disk = WorkspaceDisk(dirs.workspace, plan.limits.workspace_bytes, grow_only=dirs.operator_workspace)
        self._disk = DiskWatch(disk, timing.heartbeat_interval_s)
        self._calls = Calls(plan, budget=self._budget, log=log, disk=self._disk, stopping=self._stopping)
        self.inc: Incarnation | None = None
        self._incarnations = itertools.count(1)
        self._services: Mapping[str, child_requests.Service] = dict(services or {})
        self._start_wanted = asyncio.Event()
        self._stop_wanted = False
        self._stop_reason = ""
        self._changed = asyncio.Event()
        self._relisting = asyncio.Lock()
        self._relists_asked = self._relists_done = self._relisted_tools = 0
        self._next_relist_at = 0.0
        """One MCP tool-list swap at a time: each Describes, judges and swaps in turn."""

    @property
    def workspace_dir(self) -> Path:
        return self._dirs.workspace

    @property
    def run_dir(self) -> Path:
        return self._dirs.run_dir

    @property
    def uid(self) -> int | None:
        """The uid its children run as; None: as the supervisor."""
        return self._run_as.uid if self._run_as is not None else None

    @property
    def refusals(self) -> dict[str, str]:
        """Tool name -> why the registry refused it, from the last Describe (for
        `clawsup plugins show`)."""
        return self._tools.refusals

    @property
    def offer_refusals(self) -> dict[str, str]:
        """`kind name` -> why an offer beyond tools was refused, from the last Describe."""
        return self._offers.refusals

    def services(self) -> dict[str, str]:
        """Each declared service's state, for `status` and `plugins show`: what the
        ready child reported, else `down` with the sandbox's state."""
        declared = sorted(self.plan.offers.declares("service"))
        if self.lc.state is not S.READY:
            # A service that raised keeps its error in view while its sandbox
            # restarts (or has failed): it is the why of that.
            return {name: _down(self._service_states.get(name), self.lc.state) for name in declared}
        return {name: self._service_states.get(name, "not registered") for name in declared}

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
            "restarts_left": self._budget.left(),
            "uptime_s": round(now - self.lc.started_at, 3) if self.lc.started_at is not None else None,
            "rss_bytes": container.get("memory_bytes") if container else (inc.child.rss_bytes() if inc else None),
            "container": container,
            "tools": [r.name for r in self._registry.owned_by(self.plan.plugin_id) if r.kind is Kind.TOOL],
            "services": self.services(),
            "last_exit": self.lc.last_exit.to_json() if self.lc.last_exit else None,
        }

    def _state(self) -> SandboxState:
        """The state now: read through a call, because it changes across every await
        (and a type checker would keep the value an earlier test narrowed it to)."""
        return self.lc.state

    def _stopping(self) -> bool:
        """A stop was asked for since the last start (read through a call, as `_state`)."""
        return self._stop_wanted

    # -- the supervision loop --------------------------------------------------------

    def supervision_failed(self) -> None:
        """Its supervision ended on a bug (the manager logged it): say `failed`, so
        that status and callers see it down, until an operator's restart."""
        why = "its supervision failed (see supervisor.log); `clawsup restart` to try again"
        if self._state() in (S.STARTING, S.READY):
            self.lc.enter(S.CRASHED, why)
        if self._state() is S.CRASHED:
            self.lc.enter(S.FAILED, why)
        elif self._state() in (S.DRAINING, S.BACKOFF):
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
                if self._stopping():
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
                await self._wait_out(delay)
                self._start_wanted.clear()
                if self._stopping():
                    self.lc.enter(S.STOPPED, "stopped during backoff")
                    break
                self.lc.restarts += 1

    async def _wait_out(self, delay: float) -> None:
        """The backoff: `delay` seconds on the sandbox's clock, cut short by a start
        or a stop request."""
        async with asyncio.TaskGroup() as tg:
            timer = tg.create_task(self._clock.sleep(delay), name=f"{self.id} backoff")
            asked = tg.create_task(self._start_wanted.wait(), name=f"{self.id} backoff cut")
            await asyncio.wait((timer, asked), return_when=asyncio.FIRST_COMPLETED)
            timer.cancel()
            asked.cancel()

    async def _run_incarnation(self) -> Ended:
        number = next(self._incarnations)
        self.inc = None
        self.lc.enter(S.STARTING, f"incarnation {number}")
        self.log.new_incarnation()
        try:
            async with running(self.id, number, self._bring_up.launch, self.log, self._timing.stop_grace_s) as inc:
                self.inc = inc
                self.log.event(f"started pid {inc.child.pid} (backend {self.plan.backend})")
                exit_future = inc.child.wait()
                try:
                    async with asyncio.TaskGroup() as tg:
                        inc.tg = tg
                        life = tg.create_task(self._life(inc), name=f"{self.id}#{number} life")
                        if self._state() is S.DRAINING:  # a stop arrived during the launch
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
            if self._state() is S.DRAINING:
                return Ended(status, None)
            self.lc.last_exit = status
            delay = self._budget.death()
            self.lc.enter(S.CRASHED, status.reason)
            return Ended(status, delay)

    async def _on_death(self, inc: Incarnation, raw: ExitStatus) -> Ended:
        """The child has exited. Reclaim first, then tell the callers, then the log:
        the order is what tests/test_faults.py checks. Its descendants are swept
        after the callers know (a cgroup holding much memory empties slowly)."""
        inc.closing = True
        load = inc.output.load_error if raw.code == LOAD_ERROR_EXIT and self._state() is S.STARTING else None
        # A load error that may pass (an MCP server that exited or did not finish
        # `initialize`) is a crash like any other: backoff, and `failed` once the
        # restart budget is spent. One that may not (the plugin does not load) is
        # `failed` now, and no death against the budget.
        # Only an MCP host's word counts for that: a plugin's retry would turn its
        # load error into a restart loop.
        fatal = load if load is not None and not (load.retry and self.plan.role == "mcp") else None
        if fatal is not None:
            reason = f"could not load: {fatal.message}{f' (at {fatal.where})' if fatal.where else ''}"
        elif load is not None:
            reason = f"could not start: {load.message}"
        else:
            reason = "; ".join(r for r in (inc.kill_reason, inc.exit_note, await _quietly(inc.child.diagnose(), "")) if r)
        status = ExitStatus(code=raw.code, signal=raw.signal, reason=reason)
        gone = self._registry.reclaim(self.plan.plugin_id)
        draining = self._state() is S.DRAINING
        delay: float | None = None
        if not draining:
            self.lc.last_exit = status
            if fatal is None:
                delay = self._budget.death()
        inc.declare_dead(status)
        # From the callers' news to `crashed`, no await: a caller told of the death
        # must not find the sandbox still `ready` (tests/test_log_follow.py; a call
        # that overran waits for this too, see calls.Calls._overrun).
        inc.output.drain()
        tools = f"; withdrew {', '.join(r.name for r in gone)}" if gone else ""
        self.log.event(f"pid {inc.child.pid} {status.describe()}{tools}")
        if draining:
            logger.info("{}: pid {} {}", self.id, inc.child.pid, status.describe())
        else:
            tail = " | ".join(list(self.log.stderr_tail)[-3:])
            logger.warning("{}: pid {} {}{}{}", self.id, inc.child.pid, status.describe(), tools, f"; last stderr: {tail}" if tail and fatal is None else "")
            self.lc.enter(S.CRASHED, status.describe())
        # Descendants may outlive the leader (a fork that called setsid, a grandchild
        # still writing); the group and the cgroup go with it, before any restart.
        await _quietly(inc.child.kill_all(), None)
        return Ended(status, delay, failed=reason if fatal is not None else None)

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
        desc = await self._bring_up.connect(inc)
        if desc is None or self._state() is not S.STARTING:
            return  # failed (the kill is on its way), or being stopped meanwhile
        if self.plan.role in ("plugin", "mcp"):
            judged = await self._tools.judge(desc.tools)
            if self._state() is not S.STARTING:
                return  # stopped while its schemas compiled: its death has reclaimed
            self._tools.accept(judged)
        offered = self._offers.accept(desc.offers) if self.plan.role == "plugin" else []
        self._service_states = {r.name: "starting" for r in offered if r.kind is Kind.SERVICE}
        tools = sum(r.kind is Kind.TOOL for r in self._registry.owned_by(self.plan.plugin_id))
        self.lc.enter(S.READY, f"pid {inc.child.pid}, {tools} tool(s)" + (f", {len(offered)} other offer(s)" if offered else ""))
        services = dict(self._services)
        if self.plan.role == "plugin":
            services[SERVICE_STATE] = lambda payload: self._service_crashed(inc, payload)
        if self.plan.role == "mcp":
            # Bound to this incarnation: news from a child that is gone changes nothing.
            services[child_requests.MCP_TOOLS_CHANGED] = lambda payload: self._mcp_tools_changed(inc)
            services[child_requests.MCP_SERVER_EXITED] = lambda payload: self._mcp_server_exited(inc, payload)
        who = child_requests.Requester(sandbox_id=self.id, plugin_id=self.plan.plugin_id, log=self.log, services=services)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(watches.heartbeat(inc, self._timing), name=f"{self.id}#{inc.number} heartbeat")
            tg.create_task(self._disk.watch(inc), name=f"{self.id}#{inc.number} disk")
            tg.create_task(child_requests.serve(inc, who), name=f"{self.id}#{inc.number} stream")
            for name in self._service_states:
                tg.create_task(self._start_service(inc, name), name=f"{self.id}#{inc.number} service {name}")

    # -- a plugin's services -------------------------------------------------------

    async def _start_service(self, inc: Incarnation, name: str) -> None:
        """Ask the child to start one of its services (it runs there as a task); a
        refusal is the service's state, and the log's."""
        try:
            await self.call_offer("service", name, {}, self.plan.offers.command_timeout_s)
        except OfferFailed as e:
            if self.inc is inc:
                self._service_states[name] = f"not started: {e.message}"
                self.log.event(f"service {name!r} could not start: {e.message}")
            return
        if self.inc is inc and self._service_states.get(name) == "starting":
            self._service_states[name] = "running"
            self.log.event(f"service {name!r} running (incarnation {inc.number})")

    async def _service_crashed(self, inc: Incarnation, payload: dict[str, Any]) -> dict[str, Any]:
        """The child says one of its services raised; it exits next, and this is its
        death's reason (the sandbox restarts with its backoff)."""
        name, error = payload.get("id"), payload.get("error")
        if not isinstance(name, str) or name not in self._service_states or not isinstance(error, str):
            raise ValueError("service.state needs {\"id\": one of its services, \"error\": a string}")
        said = child_requests.one_line(f"service {name!r} raised {error}")
        if self.inc is inc:
            self._service_states[name] = f"crashed: {child_requests.one_line(error, 200)}"
        inc.exit_note = said
        self.log.event(f"the host reports: {said}")
        return {}

    # -- an MCP host's news (child_requests.MCP_*) ------------------------------------

    async def _mcp_tools_changed(self, inc: Incarnation) -> dict[str, Any]:
        """The server's tool list changed and the host has its new one: Describe it,
        judge it (schemas compiled off the loop) and swap the registrations in one
        step, if `inc` is still the ready child by then. One at a time, and coalesced:
        requests that arrive while one waits are answered by the next re-list, which
        takes whatever the host holds by then. Rate-bound: a re-list starts no sooner
        than RELIST_SPACING times the last one's cost after it ended (at least
        RELIST_MIN_INTERVAL_S), so a server that changes its list without end, with
        schemas that must each be compiled again, holds a bounded share of the
        supervisor's CPU (tests/test_mcp_attacks.py::test_a_storm_of_tool_list_changes_is_bounded)."""
        self._relists_asked += 1
        ticket = self._relists_asked
        async with self._relisting:
            if self._relists_done >= ticket:
                return {"tools": self._relisted_tools}
            loop = asyncio.get_running_loop()
            # A rate bound, not a synchronisation: the host's list is taken whole after it.
            await asyncio.sleep(max(0.0, self._next_relist_at - loop.time()))
            covered = self._relists_asked
            if not self._serving(inc):
                raise ValueError("this child is no longer the sandbox's ready one; its tool list was not taken")
            assert inc.client is not None
            began = loop.time()
            try:
                try:
                    desc = await inc.client.describe(DESCRIBE_TIMEOUT_S)
                except (HostUnreachable, HostMisbehaved, CallAborted) as e:
                    raise ValueError(f"could not Describe its new tool list: {e}") from None
                judged = await self._tools.judge(desc.tools)
                if not self._serving(inc):  # it died or is stopping: its death has reclaimed
                    raise ValueError("this child is no longer the sandbox's ready one; its tool list was not taken")
                self._relisted_tools = self._tools.accept_relist(judged)
                self._relists_done = covered
                return {"tools": self._relisted_tools}
            finally:
                ended = loop.time()
                self._next_relist_at = ended + max(RELIST_MIN_INTERVAL_S, RELIST_SPACING * (ended - began))

    async def _mcp_server_exited(self, inc: Incarnation, payload: dict[str, Any]) -> dict[str, Any]:
        """The host's server ended and the host is about to exit: how it ended
        becomes this child's death reason, for the callers in flight, the log and
        `last exit`."""
        message = payload.get("message")
        if not isinstance(message, str) or not message.strip():
            raise ValueError("mcp.server_exited needs {\"message\": a non-empty string}")
        inc.exit_note = child_requests.one_line(message)
        self.log.event(f"the host reports: {inc.exit_note}")
        return {}

    def _serving(self, inc: Incarnation) -> bool:
        return self.inc is inc and self._state() is S.READY and not inc.closing

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
        self._budget.forgive()
        return await self.start(timeout)

    async def start(self, timeout: float) -> SandboxState:
        """Ask for a start and return the first settled state it leads to: `ready`,
        or `crashed`/`backoff`/`failed` if the child did not come up."""
        seq = self.lc.seq
        self.request_start()
        return await self.wait_state(SETTLED, timeout, after=seq)

    # -- calls (supervisor/sandboxes/calls.py) -----------------------------------------

    async def invoke(self, tool: str, args_json: str, timeout: float | None) -> CallResult:
        return await self._calls.invoke(self._ready_incarnation(), tool, args_json, timeout)

    async def exec(
        self, command: str, *, workdir: str, timeout: float, output_cap: int, kill_grace: float, on_output: OutputSink | None
    ) -> ExecResult:
        """Runs one (already screened) command in this workspace sandbox; output goes
        to `on_output` as it comes. The host enforces `timeout`; a death on the way
        raises SandboxDied, like a tool call."""
        inc = self._ready_incarnation()
        return await self._calls.exec(inc, command, workdir=workdir, timeout=timeout, output_cap=output_cap, kill_grace=kill_grace, on_output=on_output)

    async def run_agent(self, run_id: str, task: str, *, max_iterations: int, timeout: float) -> tuple[str, str]:
        """Runs a subagent's loop in this (subagent) sandbox: (result text, error).
        Its model and tool calls arrive meanwhile as services on the stream. A death
        on the way raises SandboxDied."""
        return await self._calls.run_agent(self._ready_incarnation(), run_id, task, max_iterations=max_iterations, timeout=timeout)

    async def call_offer(self, kind: str, name: str, payload: dict[str, Any], timeout: float) -> Any:
        """One call of an offer beyond tools (a hook, a command, a channel's send, an
        HTTP request, a service's start); its answer as a JSON value. Raises
        OfferFailed saying how: `down` (not ready: starting, backoff, failed...),
        `timed_out`, `raised`, `died` or `failed`."""
        try:
            inc = self._ready_incarnation()
        except SandboxUnavailable as e:
            raise OfferFailed(kind, name, self.plan.plugin_id, "down", f"is not available: {e}") from None
        return await self._calls.call_offer(inc, kind, name, json.dumps(payload), timeout)

    def _ready_incarnation(self) -> Incarnation:
        inc = self.inc
        if self.lc.state is not S.READY or inc is None or inc.client is None or inc.closing:
            raise self.unavailable()
        return inc

    def unavailable(self) -> SandboxUnavailable:
        """What a caller is told while this sandbox cannot take calls: its state, and
        how its last child ended."""
        detail = f"last exit: {self.lc.last_exit.describe()}" if self.lc.last_exit else ""
        return SandboxUnavailable(self.id, self.plan.plugin_id, self.lc.state.value, detail)


async def _quietly(work: Awaitable[T], fallback: T) -> T:
    """A backend's answer that may fail (an engine gone away, a cgroup file
    unreadable): logged, never allowed to turn a child's death into a supervision
    failure."""
    try:
        return await work
    except Exception as e:
        logger.opt(exception=e).warning("a sandbox backend call failed: {}", e)
        return fallback


def _down(last: str | None, state: SandboxState) -> str:
    """A service's state while its sandbox is not ready: `down (backoff)`, or its
    crash while that is why (`crashed: RuntimeError: ... (sandbox backoff)`)."""
    if last is not None and last.startswith("crashed:"):
        return f"{last} (sandbox {state.value})"
    return f"down ({state.value})"
