"""`clawsup.plugin.json`: what a plugin folder says about itself.

Read as JSON by the supervisor (which never imports plugin code) and by the host
child. Pydantic, because the file comes from a plugin author and crosses a trust line;
errors name the key path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

MANIFEST_NAME = "clawsup.plugin.json"

# A tool name must be usable by every model provider: Anthropic's and OpenAI's tool
# names allow this set, up to 64 characters.
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
PLUGIN_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"

Backend = Literal["process", "bwrap", "docker"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class RestartRequest(_Model):
    """The OTP-style restart policy: more than `max_restarts` deaths within
    `period_seconds` and the sandbox is `failed` until an operator restarts it."""

    max_restarts: int | None = Field(default=None, ge=0, le=1000)
    period_seconds: float | None = Field(default=None, gt=0)
    backoff_initial_seconds: float | None = Field(default=None, ge=0)
    backoff_max_seconds: float | None = Field(default=None, ge=0)


class SandboxRequest(_Model):
    """What a plugin asks of its sandbox. Every field is optional: unset ones take the
    operator's defaults (`sandbox.defaults` in clawsup.json), and the operator's
    per-plugin settings win over these."""

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
    network: bool | None = None
    """Whether the plugin needs the network. Without it, backends with a network
    namespace (bwrap) give it none; the process backend cannot take it away."""
    restart: RestartRequest | None = None


class Contracts(_Model):
    """The names a plugin may register. The supervisor refuses anything else."""

    tools: list[str] = Field(default_factory=list)
    channels: list[str] = Field(default_factory=list)
    hooks: list[str] = Field(default_factory=list)
    services: list[str] = Field(default_factory=list)


class Manifest(_Model):
    id: str = Field(pattern=PLUGIN_ID_PATTERN)
    version: str = Field(min_length=1, max_length=64)
    description: str = ""
    entry: str = Field(min_length=1, description="A .py file or a module, relative to the plugin folder.")
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
        raw = path.read_text(encoding="utf-8")
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
    bad = [t for t in manifest.contracts.tools if not _valid_tool_name(t)]
    if bad:
        raise ManifestError(folder, f"{MANIFEST_NAME}: contracts.tools: invalid tool name(s) {bad}; use letters, digits, _ and -")
    return manifest


def _valid_tool_name(name: str) -> bool:
    import re

    return re.fullmatch(TOOL_NAME_PATTERN, name) is not None
