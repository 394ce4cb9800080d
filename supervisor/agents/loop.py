"""The agent loop: one turn of a routed message.

1. take the session's recent history (up to this message) from memory, reading the
   session file only on the session's first turn (see `History`);
2. compute, from the tool policy, the tools the model is shown, which are exactly
   the tools it may call this turn;
3. call the model; run the tool calls it makes through `SandboxManager.invoke` (so
   each runs in its sandbox, with the caller's agent and session);
4. feed the results back, and repeat until the model answers or a limit stops it
   (`agentLoop.maxIterations`, loop detection);
5. return the reply (the dispatcher stores and delivers it).

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
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from clawsup.supervisor.messages.bus import InboundMessage
from clawsup.supervisor.config import AgentEntry, ClawsupConfig
from clawsup.supervisor.messages.lanes import Answer, Progress
from clawsup.supervisor.errors import ClawsupError, ConfigError
from clawsup.supervisor.agents.loop_detection import STOPPED, WARNING, LoopWatch
from clawsup.supervisor.agents.providers import ModelReply, Provider, ProviderError, TurnContext, Usage, tool_specs
from clawsup.supervisor.agents.providers.offline import OfflineProvider
from clawsup.supervisor.messages.routing import Route
from clawsup.supervisor.messages.session_store import SessionStore
from clawsup.supervisor.agents.subagents import SPAWN_TOOLS, Origin, Subagents
from clawsup.supervisor.agents.tool_policy import Caller, Decision, decide

OWNER_CHANNELS = frozenset({"cli"})
"""The operator's own channels: whoever uses them is an owner."""
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
    tool calls and results and its answer as they happen, as the dispatcher and
    this loop write them to the file, so the file is not read again."""

    max_messages: int
    max_bytes: int
    entries: deque[tuple[dict[str, Any], int]] = field(default_factory=deque)
    size: int = 0

    def add(self, entry: dict[str, Any]) -> None:
        n = len(json.dumps(entry))
        self.entries.append((entry, n))
        self.size += n
        while len(self.entries) > self.max_messages or (self.size > self.max_bytes and len(self.entries) > 1):
            self._drop()
        # A window must not start with tool results whose calls it cut off.
        while self.entries and self.entries[0][0]["role"] == "tool":
            self._drop()

    def _drop(self) -> None:
        self.size -= self.entries.popleft()[1]

    def window(self) -> list[dict[str, Any]]:
        return [e for e, _ in self.entries]


def model_of(cfg: ClawsupConfig, agent: AgentEntry | None) -> str:
    m: Any = (agent.model if agent else None) or cfg.agents.defaults.model or "offline"
    if isinstance(m, dict):
        m = m.get("primary") or "offline"
    return str(m).strip()


def make_provider(model: str, cfg: ClawsupConfig, *, source: str = "config") -> Provider:
    if model == "offline":
        return OfflineProvider()
    if model.startswith("anthropic/"):
        from clawsup.supervisor.agents.providers.anthropic_provider import AnthropicProvider

        p = cfg.providers.anthropic
        key = os.environ.get(p.api_key_env or "ANTHROPIC_API_KEY", "")
        if not key:
            raise ConfigError(source, [f"model {model!r} needs ${p.api_key_env or 'ANTHROPIC_API_KEY'} (providers.anthropic.apiKeyEnv)"])
        return AnthropicProvider(model.split("/", 1)[1], api_key=key, base_url=p.base_url, max_retries=p.max_retries, timeout_s=p.timeout_seconds, max_tokens=p.max_tokens)
    if "/" not in model:
        raise ConfigError(source, [f"model {model!r}: expected `offline`, `anthropic/<model>` or `<provider>/<model>`"])
    from clawsup.supervisor.agents.providers.litellm_provider import LiteLLMProvider

    p = cfg.providers.litellm
    env_key = os.environ.get(p.api_key_env, "") if p.api_key_env else None
    return LiteLLMProvider(model, api_key=env_key or None, base_url=p.base_url, max_retries=p.max_retries, timeout_s=p.timeout_seconds, max_tokens=p.max_tokens)


class AgentLoop:
    def __init__(self, cfg: ClawsupConfig, *, manager: Any, store: SessionStore, source: str = "config") -> None:
        self.cfg = cfg
        self.manager = manager
        self.store = store
        self._agents = {a.id: a for a in cfg.agents.entries}
        self._source = source
        # Providers are made up front, so that a missing key is a start-up error.
        self._providers: dict[str, Provider] = {}
        for agent_id in cfg.agents.ids():
            self.provider(self.model_of(agent_id))
        self.subagents: Subagents | None = None
        """Set by the gateway: `sessions_spawn` and `subagents` go there."""
        self._owners = {o.strip().lower() for o in cfg.tools.owners}
        self._policy = cfg.tools.policy()
        """The policy keys, once: the config is immutable and each model call asks."""
        self._histories: OrderedDict[str, History] = OrderedDict()
        """Session key -> its history, least recently used first (ACTIVE_SESSIONS)."""

    def model_of(self, agent_id: str) -> str:
        return model_of(self.cfg, self._agents.get(agent_id))

    def provider(self, model: str) -> Provider:
        """The provider of `model`, made once; ConfigError when it cannot be (a
        missing key), which a subagent spawn naming that model reports."""
        if model not in self._providers:
            self._providers[model] = make_provider(model, self.cfg, source=self._source)
        return self._providers[model]

    async def stop_session(self, session_key: str) -> int:
        return await self.subagents.stop_session(session_key) if self.subagents is not None else 0

    def caller_of(self, route: Route, message: InboundMessage) -> Caller:
        src = message.source
        return Caller(
            agent=route.agent_id,
            provider=self.model_of(route.agent_id),
            channel=message.reply_to.channel,
            group_id=src.peer.id if src.peer.kind != "direct" else None,
            sender=src.peer.id if src.peer.kind == "direct" else None,
            owner=message.reply_to.channel in OWNER_CHANNELS or f"{message.reply_to.channel}:{src.peer.id}".lower() in self._owners,
        )

    def policy_for(self, route: Route, message: InboundMessage) -> Decision:
        agent = self._agents.get(route.agent_id)
        caller = self.caller_of(route, message)
        available = {r.name: r.owner for r in self.manager.registry.tools()}
        return decide(self._policy, agent.tools if agent else None, caller, available)

    async def turn(self, route: Route, message: InboundMessage, progress: Progress) -> Answer:
        """The reply, with the turn's tokens for the session: `usage` on each record
        of a model call (these add up to the total), `turnUsage` on the answer."""
        history = await self._history(route.session_key, message)
        try:
            return await self._turn(route, message, progress, history)
        except BaseException:
            # Stopped or failed halfway: what the file says of this turn is what the
            # dispatcher wrote, so the next turn reads it from there.
            self._histories.pop(route.session_key, None)
            raise

    async def _turn(self, route: Route, message: InboundMessage, progress: Progress, history: History) -> Answer:
        used = Usage()

        def answer(text: str, last: Usage | None = None) -> Answer:
            record = {"turnUsage": {"in": used.input_tokens, "out": used.output_tokens}}
            if last is not None:
                record["usage"] = {"in": last.input_tokens, "out": last.output_tokens}
            history.add({"role": "assistant", "text": text, "toolCalls": []})  # as the dispatcher stores it
            return Answer(text, record)

        provider = self.provider(self.model_of(route.agent_id))
        ctx = TurnContext(
            agent_id=route.agent_id,
            session_key=route.session_key,
            system=f"You are agent {route.agent_id!r} of a clawsup gateway. Use the tools you are given when they help; answer briefly.",
            notify=progress,
        )
        history.add({"role": "user", "text": message.text})
        messages = history.window()
        limits = self.cfg.agent_loop
        loops = LoopWatch(limits.loop_detection)
        for _ in range(limits.max_iterations):
            decision = self.policy_for(route, message)
            specs = tool_specs(self.manager.registry, decision.tools)
            try:
                reply: ModelReply = await provider.complete(ctx, messages, specs)
            except ProviderError as e:
                logger.warning("{}: {}", route.session_key, e)
                return answer(f"error: the model could not answer: {e}")
            used += reply.usage
            if not reply.tool_calls:
                return answer(reply.text or "(the model returned nothing)", reply.usage)
            call_record = {"role": "assistant", "text": reply.text, "toolCalls": [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls]}
            messages.append(call_record)
            history.add(call_record)
            usage = {"in": reply.usage.input_tokens, "out": reply.usage.output_tokens}
            await self.store.append(route.session_key, {**call_record, "inReplyTo": message.id, "ts": time.time(), "usage": usage})
            for call in reply.tool_calls:
                result, is_error = await self._run_tool(call.name, call.args, decision, route, message, progress)
                tool_record = {"role": "tool", "toolCallId": call.id, "name": call.name, "content": result, "isError": is_error}
                messages.append(tool_record)
                history.add(tool_record)
                await self.store.append(route.session_key, {**tool_record, "inReplyTo": message.id, "ts": time.time()})
                loops.record(call.name, call.args)
            verdict = loops.verdict()
            if verdict == "stop":
                logger.warning("{}: turn stopped by loop detection", route.session_key)
                return answer(f"stopped: {STOPPED}; try asking differently.")
            if verdict == "warn":
                messages.append({"role": "user", "text": WARNING, "warning": True})
        return answer(f"stopped: the turn reached its limit of {limits.max_iterations} model calls (agentLoop.maxIterations).")

    async def _run_tool(self, name: str, args: dict[str, Any], decision: Decision, route: Route, message: InboundMessage, progress: Progress) -> tuple[str, bool]:
        if name not in decision.tools:
            why = f"removed by the {decision.removed[name]} layer" if name in decision.removed else "not a registered tool"
            return f"tool {name!r} is not available in this turn ({why})", True
        await progress(f"calling {name}…")
        try:
            if name in SPAWN_TOOLS and self.subagents is not None:
                origin = Origin(
                    session_key=route.session_key,
                    agent_id=route.agent_id,
                    caller=self.caller_of(route, message),
                    allowed=frozenset(decision.tools),
                    message=message,
                    route=route,
                )
                return await self.subagents.call(name, args, origin), False
            result = await self.manager.invoke(name, args, agent=route.agent_id, session=route.session_key)
        except ClawsupError as e:
            return str(e), True
        return result.text, False

    async def _history(self, key: str, message: InboundMessage) -> History:
        """The session's history before `message`: from memory, or read from its file
        (in a worker thread) on the session's first turn."""
        history = self._histories.get(key)
        if history is not None:
            self._histories.move_to_end(key)
            return history
        limits = self.cfg.agent_loop
        history = History(limits.history_messages, limits.history_bytes)
        for entry in await asyncio.to_thread(self._read_history, key, message.id):
            history.add(entry)
        self._histories[key] = history
        while len(self._histories) > ACTIVE_SESSIONS:
            self._histories.popitem(last=False)
        return history

    def _read_history(self, key: str, message_id: str) -> list[dict[str, Any]]:
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
        out: list[dict[str, Any]] = []
        for r in records:
            # A turn starts with a user message, or with what the gateway told the
            # session (a subagent's announce: a system record with an id).
            if r.get("role") != "user" and not (r.get("role") == "system" and r.get("id")):
                continue
            if r.get("id") == message_id:
                break
            out.append({"role": "user", "text": r.get("text", "")})
            for a in answers.get(r.get("id", ""), []):
                if a["role"] == "assistant":
                    out.append({"role": "assistant", "text": a.get("text", ""), "toolCalls": a.get("toolCalls", [])})
                else:
                    out.append({"role": "tool", "toolCallId": a.get("toolCallId", ""), "name": a.get("name", ""), "content": a.get("content", ""), "isError": a.get("isError", False)})
        return out
