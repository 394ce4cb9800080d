"""Subagent runs: work a session hands off with `sessions_spawn` ("research X"),
done in the background by an agent loop in a sandbox of its own, and reported back
to the session that asked.

A run's loop lives in a `subagent` sandbox host (sandbox/host/subagent.py) that holds
no key and no tool. Each of its model calls and tool calls comes back here on its
Connect stream, as a service bound to the run (`_services`): the supervisor knows
which run is asking from the stream, never from what the model wrote, and answers
with that run's provider (counting its tokens), its tool set and its workspace. So a
runaway run is a child like any other: its timeout kills it, its crash fails it, and
the gateway goes on.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.messages.bus import InboundMessage, MessageBus, ReplyTarget
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.errors import BadToolArguments, ClawsupError, SandboxDied
from clawsup.supervisor.sandboxes.lifecycle import RestartPolicy, SandboxState
from clawsup.supervisor.agents.loop_detection import STOPPED, WARNING, LoopWatch
from clawsup.supervisor.agents.providers import Provider, ProviderError, TurnContext, Usage, tool_specs
from clawsup.supervisor.sandboxes.registry import CORE_OWNER, Kind, Registration, Registry
from clawsup.supervisor.messages.routing import Route, RouteInput
from clawsup.supervisor.agents.run_journal import RunJournal, origin_from, origin_json
from clawsup.supervisor.messages.session_store import SessionStore
from clawsup.supervisor.sandboxes.manager import SandboxManager
from clawsup.supervisor.sandboxes.plans import SandboxPlan, subagent_plan
from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox
from clawsup.supervisor.agents.tool_policy import CORE_GROUPS, Caller, decide
from clawsup.supervisor.tools.workspaces import Workspaces, resolve_backend

SPAWN_TOOLS = ("sessions_spawn", "subagents")
# What a run never gets from its parent: it reports to one session, it does not
# talk to others, message people or schedule work.
WITHHELD = frozenset(t for g in ("group:sessions", "group:messaging", "group:automation") for t in CORE_GROUPS[g]) | set(SPAWN_TOOLS)
FINISHED_KEPT = 200
"""Ended runs `status` still shows (the oldest go first)."""
STOP_TIMEOUT_S = 10.0
MAX_MESSAGES = 2000


class SpawnRefused(ClawsupError):
    code = "spawn_refused"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SpawnArgs(_Args):
    """OpenClaw's `sessions_spawn` input."""

    task: str = Field(min_length=1, max_length=100_000, description="What the subagent should do; it sees only this, not your conversation.")
    label: str | None = Field(default=None, max_length=80, description="A short name for the run, to find it with the `subagents` tool.")
    agentId: str | None = Field(default=None, description="Hand the task to another agent (if tools.agentToAgent allows); default: your own.")
    model: str | None = Field(default=None, description="The subagent's model, if not the configured one.")
    runTimeoutSeconds: float | None = Field(default=None, gt=0, description="Kill the run after this many seconds.")


class SubagentsArgs(_Args):
    action: Literal["list", "kill"] = Field(default="list", description="`list` your runs, or `kill` one (or `all`).")
    target: str | None = Field(default=None, description="For kill: a run id, a label, or `all`.")


SPAWN_DESCRIPTION = (
    "Hand a task to a subagent that works in the background in its own sandbox. Returns at once with a run id and "
    "the child session key; when the run ends you receive its result as a system message."
)
SUBAGENTS_DESCRIPTION = "List the subagent runs you started (running and finished), or kill one of them (and whatever it spawned)."


def register_spawn_tools(registry: Registry) -> None:
    for name, desc, model in (("sessions_spawn", SPAWN_DESCRIPTION, SpawnArgs), ("subagents", SUBAGENTS_DESCRIPTION, SubagentsArgs)):
        schema = model.model_json_schema()
        schema.pop("title", None)
        registry.register(Registration(kind=Kind.TOOL, name=name, owner=CORE_OWNER, sandbox_id=None, description=desc, input_schema=schema))


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Who is calling a spawn tool, as the supervisor knows it: a session's turn
    (depth 0, `message` and `route` say where its announces go) or a run."""

    session_key: str
    agent_id: str
    caller: Caller
    """The turn's identity for the tool policy (channel, sender, owner)."""
    allowed: frozenset[str]
    """The caller's tool set at this call: a run gets no more."""
    depth: int = 0
    run: Run | None = None
    message: InboundMessage | None = None
    route: Route | None = None


@dataclass(eq=False, kw_only=True)
class Run:
    run_id: str
    child_key: str
    label: str
    task: str
    agent_id: str
    model: str
    origin: Origin
    timeout_s: float
    sandbox_id: str
    workspace: str
    """The workspace sandbox its file and exec tools use."""
    fresh_workspace: bool
    provider: Provider
    loops: LoopWatch
    """Repeated tool calls, counted here: the run's loop cannot be trusted to."""
    status: str = "running"
    """running, succeeded, failed, timed_out, cancelled."""
    reason: str = ""
    result: str = ""
    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.monotonic)
    t1: float | None = None
    usage: Usage = field(default_factory=Usage)
    model_calls: int = 0
    children: list[Run] = field(default_factory=list)
    inbox: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    """Announces of its own children, for its next model call (or runs.wait)."""
    task_handle: asyncio.Task[None] | None = None
    cancel_reason: str = ""
    reported: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the run has ended, cleaned up and announced."""

    @property
    def depth(self) -> int:
        return self.origin.depth + 1

    @property
    def parent_key(self) -> str:
        return self.origin.session_key

    @property
    def running(self) -> bool:
        return self.status == "running"

    def caller(self) -> Caller:
        """The run's identity for the tool policy: its parent's channel, sender and
        owner, with its own agent and model."""
        return replace(self.origin.caller, agent=self.agent_id, provider=self.model, subagent=True)

    def duration_s(self) -> float:
        return (self.t1 if self.t1 is not None else time.monotonic()) - self.t0

    def subtree(self) -> Iterator[Run]:
        yield self
        for c in self.children:
            yield from c.subtree()

    def stats(self) -> str:
        """The announce's statistics line: this run and every run it spawned."""
        runs = list(self.subtree())
        tokens = Usage()
        for r in runs:
            tokens += r.usage
        return stats_line(len(runs), sum(1 for r in runs if r.status == "succeeded"), self.duration_s(), tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "label": self.label,
            "agentId": self.agent_id,
            "model": self.model,
            "childSessionKey": self.child_key,
            "parentSessionKey": self.parent_key,
            "depth": self.depth,
            "status": self.status,
            "reason": self.reason,
            "result": self.result[:4000],
            "sandbox": self.sandbox_id,
            "workspace": self.workspace,
            "startedAt": self.started_at,
            "durationS": round(self.duration_s(), 3),
            "modelCalls": self.model_calls,
            "tokensIn": self.usage.input_tokens,
            "tokensOut": self.usage.output_tokens,
            "children": [c.to_json() for c in self.children],
        }


def report(run_id: str, label: str, status: str, agent_id: str, child_key: str, body: str, stats: str) -> str:
    """The one message a run's parent gets: who, how it ended, what, and the cost."""
    return f"[subagent run {run_id} {label!r} {status.replace('_', ' ')}] agent {agent_id}, session {child_key}\n{body}\n{stats}"


def stats_line(runs: int, succeeded: int, duration_s: float, tokens: Usage) -> str:
    return (
        f"stats: runs {runs} ({succeeded} succeeded, {runs - succeeded} failed) · duration {duration_s:.1f} s · "
        f"tokens {tokens.input_tokens} in / {tokens.output_tokens} out"
    )


def run_backends(cfg: ClawsupConfig, *, source: str) -> dict[str, str]:
    """Agent id -> the backend its subagent runs use: the agent's own
    `sandbox.backend`, else `agents.defaults.sandbox.backend`; resolved at start, so
    that one that cannot work here is a config error then, not a failed run later."""
    default = cfg.agents.defaults.sandbox.backend
    entries = {a.id: (i, a) for i, a in enumerate(cfg.agents.entries)}
    out: dict[str, str] = {}
    for agent_id in cfg.agents.ids():
        i, a = entries.get(agent_id, (0, None))
        own = a.sandbox.backend if a is not None and a.sandbox is not None else None
        key = f"agents.list[{i}].sandbox.backend" if own else "agents.defaults.sandbox.backend"
        out[agent_id], _ = resolve_backend(
            own or default, key, f"agent {agent_id!r}'s subagent runs", source=source, fallback=cfg.agents.defaults.sandbox.process_fallback
        )
    return out


class Subagents:
    def __init__(
        self,
        cfg: ClawsupConfig,
        *,
        manager: SandboxManager,
        store: SessionStore,
        bus: MessageBus,
        provider: Callable[[str], Provider],
        model_of: Callable[[str], str],
        backends: dict[str, str],
        journal: RunJournal | None = None,
    ) -> None:
        """`provider(model)` gives the (cached) provider of a model, raising
        ConfigError when it cannot be made; `model_of(agent_id)` an agent's model;
        `journal` keeps sessions' runs across supervisor lives (run_journal.py)."""
        self.cfg = cfg
        self.limits = cfg.agents.defaults.subagents
        self._manager = manager
        assert manager.workspaces is not None, "the manager's workspaces come first"
        self._workspaces: Workspaces = manager.workspaces
        self._store = store
        self._bus = bus
        self._provider = provider
        self._model_of = model_of
        self._agents = {a.id: a for a in cfg.agents.entries}
        self._policy = cfg.tools.policy()
        self.backends = backends
        """Agent id -> the backend of its runs' sandboxes (see `run_backends`)."""
        self.runs: dict[str, Run] = {}
        self._journal = journal
        self._tg: asyncio.TaskGroup | None = None
        self._closing = False

    # -- the owner of every run ------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            await self._report_lost_runs()
            await stop.wait()
            self._closing = True
            self._tg = None
            for r in self.runs.values():
                if r.task_handle is not None:
                    r.cancel_reason = r.cancel_reason or "the gateway is shutting down"
                    r.task_handle.cancel()

    # -- the tools -------------------------------------------------------------------

    async def call(self, name: str, args: dict[str, Any], origin: Origin) -> str:
        """`sessions_spawn` or `subagents`, for `origin`; the answer is the tool's
        result text. Refusals raise (the model sees the sentence)."""
        if name == "sessions_spawn":
            return json.dumps(self.spawn(_parse(SpawnArgs, name, args), origin))
        a = _parse(SubagentsArgs, name, args)
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
        if target not in self.backends:
            raise SpawnRefused(f"agentId {target!r} is not an agent of this gateway (agents: {', '.join(self.backends)})")
        active = [r for r in self._own(origin) if r.running]
        if len(active) >= lim.max_children_per_agent:
            raise SpawnRefused(
                f"{len(active)} subagent runs of this session are still running (agents.defaults.subagents.maxChildrenPerAgent is "
                f"{lim.max_children_per_agent}); wait for one to report, or kill one with the `subagents` tool"
            )
        timeout = a.runTimeoutSeconds or lim.run_timeout_seconds
        if timeout > lim.max_run_timeout_seconds:
            raise BadToolArguments("sessions_spawn", f"runTimeoutSeconds: at most {lim.max_run_timeout_seconds:g}, got {timeout:g}")
        model = (a.model or _model_name(lim.model) or self._model_of(target)).strip()
        provider = self._provider(model)  # a model that cannot be used refuses the spawn
        if self._tg is None:
            raise SpawnRefused("the gateway is shutting down")
        u = uuid.uuid4()
        run_id = u.hex[:12]
        fresh = self.limits.workspace == "fresh"
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
        run.task_handle = self._tg.create_task(self._drive(run), name=f"subagent run {run_id}")
        logger.info("{}: spawned subagent run {} ({}) for agent {} at depth {}", origin.session_key, run_id, run.label, target, run.depth)
        self._prune()
        return {"status": "accepted", "runId": run_id, "childSessionKey": run.child_key, "agentId": target, "label": run.label, "runTimeoutSeconds": timeout}

    def kill(self, origin: Origin, target: str) -> dict[str, Any]:
        own = [r for r in self._own(origin) if r.running]
        hits = own if target == "all" else [r for r in own if target in (r.run_id, r.label)]
        if not hits and target != "all":
            raise ClawsupError(f"no running run {target!r} of yours; running: {', '.join(f'{r.run_id} ({r.label})' for r in own) or 'none'}")
        for r in hits:
            self._cancel(r, f"killed by {origin.session_key} with the subagents tool")
        return {"killed": [r.run_id for r in hits]}

    async def stop_session(self, session_key: str) -> int:
        """`/stop` in a session: its running runs are cancelled, and with them all
        they spawned. Returns how many of its own runs were running."""
        hits = [r for r in self.runs.values() if r.parent_key == session_key and r.origin.run is None and r.running]
        for r in hits:
            self._cancel(r, "/stop in its parent session")
        return len(hits)

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

    def _cancel(self, run: Run, reason: str) -> None:
        if run.running and run.task_handle is not None and not run.task_handle.done():
            run.cancel_reason = run.cancel_reason or reason
            run.task_handle.cancel()

    def _prune(self) -> None:
        ended = [r for r in self.runs.values() if not r.running and r.origin.run is None]
        for r in ended[: max(0, len(ended) - FINISHED_KEPT)]:
            for x in r.subtree():
                self.runs.pop(x.run_id, None)

    # -- one run, start to announce --------------------------------------------------

    def _plan(self, run: Run) -> SandboxPlan:
        return subagent_plan(self._workspaces.settings, run.sandbox_id, self.backends[run.agent_id])

    async def _drive(self, run: Run) -> None:
        sb: SupervisedSandbox | None = None
        try:
            try:
                async with asyncio.timeout(run.timeout_s):
                    await self._store.append(run.child_key, {"role": "user", "id": run.run_id, "text": run.task, "ts": time.time(), "agentId": run.agent_id, "spawnedBy": run.parent_key, "label": run.label})
                    sb = await self._manager.add_running(self._plan(run))
                    sb.services.update(self._services(run))
                    try:
                        state = await sb.start(self.limits.start_timeout_seconds)
                    except TimeoutError:  # the start's own bound, not the run's
                        raise ClawsupError(f"its sandbox did not start within {self.limits.start_timeout_seconds:g} s") from None
                    if state is not SandboxState.READY:
                        last = sb.lc.last_exit.describe() if sb.lc.last_exit else state.value
                        raise ClawsupError(f"its sandbox did not start: {last}")
                    text, error = await sb.run_agent(run.run_id, run.task, max_iterations=self.cfg.agent_loop.max_iterations, timeout=run.timeout_s + 5)
                self._end(run, "failed" if error else "succeeded", text, error)
            except TimeoutError:
                self._end(run, "timed_out", "", f"did not finish within {run.timeout_s:g} s (runTimeoutSeconds); its sandbox was killed")
            except SandboxDied as e:
                tail = f"; last stderr: {' | '.join(e.stderr_tail[-3:])}" if e.stderr_tail else ""
                self._end(run, "failed", "", f"its sandbox {e.status.describe()}{tail}; see `clawsup logs {run.sandbox_id}`")
            except (ClawsupError, OSError) as e:
                self._end(run, "failed", "", str(e))
            except asyncio.CancelledError:
                self._end(run, "cancelled", "", run.cancel_reason or "cancelled")
                raise
            except Exception as e:
                logger.exception("subagent run {} failed in the supervisor", run.run_id)
                self._end(run, "failed", "", f"supervisor error: {type(e).__name__}: {e}")
        finally:
            await self._wind_down(run, sb)

    def _end(self, run: Run, status: str, text: str, reason: str) -> None:
        run.status, run.result, run.reason, run.t1 = status, text, reason, time.monotonic()

    async def _wind_down(self, run: Run, sb: SupervisedSandbox | None) -> None:
        """Children first (a run takes its subtree with it), then its sandboxes, then
        the record and the announce. Bounded throughout: cancellation of the run's
        own task has already been delivered, so these awaits run to completion."""
        running = [c for c in run.children if c.running]
        for c in running:
            self._cancel(c, f"its parent run {run.run_id} ended ({run.status})")
        handles = [c.task_handle for c in running if c.task_handle is not None]
        if handles:
            await asyncio.wait(handles, timeout=STOP_TIMEOUT_S)
        if sb is not None:
            await self._manager.discard(sb, f"run {run.status}", STOP_TIMEOUT_S, polite=run.status == "succeeded", remove_files=True)
        if run.fresh_workspace and (ws := self._manager.sandboxes.get(run.workspace)) is not None:
            await self._manager.discard(ws, "its run ended", STOP_TIMEOUT_S, remove_files=True)
        level = "info" if run.status == "succeeded" else "warning"
        logger.log(level.upper(), "subagent run {} ({}) {}: {}", run.run_id, run.label, run.status, run.reason or "done")
        text = self._announce_text(run)
        try:
            await self._store.append(run.child_key, {"role": "system", "text": text, "ts": time.time(), "status": run.status, "tokensIn": run.usage.input_tokens, "tokensOut": run.usage.output_tokens})
        except OSError as e:
            logger.error("{}: cannot write the run's end: {}", run.child_key, e)
        try:
            await self._announce(run, text)
        finally:
            run.reported.set()

    def _announce_text(self, run: Run) -> str:
        body = run.result or "(no result)"
        if run.reason:
            body = f"{run.reason}\n{run.result}" if run.result else run.reason
        return report(run.run_id, run.label, run.status, run.agent_id, run.child_key, body, run.stats())

    async def _announce(self, run: Run, text: str) -> None:
        """One system message to the parent, and only to it. A session's report that
        cannot be delivered now (the gateway is stopping) waits in the journal for
        the next start."""
        parent = run.origin.run
        if parent is not None:
            if parent.running and not self._closing:
                parent.inbox.put_nowait({"role": "user", "text": text})
            return
        msg, route = run.origin.message, run.origin.route
        if msg is None or route is None:
            return
        if self._closing:
            if self._journal is not None:
                self._journal.ended(run.run_id, text)
            return
        await self._tell(msg.source, msg.reply_to, route, text, run.run_id)

    async def _tell(self, source: RouteInput, reply_to: ReplyTarget, route: Route, text: str, run_id: str) -> None:
        """Put a report on the bus; the journal lets go of the run once the report
        is in its session."""
        note = InboundMessage(source=source, text=text, reply_to=reply_to, route=route, role="system")
        journal = self._journal

        def done(fut: asyncio.Future[Route]) -> None:
            if fut.cancelled() or (e := fut.exception()) is not None:
                logger.warning("the report of run {} was not accepted: {}", run_id, "cancelled" if fut.cancelled() else e)
            elif journal is not None:
                journal.reported(run_id)

        note.accepted.add_done_callback(done)
        await self._bus.inbound.put(note)

    async def _report_lost_runs(self) -> None:
        """Runs of the supervisor's last life that their sessions never heard of."""
        if self._journal is None:
            return
        for r in await asyncio.to_thread(self._journal.unreported):
            try:
                source, reply_to, route = origin_from(r["origin"])
            except (KeyError, TypeError, ValueError) as e:
                logger.warning("run {} cannot be reported to its session: {}", r.get("runId"), e)
                continue
            text = r.get("ended")
            if text:
                text += "\n(reported when the gateway started again)"
            else:
                text = await asyncio.to_thread(self._lost_text, r)  # reads the run's whole session file
            logger.warning("subagent run {} ({}) of {} was not reported before the supervisor stopped; reporting it now", r["runId"], r.get("label"), route.session_key)
            await self._tell(source, reply_to, route, text, r["runId"])

    def _lost_text(self, r: dict[str, Any]) -> str:
        """What a run's own session says of it, since nothing else is left."""
        records = self._store.read(r["childKey"])
        used = Usage()
        for rec in records:
            u = rec.get("usage") if rec.get("role") == "assistant" else None
            if isinstance(u, dict):
                used += Usage(int(u.get("in", 0)), int(u.get("out", 0)))
        last = max((rec.get("ts", 0) for rec in records), default=0) or r.get("ts", 0)
        body = "the gateway stopped while the run was going (its supervisor was killed or crashed), and the run was lost with it; its session holds what it did"
        return report(r["runId"], r.get("label", r["runId"]), "failed", str(r.get("agentId")), r["childKey"], body, stats_line(1, 0, max(0.0, last - r.get("ts", last)), used))

    # -- what a run's sandbox may ask ------------------------------------------------

    def _services(self, run: Run) -> dict[str, Any]:
        async def complete(payload: dict[str, Any]) -> dict[str, Any]:
            return await self._complete(run, payload)

        async def tool_call(payload: dict[str, Any]) -> dict[str, Any]:
            return await self._tool_call(run, payload)

        async def wait(payload: dict[str, Any]) -> dict[str, Any]:
            return await self._wait(run)

        return {"model.complete": complete, "tool.call": tool_call, "runs.wait": wait}

    def tools_of(self, run: Run) -> frozenset[str]:
        """The run's tool set now: its parent's, less what runs never get, under the
        run's own policy (the `subagent` layer included); the spawn tools only while
        another level is allowed."""
        a = self._agents.get(run.agent_id)
        available = {r.name: r.owner for r in self._manager.registry.tools()}
        own = set(decide(self._policy, a.tools if a else None, run.caller(), available).tools) & run.origin.allowed
        tools = own - WITHHELD
        if run.depth < self.limits.max_spawn_depth:
            tools |= own & set(SPAWN_TOOLS)
        return frozenset(tools)

    async def _complete(self, run: Run, payload: dict[str, Any]) -> dict[str, Any]:
        if run.model_calls >= self.cfg.agent_loop.max_iterations:
            raise PermissionError(f"this run has made its {self.cfg.agent_loop.max_iterations} model calls (agentLoop.maxIterations)")
        messages = _messages(payload.get("messages"))
        inserted: list[dict[str, Any]] = []
        while not run.inbox.empty():
            inserted.append(run.inbox.get_nowait())
        verdict = run.loops.verdict()
        if verdict == "stop":
            raise PermissionError(f"this run was stopped: {STOPPED}")
        if verdict == "warn":
            inserted.append({"role": "user", "text": WARNING, "warning": True})
        messages += inserted
        specs = tool_specs(self._manager.registry, sorted(self.tools_of(run)))
        ctx = TurnContext(
            agent_id=run.agent_id,
            session_key=run.child_key,
            system=(
                f"You are a subagent (agent {run.agent_id!r}) working in the background on one task handed to you by "
                f"{run.parent_key}. Do it with your tools; your final answer is reported back as the result."
            ),
        )
        run.model_calls += 1
        try:
            reply = await run.provider.complete(ctx, messages, specs)
        except ProviderError as e:
            raise ClawsupError(f"the model could not answer: {e}") from None
        run.usage += reply.usage
        calls = [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls]
        await self._record_inserted(run, inserted)
        await self._store.append(
            run.child_key,
            {"role": "assistant", "text": reply.text, "toolCalls": calls, "inReplyTo": run.run_id, "ts": time.time(), "usage": {"in": reply.usage.input_tokens, "out": reply.usage.output_tokens}},
        )
        return {"text": reply.text, "toolCalls": calls, "inserted": inserted, "childrenRunning": any(c.running for c in run.children)}

    async def _tool_call(self, run: Run, payload: dict[str, Any]) -> dict[str, Any]:
        name, call_id, args = payload.get("name"), payload.get("id", ""), payload.get("args", {})
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ValueError("tool.call needs {name: str, args: object}")
        run.loops.record(name, args)
        tools = self.tools_of(run)
        if name not in tools:
            content, is_error = f"tool {name!r} is not available to this subagent run (its tools: {', '.join(sorted(tools)) or 'none'})", True
        else:
            try:
                if name in SPAWN_TOOLS:
                    me = Origin(session_key=run.child_key, agent_id=run.agent_id, caller=run.caller(), allowed=tools, depth=run.depth, run=run)
                    content = await self.call(name, args, me)
                else:
                    result = await self._manager.invoke(name, args, agent=run.agent_id, session=run.child_key, workspace=run.workspace)
                    content = result.text
                is_error = False
            except ClawsupError as e:
                content, is_error = str(e), True
        await self._store.append(run.child_key, {"role": "tool", "toolCallId": call_id, "name": name, "content": content, "isError": is_error, "inReplyTo": run.run_id, "ts": time.time()})
        return {"content": content, "isError": is_error}

    async def _wait(self, run: Run) -> dict[str, Any]:
        if run.inbox.empty() and not any(c.running for c in run.children):
            return {"announces": []}
        first = await run.inbox.get()
        rest = []
        while not run.inbox.empty():
            rest.append(run.inbox.get_nowait())
        await self._record_inserted(run, [first, *rest])
        return {"announces": [first, *rest]}

    async def _record_inserted(self, run: Run, messages: list[dict[str, Any]]) -> None:
        """What the supervisor put in the run's conversation (its children's
        reports, a loop warning) goes in its session too."""
        for m in messages:
            await self._store.append(run.child_key, {"role": "system", "text": m["text"], "ts": time.time()})


class _ToolCall(BaseModel):
    id: str
    name: str
    args: dict[str, Any]


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant", "tool"]
    text: str = ""
    toolCalls: list[_ToolCall] = Field(default_factory=list)
    toolCallId: str = ""
    name: str = ""
    content: str = ""
    isError: bool = False


def _messages(raw: Any) -> list[dict[str, Any]]:
    """A run's conversation, as its sandbox sends it: checked here, since the sandbox
    is on the other side of the wall."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_MESSAGES:
        raise ValueError(f"messages: a list of 1 to {MAX_MESSAGES} messages")
    try:
        return [_Message.model_validate(m).model_dump() for m in raw]
    except ValidationError as e:
        raise ValueError(f"messages: {format_validation_error(e)}") from None


def _parse(model: type[_Args], tool: str, args: dict[str, Any]) -> Any:
    try:
        return model.model_validate(args)
    except ValidationError as e:
        raise BadToolArguments(tool, format_validation_error(e)) from None


def _model_name(m: Any) -> str:
    if isinstance(m, dict):
        m = m.get("primary")
    return str(m or "")
