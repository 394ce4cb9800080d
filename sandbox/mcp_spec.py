"""What one MCP server sandbox runs: the server to start or reach, and which of its
tools are served under which names. Built by the supervisor from the operator's
`mcpServers.<id>` entry (supervisor/sandboxes/mcp_plans.py) and handed to the child
on its start gate, where the sandbox host is the server's MCP client
(sandbox/host/mcp_bridge.py). Shared by both sides; stdlib only.

The naming rule (`served_name`, `picks`) is applied twice: by the host, which serves
only what it picks, and again by the supervisor, which is the judge and registers
only what this rule allows, whatever the host described.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Literal

McpTransport = Literal["stdio", "http"]
"""`stdio`: a command the host starts inside the sandbox. `http`: a remote server
spoken to over streamable HTTP, from inside a sandbox that has the network."""


@dataclass(frozen=True, kw_only=True)
class McpServerSpec:
    server_id: str
    """The key under `mcpServers`, as the operator wrote it."""
    transport: McpTransport
    command: str = ""
    """stdio: the executable, resolved on the supervisor's host to an absolute path
    (or, on the docker backend, a name the image's PATH resolves)."""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict, repr=False)
    """stdio: added to the host's own scrubbed environment for the server process
    only, `${VAR}` already expanded. May hold secrets: never logged."""
    url: str = ""
    """http: the server's endpoint."""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    """http: sent with every request, `${VAR}` already expanded. May hold secrets."""
    prefix: str = ""
    """Each served tool is registered as prefix + the server's name for it."""
    allow: list[str] = field(default_factory=list)
    """The server's tool names (before the prefix) to serve, `*` and `?` wildcards
    allowed; empty serves all that `deny` leaves."""
    deny: list[str] = field(default_factory=list)
    """Never served; beats `allow`."""
    initialize_timeout_s: float = 10.0
    """From the start of the server to the end of `initialize` and the first
    `tools/list`; past it the host kills the server and says so."""
    cancel_grace_s: float = 2.0
    """After `notifications/cancelled`, how long the server has to show it still
    answers (a ping) before the host kills it."""

    @property
    def label(self) -> str:
        """How messages name the server: `MCP server 'time'`."""
        return f"MCP server {self.server_id!r}"

    def served_name(self, tool: str) -> str:
        return self.prefix + tool

    def picks(self, tool: str) -> bool:
        """Whether the server's tool `tool` (its own name, before the prefix) is served."""
        if any(fnmatch.fnmatchcase(tool, p) for p in self.deny):
            return False
        return not self.allow or any(fnmatch.fnmatchcase(tool, p) for p in self.allow)

    def server_name(self, served: str) -> str | None:
        """The server's own name for a served tool name, or None if it is not one."""
        if not served.startswith(self.prefix):
            return None
        tool = served[len(self.prefix) :]
        return tool if tool and self.picks(tool) else None
