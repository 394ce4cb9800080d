"""The launcher interface: how the supervisor starts one sandbox child, whatever the
backend. One small contract (go-plugin's runner.Runner is the model): start, wait,
signal, kill everything, read its output pipes, say where its socket is, and diagnose
a death. `sandbox.process` is the first implementation; bwrap and docker follow it.

Supervisor-side code: it never runs plugin code and never imports `sandbox.host`.
"""

from __future__ import annotations

import asyncio
import signal as _signal
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sandbox.handshake import GatePayload

MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Limits:
    call_timeout_s: float = 30.0
    memory_bytes: int = 512 * MiB
    cpu_seconds: int = 600
    max_processes: int = 64
    max_open_files: int = 256
    max_file_size_bytes: int = 64 * MiB
    cpus: float = 1.0
    workspace_bytes: int = 1024 * MiB
    """The most the workspace may hold (`maxWorkspaceMb`); past it the supervisor
    kills the sandbox, reported like a memory kill (`disk limit`)."""
    tmp_bytes: int = 64 * MiB
    """The size of the private /tmp and of /dev/shm, each (`tmpMb`), where the
    backend gives the child its own (bwrap, docker)."""


@dataclass(frozen=True)
class ChildUser:
    """Who a child runs as, when not as the supervisor."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    sandbox_id: str
    plugin_dir: Path | None
    """None for a workspace host, which loads no plugin."""
    workspace: Path
    """The child's working directory and its only writable place of its own."""
    run_dir: Path
    """A 0700 directory for the child's gRPC socket."""
    limits: Limits
    env: dict[str, str]
    """The child's whole environment, already built from an allowlist."""
    gate: GatePayload
    run_as: ChildUser | None = None
    """None: as the supervisor's own user."""
    network: bool = True
    """Whether the child may reach the network; only backends with a network
    namespace (bwrap, docker) can take it away."""
    trusted: bool = False
    """The operator's word (`plugins.entries.<id>.trust`); only trusted code may run
    on the `process` backend."""
    protected_paths: tuple[str, ...] = ()
    """Workspace-relative paths that make the host run code later (`.git/hooks`,
    `.git/config`, rc files): read-only to the child where the backend can do that,
    and refused by the file tools (`sandbox.protectedPaths`)."""
    operator_workspace: bool = False
    """The workspace is a folder the operator named (`clawsup exec run --workspace`):
    it stays the operator's; no launcher hands it to the child's uid."""
    private_dir: Path | None = None
    """A directory only the supervisor writes (`<state>/sandboxes/<id>/private`), for
    what it hands the child (the docker start gate); a launcher may mount it
    read-only into the child. Never a folder the child can write."""


@dataclass(frozen=True, kw_only=True)
class ExitStatus:
    """How a child ended, as the supervisor saw it."""

    code: int | None = None
    signal: int | None = None
    reason: str = ""
    """What the supervisor knows beyond the status: "memory limit", "heartbeat
    missed", "stopped by operator"..."""

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = _signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            how = f"was killed by {name}"
        elif self.code is not None:
            how = f"exited with code {self.code}"
        else:
            how = "ended"
        return f"{how} ({self.reason})" if self.reason else how

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "signal": self.signal, "reason": self.reason, "text": self.describe()}


class Child(Protocol):
    """One started child. Created by `Launcher.launch`; owned by the supervisor's
    Sandbox record for one incarnation; `close()` releases its fds once it is dead."""

    pid: int
    stdout_fd: int
    stderr_fd: int
    socket_path: str
    """The address the supervisor dials (translated for containers)."""

    def wait(self) -> asyncio.Future[ExitStatus]:
        """The same future on every call, resolved when the child itself has exited
        (event-driven, never polled)."""
        ...

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the child's whole process group."""
        ...

    def kill_all(self) -> None:
        """SIGKILL the child and everything it started: its group and its cgroup.
        Safe to call after the child has exited, to sweep up descendants."""
        ...

    def diagnose(self) -> str:
        """Why the child may have died, from what the backend saw (for example the
        memory cgroup's OOM counter). Empty when there is nothing to add."""
        ...

    def rss_bytes(self) -> int | None: ...

    def usage(self) -> dict[str, object] | None:
        """What `clawsup status` shows beyond the pid: a container's id, memory and
        CPU time. None for a plain process."""
        ...

    def close(self) -> None: ...


class Launcher(Protocol):
    name: str

    async def launch(self, spec: LaunchSpec) -> Child: ...

    def close(self) -> None:
        """Release what the launcher holds for all its children (cgroup parents)."""
        ...
