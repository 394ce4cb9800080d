"""The agent loop: one turn of a routed message.

1. load the session's history (up to this message);
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
but the registry.
"""

from __future__ import annotations

import os
import time
from typing import Any

from loguru import logger

from supervisor.bus import InboundMessage
from supervisor.config import AgentEntry, ClawsupConfig
from supervisor.dispatcher import Answer, Progress
from supervisor.errors import ClawsupError, ConfigError
from supervisor.loop_detection import STOPPED, WARNING, LoopWatch
from supervisor.providers import ModelReply, Provider, ProviderError, TurnContext, Usage, tool_specs
from supervisor.providers.offline import OfflineProvider
from supervisor.routing import Route
from supervisor.session_store import SessionStore
from supervisor.subagents import SPAWN_TOOLS, Origin, Subagents
from supervisor.tool_policy import Caller, Decision, decide

OWNER_CHANNELS = frozenset({"cli"})
"""The operator's own channels: whoever uses them is an owner."""


def model_of(cfg: ClawsupConfig, agent: AgentEntry | None) -> str:
    m: Any = (agent.model if agent else None) or cfg.agents.defaults.model or "offline"
    if isinstance(m, dict):
        m = m.get("primary") or "offline"
    return str(m).strip()


def make_provider(model: str, cfg: ClawsupConfig, *, source: str = "config") -> Provider:
    if model == "offline":
        return OfflineProvider()
    if model.startswith("anthropic/"):
        from supervisor.providers.anthropic_provider import AnthropicProvider

        p = cfg.providers.anthropic
        key = os.environ.get(p.api_key_env or "ANTHROPIC_API_KEY", "")
        if not key:
            raise ConfigError(source, [f"model {model!r} needs ${p.api_key_env or 'ANTHROPIC_API_KEY'} (providers.anthropic.apiKeyEnv)"])
        return AnthropicProvider(model.split("/", 1)[1], api_key=key, base_url=p.base_url, max_retries=p.max_retries, timeout_s=p.timeout_seconds, max_tokens=p.max_tokens)
    if "/" not in model:
        raise ConfigError(source, [f"model {model!r}: expected `offline`, `anthropic/<model>` or `<provider>/<model>`"])
    from supervisor.providers.litellm_provider import LiteLLMProvider

    p = cfg.providers.litellm
    key = os.environ.get(p.api_key_env, "") if p.api_key_env else None
    return LiteLLMProvider(model, api_key=key or None, base_url=p.base_url, max_retries=p.max_retries, timeout_s=p.timeout_seconds, max_tokens=p.max_tokens)


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
        used = Usage()

        def answer(text: str, last: Usage | None = None) -> Answer:
            record = {"turnUsage": {"in": used.input_tokens, "out": used.output_tokens}}
            if last is not None:
                record["usage"] = {"in": last.input_tokens, "out": last.output_tokens}
            return Answer(text, record)

        provider = self.provider(self.model_of(route.agent_id))
        ctx = TurnContext(
            agent_id=route.agent_id,
            session_key=route.session_key,
            system=f"You are agent {route.agent_id!r} of a clawsup gateway. Use the tools you are given when they help; answer briefly.",
            notify=progress,
        )
        messages = self._history(route.session_key, message)
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
            usage = {"in": reply.usage.input_tokens, "out": reply.usage.output_tokens}
            await self.store.append(route.session_key, {**call_record, "inReplyTo": message.id, "ts": time.time(), "usage": usage})
            for call in reply.tool_calls:
                result, is_error = await self._run_tool(call.name, call.args, decision, route, message, progress)
                tool_record = {"role": "tool", "toolCallId": call.id, "name": call.name, "content": result, "isError": is_error}
                messages.append(tool_record)
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

    def _history(self, key: str, message: InboundMessage) -> list[dict[str, Any]]:
        """The conversation up to this message, in conversation order. In the file a
        later message can come before an earlier turn's answer (messages are written
        as they arrive), so each turn's records are gathered by `inReplyTo`."""
        records = self.store.read(key)
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
            out.append({"role": "user", "text": r.get("text", "")})
            if r.get("id") == message.id:
                break
            for a in answers.get(r.get("id", ""), []):
                if a["role"] == "assistant":
                    out.append({"role": "assistant", "text": a.get("text", ""), "toolCalls": a.get("toolCalls", [])})
                else:
                    out.append({"role": "tool", "toolCallId": a.get("toolCallId", ""), "name": a.get("name", ""), "content": a.get("content", ""), "isError": a.get("isError", False)})
        out = out[-self.cfg.agent_loop.history_messages :]
        # A window must not start with tool results whose calls it cut off.
        while out and out[0]["role"] == "tool":
            out.pop(0)
        return out
