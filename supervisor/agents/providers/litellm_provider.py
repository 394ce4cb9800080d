"""Any other `provider/model`, through `litellm` (OpenAI-style tool calls), streamed.
litellm retries transient failures itself (`maxRetries`). A failed tool's result is
marked in its text, since the OpenAI format has no error flag."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from clawsup.sandbox.agent_loop import AssistantMessage, Message, UserMessage
from clawsup.supervisor.tools.spec import ToolSpec
from clawsup.supervisor.agents.providers import ModelReply, ProviderError, TextSink, ToolCall, TurnContext, Usage


class LiteLLMProvider:
    def __init__(self, model: str, *, api_key: str | None, base_url: str | None, max_retries: int, timeout_s: float, max_tokens: int) -> None:
        self.name = model
        self.model = model
        self.api_key = api_key
        self.base_url = base_url
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens

    async def complete(self, ctx: TurnContext, messages: Sequence[Message], tools: list[ToolSpec], on_text: TextSink | None = None) -> ModelReply:
        import litellm  # slow to import (about a second): only when a model needs it

        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": ctx.system}, *to_openai(messages)],
            "stream": True,
            # The last chunk then carries the usage: every token is counted.
            "stream_options": {"include_usage": True},
            "max_tokens": self.max_tokens,
            "num_retries": self.max_retries,
            "timeout": self.timeout_s,
        }
        if tools:
            kwargs["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema or {"type": "object"}}} for t in tools]
        if self.base_url:
            kwargs["api_base"] = self.base_url
        if self.api_key:
            kwargs["api_key"] = self.api_key
        reply = ModelReply()
        calls: dict[int, dict[str, str]] = {}
        try:
            stream = await litellm.acompletion(**kwargs)
            async for chunk in stream:
                if (usage := getattr(chunk, "usage", None)) is not None:
                    reply.usage = Usage(int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0))
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                if getattr(delta, "content", None):
                    reply.text += delta.content
                    if on_text is not None:
                        await on_text(delta.content)
                for tc in getattr(delta, "tool_calls", None) or []:
                    c = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                    c["id"] = tc.id or c["id"]
                    if tc.function is not None:
                        c["name"] = tc.function.name or c["name"]
                        c["args"] += tc.function.arguments or ""
        except litellm.exceptions.APIError as e:
            raise ProviderError(f"{self.name}: {type(e).__name__}: {getattr(e, 'message', e)}") from None
        except Exception as e:
            if type(e).__module__.startswith("litellm"):
                raise ProviderError(f"{self.name}: {type(e).__name__}: {getattr(e, 'message', e)}") from None
            raise
        for _, c in sorted(calls.items()):
            try:
                args = json.loads(c["args"] or "{}")
            except json.JSONDecodeError:
                args = {"_unparsed": c["args"]}
            reply.tool_calls.append(ToolCall(id=c["id"], name=c["name"], args=args if isinstance(args, dict) else {"value": args}))
        return reply


def to_openai(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The loop's messages to OpenAI-style chat messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, UserMessage):
            out.append({"role": "user", "content": m.text})
        elif isinstance(m, AssistantMessage):
            msg: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args)}} for c in m.tool_calls]
            out.append(msg)
        else:
            out.append({"role": "tool", "tool_call_id": m.call_id, "content": f"ERROR: {m.content}" if m.is_error else m.content})
    return out
