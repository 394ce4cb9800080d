"""The settings of the workspace sandboxes and their `exec` tool, resolved from the
config (`agents.defaults.sandbox`, `tools.exec`, `tools.fs`), and the choice of a
backend for sandboxes that run model-written commands (`resolve_backend`, also used
for subagent runs).

Resolved once by the gateway (and by `clawsup exec run`), off the event loop: `auto`
asks the machine which backend works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loguru import logger

from clawsup.sandbox.launch.backends import backend_problem, first_isolating
from clawsup.sandbox.launch.launcher import Backend, BackendChoice, Limits, MiB
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.sandboxes.restarts import RestartPolicy
from clawsup.supervisor.sandboxes.plans import restart_policy
from clawsup.supervisor.tools.exec_screen import ExecScreen

WorkspaceScope = Literal["agent", "session", "shared"]
"""Which callers share a workspace sandbox: each agent has its own (`agent`), each
session has its own (`session`, discarded when idle), or all share one (`shared`)."""


@dataclass(frozen=True, kw_only=True)
class ExecSettings:
    timeout_s: float = 60.0
    max_timeout_s: float = 600.0
    max_output_bytes: int = 64 * 1024
    kill_grace_s: float = 2.0
    shell: str = "/bin/sh"


@dataclass(frozen=True, kw_only=True)
class WorkspaceSettings:
    scope: WorkspaceScope = "agent"
    backend: Backend = "process"
    network: bool = False
    limits: Limits = field(default_factory=lambda: Limits(memory_bytes=1024 * MiB, max_processes=256, cpu_seconds=3600, max_file_size_bytes=256 * MiB))
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    exec: ExecSettings = field(default_factory=ExecSettings)
    screen: ExecScreen = field(default_factory=ExecScreen)
    read_max_bytes: int = 256 * 1024
    idle_stop_s: float = 600.0
    protected_paths: tuple[str, ...] = ()
    unisolated: str = ""
    """Why the model's commands run on the process backend (the fallback was taken),
    said at start and in `clawsup status`; empty when they are isolated."""


def settings_from_config(cfg: ClawsupConfig, *, source: str) -> WorkspaceSettings:
    """Resolves `agents.defaults.sandbox` and `tools` into settings; `auto` becomes
    bwrap where bwrap works, else process (with a warning, since the process backend
    is no security boundary)."""
    a = cfg.agents.defaults.sandbox
    backend, unisolated = resolve_backend(a.backend, "agents.defaults.sandbox.backend", "exec and file tools", source=source, fallback=a.process_fallback)
    e = cfg.tools.exec
    d = cfg.sandbox.defaults
    return WorkspaceSettings(
        scope=a.scope,
        backend=backend,
        network=a.network,
        limits=Limits(
            memory_bytes=a.memory_mb * MiB,
            max_processes=a.max_processes,
            cpu_seconds=a.cpu_seconds,
            max_file_size_bytes=a.max_file_size_mb * MiB,
            max_open_files=max(d.max_open_files, 1024),
            workspace_bytes=a.max_workspace_mb * MiB,
            tmp_bytes=a.tmp_mb * MiB,
        ),
        restart=restart_policy(d.restart)[0],
        exec=ExecSettings(
            timeout_s=min(e.timeout_seconds, e.max_timeout_seconds),
            max_timeout_s=e.max_timeout_seconds,
            max_output_bytes=e.max_output_bytes,
            kill_grace_s=e.kill_grace_seconds,
            shell=e.shell,
        ),
        screen=screen_from_config(cfg),
        read_max_bytes=cfg.tools.fs.read_max_bytes,
        idle_stop_s=a.idle_stop_seconds,
        protected_paths=tuple(cfg.sandbox.protected_paths),
        unisolated=unisolated,
    )


def resolve_backend(backend: BackendChoice, key: str, what: str, *, source: str, fallback: bool = False) -> tuple[Backend, str]:
    """The backend for sandboxes that run model-written commands, and, when it is
    `process`, why (said at start and in status). `auto` takes bwrap, else docker;
    the process backend only where `fallback` allows it, never silently. A named
    backend that cannot work here, or no isolating one without the fallback, is a
    config error that names the ways out."""
    if backend != "auto":
        if problem := backend_problem(backend):
            raise ConfigError(source, [f"{key}: {problem}"])
        return backend, ("configured" if backend == "process" else "")
    isolating, why = first_isolating()
    if isolating is not None:
        return isolating, ""
    if not fallback:
        raise ConfigError(source, [
            f"{key}: {what} need an isolating backend and none works here ({why}). Install bubblewrap "
            "(apt-get install bubblewrap) or start a Docker engine with the sandbox image (scripts/build-sandbox-image); "
            f"or accept unconfined commands with {key.rsplit('.', 1)[0]}.processFallback: true"
        ])  # fmt: skip
    logger.warning("{} run under the process backend, which is NOT a security boundary ({}); install bubblewrap to contain them", what, why)
    return "process", why


def screen_from_config(cfg: ClawsupConfig) -> ExecScreen:
    e = cfg.tools.exec
    return ExecScreen.build(use_defaults=e.deny_defaults, deny={k: p.pattern for k, p in e.deny.items()}, allow=[p.pattern for p in e.allow])
