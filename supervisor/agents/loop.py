"""A session's turn: one routed message through the agent loop.

1. take the session's recent history (up to this message) from memory, reading the
   session file only on the session's first turn (see `History`);
2. run the one agent loop (clawsup.sandbox.agent_loop) with this turn's ports
   (`_Turn`): before each model call, the tools the model is shown, which are
   exactly the tools it may call, from the tool policy; each tool call it makes
   through tool dispatch (so each runs in its sandbox, with the caller's agent and
   session), or to the spawn tools; loop detection; progress for the user; every
   call and result written to the session;
3. stop when the model answers or a limit stops it (`agentLoop.maxIterations`, loop
   detection), and return the reply (the session lanes store and deliver it).

A call to a tool outside this turn's set is refused with a tool error and never run.
A tool that fails (its sandbox crashed, it timed out, its arguments were bad) gives
the model an error result and the turn goes on. Plugin tools that appeared or went
away since the last model call are reflected at the next one: the set is recomputed
before each call. Created by the gateway; one per supervisor; turns share nothing
but the registry and the histories (one per session, and a session's turns run one
at a time).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from clawsup.sandbox import agent_loop
from clawsup.sandbox.agent_loop import AssistantMessage, Message, ModelTurn, Stop, ToolCall, ToolResult, UserMessage, message_from_json, message_json
from clawsup.supervisor.agents.loop_detection import STOPPED, LoopWatch
from clawsup.supervisor.agents.models import Models
from clawsup.supervisor.agents.providers import Provider, ProviderError, TurnContext, Usage, tool_specs
from clawsup.supervisor.agents.runs import Origin
from clawsup.supervisor.agents.spawn_tools import SPAWN_TOOLS, SpawnTools
from clawsup.supervisor.automation.cron_tool import CRON_TOOL, CronTool
from clawsup.supervisor.agents.tool_dispatch import ToolDispatch
from clawsup.supervisor.agents.tool_policy import Caller, Decision, decide
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.messages.bus import InboundMessage
from clawsup.supervisor.messages.lanes import Answer, Progress
from clawsup.supervisor.messages.owners import Owners
from clawsup.supervisor.messages.routing import Route
from clawsup.supervisor.messages.session_store import SessionStore
from clawsup.supervisor.hooks import Hooks

ACTIVE_SESSIONS = 64
"""Sessions whose history is kept in memory; past it the least recently used is
forgotten, and its next turn reads its file again. With `agentLoop.historyBytes`
this bounds the memory histories take, however many sessions there are."""
TAIL_FACTOR = 4
"""A first turn reads the last `historyBytes` x this of the session file: a record
carries ids, timestamps and routing beside what the model sees."""


@dataclass
class History:
    """One session's recent conversation as the model sees it: at most `max_messages`
    entries and, past one entry, at most `max_bytes` of them as JSON. Made from the
    session file on the session's first turn; then each turn adds its message, its
    tool calls and results and its answer as they happen, as the session lanes and
    this loop write them to the file, so the file is not read again."""

    max_messages: int
    max_bytes: int
    entries: deque[tuple[Message, int]] = field(default_factory=deque)
    size: int = 0

    def add(self, entry: Message) -> None:
        n = len(json.dumps(message_json(entry)))
        self.entries.append((entry, n))
        self.size += n
        while len(self.entries) > self.max_messages or (self.size > self.max_bytes and len(self.entries) > 1):
            self._drop()
        # A window must not start with tool results whose calls it cut off.
        while self.entries and isinstance(self.entries[0][0], ToolResult):
            self._drop()

    def _drop(self) -> None:
        self.size -= self.entries.popleft()[1]

    def window(self) -> list[Message]:
        return [e for e, _ in self.entries]


class AgentLoop:
    def __init__(
        self, cfg: ClawsupConfig, *, models: Models, tools: ToolDispatch, spawn: SpawnTools, store: SessionStore, hooks: Hooks | None = None
    ) -> None:
        """`tools`: tool dispatch (and its registry); `spawn`: the spawn tools
        (`Subagents`); `hooks`: the plugins' `before_agent_start` (context for the
        turn), `agent_end` and `session_start` (supervisor/hooks.py)."""
        self.cfg = cfg
        self._hooks = hooks
        self._models = models
        self._tools = tools
        self._spawn = spawn
        self.store = store
        self._agents = {a.id: a for a in cfg.agents.entries}
        self._owners = Owners.from_config(cfg)
        self._policy = cfg.tools.policy()
        """The policy keys, once: the config is immutable and each model call asks."""
        self.cron: CronTool | None = None
        """The `cron` tool's server (supervisor/automation/cron_tool.py), once the
        scheduler is built; without it the tool is not registered."""
        self._histories: OrderedDict[str, History] = OrderedDict()
        """Session key -> its history, least recently used first (ACTIVE_SESSIONS)."""

    async def stop_session(self, session_key: str) -> int:
        return await self._spawn.stop_session(session_key)

    def caller_of(self, route: Route, message: InboundMessage) -> Caller:
        src = message.source
        return Caller(
            agent=route.agent_id,
            provider=self._models.model_of(route.agent_id),
            # Where the message came from: a channel's messages are answered there,
            # a cron run's come from `cron` and are answered where its job says.
            channel=src.channel,
            group_id=src.peer.id if src.peer.kind != "direct" else None,
            sender=src.peer.id if src.peer.kind == "direct" else None,
            owner=self._owners.is_owner(message),
        )

    def policy_for(self, route: Route, message: InboundMessage) -> Decision:
        agent = self._agents.get(route.agent_id)
        caller = self.caller_of(route, message)
        available = {r.name: r.owner for r in self._tools.registry.tools()}
        return decide(self._policy, agent.tools if agent else None, caller, available)

    async def turn(self, route: Route, message: InboundMessage, progress: Progress) -> Answer:
        """The reply, with the turn's tokens for the session: `usage` on each record
        of a model call (these add up to the total), `turnUsage` on the answer."""
        history = await self._history(route.session_key, message)
        try:
            answer = await self._turn(route, message, progress, history)
        except BaseException as e:
            # Stopped or failed halfway: what the file says of this turn is what the
            # session lanes (supervisor/messages/lanes.py) and `_record` wrote, so the
            # next turn reads it from there.
            self._histories.pop(route.session_key, None)
            self._ended(route, message, "stopped" if isinstance(e, asyncio.CancelledError) else "failed", None)
            raise
        self._ended(route, message, "answered", answer.text)
        return answer

    def _ended(self, route: Route, message: InboundMessage, outcome: str, text: str | None) -> None:
        if self._hooks is not None:
            event = {"agentId": route.agent_id, "sessionKey": route.session_key, "messageId": message.id, "outcome": outcome, "reply": text}
            self._hooks.observe("agent_end", event)

    async def _turn(self, route: Route, message: InboundMessage, progress: Progress, history: History) -> Answer:
        limits = self.cfg.agent_loop
        provider = self._models.provider(self._models.model_of(route.agent_id))
        context = ""
        if self._hooks is not None and self._hooks.declared("before_agent_start"):
            # For this turn only: never stored, so the session file stays what was said.
            context = await self._hooks.before_agent_start(message.text, agent=route.agent_id, session=route.session_key, channel=message.reply_to.channel)
        if message.context:
            context = f"{message.context}\n\n{context}" if context else message.context
        turn = _Turn(self, route, message, progress, history, provider, tools=self._tools, spawn=self._spawn, context=context)
        history.add(UserMessage(message.text))
        out = await agent_loop.run(history.window(), turn, turn, max_iterations=limits.max_iterations)
        if out.ending == "answered":
            return turn.answer(out.text or "(the model returned nothing)", turn.last)
        if out.ending == "stopped":
            return turn.answer(out.error)
        # At the limit, a loop the last tool calls closed is still named as such.
        if turn.loops.verdict() == "stop":
            logger.warning("{}: turn stopped by loop detection", route.session_key)
            return turn.answer(f"stopped: {STOPPED}; try asking differently.")
        return turn.answer(f"stopped: the turn reached its limit of {limits.max_iterations} model calls (agentLoop.maxIterations).")

    async def _history(self, key: str, message: InboundMessage) -> History:
        """The session's history before `message`: from memory, or read from its file
        (in a worker thread) on the session's first turn."""
        history = self._histories.get(key)
        if history is not None:
            self._histories.move_to_end(key)
            return history
        limits = self.cfg.agent_loop
        history = History(limits.history_messages, limits.history_bytes)
        before = await asyncio.to_thread(self._read_history, key, message.id)
        for entry in before:
            history.add(entry)
        if not before and self._hooks is not None:
            self._hooks.observe("session_start", {"sessionKey": key, "channel": message.reply_to.channel, "messageId": message.id})
        self._histories[key] = history
        while len(self._histories) > ACTIVE_SESSIONS:
            self._histories.popitem(last=False)
        return history

    def _read_history(self, key: str, message_id: str) -> list[Message]:
        """The conversation before `message_id` as the file tells it, in conversation
        order. In the file a later message can come before an earlier turn's answer
        (messages are written as they arrive), so each turn's records are gathered
        by `inReplyTo`. A line torn by a crash is skipped (see session_store)."""
        records = self.store.read_tail(key, TAIL_FACTOR * self.cfg.agent_loop.history_bytes)
        if not any(r.get("id") == message_id for r in records):
            # Further back than the tail read (a long queue of long messages):
            # what the tail holds all came after it.
            logger.warning("{}: message {} is not in the last {} bytes of the session; its turn starts without history", key, message_id, TAIL_FACTOR * self.cfg.agent_loop.history_bytes)
            return []
        answers: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            if r.get("role") in ("assistant", "tool") and r.get("inReplyTo"):
                answers.setdefault(r["inReplyTo"], []).append(r)
        out: list[Message] = []
        for r in records:
            # A turn starts with a user message, or with what the gateway told the
            # session (a subagent's announce: a system record with an id).
            if r.get("role") != "user" and not (r.get("role") == "system" and r.get("id")):
                continue
            if r.get("id") == message_id:
                break
            out.append(UserMessage(str(r.get("text", "")), "message" if r.get("role") == "user" else "announce"))
            out += [message_from_json(a) for a in answers.get(r.get("id", ""), [])]
        return out


class _Turn:
    """The ports of one session's turn (the model and the tools), and its tally:
    the tokens it used, the tool calls it repeated."""

    def __init__(
        self,
        loop: AgentLoop,
        route: Route,
        message: InboundMessage,
        progress: Progress,
        history: History,
        provider: Provider,
        *,
        tools: ToolDispatch,
        spawn: SpawnTools,
        context: str = "",
    ) -> None:
        """`loop` decides the tool policy and keeps the session file; `context`: what
        the plugins' before_agent_start hooks prepend to this turn."""
        self._loop = loop
        self._tools = tools
        self._spawn = spawn
        self._route = route
        self._message = message
        self._progress = progress
        self._history = history
        self._provider = provider
        self._ctx = TurnContext(
            agent_id=route.agent_id,
            session_key=route.session_key,
            system=f"You are agent {route.agent_id!r} of a clawsup gateway. Use the tools you are given when they help; answer briefly."
            + (f"\n\n{context}" if context else ""),
            notify=progress,
        )
        self.loops = LoopWatch(loop.cfg.agent_loop.loop_detection)
        self.used = Usage()
        self.last: Usage | None = None
        """The usage of the model call that answered."""
        self._decision: Decision | None = None

    def answer(self, text: str, last: Usage | None = None) -> Answer:
        record: dict[str, Any] = {"turnUsage": {"in": self.used.input_tokens, "out": self.used.output_tokens}}
        if last is not None:
            record["usage"] = {"in": last.input_tokens, "out": last.output_tokens}
        self._history.add(AssistantMessage(text))  # as the session lanes store it
        return Answer(text, record)

    async def _record(self, m: Message, **extra: Any) -> None:
        self._history.add(m)
        await self._loop.store.append(self._route.session_key, {**message_json(m), "inReplyTo": self._message.id, "ts": time.time(), **extra})

    async def complete(self, messages: Sequence[Message]) -> ModelTurn:
        inserted = self.loops.before_model_call()
        if inserted is None:
            logger.warning("{}: turn stopped by loop detection", self._route.session_key)
            raise Stop(f"stopped: {STOPPED}; try asking differently.")
        self._decision = decision = self._loop.policy_for(self._route, self._message)
        specs = tool_specs(self._tools.registry, decision.tools)
        try:
            reply = await self._provider.complete(self._ctx, [*messages, *inserted], specs)
        except ProviderError as e:
            logger.warning("{}: {}", self._route.session_key, e)
            raise Stop(f"error: the model could not answer: {e}") from None
        self.used += reply.usage
        self.last = reply.usage
        said = reply.said()
        if said.tool_calls:
            await self._record(said, usage={"in": reply.usage.input_tokens, "out": reply.usage.output_tokens})
        return ModelTurn(said, inserted)

    async def call(self, call: ToolCall) -> ToolResult:
        content, is_error = await self._run_tool(call)
        result = ToolResult(call.id, call.name, content, is_error)
        await self._record(result)
        self.loops.record(call.name, call.args)
        return result

    async def _run_tool(self, call: ToolCall) -> tuple[str, bool]:
        name, decision, route = call.name, self._decision, self._route
        assert decision is not None, "a tool call follows a model call"
        if name not in decision.tools:
            why = f"removed by the {decision.removed[name]} layer" if name in decision.removed else "not a registered tool"
            return f"tool {name!r} is not available in this turn ({why})", True
        await self._progress(f"calling {name}…")
        try:
            if name == CRON_TOOL and self._loop.cron is not None:
                caller = self._loop.caller_of(route, self._message)
                return await self._loop.cron.call(call.args, agent=route.agent_id, owner=caller.owner, session=route.session_key), False
            if name in SPAWN_TOOLS:
                origin = Origin(
                    session_key=route.session_key,
                    agent_id=route.agent_id,
                    caller=self._loop.caller_of(route, self._message),
                    allowed=frozenset(decision.tools),
                    message=self._message,
                    route=route,
                )
                return await self._spawn.call(name, call.args, origin), False
            result = await self._tools.invoke(name, call.args, agent=route.agent_id, session=route.session_key)
        except ClawsupError as e:
            return str(e), True
        return result.text, False
