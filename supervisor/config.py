"""`clawsup.json` (JSON5): one pydantic tree, errors that name the key path.

`agents`, `bindings`, `session` and `tools` keep OpenClaw's key names and meanings,
and `plugins` its shape (`plugins.load.paths`, `plugins.entries.<id>`), so those
sections of an `openclaw.json` work unchanged: keys of them that clawsup does not use
are accepted and named in a warning at start (`ignored_keys`). `sandbox`, `channels`
and `sessionStore` are ours, and strict.
"""

from __future__ import annotations

from pathlib import Path
import re
from typing import Annotated, Any, Literal

import json5
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from clawsup.sandbox import offers
from clawsup.sandbox.launch.launcher import BackendChoice
from clawsup.sandbox.manifest import RestartRequest, SandboxRequest, format_validation_error
from clawsup.supervisor.errors import ConfigError

BUNDLED_PREFIX = "bundled:"
def _bundled_plugins() -> Path:
    """The bundled plugins, `clawsup.plugins`: beside `clawsup.supervisor` both in a
    checkout (plugins/ beside supervisor/) and in an installed package, because the
    namespace mirrors the repository's folders. Found without importing plugin code."""
    return Path(__file__).resolve().parent.parent / "plugins"


BUNDLED_PLUGINS = _bundled_plugins()
DEFAULT_CONFIG = Path(__file__).resolve().parent / "default_config.json5"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class _OpenClaw(BaseModel):
    """A part of one of OpenClaw's sections: its key names; keys clawsup does not use
    are kept aside (`model_extra`) rather than refused."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True, frozen=True)


# Every number in the config has a floor and a ceiling, each defined once here. The
# floors keep supervision working (a 1 ms heartbeat is a busy loop, a 1 ms restart
# period never spends its budget); the ceilings keep every wait finite (a stop grace of
# a day would hold a shutdown for a day) and catch a number in the wrong unit, bytes or
# KiB where MiB is meant. A value outside them is a ConfigError that names the key
# path, the value and the bound (`_problems`).
MINUTE, HOUR, DAY = 60, 3600, 86_400
MAX_RAM_MB = 65_536
"""Memory, and tmpfs (which is memory), for one sandbox: past 64 GiB it is a unit slip."""

# Durations, in seconds.
GraceSeconds = Annotated[float, Field(ge=0.1, le=MINUTE)]
"""One polite step of a stop (Shutdown RPC, then SIGTERM) or of an exec kill before
the harsher one; a stop takes two of them, so at most two minutes."""
StartSeconds = Annotated[float, Field(ge=0.5, le=10 * MINUTE)]
"""For a child to come up; under 0.5 s no Python child gets through its imports."""
HeartbeatIntervalSeconds = Annotated[float, Field(ge=0.1, le=10 * MINUTE)]
HeartbeatTimeoutSeconds = Annotated[float, Field(ge=0.05, le=10 * MINUTE)]
CallSeconds = Annotated[float, Field(ge=0.1, le=HOUR)]
"""One tool call or one model request; longer work is a subagent run."""
RunSeconds = Annotated[float, Field(ge=1, le=DAY)]
"""A shell command's or a subagent run's deadline."""
IdleSeconds = Annotated[float, Field(ge=1, le=7 * DAY)]
BackoffSeconds = Annotated[float, Field(ge=0.05, le=HOUR)]
PeriodSeconds = Annotated[float, Field(ge=1, le=DAY)]

# Sizes, in MiB.
SandboxMemoryMb = Annotated[int, Field(ge=32, le=MAX_RAM_MB)]
"""Under 32 MiB the plugin host's Python does not start."""
WorkspaceMemoryMb = Annotated[int, Field(ge=64, le=MAX_RAM_MB)]
"""A shell and the tools it runs need more than a plugin host."""
TmpMb = Annotated[int, Field(ge=1, le=MAX_RAM_MB)]
FileSizeMb = Annotated[int, Field(ge=1, le=MAX_RAM_MB)]
DiskMb = Annotated[int, Field(ge=1, le=1_048_576)]
"""A workspace's disk, up to 1 TiB (its usage is walked to enforce the limit)."""

# Counts.
SandboxProcesses = Annotated[int, Field(ge=8, le=32_768)]
"""pids.max, docker's pids limit or RLIMIT_NPROC: a plugin host and its threads need
8; 32768 is the classic pid_max, every pid many machines have."""
WorkspaceProcesses = Annotated[int, Field(ge=16, le=32_768)]
OpenFiles = Annotated[int, Field(ge=32, le=1_048_576)]
"""RLIMIT_NOFILE: setting it above fs.nr_open (1048576 by default) fails."""
CpuSeconds = Annotated[int, Field(ge=1, le=30 * DAY)]
Cpus = Annotated[float, Field(ge=0.01, le=64)]
"""CPUs' worth of time at once; docker's --cpus takes 0.01 at least."""
MaxRestarts = Annotated[int, Field(ge=0, le=1000)]
QueueSize = Annotated[int, Field(ge=1, le=100_000)]
"""Messages held in the supervisor's memory."""
LoopCount = Annotated[int, Field(ge=2, le=1000)]
"""Repeats of one call in a turn; a turn's model calls each may ask for several."""


class PluginLoad(_Model):
    paths: list[str] = Field(default_factory=list)
    """Plugin folders: absolute, relative to this config file, or `bundled:NAME`."""


Trust = Literal["untrusted", "trusted"]


class RestartGrant(RestartRequest):
    """The operator's restart policy. Floors (with the one on the period that
    supervisor/sandboxes/plans.py computes from the backoff) so that a crash loop always spends
    its budget and ends in `failed`: a 1 ms period never would."""

    max_restarts: MaxRestarts | None = None
    period_seconds: PeriodSeconds | None = None
    backoff_initial_seconds: BackoffSeconds | None = None
    backoff_max_seconds: BackoffSeconds | None = None


class SandboxGrant(SandboxRequest):
    """What the operator grants one plugin (`plugins.entries.<id>.sandbox`): the
    limits of `sandbox.defaults`, with the same bounds. (A manifest may ask for more
    than these, and is shown and refused for it, not failed.)"""

    backend: BackendChoice | None = None  # type: ignore[assignment]  # wider than a manifest's: `auto` too
    call_timeout_seconds: CallSeconds | None = None
    memory_mb: SandboxMemoryMb | None = None
    cpu_seconds: CpuSeconds | None = None
    max_processes: SandboxProcesses | None = None
    max_open_files: OpenFiles | None = None
    max_file_size_mb: FileSizeMb | None = None
    cpus: Cpus | None = None
    max_workspace_mb: DiskMb | None = None
    tmp_mb: TmpMb | None = None
    restart: RestartGrant | None = None


MAX_HOOK_TIMEOUT_S = 60.0
DEFAULT_HOOK_TIMEOUT_S = 5.0


class HooksGrant(_Model):
    """What the operator grants a plugin's hooks (`plugins.entries.<id>.hooks`); the
    plugin can set none of it."""

    allow: list[str] = Field(default_factory=list)
    """Hooks that see what others wrote (sandbox/offers.py CONTENT_HOOKS): other
    plugins' tool arguments and results, a session's text. Ungranted, the tool hooks
    see the plugin's own tools alone, and the message and agent hooks are refused."""
    fail_open: bool = False
    """Let a call through when this plugin's gate (`before_tool_call`) errs, overruns
    or is down. The default refuses it: a gate fails closed."""
    timeout_seconds: float = Field(default=DEFAULT_HOOK_TIMEOUT_S, gt=0, le=MAX_HOOK_TIMEOUT_S)
    """Each of its hooks' deadline."""

    @field_validator("allow")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - offers.HOOKS)
        if unknown:
            raise ValueError(f"unknown hook(s) {unknown}; the hooks are {sorted(offers.HOOKS)}")
        return v


class HttpGrant(_Model):
    """`plugins.entries.<id>.http`: what the plugin's HTTP routes may do."""

    allow_plugin_auth: bool = False
    """Serve the plugin's routes that ask `auth: "plugin"` (it checks callers itself,
    a webhook's signature say) without the gateway's token. Refused otherwise."""
    timeout_seconds: float = Field(default=10.0, gt=0, le=MAX_HOOK_TIMEOUT_S)
    """Each request's deadline."""


class PluginEntry(_Model):
    enabled: bool = True
    trust: Trust = "untrusted"
    """The operator's word, never the manifest's: an untrusted plugin runs only on an
    isolating backend (bwrap, docker); `trusted` also allows `process`."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Handed to the plugin, after a check against its manifest's configSchema."""
    sandbox: SandboxGrant = Field(default_factory=SandboxGrant)
    """What the operator grants this plugin, over `sandbox.defaults`. The manifest
    only asks: each limit is the stricter of the two, and backend, network and
    restart are the operator's alone."""
    hooks: HooksGrant = Field(default_factory=HooksGrant)
    http: HttpGrant = Field(default_factory=HttpGrant)
    command_timeout_seconds: float = Field(default=10.0, gt=0, le=MAX_HOOK_TIMEOUT_S)
    """Each of its slash commands' deadline (and a channel's delivery's)."""


MCP_SERVER_ID = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"
"""An MCP server's key; its sandbox is `mcp-<id in lower case>`."""


class McpToolFilter(_Model):
    allow: list[str] = Field(default_factory=list)
    """The server's own tool names (before `toolPrefix`) to serve; `*` and `?`
    wildcards. Empty: every tool `deny` leaves."""
    deny: list[str] = Field(default_factory=list)
    """Never served; beats `allow`."""


McpTransportName = Literal["stdio", "http", "streamable-http", "streamableHttp", "sse"]


class McpServerEntry(BaseModel):
    """One MCP server (`mcpServers.<id>`). The keys Claude Desktop, Cursor and
    Nanobot write (`command`, `args`, `env`, `url`, `headers`, `type`) mean what they
    mean there; clawsup's own sit beside them. Keys of other clients (`autoApprove`,
    `timeout`...) are accepted and named in the start-up warning, so that a pasted
    block loads."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True, frozen=True)

    command: str | None = Field(default=None, min_length=1)
    """stdio: the server's executable, resolved on this host's PATH (or a path)."""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """For the server process only; `${VAR}` and `${VAR:-default}` expand from the
    supervisor's environment for this entry alone."""
    url: str | None = Field(default=None, min_length=1)
    """A remote server, spoken to over streamable HTTP."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request to `url`; `${VAR}` expands as in `env`."""
    type: McpTransportName | None = None
    """What Claude Code and Cursor write; inferred from `command` / `url` when absent."""
    enabled: bool = True
    disabled: bool = False
    """Cline's spelling of `enabled: false`."""
    trust: Trust = "untrusted"
    sandbox: SandboxGrant = Field(default_factory=SandboxGrant)
    """Limits and backend, as for a plugin (`plugins.entries.<id>.sandbox`)."""
    network: bool | None = None
    """The operator's grant. Default: granted for a remote server (`url`), which
    cannot work without it; `sandbox.defaults.network` for a command."""
    tool_prefix: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9_-]{0,32}$")
    """Each tool is registered as this + its name; default `<id>_`."""
    tools: McpToolFilter = Field(default_factory=McpToolFilter)
    call_timeout_seconds: CallSeconds | None = None
    """Each call's deadline; default the sandbox's (`sandbox.defaults.callTimeoutSeconds`)."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerEntry:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either `command` (a server this host starts) or `url` (a remote server), not both or neither")
        if self.type == "sse":
            raise ValueError("type 'sse' (the deprecated HTTP+SSE transport) is not supported; use the server's streamable HTTP endpoint")
        if self.type == "stdio" and self.command is None:
            raise ValueError("type 'stdio' needs `command`")
        if self.type not in (None, "stdio") and self.url is None:
            raise ValueError(f"type {self.type!r} needs `url`")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    @property
    def on(self) -> bool:
        return self.enabled and not self.disabled


class PluginsConfig(_Model):
    load: PluginLoad = Field(default_factory=PluginLoad)
    entries: dict[str, PluginEntry] = Field(default_factory=dict)


class SandboxDefaults(_Model):
    backend: BackendChoice = "auto"
    """`auto`: bwrap where it works, else docker where an engine and the image are
    there; a trusted plugin may also fall back to `process`, an untrusted one never
    does (it is refused at start, with the reason)."""
    network: bool = False
    """Whether plugins get the network; a manifest that asks for it without this
    grant (here or in `plugins.entries.<id>.sandbox`) runs without it."""
    call_timeout_seconds: CallSeconds = 30.0
    memory_mb: SandboxMemoryMb = 512
    cpu_seconds: CpuSeconds = 600
    max_processes: SandboxProcesses = 64
    max_open_files: OpenFiles = 256
    max_file_size_mb: FileSizeMb = 64
    cpus: Cpus = 1.0
    max_workspace_mb: DiskMb = 1024
    """The most a plugin's workspace may hold; past it the sandbox is killed
    (`disk limit`), as for its memory limit."""
    tmp_mb: TmpMb = 64
    """The size of a plugin's private /tmp and /dev/shm (bwrap, docker)."""
    restart: RestartGrant = Field(default_factory=RestartGrant)
    """Unset keys take RestartPolicy's defaults (supervisor/sandboxes/restarts.py),
    their one source."""


# Paths inside a workspace that make the host run code later: read-only to the
# sandbox, refused by the file tools. README "Security model". The whole of .git,
# not only hooks/ and config: git also takes its config and hooks from wherever
# `.git/commondir`, `config.worktree`, `worktrees/` or `modules/` say, and a missing
# `commondir` cannot be pre-made empty (git dies reading it), so only a read-only
# .git leaves the child no file to plant. The sandbox can still read the history;
# committing is for the operator (or a protectedPaths list without ".git").
DEFAULT_PROTECTED_PATHS = (
    ".git", ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile",
    ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".envrc",
)  # fmt: skip


class UidConfig(_Model):
    """Where a root supervisor takes its sandboxes' uids from: a range, and a record
    of who holds which, shared by every clawsup supervisor on the machine."""

    first: int = Field(default=1_900_000_000, ge=1000, le=2**31 - 1 - 16)
    """Above the system's users (1000), with room for the smallest range below 2**31 - 1."""
    count: int = Field(default=1_000_000, ge=16, le=2**30)
    registry: str = "/var/lib/clawsup/uids.json"

    @model_validator(mode="after")
    def _in_range(self) -> UidConfig:
        if self.first + self.count > 2**31 - 1:
            raise ValueError("first + count: must stay below 2**31 - 1 (some tools mishandle larger uids)")
        return self


class SandboxConfig(_Model):
    defaults: SandboxDefaults = Field(default_factory=SandboxDefaults)
    handshake_timeout_seconds: StartSeconds = 10.0
    heartbeat_interval_seconds: HeartbeatIntervalSeconds = 2.0
    heartbeat_timeout_seconds: HeartbeatTimeoutSeconds = 1.0
    heartbeat_misses: int = Field(default=2, ge=1, le=100)
    """Consecutive unanswered health checks before a child counts as hung and is killed."""
    stop_grace_seconds: GraceSeconds = 2.0
    """How long each polite step of a stop (Shutdown RPC, then SIGTERM) may take
    before the next, harsher one."""
    run_as: str = Field(default="auto", min_length=1)
    """Who children run as: `auto` (as `nobody` when the supervisor is root and that
    works, else as the supervisor), `supervisor`, or a user name or uid."""
    env_allowlist: list[str] = Field(default_factory=lambda: ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ"])
    """The only variables of the supervisor's environment a child inherits."""
    protected_paths: list[str] = Field(default_factory=lambda: list(DEFAULT_PROTECTED_PATHS))
    """Workspace-relative paths read-only to every sandbox and refused by the file
    tools (a plugin's own manifest and entry are added for its sandbox)."""
    uids: UidConfig = Field(default_factory=UidConfig)

    @field_validator("protected_paths")
    @classmethod
    def _relative(cls, v: list[str]) -> list[str]:
        out = []
        for i, p in enumerate(v):
            parts = [x for x in p.strip().split("/") if x not in ("", ".")]
            if not parts or p.startswith("/") or ".." in parts:
                raise ValueError(f"[{i}]: {p!r} must be a path inside the workspace, such as '.git/hooks'")
            out.append("/".join(parts))
        return out


class ExecToolConfig(_OpenClaw):
    """The `exec` core tool. The deny list is the outer fence only: what slips past
    it meets the workspace sandbox (see supervisor/tools/exec_screen.py)."""

    timeout_seconds: RunSeconds = 60.0
    """A command's deadline when the call does not ask for one."""
    max_timeout_seconds: RunSeconds = 600.0
    """The longest deadline a call may ask for."""
    # At most 8 MiB: half of it (the head, or the marker and tail) travels in one
    # message, and the supervisor takes at most 4 MiB in one (supervisor/sandboxes/host_client.py).
    max_output_bytes: int = Field(default=64 * 1024, ge=1024, le=8 * 1024 * 1024)
    """Output beyond this keeps its head and tail, with a marker between them."""
    kill_grace_seconds: GraceSeconds = 2.0
    """From SIGTERM to SIGKILL when a command outlives its deadline."""
    shell: str = Field(default="/bin/sh", min_length=1)
    deny_defaults: bool = True
    """Keep the built-in rules (supervisor/tools/exec_screen.py DEFAULT_RULES)."""
    deny: dict[str, re.Pattern[str]] = Field(default_factory=dict)
    """More rules: a name (shown in refusals) -> a regex, searched in each simple
    command after normalisation (wrappers such as sudo/env peeled off)."""
    allow: list[re.Pattern[str]] = Field(default_factory=list)
    """When set, every simple command must match one of these."""


class AgentToAgentConfig(_OpenClaw):
    """Which other agents a session may hand work to (`sessions_spawn` with an
    `agentId` that is not its own agent)."""

    enabled: bool = False
    allow: list[str] = Field(default_factory=list)
    """Agent ids (globs work; `*` is any)."""


class FsToolsConfig(_OpenClaw):
    read_max_bytes: int = Field(default=256 * 1024, ge=1024, le=2 * 1024 * 1024)
    """The most `read` returns in one call; larger files are read with offset/limit."""


ToolProfile = Literal["minimal", "coding", "messaging", "full"]


class ToolsConfig(_OpenClaw):
    exec: ExecToolConfig = Field(default_factory=ExecToolConfig)
    fs: FsToolsConfig = Field(default_factory=FsToolsConfig)
    agent_to_agent: AgentToAgentConfig = Field(default_factory=AgentToAgentConfig)
    # OpenClaw's tool policy (supervisor/agents/tool_policy.py has the layers and their order).
    profile: ToolProfile | None = None
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    also_allow: list[str] = Field(default_factory=list)
    by_provider: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by_channel: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by_sender: dict[str, dict[str, Any]] = Field(default_factory=dict)
    owner_only: list[str] = Field(default_factory=lambda: ["group:automation"])
    """Tools only an owner may see and call. By default the automation tools (`cron`):
    a list given here replaces that default."""
    sandbox: dict[str, Any] = Field(default_factory=dict)
    """`sandbox.tools.allow/deny`: the policy's sandbox layer."""
    subagents: dict[str, Any] = Field(default_factory=dict)
    """`subagents.tools.allow/deny`: the policy's layer for subagent runs."""
    owners: list[str] = Field(default_factory=list)
    """Owners, as `channel:peerId` (the cli channel's operator always is one)."""

    def policy(self) -> dict[str, Any]:
        """The policy keys as OpenClaw spells them, for tool_policy.decide."""
        return self.model_dump(by_alias=True, exclude={"exec", "fs", "agent_to_agent"})


class AgentSandboxOverride(_OpenClaw):
    backend: BackendChoice | None = None
    """Where this agent's subagent runs live (default: `agents.defaults.sandbox.backend`)."""


class AgentSandboxConfig(_OpenClaw):
    """Where an agent's exec and file tools run (OpenClaw's `agents.defaults.sandbox`)."""

    scope: Literal["agent", "session", "shared"] = "agent"
    """One workspace sandbox per agent, per session, or one for everything."""
    backend: BackendChoice = "auto"
    """`auto`: bwrap when it works on this machine, else docker; else, only when
    `processFallback` allows it, process (said at start and in status: the process
    backend is not a security boundary). A named backend that cannot work here is a
    config error."""
    process_fallback: bool = False
    """Let `auto` fall back to the process backend when no isolating backend works
    here. The bundled default config sets it so that a fresh machine starts; the
    model's commands then run unconfined."""
    network: bool = False
    """Only bwrap and docker can take the network away; process always has it."""
    max_workspace_mb: DiskMb = 4096
    tmp_mb: TmpMb = 256
    memory_mb: WorkspaceMemoryMb = 1024
    max_processes: WorkspaceProcesses = 256
    max_file_size_mb: FileSizeMb = 256
    cpu_seconds: CpuSeconds = 3600
    idle_stop_seconds: IdleSeconds = 600.0
    """A per-session workspace sandbox with no call for this long is stopped (its
    files stay); the next call starts it again."""


class SubagentsConfig(_OpenClaw):
    """Background runs handed off with `sessions_spawn` (supervisor/agents/subagents.py)."""

    max_spawn_depth: int = Field(default=1, ge=1, le=5)
    """How deep runs may nest: at 1 a subagent cannot spawn; at 2 its children are
    leaves."""
    max_children_per_agent: int = Field(default=5, ge=1, le=50)
    """Runs one session (or one run) may have going at once."""
    run_timeout_seconds: RunSeconds = 600.0
    """A run's limit when the spawn does not give `runTimeoutSeconds`."""
    max_run_timeout_seconds: RunSeconds = 3600.0
    """The most `runTimeoutSeconds` a spawn may ask for."""
    model: str | dict[str, Any] | None = None
    """The subagents' model when the spawn names none (default: the target agent's)."""
    workspace: Literal["inherit", "fresh"] = "inherit"
    """Where a run's file and exec tools work: the spawning session's workspace
    sandbox, or a fresh one for the run, removed with it."""
    start_timeout_seconds: StartSeconds = 30.0
    """For the run's sandbox host to come up (counted in the run's timeout too)."""

    @model_validator(mode="after")
    def _default_within_max(self) -> SubagentsConfig:
        # Else every spawn that gives no runTimeoutSeconds would be refused. A config
        # that only lowers the maximum takes the default down with it, as exec's does.
        if self.run_timeout_seconds > self.max_run_timeout_seconds:
            if "run_timeout_seconds" not in self.model_fields_set:
                self.__dict__["run_timeout_seconds"] = self.max_run_timeout_seconds
                return self
            raise ValueError(
                f"runTimeoutSeconds: {_number(self.run_timeout_seconds)} is more than maxRunTimeoutSeconds ({_number(self.max_run_timeout_seconds)})"
            )
        return self


class AgentDefaults(_OpenClaw):
    sandbox: AgentSandboxConfig = Field(default_factory=AgentSandboxConfig)
    subagents: SubagentsConfig = Field(default_factory=SubagentsConfig)
    model: str | dict[str, Any] | None = None
    """`offline` (the default), `anthropic/<model>`, or any `provider/model` litellm
    knows; OpenClaw's `{primary: ...}` form works too."""


_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DEFAULT_AGENT_ID = "main"


class AgentEntry(_OpenClaw):
    id: str = Field(pattern=_ID)
    default: bool = False
    name: str | None = None
    workspace: str | None = None
    model: str | dict[str, Any] | None = None
    tools: dict[str, Any] | None = None
    """This agent's tool policy (allow/deny/profile); applied by the agent loop."""
    sandbox: AgentSandboxOverride | None = None

    @field_validator("id")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.lower()


class AgentsConfig(_OpenClaw):
    defaults: AgentDefaults = Field(default_factory=AgentDefaults)
    entries: list[AgentEntry] = Field(default_factory=list, alias="list")
    """`agents.list` in the file."""

    @model_validator(mode="after")
    def _one_of_each(self) -> AgentsConfig:
        seen: set[str] = set()
        for i, a in enumerate(self.entries):
            if a.id in seen:
                raise ValueError(f"list[{i}].id: agent id {a.id!r} appears twice")
            seen.add(a.id)
        defaults = [a.id for a in self.entries if a.default]
        if len(defaults) > 1:
            raise ValueError(f"list: more than one agent has default: true ({', '.join(defaults)})")
        return self

    def ids(self) -> list[str]:
        return [a.id for a in self.entries] or [DEFAULT_AGENT_ID]

    def default_id(self) -> str:
        """The agent with `default: true`, else the first listed, else `main`."""
        for a in self.entries:
            if a.default:
                return a.id
        return self.entries[0].id if self.entries else DEFAULT_AGENT_ID


PeerKind = Literal["direct", "group", "channel"]
"""A peer's kind, as routing and session keys see it."""
PeerKindSetting = Literal["direct", "dm", "group", "channel"]
"""As a binding may write it: `dm` is `direct`."""


class PeerMatch(_OpenClaw):
    kind: PeerKindSetting
    id: str = Field(min_length=1)


class BindingMatch(_OpenClaw):
    channel: str = Field(min_length=1)
    account_id: str | None = None
    """Omitted: the channel's default account. `"*"`: any account."""
    peer: PeerMatch | None = None
    guild_id: str | None = None
    team_id: str | None = None
    roles: list[str] | None = None
    """With `guildId`: the member must hold at least one of these roles."""


class Binding(_OpenClaw):
    agent_id: str = Field(min_length=1)
    match: BindingMatch


DmScope = Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]


class SessionConfig(_OpenClaw):
    dm_scope: DmScope = "main"
    identity_links: dict[str, list[str]] = Field(default_factory=dict)
    """A canonical peer id -> the channel identities (`channel:peerId`) that are that
    person; used in direct-message session keys when `dmScope` is not `main`."""


class CliChannelConfig(_Model):
    enabled: bool = True


class HttpChannelConfig(_Model):
    enabled: bool = False
    host: Literal["127.0.0.1", "::1", "localhost"] = "127.0.0.1"
    """Loopback only: the endpoint trusts its bearer for identity fields."""
    port: int = Field(default=8787, ge=0, le=65535)
    """0: any free port (written to `<state>/run/http.port`)."""
    token: str | None = Field(default=None, min_length=16)
    token_env: str | None = None
    """Read the token from this environment variable instead (kept out of the file)."""
    account_id: str = "default"
    max_connections: int = Field(default=256, ge=1, le=65_536)
    """Connections open at once; past it a new one is closed at once (a token is
    asked only with a request, so idle connections must not take the gateway's
    descriptors)."""

    @model_validator(mode="after")
    def _needs_token(self) -> HttpChannelConfig:
        if self.enabled and not (self.token or self.token_env):
            raise ValueError("an enabled http channel needs `token` (16+ characters) or `tokenEnv`")
        return self


class PluginChannelConfig(_Model):
    """`channels.<id>` for a channel a plugin serves (its manifest's
    `contracts.channels`): the plugin may speak for it only while it is enabled here."""

    enabled: bool = True
    owners: list[str] = Field(default_factory=list)
    """Sender (or peer) ids, as the channel reports them, who own this gateway: they
    may run owner-only commands and tools. Never the plugin's word."""


class ChannelsConfig(_Model):
    """`cli` and `http` are built in; any other key is a plugin's channel."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True, frozen=True)
    cli: CliChannelConfig = Field(default_factory=CliChannelConfig)
    http: HttpChannelConfig = Field(default_factory=HttpChannelConfig)

    @model_validator(mode="after")
    def _plugin_channels(self) -> ChannelsConfig:
        extra = self.__pydantic_extra__ or {}
        for key, value in list(extra.items()):
            if re.fullmatch(offers.CHANNEL_ID_PATTERN, key) is None:
                raise ValueError(f"{key!r} is not a channel id (lower-case letters, digits, _ and -)")
            try:
                extra[key] = PluginChannelConfig.model_validate(value)
            except ValidationError as e:
                raise ValueError(format_validation_error(e, prefix=key)) from None
        return self

    def plugin_channels(self) -> dict[str, PluginChannelConfig]:
        """The plugin channels the operator configured, by id."""
        return {k: v for k, v in (self.__pydantic_extra__ or {}).items() if isinstance(v, PluginChannelConfig)}


FsyncMode = Literal["always", "interval", "never"]
"""When the session store forces an appended record to disk (supervisor/messages/session_store.py)."""


class SessionStoreConfig(_Model):
    fsync: FsyncMode = "always"
    """When an appended message is forced to disk. Every message is written before
    it is acknowledged, so a killed supervisor loses nothing acknowledged with any
    of these; `always` also survives a power cut (at a cost per message), `interval`
    loses at most `fsyncIntervalMs` of them then."""
    fsync_interval_ms: int = Field(default=200, ge=1, le=60_000)
    max_open_files: int = Field(default=64, ge=4, le=4096)
    """Session files kept open at once; the least recently used is closed past it."""


class BusConfig(_Model):
    inbound_capacity: QueueSize = 1000
    """Messages the gateway holds (handed in, not yet answered); past it channels
    refuse new ones at once (HTTP 429, cli `gateway_busy`)."""
    outbound_capacity: QueueSize = 1000
    session_queue: QueueSize = 100
    """Messages waiting in one session behind its turn in flight; one more is
    refused (HTTP 429, cli `session_busy`) and not written to the session."""


class ProviderConfig(_Model):
    api_key_env: str | None = None
    """The environment variable with the key (default: the provider's usual one,
    such as ANTHROPIC_API_KEY). Keys never go in this file."""
    base_url: str | None = None
    max_retries: int = Field(default=3, ge=0, le=10)
    """Retries of transient failures (rate limits, overload), with backoff."""
    timeout_seconds: CallSeconds = 120.0
    max_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    """Past a million it is no model's output limit."""


class ProvidersConfig(_Model):
    anthropic: ProviderConfig = Field(default_factory=ProviderConfig)
    litellm: ProviderConfig = Field(default_factory=ProviderConfig)
    """Every provider that is not `anthropic` or `offline`."""


class LoopDetectionConfig(_Model):
    enabled: bool = True
    same_call_warn: LoopCount = 3
    """The same tool with the same arguments this many times in one turn: the model
    gets a warning."""
    same_call_stop: LoopCount = 5
    """... and this many: the turn stops."""
    same_file_reads_warn: LoopCount = 4
    same_file_reads_stop: LoopCount = 6


class AgentLoopConfig(_Model):
    max_iterations: int = Field(default=12, ge=1, le=200)
    """Model calls per turn, at most."""
    history_messages: int = Field(default=60, ge=1, le=10_000)
    """How much of the session the model sees."""
    history_bytes: int = Field(default=256 * 1024, ge=4096, le=16 * 1024 * 1024)
    """... at most this much of it (JSON bytes); also what each active session's
    history holds in memory."""
    loop_detection: LoopDetectionConfig = Field(default_factory=LoopDetectionConfig)


class CronConfig(_Model):
    """Scheduled agent turns (supervisor/automation/)."""

    enabled: bool = True
    max_concurrent_runs: int = Field(default=4, ge=1, le=1000)
    """Runs going at once across all jobs; a due run past it waits for a slot."""
    default_timeout_seconds: RunSeconds = 600.0
    """A run's limit when its job gives none."""
    max_jobs: int = Field(default=10_000, ge=1, le=100_000)
    max_jobs_per_agent: int = Field(default=50, ge=0, le=100_000)
    """Jobs an agent may have that it added itself (the `cron` tool); the operator's
    jobs do not count against it."""
    runs_kept: int = Field(default=100, ge=1, le=1000)
    """Run records kept per job (older ones go when the record file is compacted)."""


class HeartbeatConfig(_Model):
    """A periodic turn that reads `HEARTBEAT.md` in the agent's workspace and acts
    only when its "Active tasks" section lists something (supervisor/automation/heartbeat.py)."""

    enabled: bool = False
    every: str = "30m"
    agent: str = "main"
    session: str | None = None
    """The session its turns run in; default: one of its own, `agent:<agent>:heartbeat`."""
    channel: str | None = None
    """Where a beat that has something to tell says it (with `peer`); without, it is
    only recorded."""
    peer: str | None = None
    timeout_seconds: RunSeconds = 300.0
    owner: bool = False
    """Whether its turns speak for an owner (get owner-only tools, such as `cron`).
    Off by default: HEARTBEAT.md is in the workspace, where anyone whose turns may
    run commands there can write the tasks it carries out."""

    @model_validator(mode="after")
    def _checked(self) -> HeartbeatConfig:
        from clawsup.supervisor.automation.schedule import ScheduleError, parse_duration

        try:
            parse_duration(self.every, "every")
        except ScheduleError as e:
            raise ValueError(str(e)) from None
        if (self.channel is None) != (self.peer is None):
            raise ValueError("channel and peer: give both, or neither (the beat is then only recorded)")
        return self


class AutomationConfig(_Model):
    cron: CronConfig = Field(default_factory=CronConfig)
    heartbeat: HeartbeatConfig = Field(default_factory=HeartbeatConfig)


class ClawsupConfig(_Model):
    plugins: PluginsConfig = Field(default_factory=PluginsConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    bindings: list[Binding] = Field(default_factory=list)
    session: SessionConfig = Field(default_factory=SessionConfig)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    session_store: SessionStoreConfig = Field(default_factory=SessionStoreConfig)
    bus: BusConfig = Field(default_factory=BusConfig)
    providers: ProvidersConfig = Field(default_factory=ProvidersConfig)
    agent_loop: AgentLoopConfig = Field(default_factory=AgentLoopConfig)
    automation: AutomationConfig = Field(default_factory=AutomationConfig)
    mcp_servers: dict[Annotated[str, Field(pattern=MCP_SERVER_ID)], McpServerEntry] = Field(default_factory=dict)
    """MCP servers, each in a sandbox of its own (`mcp-<id>`), in the shape Claude
    Desktop, Cursor and Nanobot use."""
    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True, frozen=True)


# Top-level sections of an openclaw.json that clawsup does not read (yet): accepted,
# named in the start-up warning. Anything else unknown at the top is a typo.
OPENCLAW_SECTIONS = frozenset({"models", "gateway", "messages", "commands", "hooks", "skills", "browser", "ui", "wizard", "logging", "env", "auth", "cron", "web", "talk", "meta", "diagnostics", "update", "discovery", "canvasHost", "broadcast", "audio", "approvals", "nodeHost"})


def ignored_keys(model: BaseModel, path: str = "") -> list[str]:
    """Keys of the config that were accepted but mean nothing to clawsup."""
    # A plugin channel (`channels.<id>`) is an extra key the model keeps on purpose.
    out = [f"{path}{k}" for k, v in (model.model_extra or {}).items() if not isinstance(v, PluginChannelConfig)]
    for name, field in type(model).model_fields.items():
        key = f"{path}{field.alias or name}"
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out += ignored_keys(value, key + ".")
        elif isinstance(value, list):
            out += [k for i, v in enumerate(value) if isinstance(v, BaseModel) for k in ignored_keys(v, f"{key}[{i}].")]
        elif isinstance(value, dict):
            out += [k for n, v in value.items() if isinstance(v, BaseModel) for k in ignored_keys(v, f"{key}.{n}.")]
    return out


_TOP_KEYS = {f.alias or n for n, f in ClawsupConfig.model_fields.items()}


def load_config(path: Path) -> ClawsupConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), ["file not found; `clawsup start` without --config uses the bundled default"]) from None
    except OSError as e:
        raise ConfigError(str(path), [f"cannot read: {e.strerror}"]) from e
    return parse_config(text, str(path))


def parse_config(text: str, source: str) -> ClawsupConfig:
    try:
        data = json5.loads(text)
    except ValueError as e:
        raise ConfigError(source, [f"not valid JSON5: {e}"]) from e
    if not isinstance(data, dict):
        raise ConfigError(source, ["<root>: must be an object"])
    unknown = sorted(set(data) - set(_TOP_KEYS) - OPENCLAW_SECTIONS)
    if unknown:
        raise ConfigError(source, [f"{k}: not a clawsup or OpenClaw section (known: {', '.join(sorted(_TOP_KEYS))})" for k in unknown])
    try:
        return ClawsupConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, _problems(e)) from e


_OUT_OF_BOUNDS = {
    "greater_than_equal": ("ge", "is less than the minimum of"),
    "less_than_equal": ("le", "is more than the maximum of"),
    "greater_than": ("gt", "must be more than"),
    "less_than": ("lt", "must be less than"),
}


def _problems(err: ValidationError) -> list[str]:
    """One line per problem, naming the key path as sandbox/manifest.py's
    format_validation_error does; a number out of bounds is said in words with the
    value and the bound (`sandbox.stopGraceSeconds: 100000 is more than the maximum
    of 60`), where pydantic says `Input should be less than or equal to 60`."""
    out = []
    for e in err.errors(include_url=False):
        bound = _OUT_OF_BOUNDS.get(e["type"])
        if bound is None:
            msg = e["msg"].removeprefix("Value error, ")
        else:
            key, words = bound
            value = e["input"]
            msg = "must be a number, not NaN" if value != value else f"{_number(value)} {words} {_number(e['ctx'][key])}"
        out.append(f"{_key_path(e['loc'])}: {msg}")
    return out


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for p in loc:
        path += f"[{p}]" if isinstance(p, int) else (f".{p}" if path else str(p))
    return path or "<root>"


def _number(v: Any) -> str:
    # 60.0 reads as 60; a bool that pydantic took for a number reads as itself.
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v) if isinstance(v, (int, float)) else repr(v)


def resolve_plugin_path(entry: str, base: Path) -> Path:
    if entry.startswith(BUNDLED_PREFIX):
        return BUNDLED_PLUGINS / entry[len(BUNDLED_PREFIX) :]
    p = Path(entry).expanduser()
    return (p if p.is_absolute() else base / p).resolve()
