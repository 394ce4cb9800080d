"""What a subagent run's sandbox may ask: the supervisor's side of the run's agent
loop (the loop itself runs in the sandbox, sandbox/host/subagent.py).

Each request arrives on the run's Connect stream, bound to the run (`bind`): the
supervisor knows which run is asking from the stream, never from what the model
wrote. It answers with that run's provider (counting its tokens and model calls),
its tool set (the policy decides each call) and its workspace, counts repeated tool
calls (loop detection is here: the run's loop cannot be trusted to), and writes the
run's session. The conversation the sandbox sends is checked here, since the
sandbox is on the other side of the wall. Created by the gateway; one for all runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawsup.sandbox.agent_loop import Message, UserMessage, message_from_json, message_json
from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.agents.loop_detection import STOPPED
from clawsup.supervisor.agents.providers import ProviderError, TurnContext, tool_specs
from clawsup.supervisor.agents.runs import Origin, Run
from clawsup.supervisor.agents.spawn_tools import SPAWN_TOOLS, WITHHELD, SpawnTools
from clawsup.supervisor.agents.tool_dispatch import ToolDispatch
from clawsup.supervisor.agents.tool_policy import decide
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.messages.session_store import SessionStore
from clawsup.supervisor.sandboxes.child_requests import Service

MAX_MESSAGES = 2000


class RunServices:
    def __init__(self, cfg: ClawsupConfig, *, tools: ToolDispatch, store: SessionStore) -> None:
        self._max_iterations = cfg.agent_loop.max_iterations
        self._max_depth = cfg.agents.defaults.subagents.max_spawn_depth
        self._agents = {a.id: a for a in cfg.agents.entries}
        self._policy = cfg.tools.policy()
        self._tools = tools
        self._store = store

    def bind(self, run: Run, spawn: SpawnTools) -> Mapping[str, Service]:
        """The services of `run`'s sandbox; `spawn` serves its spawn tools (its own
        children)."""

        async def complete(payload: dict[str, Any]) -> dict[str, Any]:
            return await self._complete(run, payload)

        async def tool_call(payload: dict[str, Any]) -> dict[str, Any]:
            return await self._tool_call(run, spawn, payload)

        async def wait(payload: dict[str, Any]) -> dict[str, Any]:
            return await self._wait(run)

        return {"model.complete": complete, "tool.call": tool_call, "runs.wait": wait}

    def tools_of(self, run: Run) -> frozenset[str]:
        """The run's tool set now: its parent's, less what runs never get, under the
        run's own policy (the `subagent` layer included); the spawn tools only while
        another level is allowed."""
        a = self._agents.get(run.agent_id)
        available = {r.name: r.owner for r in self._tools.registry.tools()}
        own = set(decide(self._policy, a.tools if a else None, run.caller(), available).tools) & run.origin.allowed
        tools = own - WITHHELD
        if run.depth < self._max_depth:
            tools |= own & set(SPAWN_TOOLS)
        return frozenset(tools)

    async def _complete(self, run: Run, payload: dict[str, Any]) -> dict[str, Any]:
        if run.model_calls >= self._max_iterations:
            raise PermissionError(f"this run has made its {self._max_iterations} model calls (agentLoop.maxIterations)")
        messages = _messages(payload.get("messages"))
        inserted: list[UserMessage] = []
        while not run.inbox.empty():
            inserted.append(run.inbox.get_nowait())
        warning = run.loops.before_model_call()
        if warning is None:
            raise PermissionError(f"this run was stopped: {STOPPED}")
        inserted += warning
        messages += inserted
        specs = tool_specs(self._tools.registry, sorted(self.tools_of(run)))
        ctx = TurnContext(
            agent_id=run.agent_id,
            session_key=run.child_key,
            system=(
                f"You are a subagent (agent {run.agent_id!r}) working in the background on one task handed to you by "
                f"{run.parent_key}. Do it with your tools; your final answer is reported back as the result."
            ),
        )
        run.model_calls += 1
        try:
            reply = await run.provider.complete(ctx, messages, specs)
        except ProviderError as e:
            raise ClawsupError(f"the model could not answer: {e}") from None
        run.usage += reply.usage
        said = message_json(reply.said())
        await self._record_inserted(run, inserted)
        await self._store.append(run.child_key, {**said, "inReplyTo": run.run_id, "ts": time.time(), "usage": {"in": reply.usage.input_tokens, "out": reply.usage.output_tokens}})
        return {"text": said["text"], "toolCalls": said["toolCalls"], "inserted": [message_json(m) for m in inserted], "childrenRunning": any(c.running for c in run.children)}

    async def _tool_call(self, run: Run, spawn: SpawnTools, payload: dict[str, Any]) -> dict[str, Any]:
        name, call_id, args = payload.get("name"), payload.get("id", ""), payload.get("args", {})
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ValueError("tool.call needs {name: str, args: object}")
        run.loops.record(name, args)
        tools = self.tools_of(run)
        if name not in tools:
            content, is_error = f"tool {name!r} is not available to this subagent run (its tools: {', '.join(sorted(tools)) or 'none'})", True
        else:
            try:
                if name in SPAWN_TOOLS:
                    me = Origin(session_key=run.child_key, agent_id=run.agent_id, caller=run.caller(), allowed=tools, depth=run.depth, run=run)
                    content = await spawn.call(name, args, me)
                else:
                    content = (await self._tools.invoke(name, args, agent=run.agent_id, session=run.child_key, workspace=run.workspace)).text
                is_error = False
            except ClawsupError as e:
                content, is_error = str(e), True
        await self._store.append(run.child_key, {"role": "tool", "toolCallId": call_id, "name": name, "content": content, "isError": is_error, "inReplyTo": run.run_id, "ts": time.time()})
        return {"content": content, "isError": is_error}

    async def _wait(self, run: Run) -> dict[str, Any]:
        if run.inbox.empty() and not any(c.running for c in run.children):
            return {"announces": []}
        announces = [await run.inbox.get()]
        while not run.inbox.empty():
            announces.append(run.inbox.get_nowait())
        await self._record_inserted(run, announces)
        return {"announces": [message_json(m) for m in announces]}

    async def _record_inserted(self, run: Run, messages: list[UserMessage]) -> None:
        """What the supervisor put in the run's conversation (its children's
        reports, a loop warning) goes in its session too."""
        for m in messages:
            await self._store.append(run.child_key, {"role": "system", "text": m.text, "ts": time.time()})


class _ToolCall(BaseModel):
    id: str
    name: str
    args: dict[str, Any]


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant", "tool"]
    text: str = ""
    warning: bool = False
    toolCalls: list[_ToolCall] = Field(default_factory=list)
    toolCallId: str = ""
    name: str = ""
    content: str = ""
    isError: bool = False


def _messages(raw: Any) -> list[Message]:
    """A run's conversation, as its sandbox sends it: checked here, since the sandbox
    is on the other side of the wall."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_MESSAGES:
        raise ValueError(f"messages: a list of 1 to {MAX_MESSAGES} messages")
    try:
        return [message_from_json(_Message.model_validate(m).model_dump()) for m in raw]
    except ValidationError as e:
        raise ValueError(f"messages: {format_validation_error(e)}") from None
