"""What the agent loop and subagent runs need of tool dispatch
(supervisor/tools/dispatch.py): the registry of callable tools, and the one call
path every tool call takes."""

from __future__ import annotations

from typing import Any, Protocol

from clawsup.supervisor.sandboxes.registry import Registry


class ToolOutput(Protocol):
    @property
    def text(self) -> str: ...


class ToolDispatch(Protocol):
    @property
    def registry(self) -> Registry: ...

    async def invoke(self, name: str, args: dict[str, Any], *, agent: str | None = None, session: str | None = None, workspace: str | None = None) -> ToolOutput:
        """One tool call, for `agent` in `session` (from the caller's context, never
        from the model); `workspace` names a subagent run's own workspace sandbox."""
        ...
