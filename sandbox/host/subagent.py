"""A subagent's agent loop, inside its own sandbox host.

The loop holds nothing worth stealing: no API key, no tool, no file of the parent's.
It keeps the conversation and decides what to ask next; everything with an effect
is a request to the supervisor on the Connect stream, which knows who this run is
(from the stream, never from the payload) and judges each request:

  model.complete {messages}      -> {text, toolCalls, inserted, childrenRunning}
      The supervisor adds the tools this run may use and calls the provider, counting
      the tokens. `inserted` are announces of this run's own children that arrived
      since the last call: they were shown to the model before `messages`' reply,
      and belong in the conversation before it.
  tool.call {id, name, args}     -> {content, isError}
  runs.wait {}                   -> {announces}
      The model answered while children of this run are still running: wait for the
      next of their announces (a run reports once its subtree has).

Created by the host server for each RunAgent call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Request = Callable[..., Awaitable[dict[str, Any]]]


@dataclass
class Outcome:
    text: str
    model_calls: int
    error: str = ""


async def run_task(request: Request, task: str, max_iterations: int) -> Outcome:
    messages: list[dict[str, Any]] = [{"role": "user", "text": task}]
    calls = 0
    while calls < max_iterations:
        calls += 1
        reply = await request("model.complete", {"messages": messages}, timeout=None)
        messages += reply.get("inserted", [])
        tool_calls = reply.get("toolCalls") or []
        if not tool_calls:
            if reply.get("childrenRunning"):
                # Our answer would leave children unreported: hear them out first.
                messages.append({"role": "assistant", "text": reply.get("text", ""), "toolCalls": []})
                waited = await request("runs.wait", {}, timeout=None)
                messages += waited.get("announces", [])
                continue
            return Outcome(text=reply.get("text", ""), model_calls=calls)
        messages.append({"role": "assistant", "text": reply.get("text", ""), "toolCalls": tool_calls})
        for c in tool_calls:
            result = await request("tool.call", {"id": c["id"], "name": c["name"], "args": c.get("args", {})}, timeout=None)
            messages.append({"role": "tool", "toolCallId": c["id"], "name": c["name"], "content": result.get("content", ""), "isError": bool(result.get("isError"))})
    last = next((m.get("text", "") for m in reversed(messages) if m["role"] == "assistant" and m.get("text")), "")
    return Outcome(text=last, model_calls=calls, error=f"stopped after {max_iterations} model calls (agentLoop.maxIterations)")
