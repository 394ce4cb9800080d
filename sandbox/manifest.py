"""`clawsup.plugin.json`: what a plugin folder says about itself.

Read as JSON by the supervisor, which never imports plugin code (the child gets what
it needs of it, the entry and the config, on its start gate). Pydantic, because the
file comes from a plugin author and crosses a trust line; errors name the key path.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from clawsup.sandbox import offers
from clawsup.sandbox.launch.launcher import Backend

MANIFEST_NAME = "clawsup.plugin.json"

# A tool name must be usable by every model provider: Anthropic's and OpenAI's tool
# names allow this set, up to 64 characters.
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
PLUGIN_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
# Metadata is data from a stranger that the gateway keeps, shows and sends to the
# model on every turn: each part has a size cap, and a manifest past one is refused.
MAX_MANIFEST_BYTES = 256 * 1024
MAX_DESCRIPTION_CHARS = 1024
MAX_CONTRACT_NAMES = 128
MAX_CONFIG_SCHEMA_BYTES = 64 * 1024



class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class RestartRequest(_Model):
    """The OTP-style restart policy: more than `max_restarts` deaths within
    `period_seconds` and the sandbox is `failed` until an operator restarts it."""

    # A manifest's restart ask is shown and refused (the policy is the operator's), so
    # it only has to make sense; the operator's has floors (supervisor/config.py).
    max_restarts: int | None = Field(default=None, ge=0, le=1000)
    period_seconds: float | None = Field(default=None, gt=0)
    backoff_initial_seconds: float | None = Field(default=None, ge=0)
    backoff_max_seconds: float | None = Field(default=None, ge=0)


class SandboxRequest(_Model):
    """What a plugin asks of its sandbox (in its manifest), or what the operator
    grants it (`plugins.entries.<id>.sandbox`, over `sandbox.defaults`). Every field
    is optional. The manifest only asks: each limit is the stricter of the ask and
    the grant; `backend`, `network` and `restart` are the operator's alone, and a
    manifest's are shown, and refused with a warning where they differ
    (supervisor/sandboxes/plans.py)."""

    backend: Backend | None = None
    call_timeout_seconds: float | None = Field(default=None, gt=0, le=3600)
    memory_mb: int | None = Field(default=None, ge=32)
    cpu_seconds: int | None = Field(default=None, ge=1)
    max_processes: int | None = Field(default=None, ge=8)
    max_open_files: int | None = Field(default=None, ge=32)
    max_file_size_mb: int | None = Field(default=None, ge=1)
    cpus: float | None = Field(default=None, gt=0, le=64)
    """CPUs' worth of time the sandbox may use at once (docker; the others have
    rlimits on CPU seconds only)."""
    max_workspace_mb: int | None = Field(default=None, ge=1)
    """The most its workspace may hold."""
    tmp_mb: int | None = Field(default=None, ge=1, le=65536)
    """The size of its private /tmp and /dev/shm."""
    network: bool | None = None
    """Whether the plugin needs the network. It gets it only where the operator
    grants it; backends with a network namespace (bwrap, docker) then give it none.
    The process backend cannot take it away."""
    restart: RestartRequest | None = None


def _names(pattern: str, what: str) -> Any:
    def check(names: list[str]) -> list[str]:
        bad = [n for n in names if not isinstance(n, str) or re.fullmatch(pattern, n) is None]
        if bad:
            raise ValueError(f"invalid {what} {bad[:8]}; each must match {pattern}")
        return names

    return AfterValidator(check)


def _hook_names(names: list[str]) -> list[str]:
    unknown = sorted(set(names) - offers.HOOKS)
    if unknown:
        raise ValueError(f"unknown hook(s) {unknown}; the hooks are {sorted(offers.HOOKS)}")
    return names


def _route_paths(paths: list[str]) -> list[str]:
    bad = [p for p in paths if not offers.valid_route(p)]
    if bad:
        raise ValueError(f"invalid route path(s) {bad[:8]}; a path below /plugins/<id>/ is plain segments (letters, digits, _ . ~ -) joined by /")
    return paths


def _command_names(names: list[str]) -> list[str]:
    taken = sorted(set(names) & offers.BUILTIN_COMMANDS)
    if taken:
        raise ValueError(f"{['/' + n for n in taken]} belong to the gateway; choose other names")
    return names


class Contracts(_Model):
    """The names a plugin may register, by kind. The supervisor refuses anything else."""

    tools: list[str] = Field(default_factory=list, max_length=MAX_CONTRACT_NAMES)
    channels: Annotated[list[str], _names(offers.CHANNEL_ID_PATTERN, "channel id(s)")] = Field(default_factory=list, max_length=MAX_CONTRACT_NAMES)
    hooks: Annotated[list[str], AfterValidator(_hook_names)] = Field(default_factory=list, max_length=MAX_CONTRACT_NAMES)
    services: Annotated[list[str], _names(offers.SERVICE_ID_PATTERN, "service id(s)")] = Field(default_factory=list, max_length=MAX_CONTRACT_NAMES)
    commands: Annotated[list[str], _names(offers.COMMAND_NAME_PATTERN, "command name(s) (without the slash)"), AfterValidator(_command_names)] = Field(
        default_factory=list, max_length=MAX_CONTRACT_NAMES
    )
    http_routes: Annotated[list[str], AfterValidator(_route_paths)] = Field(default_factory=list, max_length=MAX_CONTRACT_NAMES)

    def declared(self, kind: offers.OfferKind) -> frozenset[str]:
        """The names declared for one offer kind."""
        by_kind = {"hook": self.hooks, "command": self.commands, "service": self.services, "channel": self.channels, "http_route": self.http_routes}
        return frozenset(by_kind[kind])


class Manifest(_Model):
    id: str = Field(pattern=PLUGIN_ID_PATTERN)
    version: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$")
    description: str = Field(default="", max_length=MAX_DESCRIPTION_CHARS)
    entry: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$", description="A .py file or a module, relative to the plugin folder.")
    contracts: Contracts = Field(default_factory=Contracts)
    config_schema: dict[str, Any] | None = None
    sandbox: SandboxRequest = Field(default_factory=SandboxRequest)


class ManifestError(Exception):
    """A plugin folder whose manifest is missing or wrong. For the plugin's author."""

    def __init__(self, folder: Path, problem: str) -> None:
        self.folder = folder
        self.problem = problem
        super().__init__(f"plugin folder {folder}: {problem}")


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem, each naming the key path (`sandbox.memoryMb: ...`)."""
    lines = []
    for e in err.errors():
        path = ""
        for p in (prefix, *e["loc"]):
            if isinstance(p, int):
                path += f"[{p}]"
            elif p != "":
                path += f".{p}" if path else str(p)
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{path or '<root>'}: {msg}")
    return "; ".join(lines)


def load_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST_NAME
    try:
        with open(path, "rb") as f:
            raw_bytes = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw_bytes) > MAX_MANIFEST_BYTES:
            raise ManifestError(folder, f"{MANIFEST_NAME} is larger than {MAX_MANIFEST_BYTES // 1024} KiB; a manifest is metadata, not data")
        raw = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(folder, f"{MANIFEST_NAME} is not UTF-8 ({e.reason})") from e
    except FileNotFoundError:
        raise ManifestError(folder, f"no {MANIFEST_NAME} in it; every plugin folder needs one") from None
    except OSError as e:
        raise ManifestError(folder, f"cannot read {MANIFEST_NAME}: {e.strerror}") from e
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ManifestError(folder, f"{MANIFEST_NAME} is not valid JSON (line {e.lineno}: {e.msg})") from e
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as e:
        raise ManifestError(folder, f"{MANIFEST_NAME}: {format_validation_error(e)}") from e
    if manifest.config_schema is not None and len(json.dumps(manifest.config_schema)) > MAX_CONFIG_SCHEMA_BYTES:
        raise ManifestError(folder, f"{MANIFEST_NAME}: configSchema is larger than {MAX_CONFIG_SCHEMA_BYTES // 1024} KiB")
    if ".." in manifest.entry.split("/") or manifest.entry.startswith("/"):
        raise ManifestError(folder, f"{MANIFEST_NAME}: entry: {manifest.entry!r} must stay inside the plugin folder")
    bad = [t for t in manifest.contracts.tools if not _valid_tool_name(t)]
    if bad:
        raise ManifestError(folder, f"{MANIFEST_NAME}: contracts.tools: invalid tool name(s) {bad}; use letters, digits, _ and -")
    return manifest


def _valid_tool_name(name: str) -> bool:
    return re.fullmatch(TOOL_NAME_PATTERN, name) is not None
