"""A subagent's agent loop, inside its own sandbox host: the one agent loop
(sandbox/agent_loop.py), with ports that are requests on the Connect stream.

The loop holds nothing worth stealing: no API key, no tool, no file of the parent's.
It keeps the conversation and decides what to ask next; everything with an effect
is a request to the supervisor, which knows who this run is (from the stream, never
from the payload) and judges each request:

  model.complete {messages}      -> {text, toolCalls, inserted, childrenRunning}
      The supervisor adds the tools this run may use and calls the provider, counting
      the tokens. `inserted` are announces of this run's own children that arrived
      since the last call (and a loop warning): they were shown to the model before
      `messages`' reply, and belong in the conversation before it.
  tool.call {id, name, args}     -> {content, isError}
  runs.wait {}                   -> {announces}
      The model answered while children of this run are still running: wait for the
      next of their announces (a run reports once its subtree has).

A refusal (`SupervisorRefused`) ends the run; the host server reports it. Created by
the host server for each RunAgent call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from clawsup.sandbox.agent_loop import (
    AssistantMessage,
    Message,
    ModelTurn,
    Outcome,
    ToolCall,
    ToolResult,
    UserMessage,
    message_from_json,
    message_json,
    run,
)

Request = Callable[..., Awaitable[dict[str, Any]]]


def _announces(raw: Any) -> list[UserMessage]:
    out = []
    for d in raw or []:
        m = message_from_json(d, user="announce")
        if isinstance(m, UserMessage):
            out.append(m)
    return out


class _StreamPorts:
    """The loop's model, tools and children: requests to the supervisor."""

    def __init__(self, request: Request) -> None:
        self._request = request

    async def complete(self, messages: Sequence[Message]) -> ModelTurn:
        reply = await self._request("model.complete", {"messages": [message_json(m) for m in messages]}, timeout=None)
        said = message_from_json({"role": "assistant", "text": reply.get("text", ""), "toolCalls": reply.get("toolCalls") or []})
        assert isinstance(said, AssistantMessage)
        return ModelTurn(said, tuple(_announces(reply.get("inserted"))), bool(reply.get("childrenRunning")))

    async def call(self, call: ToolCall) -> ToolResult:
        result = await self._request("tool.call", {"id": call.id, "name": call.name, "args": call.args}, timeout=None)
        return ToolResult(call.id, call.name, str(result.get("content", "")), bool(result.get("isError")))

    async def wait(self) -> list[UserMessage]:
        waited = await self._request("runs.wait", {}, timeout=None)
        return _announces(waited.get("announces"))


async def run_task(request: Request, task: str, max_iterations: int) -> Outcome:
    ports = _StreamPorts(request)
    return await run([UserMessage(task)], ports, ports, max_iterations=max_iterations, children=ports)
