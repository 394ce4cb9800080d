"""Model providers behind one small interface. The agent loop speaks a neutral message
shape; each provider translates it to its wire format with the provider's own SDK
(no framework between the loop and the SDKs).

Neutral messages:
  {"role": "user", "text": ...}
  {"role": "assistant", "text": ..., "toolCalls": [{"id", "name", "args"}]}
  {"role": "tool", "toolCallId", "name", "content", "isError"}
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.sandboxes.registry import Kind, Registry
from clawsup.supervisor.tools.spec import ToolSpec


def tool_specs(registry: Registry, names: Iterable[str]) -> list[ToolSpec]:
    """What the model is shown of `names`: those still registered, in that order."""
    out = []
    for name in names:
        reg = registry.get(Kind.TOOL, name)
        if reg is not None:
            out.append(ToolSpec(name=reg.name, description=reg.description, input_schema=reg.input_schema))
    return out


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict[str, Any]


@dataclass
class Usage:
    """Tokens of one model call, as the provider counted them."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __iadd__(self, other: Usage) -> Usage:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        return self


@dataclass
class ModelReply:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, kw_only=True)
class TurnContext:
    agent_id: str
    session_key: str
    system: str
    notify: TextSink | None = None
    """A progress note for the user while the model works (not part of the answer)."""


TextSink = Callable[[str], Awaitable[None]]


class ProviderError(ClawsupError):
    """The model provider failed after its retries; the message says how."""

    code = "provider_error"


class Provider(Protocol):
    name: str

    async def complete(self, ctx: TurnContext, messages: list[dict[str, Any]], tools: list[ToolSpec], on_text: TextSink | None = None) -> ModelReply: ...
