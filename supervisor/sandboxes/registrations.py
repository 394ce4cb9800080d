"""Which of the tools a plugin's or an MCP server's host described it may hold: each
is judged (a valid name, a readable schema, declared in its manifest or, for an MCP
server, picked by its `mcpServers.<id>` prefix and `tools` rule, not held by another
owner), its schema compiled, and registered; a refusal is named in the sandbox's log
and kept for `clawsup plugins show` / `clawsup mcp list`. The supervisor is the
judge, never the host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loguru import logger

from clawsup.sandbox.manifest import TOOL_NAME_PATTERN
from clawsup.supervisor.errors import RegistrationRefused
from clawsup.supervisor.sandboxes.host_client import UnreadableTool
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.plans import SandboxPlan
from clawsup.supervisor.names import owner_label
from clawsup.supervisor.sandboxes.registry import Kind, Registration, Registry, with_compiled_schemas
from clawsup.supervisor.tools.spec import ToolSpec

# A manifest declares at most 128 tools (sandbox/manifest.py); a Describe that lists
# many more is looked at this far, and its refusals are named this many times.
MAX_DESCRIBED_TOOLS = 1024
MAX_NAMED_REFUSALS = 16


@dataclass(frozen=True)
class Judged:
    """A Describe's tools, each with its compiled registration or why not."""

    verdicts: list[tuple[ToolSpec | UnreadableTool, Registration | str]]
    unnamed: int
    """Described beyond MAX_DESCRIBED_TOOLS: refused without a look."""


class ToolAcceptance:
    """The judge of one sandbox's described tools. Created with its
    SupervisedSandbox, used once per incarnation (between Describe and READY), and
    for an MCP server again at each change of its tool list (`accept_relist`)."""

    def __init__(self, plan: SandboxPlan, registry: Registry, log: SandboxLog) -> None:
        self._plan = plan
        self._registry = registry
        self._log = log
        self._who = owner_label(plan.plugin_id)
        # An MCP server's tools are known at run time only: its spec's rule is the
        # contract, not a manifest.
        self._declared = None if plan.mcp is not None else plan.declared_tools
        self.refusals: dict[str, str] = {}
        """Tool name -> why the registry refused it, from the last Describe accepted."""

    async def judge(self, tools: tuple[ToolSpec | UnreadableTool, ...]) -> Judged:
        """The cheap checks first, on the loop, so that names it may not hold cost no
        compile; the schemas of the rest are compiled in one batch off the loop
        (tests/test_hostile_bounds.py::test_a_plugins_registration_does_not_stall_other_callers).
        Nothing is registered yet: the sandbox may be stopped meanwhile."""
        described = list(tools[:MAX_DESCRIBED_TOOLS])
        screened = [self._screen(spec) for spec in described]
        compiled = iter(await with_compiled_schemas([r for r in screened if isinstance(r, Registration)]))
        verdicts = [(spec, first if isinstance(first, str) else next(compiled)) for spec, first in zip(described, screened)]
        return Judged(verdicts, unnamed=len(tools) - len(described))

    def accept(self, judged: Judged) -> None:
        """Register what may be, and name the refusals. A host that describes a flood
        of names it may not register gets the first few named and the rest counted
        in one line, so that it cannot fill the logs or hold the loop
        (tests/test_trust.py::test_a_flood_of_refused_tools)."""
        refused = []
        for spec, verdict in judged.verdicts:
            why = verdict if isinstance(verdict, str) else self._register(verdict)
            if why is not None:
                refused.append((spec, why))
        self._name_refusals(refused, judged.unnamed)

    def accept_relist(self, judged: Judged) -> int:
        """An MCP server's new tool list in place of its old one, in one synchronous
        step (Registry.replace_owned): a caller finds either list whole, never a mix.
        Refusals are named as at a start. Returns how many tools it now holds."""
        swap = self._registry.replace_owned(self._plan.plugin_id, Kind.TOOL, [v for _, v in judged.verdicts if isinstance(v, Registration)], declared=self._declared)
        late = swap.refused
        refused = [(spec, v if isinstance(v, str) else late[v.name]) for spec, v in judged.verdicts if isinstance(v, str) or v.name in late]
        self._name_refusals(refused, judged.unnamed)
        self._log.event(f"tool list changed: now {swap.held} tool(s); added {_names(swap.added)}; withdrew {_names(swap.removed)}")
        return swap.held

    def _name_refusals(self, refused: list[tuple[ToolSpec | UnreadableTool, str]], unnamed: int) -> None:
        self.refusals = {}
        for spec, why in refused:
            if len(self.refusals) >= MAX_NAMED_REFUSALS:
                unnamed += 1
                continue
            shown = repr(spec.name[:64]) + ("…" if len(spec.name) > 64 else "")
            self.refusals[spec.name[:64]] = why
            said = f"{self._who} may not register tool {shown}: {why}"
            self._log.event(f"refused: {said}")
            logger.warning("{}: {}", self._plan.sandbox_id, said)
        if unnamed:
            line = f"and {unnamed} more tool(s) it described were refused (not named one by one)"
            self.refusals["…"] = line
            self._log.event(line)
            logger.warning("{}: {}", self._plan.sandbox_id, line)

    def _screen(self, spec: ToolSpec | UnreadableTool) -> Registration | str:
        """One described tool as a registration, or why it may not be one (without
        compiling its schema)."""
        if not re.fullmatch(TOOL_NAME_PATTERN, spec.name):
            return "not a valid tool name (letters, digits, _ and -, at most 64)"
        if isinstance(spec, UnreadableTool):
            return spec.problem
        if (mcp := self._plan.mcp) is not None and mcp.server_name(spec.name) is None:
            if not spec.name.startswith(mcp.prefix) or spec.name == mcp.prefix:
                return f"not a tool of MCP server {mcp.server_id!r} under prefix {mcp.prefix!r}"
            return f"not picked by mcpServers.{mcp.server_id}.tools"
        reg = Registration(
            kind=Kind.TOOL,
            name=spec.name,
            owner=self._plan.plugin_id,
            sandbox_id=self._plan.sandbox_id,
            description=spec.description,
            input_schema=spec.input_schema,
        )
        return self._registry.refusal(reg, declared=self._declared) or reg

    def _register(self, reg: Registration) -> str | None:
        """Register one tool, its schema compiled; None when accepted, else why not."""
        try:
            self._registry.register(reg, declared=self._declared)
        except RegistrationRefused as e:
            return e.reason
        return None


def _names(names: list[str]) -> str:
    """A few names for a log line; the rest counted."""
    if not names:
        return "none"
    shown = sorted(names)[:MAX_NAMED_REFUSALS]
    return ", ".join(shown) + (f" and {len(names) - len(shown)} more" if len(names) > len(shown) else "")
