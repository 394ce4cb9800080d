"""Names with one owner. The supervisor's own sandboxes (workspaces, subagent runs),
files (`logs/supervisor.log`), owners (`core`) and folders live in a namespace that
no plugin id can enter: a plugin that could call itself `workspace-main` would get
every exec and file call of the agent, and one called `supervisor` would write into
the gateway's own log (tests/test_trust.py::test_reserved_plugin_ids_are_refused).
"""

from __future__ import annotations

# Whole ids the supervisor uses, or that name one of its files or folders.
RESERVED_IDS = frozenset({
    "supervisor", "core", "clawsup", "workspace", "subagent", "warden", "control", "run", "runs",
    "logs", "sandboxes", "sessions", "hosts", "private", "default", "all", "tasks", "notify_on_release", "mcp",
})  # fmt: skip
# Prefixes of the ids the supervisor gives its own sandboxes.
RESERVED_PREFIXES = ("workspace-", "subagent-", "clawsup-", "supervisor-", "core-", "mcp-")


def reserved_reason(plugin_id: str) -> str:
    """Why a plugin may not take this id, or empty when it may."""
    if plugin_id in RESERVED_IDS:
        return f"{plugin_id!r} is reserved for the supervisor's own use"
    for prefix in RESERVED_PREFIXES:
        if plugin_id.startswith(prefix):
            return f"ids starting with {prefix!r} are reserved for the supervisor's own sandboxes"
    return ""


MCP_OWNER_PREFIX = "mcp:"
"""The owner of an MCP server's registrations is `mcp:<id>`: no plugin id holds a colon."""


def owner_label(owner: str) -> str:
    """An owner as a sentence names it: `plugin 'basics'`, `MCP server 'time'`."""
    if owner.startswith(MCP_OWNER_PREFIX):
        return f"MCP server {owner.removeprefix(MCP_OWNER_PREFIX)!r}"
    return f"plugin {owner!r}"
