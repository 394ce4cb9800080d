"""`anthropic/<model>`: the Messages API through the `anthropic` SDK, with native
`tool_use` and `tool_result` blocks (a failed tool sets `is_error`), streamed. The
SDK retries rate limits and overload with backoff (`maxRetries`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anthropic

from clawsup.sandbox.agent_loop import AssistantMessage, Message, UserMessage
from clawsup.supervisor.tools.spec import ToolSpec
from clawsup.supervisor.agents.providers import ModelReply, ProviderError, TextSink, ToolCall, TurnContext, Usage


class AnthropicProvider:
    def __init__(self, model: str, *, api_key: str, base_url: str | None, max_retries: int, timeout_s: float, max_tokens: int) -> None:
        self.name = f"anthropic/{model}"
        self.model = model
        self.max_tokens = max_tokens
        self.client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout_s)

    async def complete(self, ctx: TurnContext, messages: Sequence[Message], tools: list[ToolSpec], on_text: TextSink | None = None) -> ModelReply:
        kwargs: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "system": ctx.system, "messages": to_anthropic(messages)}
        if tools:
            kwargs["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.input_schema or {"type": "object"}} for t in tools]
        try:
            async with self.client.messages.stream(**kwargs) as stream:
                async for text in stream.text_stream:
                    if on_text is not None and text:
                        await on_text(text)
                final = await stream.get_final_message()
        except anthropic.APIStatusError as e:
            raise ProviderError(f"{self.name}: the API answered {e.status_code}: {_message(e)}") from None
        except anthropic.APIConnectionError as e:
            raise ProviderError(f"{self.name}: cannot reach the API: {e}") from None
        reply = ModelReply(usage=Usage(final.usage.input_tokens, final.usage.output_tokens))
        for block in final.content:
            if block.type == "text":
                reply.text += block.text
            elif block.type == "tool_use":
                reply.tool_calls.append(ToolCall(id=block.id, name=block.name, args=dict(block.input or {})))
        return reply


def to_anthropic(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The loop's messages to Messages API turns: roles alternate, tool results travel in
    a user turn as `tool_result` blocks."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if isinstance(m, UserMessage):
            add("user", [{"type": "text", "text": m.text}])
        elif isinstance(m, AssistantMessage):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m.text}] if m.text else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in m.tool_calls]
            if blocks:
                add("assistant", blocks)
        else:
            add("user", [{"type": "tool_result", "tool_use_id": m.call_id, "content": m.content, "is_error": m.is_error}])
    return out


def _message(e: anthropic.APIStatusError) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    err = body.get("error")
    return str((err.get("message") if isinstance(err, dict) else None) or e.message)
