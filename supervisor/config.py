"""`clawsup.json` (JSON5): one pydantic tree, errors that name the key path.

`plugins` follows OpenClaw's shape (`plugins.load.paths`, `plugins.entries.<id>`), so
a user's plugin list carries over; `sandbox` is ours. Later layers add `agents`,
`bindings`, `session`, `tools`, `channels` and `providers` here.
"""

from __future__ import annotations

from pathlib import Path
import re
from typing import Any, Literal

import json5
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from sandbox.manifest import Backend, RestartRequest, SandboxRequest, format_validation_error
from supervisor.errors import ConfigError

BUNDLED_PREFIX = "bundled:"
BUNDLED_PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
DEFAULT_CONFIG = Path(__file__).resolve().parent / "default_config.json5"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class PluginLoad(_Model):
    paths: list[str] = Field(default_factory=list)
    """Plugin folders: absolute, relative to this config file, or `bundled:NAME`."""


class PluginEntry(_Model):
    enabled: bool = True
    config: dict[str, Any] = Field(default_factory=dict)
    """Handed to the plugin, after a check against its manifest's configSchema."""
    sandbox: SandboxRequest = Field(default_factory=SandboxRequest)
    """The operator's overrides; they win over what the manifest asks for."""


class PluginsConfig(_Model):
    load: PluginLoad = Field(default_factory=PluginLoad)
    entries: dict[str, PluginEntry] = Field(default_factory=dict)


class SandboxDefaults(_Model):
    backend: Backend = "process"
    call_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    memory_mb: int = Field(default=512, ge=32)
    cpu_seconds: int = Field(default=600, ge=1)
    max_processes: int = Field(default=64, ge=8)
    max_open_files: int = Field(default=256, ge=32)
    max_file_size_mb: int = Field(default=64, ge=1)
    restart: RestartRequest = Field(
        default_factory=lambda: RestartRequest(
            max_restarts=5, period_seconds=60.0, backoff_initial_seconds=0.5, backoff_max_seconds=30.0
        )
    )


class SandboxConfig(_Model):
    defaults: SandboxDefaults = Field(default_factory=SandboxDefaults)
    handshake_timeout_seconds: float = Field(default=10.0, gt=0)
    heartbeat_interval_seconds: float = Field(default=2.0, gt=0)
    heartbeat_timeout_seconds: float = Field(default=1.0, gt=0)
    heartbeat_misses: int = Field(default=2, ge=1)
    """Consecutive unanswered health checks before a child counts as hung and is killed."""
    stop_grace_seconds: float = Field(default=2.0, gt=0)
    """How long each polite step of a stop (Shutdown RPC, then SIGTERM) may take
    before the next, harsher one."""
    run_as: str = Field(default="auto", min_length=1)
    """Who children run as: `auto` (as `nobody` when the supervisor is root and that
    works, else as the supervisor), `supervisor`, or a user name or uid."""
    env_allowlist: list[str] = Field(default_factory=lambda: ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ"])
    """The only variables of the supervisor's environment a child inherits."""


class ExecToolConfig(_Model):
    """The `exec` core tool. The deny list is the outer fence only: what slips past
    it meets the workspace sandbox (see supervisor/exec_screen.py)."""

    timeout_seconds: float = Field(default=60.0, gt=0)
    """A command's deadline when the call does not ask for one."""
    max_timeout_seconds: float = Field(default=600.0, gt=0)
    """The longest deadline a call may ask for."""
    max_output_bytes: int = Field(default=64 * 1024, ge=1024, le=64 * 1024 * 1024)
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


class FsToolsConfig(_Model):
    read_max_bytes: int = Field(default=256 * 1024, ge=1024)
    """The most `read` returns in one call; larger files are read with offset/limit."""


class ToolsConfig(_Model):
    exec: ExecToolConfig = Field(default_factory=ExecToolConfig)
    fs: FsToolsConfig = Field(default_factory=FsToolsConfig)


WorkspaceBackend = Literal["auto", "process", "bwrap"]


class AgentSandboxConfig(_Model):
    """Where an agent's exec and file tools run (OpenClaw's `agents.defaults.sandbox`)."""

    scope: Literal["agent", "session", "shared"] = "agent"
    """One workspace sandbox per agent, per session, or one for everything."""
    backend: WorkspaceBackend = "auto"
    """`auto`: bwrap when it works on this machine, else process (with a warning:
    the process backend is not a security boundary)."""
    network: bool = False
    """Only bwrap and docker can take the network away; process always has it."""
    memory_mb: int = Field(default=1024, ge=64)
    max_processes: int = Field(default=256, ge=16)
    max_file_size_mb: int = Field(default=256, ge=1)
    cpu_seconds: int = Field(default=3600, ge=1)
    idle_stop_seconds: float = Field(default=600.0, gt=0)
    """A per-session workspace sandbox with no call for this long is stopped (its
    files stay); the next call starts it again."""


class AgentDefaults(_Model):
    sandbox: AgentSandboxConfig = Field(default_factory=AgentSandboxConfig)


class AgentsConfig(_Model):
    defaults: AgentDefaults = Field(default_factory=AgentDefaults)


class ClawsupConfig(_Model):
    plugins: PluginsConfig = Field(default_factory=PluginsConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)


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
    try:
        return ClawsupConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, format_validation_error(e).split("; ")) from e


def resolve_plugin_path(entry: str, base: Path) -> Path:
    if entry.startswith(BUNDLED_PREFIX):
        return BUNDLED_PLUGINS / entry[len(BUNDLED_PREFIX) :]
    p = Path(entry).expanduser()
    return (p if p.is_absolute() else base / p).resolve()
