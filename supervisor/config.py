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
from typing import Any, Literal

import json5
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from sandbox.manifest import Backend, RestartRequest, SandboxRequest, format_validation_error
from supervisor.errors import ConfigError

BUNDLED_PREFIX = "bundled:"
def _bundled_plugins() -> Path:
    """The bundled plugins: beside this package in a checkout, else the installed
    `clawsup.plugins` folder (found without importing any plugin code)."""
    here = Path(__file__).resolve().parent.parent / "plugins"
    if here.is_dir():
        return here
    import importlib.util

    spec = importlib.util.find_spec("clawsup.plugins")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return here


BUNDLED_PLUGINS = _bundled_plugins()
DEFAULT_CONFIG = Path(__file__).resolve().parent / "default_config.json5"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class _OpenClaw(BaseModel):
    """A part of one of OpenClaw's sections: its key names; keys clawsup does not use
    are kept aside (`model_extra`) rather than refused."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True, frozen=True)


class PluginLoad(_Model):
    paths: list[str] = Field(default_factory=list)
    """Plugin folders: absolute, relative to this config file, or `bundled:NAME`."""


Trust = Literal["untrusted", "trusted"]
PluginBackend = Literal["auto", "process", "bwrap", "docker"]


class RestartGrant(RestartRequest):
    """The operator's restart policy. Floors (with the one on the period that
    supervisor/plans.py computes from the backoff) so that a crash loop always spends
    its budget and ends in `failed`: a 1 ms period never would."""

    max_restarts: int | None = Field(default=None, ge=0, le=1000)
    period_seconds: float | None = Field(default=None, ge=1, le=86_400)
    backoff_initial_seconds: float | None = Field(default=None, ge=0.05, le=3600)
    backoff_max_seconds: float | None = Field(default=None, ge=0.05, le=3600)


class SandboxGrant(SandboxRequest):
    """What the operator grants one plugin (`plugins.entries.<id>.sandbox`)."""

    backend: PluginBackend | None = None  # type: ignore[assignment]
    restart: RestartGrant | None = None


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


class PluginsConfig(_Model):
    load: PluginLoad = Field(default_factory=PluginLoad)
    entries: dict[str, PluginEntry] = Field(default_factory=dict)


class SandboxDefaults(_Model):
    backend: PluginBackend = "auto"
    """`auto`: bwrap where it works, else docker where an engine and the image are
    there; a trusted plugin may also fall back to `process`, an untrusted one never
    does (it is refused at start, with the reason)."""
    network: bool = False
    """Whether plugins get the network; a manifest that asks for it without this
    grant (here or in `plugins.entries.<id>.sandbox`) runs without it."""
    call_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    memory_mb: int = Field(default=512, ge=32)
    cpu_seconds: int = Field(default=600, ge=1)
    max_processes: int = Field(default=64, ge=8)
    max_open_files: int = Field(default=256, ge=32)
    max_file_size_mb: int = Field(default=64, ge=1)
    cpus: float = Field(default=1.0, gt=0, le=64)
    max_workspace_mb: int = Field(default=1024, ge=1)
    """The most a plugin's workspace may hold; past it the sandbox is killed
    (`disk limit`), as for its memory limit."""
    tmp_mb: int = Field(default=64, ge=1, le=65536)
    """The size of a plugin's private /tmp and /dev/shm (bwrap, docker)."""
    restart: RestartGrant = Field(
        default_factory=lambda: RestartGrant(
            max_restarts=5, period_seconds=60.0, backoff_initial_seconds=0.5, backoff_max_seconds=30.0
        )
    )


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

    first: int = Field(default=1_900_000_000, ge=1000, le=2**31 - 2)
    count: int = Field(default=1_000_000, ge=16, le=2**30)
    registry: str = "/var/lib/clawsup/uids.json"

    @model_validator(mode="after")
    def _in_range(self) -> UidConfig:
        if self.first + self.count > 2**31 - 1:
            raise ValueError("first + count: must stay below 2**31 - 1 (some tools mishandle larger uids)")
        return self


class SandboxConfig(_Model):
    defaults: SandboxDefaults = Field(default_factory=SandboxDefaults)
    # Floors: a 1 ms heartbeat or handshake turns supervision into a busy loop, or
    # kills every child before it can start.
    handshake_timeout_seconds: float = Field(default=10.0, ge=0.5, le=600)
    heartbeat_interval_seconds: float = Field(default=2.0, ge=0.1, le=600)
    heartbeat_timeout_seconds: float = Field(default=1.0, ge=0.05, le=600)
    heartbeat_misses: int = Field(default=2, ge=1, le=100)
    """Consecutive unanswered health checks before a child counts as hung and is killed."""
    stop_grace_seconds: float = Field(default=2.0, ge=0.1, le=60)
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
    it meets the workspace sandbox (see supervisor/exec_screen.py)."""

    timeout_seconds: float = Field(default=60.0, gt=0)
    """A command's deadline when the call does not ask for one."""
    max_timeout_seconds: float = Field(default=600.0, gt=0)
    """The longest deadline a call may ask for."""
    # At most 8 MiB: half of it (the head, or the marker and tail) travels in one
    # message, and the supervisor takes at most 4 MiB in one (supervisor/host_client.py).
    max_output_bytes: int = Field(default=64 * 1024, ge=1024, le=8 * 1024 * 1024)
    """Output beyond this keeps its head and tail, with a marker between them."""
    kill_grace_seconds: float = Field(default=2.0, gt=0, le=60)
    """From SIGTERM to SIGKILL when a command outlives its deadline."""
    shell: str = Field(default="/bin/sh", min_length=1)
    deny_defaults: bool = True
    """Keep the built-in rules (supervisor/exec_screen.py DEFAULT_RULES)."""
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
    # OpenClaw's tool policy (supervisor/tool_policy.py has the layers and their order).
    profile: ToolProfile | None = None
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    also_allow: list[str] = Field(default_factory=list)
    by_provider: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by_channel: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by_sender: dict[str, dict[str, Any]] = Field(default_factory=dict)
    owner_only: list[str] = Field(default_factory=list)
    """Tools only an owner may see and call."""
    sandbox: dict[str, Any] = Field(default_factory=dict)
    """`sandbox.tools.allow/deny`: the policy's sandbox layer."""
    subagents: dict[str, Any] = Field(default_factory=dict)
    """`subagents.tools.allow/deny`: the policy's layer for subagent runs."""
    owners: list[str] = Field(default_factory=list)
    """Owners, as `channel:peerId` (the cli channel's operator always is one)."""

    def policy(self) -> dict[str, Any]:
        """The policy keys as OpenClaw spells them, for tool_policy.decide."""
        return self.model_dump(by_alias=True, exclude={"exec", "fs", "agent_to_agent"})


WorkspaceBackend = Literal["auto", "process", "bwrap", "docker"]


class AgentSandboxOverride(_OpenClaw):
    backend: WorkspaceBackend | None = None
    """Where this agent's subagent runs live (default: `agents.defaults.sandbox.backend`)."""


class AgentSandboxConfig(_OpenClaw):
    """Where an agent's exec and file tools run (OpenClaw's `agents.defaults.sandbox`)."""

    scope: Literal["agent", "session", "shared"] = "agent"
    """One workspace sandbox per agent, per session, or one for everything."""
    backend: WorkspaceBackend = "auto"
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
    max_workspace_mb: int = Field(default=4096, ge=1)
    tmp_mb: int = Field(default=256, ge=1, le=65536)
    memory_mb: int = Field(default=1024, ge=64)
    max_processes: int = Field(default=256, ge=16)
    max_file_size_mb: int = Field(default=256, ge=1)
    cpu_seconds: int = Field(default=3600, ge=1)
    idle_stop_seconds: float = Field(default=600.0, gt=0)
    """A per-session workspace sandbox with no call for this long is stopped (its
    files stay); the next call starts it again."""


class SubagentsConfig(_OpenClaw):
    """Background runs handed off with `sessions_spawn` (supervisor/subagents.py)."""

    max_spawn_depth: int = Field(default=1, ge=1, le=5)
    """How deep runs may nest: at 1 a subagent cannot spawn; at 2 its children are
    leaves."""
    max_children_per_agent: int = Field(default=5, ge=1, le=50)
    """Runs one session (or one run) may have going at once."""
    run_timeout_seconds: float = Field(default=600.0, gt=0, le=86_400)
    """A run's limit when the spawn does not give `runTimeoutSeconds`."""
    max_run_timeout_seconds: float = Field(default=3600.0, gt=0, le=86_400)
    """The most `runTimeoutSeconds` a spawn may ask for."""
    model: str | dict[str, Any] | None = None
    """The subagents' model when the spawn names none (default: the target agent's)."""
    workspace: Literal["inherit", "fresh"] = "inherit"
    """Where a run's file and exec tools work: the spawning session's workspace
    sandbox, or a fresh one for the run, removed with it."""
    start_timeout_seconds: float = Field(default=30.0, gt=0)
    """For the run's sandbox host to come up (counted in the run's timeout too)."""


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


PeerKind = Literal["direct", "dm", "group", "channel"]


class PeerMatch(_OpenClaw):
    kind: PeerKind
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

    @model_validator(mode="after")
    def _needs_token(self) -> HttpChannelConfig:
        if self.enabled and not (self.token or self.token_env):
            raise ValueError("an enabled http channel needs `token` (16+ characters) or `tokenEnv`")
        return self


class ChannelsConfig(_Model):
    cli: CliChannelConfig = Field(default_factory=CliChannelConfig)
    http: HttpChannelConfig = Field(default_factory=HttpChannelConfig)


class SessionStoreConfig(_Model):
    fsync: Literal["always", "interval", "never"] = "always"
    """When an appended message is forced to disk. Every message is written before
    it is acknowledged, so a killed supervisor loses nothing acknowledged with any
    of these; `always` also survives a power cut (at a cost per message), `interval`
    loses at most `fsyncIntervalMs` of them then."""
    fsync_interval_ms: int = Field(default=200, ge=1, le=60_000)


class BusConfig(_Model):
    inbound_capacity: int = Field(default=1000, ge=1)
    """Messages waiting for their session; a full queue makes channels wait."""
    outbound_capacity: int = Field(default=1000, ge=1)
    session_queue: int = Field(default=100, ge=1)
    """Messages waiting in one session behind its turn in flight."""


class ProviderConfig(_Model):
    api_key_env: str | None = None
    """The environment variable with the key (default: the provider's usual one,
    such as ANTHROPIC_API_KEY). Keys never go in this file."""
    base_url: str | None = None
    max_retries: int = Field(default=3, ge=0, le=10)
    """Retries of transient failures (rate limits, overload), with backoff."""
    timeout_seconds: float = Field(default=120.0, gt=0)
    max_tokens: int = Field(default=4096, ge=1)


class ProvidersConfig(_Model):
    anthropic: ProviderConfig = Field(default_factory=ProviderConfig)
    litellm: ProviderConfig = Field(default_factory=ProviderConfig)
    """Every provider that is not `anthropic` or `offline`."""


class LoopDetectionConfig(_Model):
    enabled: bool = True
    same_call_warn: int = Field(default=3, ge=2)
    """The same tool with the same arguments this many times in one turn: the model
    gets a warning."""
    same_call_stop: int = Field(default=5, ge=2)
    """... and this many: the turn stops."""
    same_file_reads_warn: int = Field(default=4, ge=2)
    same_file_reads_stop: int = Field(default=6, ge=2)


class AgentLoopConfig(_Model):
    max_iterations: int = Field(default=12, ge=1, le=200)
    """Model calls per turn, at most."""
    history_messages: int = Field(default=60, ge=1)
    """How much of the session the model sees."""
    loop_detection: LoopDetectionConfig = Field(default_factory=LoopDetectionConfig)


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
    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True, frozen=True)


# Top-level sections of an openclaw.json that clawsup does not read (yet): accepted,
# named in the start-up warning. Anything else unknown at the top is a typo.
OPENCLAW_SECTIONS = frozenset({"models", "gateway", "messages", "commands", "hooks", "skills", "browser", "ui", "wizard", "logging", "env", "auth", "cron", "web", "talk", "meta", "diagnostics", "update", "discovery", "canvasHost", "broadcast", "audio", "approvals", "nodeHost"})


def ignored_keys(model: BaseModel, path: str = "") -> list[str]:
    """Keys of the config that were accepted but mean nothing to clawsup."""
    out = [f"{path}{k}" for k in (model.model_extra or {})]
    for name, field in type(model).model_fields.items():
        key = f"{path}{field.alias or name}"
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out += ignored_keys(value, key + ".")
        elif isinstance(value, list):
            out += [k for i, v in enumerate(value) if isinstance(v, BaseModel) for k in ignored_keys(v, f"{key}[{i}].")]
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
        raise ConfigError(source, format_validation_error(e).split("; ")) from e


def resolve_plugin_path(entry: str, base: Path) -> Path:
    if entry.startswith(BUNDLED_PREFIX):
        return BUNDLED_PLUGINS / entry[len(BUNDLED_PREFIX) :]
    p = Path(entry).expanduser()
    return (p if p.is_absolute() else base / p).resolve()
