"""How a child and its supervisor find each other: the start gate and the handshake
line. Shared by both sides; stdlib only, because the child reads it before anything
else is imported.

Start gate. The child is started with a pipe on `--gate-fd`. Before it may run any
plugin code it blocks reading that pipe to EOF. The supervisor writes the gate payload
only after it has put the child into its cgroup and applied its rlimits, so no plugin
code runs outside its limits, and the secrets travel there rather than in argv or the
environment (both are readable through /proc).

Handshake line. When the gRPC server listens, the child prints one line on stdout:

    CLAWSUP|1|unix|/path/to/host.sock|grpc

(the go-plugin shape: core protocol version, network, address, protocol). The
supervisor dials only after this line, which avoids gRPC's 1 s reconnect backoff for a
dial that comes too early. Lines before it are plugin noise: logged, not fatal.

Load error line. A plugin that cannot load (no entry file, a SyntaxError, an
ImportError, a raise in `clawsup_register`, tools declared but none registered) fails
the same way every time, so restarting it only delays the verdict. Instead of the
handshake the host prints one line,

    CLAWSUP-LOAD-ERROR|1|{"message": "...", "where": "plugin.py:3"}

and exits with `LOAD_ERROR_EXIT`. The supervisor believes the line only together with
that exit code (a plugin can print anything on stdout), and then goes straight to
`failed` (tests/test_load_errors.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from clawsup.sandbox.mcp_spec import McpServerSpec

MAGIC = "CLAWSUP"
CORE_PROTOCOL_VERSION = 1
TOKEN_METADATA_KEY = "x-clawsup-token"
HOST_TOKEN_METADATA_KEY = "x-clawsup-host-token"


@dataclass(frozen=True, kw_only=True)
class Handshake:
    network: str
    address: str
    protocol: str


class HandshakeError(ValueError):
    pass


LOAD_ERROR_EXIT = 78
"""The host's exit code when the plugin could not load (EX_CONFIG in sysexits.h).
Exit code 3 stays for the host's own unexpected failures."""
SERVICE_FAILED_EXIT = 70
"""The host's exit code when one of the plugin's services raised (EX_SOFTWARE): the
sandbox restarts with its backoff, and the service's error is the death's reason."""
SERVICE_STATE = "service.state"
"""The host's word to the supervisor on the Connect stream that a service raised
(`{"id": ..., "error": ...}`), just before it exits with SERVICE_FAILED_EXIT."""
LOAD_ERROR_MAGIC = "CLAWSUP-LOAD-ERROR"
MAX_LOAD_ERROR_MESSAGE = 2000
MAX_LOAD_ERROR_WHERE = 300
MAX_LOAD_ERROR_LINE = 8 * 1024


@dataclass(frozen=True, kw_only=True)
class LoadError:
    """Why a plugin could not load, as its host saw it."""

    message: str
    """One line: `SyntaxError: invalid syntax (plugin.py, line 3)`,
    `ModuleNotFoundError: No module named 'nope'`, or
    `plugin declares tools weather, forecast but registered none`."""
    where: str = ""
    """The last frame in the plugin's own code, relative to its folder
    (`plugin.py:3`, `plugin.py:12 in clawsup_register`); "" if none."""
    retry: bool = False
    """The failure may pass: an MCP server that exited or did not finish
    `initialize` in time. The supervisor counts it as a crash and restarts with
    backoff (the usual intensity rule) instead of going straight to `failed`."""


def format_load_error(err: LoadError) -> str:
    """One line of ASCII: whatever the plugin's message holds (a newline, U+2028, a
    lone surrogate) is escaped, so that no reader splits it or fails to encode it."""
    message, where = _cut(err.message, MAX_LOAD_ERROR_MESSAGE), _cut(err.where, MAX_LOAD_ERROR_WHERE)
    while True:
        body: dict[str, Any] = {"message": message, "where": where}
        if err.retry:
            body["retry"] = True
        line = f"{LOAD_ERROR_MAGIC}|{CORE_PROTOCOL_VERSION}|" + json.dumps(body, separators=(",", ":"))
        # Escaping can grow a character to 12 bytes; the supervisor cuts stdout lines
        # at 16 KiB (supervisor/sandboxes/log.py), and a cut line would not parse.
        if len(line) <= MAX_LOAD_ERROR_LINE:
            return line
        message, where = _cut(message, len(message) // 2), _cut(where, len(where) // 2)


def parse_load_error(line: str) -> LoadError | None:
    """The load error a line carries, or None when it carries none (any junk)."""
    prefix = f"{LOAD_ERROR_MAGIC}|{CORE_PROTOCOL_VERSION}|"
    line = line.strip()
    if not line.startswith(prefix):
        return None
    try:
        body = json.loads(line[len(prefix) :])
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("message"), str) or not body["message"]:
        return None
    where = body.get("where", "")
    return LoadError(
        message=_cut(body["message"], MAX_LOAD_ERROR_MESSAGE),
        where=_cut(where, MAX_LOAD_ERROR_WHERE) if isinstance(where, str) else "",
        retry=body.get("retry") is True,
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def format_handshake(address: str) -> str:
    return f"{MAGIC}|{CORE_PROTOCOL_VERSION}|unix|{address}|grpc"


def parse_handshake(line: str) -> Handshake:
    parts = line.strip().split("|")
    if len(parts) != 5 or parts[0] != MAGIC:
        raise HandshakeError(f"malformed handshake line {line[:200]!r}")
    if parts[1] != str(CORE_PROTOCOL_VERSION):
        raise HandshakeError(
            f"child speaks core protocol {parts[1]!r}, this supervisor speaks {CORE_PROTOCOL_VERSION}; "
            "the sandbox runtime and the supervisor come from different clawsup versions, reinstall clawsup"
        )
    if parts[2] != "unix" or parts[4] != "grpc":
        raise HandshakeError(f"unsupported transport {parts[2]}/{parts[4]} in handshake")
    return Handshake(network=parts[2], address=parts[3], protocol=parts[4])


SandboxRole = Literal["plugin", "workspace", "subagent", "mcp"]
"""What a sandbox is for: one plugin, an agent's workspace, one subagent run, or one
MCP server (the host is its MCP client)."""


@dataclass(frozen=True, kw_only=True)
class GatePayload:
    """What the supervisor tells a child on its start gate. The plugin's identity and
    entry come from the manifest the supervisor already judged, so the child needs no
    manifest parser (and no pydantic) of its own."""

    sandbox_id: str
    supervisor_token: str
    host_token: str
    plugin_id: str
    plugin_version: str
    entry: str
    plugin_config: dict[str, Any]
    run_as: tuple[int, int] | None = None
    """(uid, gid) the child drops to, itself, before any plugin code runs."""
    role: SandboxRole = "plugin"
    """`plugin`: load the plugin at --plugin-dir. `workspace`: serve the core exec
    and file tools on the workspace (the cwd) instead; no plugin code at all.
    `subagent`: a workspace host that also runs one subagent's loop (RunAgent).
    `mcp`: the MCP client of the server `mcp` names, serving its tools; no plugin."""
    workspace_tools: dict[str, Any] = field(default_factory=dict)
    """For `workspace`: shell, kill_grace_s, read_max_bytes (see
    sandbox/host/server.py serve)."""
    tools: list[str] | None = None
    """For `plugin`: the only tool names the host may serve (its manifest's contract,
    less names the supervisor will refuse). A registration outside it never leaves
    the host; None (a workspace or subagent host) means the role's own."""
    subreaper: bool = False
    """Keep orphans below the host (PR_SET_CHILD_SUBREAPER) and end them at shutdown:
    set where no cgroup holds the sandbox's processes. A workspace host always is one
    (its commands' orphans are its to kill)."""
    rlimits: dict[str, int] = field(default_factory=dict)
    """`RLIMIT_*` name -> value (soft = hard). The launcher also sets them from
    outside with prlimit where it may; the child sets them on itself before any
    plugin code runs, which needs no privilege (lowering a limit never does)."""

    mcp: McpServerSpec | None = None
    """For `mcp`: the server, and which of its tools are served under which names."""

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> GatePayload:
        d = json.loads(raw)
        if d.get("run_as") is not None:
            d["run_as"] = tuple(d["run_as"])
        if d.get("mcp") is not None:
            d["mcp"] = McpServerSpec(**d["mcp"])
        return cls(**d)
