"""Model providers behind one small interface. The agent loop speaks its typed
messages (clawsup.sandbox.agent_loop: user, assistant with tool calls, tool result);
each provider translates them to its wire format with the provider's own SDK (no
framework between the loop and the SDKs), in one function of its module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from clawsup.sandbox.agent_loop import AssistantMessage, Message, ToolCall
from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.sandboxes.registry import Kind, Registry
from clawsup.supervisor.tools.spec import ToolSpec

__all__ = ["ModelReply", "Provider", "ProviderError", "TextSink", "ToolCall", "TurnContext", "Usage", "tool_specs"]


def tool_specs(registry: Registry, names: Iterable[str]) -> list[ToolSpec]:
    """What the model is shown of `names`: those still registered, in that order."""
    out = []
    for name in names:
        reg = registry.get(Kind.TOOL, name)
        if reg is not None:
            out.append(ToolSpec(name=reg.name, description=reg.description, input_schema=reg.input_schema))
    return out


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

    def said(self) -> AssistantMessage:
        return AssistantMessage(self.text, tuple(self.tool_calls))


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

    async def complete(self, ctx: TurnContext, messages: Sequence[Message], tools: list[ToolSpec], on_text: TextSink | None = None) -> ModelReply: ...
