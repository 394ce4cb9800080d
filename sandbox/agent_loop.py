"""The agent loop, and the messages it carries: ask the model, run the tools it
calls, feed the results back, until it answers or the iteration limit stops it.

One loop for both kinds of turn. A session's turn runs it in the supervisor
(supervisor/agents/loop.py); a subagent run runs it inside its own sandbox host
(sandbox/host/subagent.py), where it holds nothing worth stealing. So it lives here,
where both sides can import it: stdlib only, no supervisor import. Whatever has an
effect goes through a port the caller plugs in:

  Model      ask the model (the supervisor's port adds the tools a turn may call,
             counts tokens and watches for loops; the host's port is a
             `model.complete` request on its Connect stream)
  Tools      call one tool (the supervisor's port checks the policy first; the
             host's is a `tool.call` request)
  Children   wait for the next announce of a child run (subagent runs only: a run
             answers only after its children have reported)

A port may end the loop early by raising `Stop`; any other exception is the
caller's. `message_json` and `message_from_json` are the one conversion between
these messages and their JSON (the session file's records, the Connect stream's
payloads); each provider translates them to its own wire format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Role = Literal["user", "assistant", "tool"]
UserKind = Literal["message", "announce", "warning"]
Ending = Literal["answered", "stopped", "limit"]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class UserMessage:
    """What the model reads as the user's turn."""

    text: str
    kind: UserKind = "message"
    """`message`: a person's words or a run's task; `announce`: a child run's
    report; `warning`: the supervisor's loop warning (the offline model stops on
    it)."""
    role: Literal["user"] = field(default="user", init=False)


@dataclass(frozen=True)
class AssistantMessage:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    role: Literal["assistant"] = field(default="assistant", init=False)


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = field(default="tool", init=False)


Message = UserMessage | AssistantMessage | ToolResult


def message_json(m: Message) -> dict[str, Any]:
    """The neutral JSON of a message: a session record's conversation fields, and
    the shape that crosses the sandbox wall."""
    if isinstance(m, UserMessage):
        return {"role": "user", "text": m.text, "warning": True} if m.kind == "warning" else {"role": "user", "text": m.text}
    if isinstance(m, AssistantMessage):
        return {"role": "assistant", "text": m.text, "toolCalls": [{"id": c.id, "name": c.name, "args": c.args} for c in m.tool_calls]}
    return {"role": "tool", "toolCallId": m.call_id, "name": m.name, "content": m.content, "isError": m.is_error}


def message_from_json(d: dict[str, Any], *, user: UserKind = "message") -> Message:
    """The message of a neutral JSON object whose types have been checked (by the
    caller: a session record, or a payload validated at the wall). `user` is what a
    user message without the warning flag is (the host knows `inserted` and
    `announces` carry announces)."""
    role = d.get("role")
    if role == "user":
        return UserMessage(str(d.get("text", "")), "warning" if d.get("warning") else user)
    if role == "assistant":
        calls = tuple(ToolCall(str(c["id"]), str(c["name"]), dict(c.get("args") or {})) for c in d.get("toolCalls") or [])
        return AssistantMessage(str(d.get("text") or ""), calls)
    if role == "tool":
        return ToolResult(str(d.get("toolCallId", "")), str(d.get("name", "")), str(d.get("content", "")), bool(d.get("isError", False)))
    raise ValueError(f"not a message role: {role!r}")


@dataclass(frozen=True)
class ModelTurn:
    """What one model call gave the loop."""

    said: AssistantMessage
    inserted: tuple[UserMessage, ...] = ()
    """Shown to the model before it answered, after the messages the loop sent
    (a child's announce, a loop warning): they belong in the conversation there."""
    children_running: bool = False
    """Children of this run are still going: an answer now would leave them
    unreported."""


class Stop(Exception):
    """Raised by a port to end the loop now; the sentence says why."""


class Model(Protocol):
    async def complete(self, messages: Sequence[Message]) -> ModelTurn: ...


class Tools(Protocol):
    async def call(self, call: ToolCall) -> ToolResult: ...


class Children(Protocol):
    async def wait(self) -> list[UserMessage]:
        """The next announces of this run's children (none when none is running)."""
        ...


@dataclass(frozen=True)
class Outcome:
    ending: Ending
    text: str
    """The answer; at the limit, the last thing the model said."""
    model_calls: int
    error: str = ""
    """Why the loop stopped before an answer (`stopped`, `limit`)."""


async def run(messages: list[Message], model: Model, tools: Tools, *, max_iterations: int, children: Children | None = None) -> Outcome:
    """Run the loop on `messages` (which it extends with the conversation) until the
    model answers, a port raises `Stop`, or `max_iterations` model calls are made."""
    calls = 0
    try:
        while calls < max_iterations:
            calls += 1
            turn = await model.complete(messages)
            messages += turn.inserted
            said = turn.said
            if not said.tool_calls:
                if turn.children_running and children is not None:
                    # Our answer would leave children unreported: hear them out first.
                    messages.append(said)
                    messages += await children.wait()
                    continue
                return Outcome("answered", said.text, calls)
            messages.append(said)
            for call in said.tool_calls:
                messages.append(await tools.call(call))
    except Stop as e:
        return Outcome("stopped", "", calls, str(e))
    last = next((m.text for m in reversed(messages) if isinstance(m, AssistantMessage) and m.text), "")
    return Outcome("limit", last, calls, f"stopped after {max_iterations} model calls (agentLoop.maxIterations)")
