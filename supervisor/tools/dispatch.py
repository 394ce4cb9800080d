"""Where a tool call is dispatched: the one path every tool call takes (the CLI's,
through the control API; the agent loop's; a subagent run's).

A name goes to its registration: a core tool to its workspace sandbox
(supervisor/tools/workspaces.py), a plugin's tool to the sandbox that registered it.
The arguments are checked against the tool's schema before either
(supervisor/tools/arguments.py): a call that does not fit never reaches a handler.
A declared tool (or an MCP server's name) whose sandbox is not ready says so, with
its last exit.

Created by the gateway (and by scripts/bench.py) once the set of sandboxes and the
workspaces exist; lives as long as they do.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from clawsup.supervisor.errors import ClawsupError, ToolFailed, ToolNotFound
from clawsup.supervisor.sandboxes.calls import CallResult, OutputSink
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.manager import Sandboxes
from clawsup.supervisor.sandboxes.registry import Kind, Registration, Registry
from clawsup.supervisor.tools.arguments import check_arguments_async
from clawsup.supervisor.tools.core import CORE_TOOLS
from clawsup.supervisor.tools.workspaces import Workspaces

if TYPE_CHECKING:
    from clawsup.supervisor.hooks import Hooks


class ToolDispatcher:
    def __init__(self, sandboxes: Sandboxes, workspaces: Workspaces | None, hooks: Hooks | None = None) -> None:
        """`workspaces` None: no core tool can run (a supervisor of plugins only, as in
        scripts/bench.py). `hooks`: the plugins' `before_tool_call` gates and
        `after_tool_call` observers (supervisor/hooks.py), asked on every call."""
        self._sandboxes = sandboxes
        self._workspaces = workspaces
        self._hooks = hooks

    @property
    def registry(self) -> Registry:
        """Every tool that may be called, with its owner and schema."""
        return self._sandboxes.registry

    async def invoke(
        self,
        name: str,
        args: dict[str, Any] | str,
        timeout: float | None = None,
        *,
        agent: str | None = None,
        session: str | None = None,
        workspace: str | None = None,
        on_output: OutputSink | None = None,
    ) -> CallResult:
        """One tool call. `agent` and `session` say who calls (from the caller's
        context, never from the model's arguments); they pick the workspace sandbox
        of the core tools, unless the supervisor names one (`workspace`: a subagent
        run's own)."""
        reg = self.registry.get(Kind.TOOL, name)
        if reg is None:
            for sb in self._sandboxes.sandboxes.values():
                # An MCP server's names are known only while it runs; one of its prefix
                # is taken as its (`time_*` while `mcp-time` restarts).
                ours = name in sb.plan.declared_tools or (sb.plan.mcp is not None and sb.plan.mcp.server_name(name) is not None)
                if ours and sb.lc.state is not SandboxState.READY:
                    raise sb.unavailable()
            raise ToolNotFound(name, [r.name for r in self.registry.tools()])
        if reg.sandbox_id is None:
            if name not in CORE_TOOLS:
                raise ToolFailed(name, reg.owner, "not_routable", "it acts for a session, so only an agent turn can call it")
            if self._workspaces is None:
                raise ToolFailed(name, reg.owner, "not_routable", "this core tool has no sandbox to run in")
        await check_arguments_async(reg, args)  # before dispatch: a call that does not fit never reaches its handler
        hooks = self._hooks
        if hooks is None or not (hooks.declared("before_tool_call") or hooks.declared("after_tool_call")):
            return await self._dispatch(reg, name, args, timeout, agent=agent, session=session, workspace=workspace, on_output=on_output)
        given = json.loads(args) if isinstance(args, str) else args
        changed = await hooks.before_tool_call(name, reg.owner, given, agent=agent, session=session)
        if self.registry.get(Kind.TOOL, name) is not reg:
            # The gates took time; the tool's plugin died or restarted meanwhile, and
            # what was judged (its owner, its schema) may no longer be what would run.
            raise ToolFailed(name, reg.owner, "transport", "its plugin restarted while the call's gates were asked; call it again")
        if changed is not given:
            await check_arguments_async(reg, changed)  # what a gate changed must still fit
        began = time.monotonic()
        try:
            result = await self._dispatch(reg, name, changed, timeout, agent=agent, session=session, workspace=workspace, on_output=on_output)
        except ClawsupError as e:
            hooks.after_tool_call(name, reg.owner, changed, result=None, error=str(e), duration_s=time.monotonic() - began, agent=agent, session=session)
            raise
        hooks.after_tool_call(name, reg.owner, changed, result=result.text, error=None, duration_s=time.monotonic() - began, agent=agent, session=session)
        return result

    async def _dispatch(
        self, reg: Registration, name: str, args: dict[str, Any] | str, timeout: float | None, *,
        agent: str | None, session: str | None, workspace: str | None, on_output: OutputSink | None,
    ) -> CallResult:  # fmt: skip
        if reg.sandbox_id is None:
            assert self._workspaces is not None
            return await self._workspaces.call(name, args, agent=agent, session=session, sandbox_id=workspace, timeout=timeout, on_output=on_output)
        sb = self._sandboxes.sandboxes[reg.sandbox_id]
        args_json = args if isinstance(args, str) else json.dumps(args)
        return await sb.invoke(name, args_json, timeout)
