"""The launcher interface: how the supervisor starts one sandbox child, whatever the
backend. One small contract (go-plugin's runner.Runner is the model): start, wait,
signal, kill everything, read its output pipes, say where its socket is, and diagnose
a death. `clawsup.sandbox.launch.process` is the first implementation; bwrap and docker follow it.

Event-loop discipline: every method that may block (a process spawn, a chown walk,
a scan of the process table, a cgroup write or wait, an engine call) is async and
does its blocking part in a worker thread (`in_thread`); what stays sync is cheap
(`wait`, `rss_bytes`) or is the documented exception (`kill_all_now`). A launch that
is cancelled midway kills and removes what it started before the cancellation goes
on: no orphan child, cgroup folder or container (tests/test_launchers.py).

Supervisor-side code: it never runs plugin code and never imports `clawsup.sandbox.host`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import signal as _signal
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from clawsup.sandbox.handshake import GatePayload

T = TypeVar("T")
MiB = 1024 * 1024

Backend = Literal["process", "bwrap", "docker"]
"""A launch backend, by name: one launcher each (`clawsup.sandbox.launch.backends`)."""
BackendChoice = Literal["auto", "process", "bwrap", "docker"]
"""What the operator may write for a backend: one of them, or `auto` (the first
isolating one that works here, `backends.first_isolating`)."""


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
    visible_paths: tuple[str, ...] = ()
    """Absolute host paths the child must see, read-only at the same paths: what an
    MCP server's command needs (its executable, venv or node_modules, interpreter;
    supervisor/sandboxes/mcp_install.py). bwrap and docker bind them; the process
    backend sees the host's files anyway."""
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
    incarnation of a sandbox, which calls `aclose()` once it is dead."""

    pid: int
    stdout_fd: int
    stderr_fd: int
    socket_path: str
    """The address the supervisor dials (translated for containers)."""

    def wait(self) -> asyncio.Future[ExitStatus]:
        """The same future on every call, resolved when the child itself has exited
        (event-driven, never polled)."""
        ...

    async def signal_group(self, sig: int) -> None:
        """Send `sig` to the child's whole process group (bwrap: the host's group
        inside the sandbox; docker: the container)."""
        ...

    async def kill_all(self) -> None:
        """SIGKILL the child and everything it started: its group, its cgroup (and
        its container). Idempotent, and safe after the child has exited, to sweep up
        descendants."""
        ...

    def kill_all_now(self) -> None:
        """`kill_all` for code that cannot await: a `finally` on a path where the
        loop is gone or the process is exiting. Best effort and sync; it sends the
        kills and waits for no engine beyond a short bound. Everywhere else, await
        `kill_all`."""
        ...

    async def diagnose(self) -> str:
        """Why the child may have died, from what the backend saw (for example the
        memory cgroup's OOM counter). Empty when there is nothing to add."""
        ...

    async def usage(self) -> dict[str, object] | None:
        """What `clawsup status` shows beyond the pid: a container's id, memory and
        CPU time. None for a plain process. Never waits on the engine for more than
        the sample already in flight: a poll gets the last sample, at most one a
        second is taken."""
        ...

    def rss_bytes(self) -> int | None:
        """Resident memory, cheaply (a few /proc reads); None when unknown."""
        ...

    async def aclose(self) -> None:
        """Release what the child holds: its fds, its cgroup folder (once its last
        process is gone), its container and start gate. Idempotent; meant for after
        its death (a live child is killed first)."""
        ...


class Launcher(Protocol):
    @property
    def name(self) -> Backend: ...

    async def launch(self, spec: LaunchSpec) -> Child:
        """Start one child. Never blocks the loop; if cancelled midway, kills and
        removes what it had started before the cancellation propagates."""
        ...

    async def aclose(self) -> None:
        """Release what the launcher holds for all its children (cgroup parents, its
        warden if it owns one, its engine client). After its children are closed."""
        ...


# -- for implementations ----------------------------------------------------------


async def in_thread(fn: Callable[[], T], *, executor: Executor | None = None) -> T:
    """`fn()` in a worker thread. A thread cannot be stopped, so if the caller is
    cancelled meanwhile this still waits for `fn` to finish before re-raising: what
    `fn` made is then recorded where the caller's cleanup finds it, never left
    running unowned. `fn` must be bounded."""
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(executor, functools.partial(contextvars.copy_context().run, fn))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await outlast(fut)
        raise


async def outlast(fut: asyncio.Future[T]) -> bool:
    """Wait for `fut` to settle, through any cancellation of the caller (cleanup that
    must complete). Returns whether the caller was cancelled meanwhile: re-raising
    that is the caller's job. `fut`'s own result or error is not raised here."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancelled = True
        except BaseException:
            break
    if not fut.cancelled():
        fut.exception()  # retrieved: no "exception was never retrieved" noise
    return cancelled


async def cleanup_in_thread(fn: Callable[[], object], *, executor: Executor | None = None) -> None:
    """Run cleanup `fn` in a worker thread to its end, whatever cancellation arrives
    meanwhile; then raise that cancellation, else `fn`'s own error."""
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(executor, functools.partial(contextvars.copy_context().run, fn))
    if await outlast(fut):
        raise asyncio.CancelledError
    fut.result()


class Pacer:
    """For a long walk in a worker thread (a chown of a whole workspace, a sweep of
    /tmp): every `every` entries it lets go of the GIL for a moment. Python code in a
    thread holds the GIL between its syscalls, and on a busy machine the holder is
    often descheduled while holding it: the loop's thread then waited tens of ms for
    it (tests/test_launchers.py::test_a_slow_launch_does_not_stall_the_loop)."""

    def __init__(self, every: int = 128, pause_s: float = 0.0005) -> None:
        self._every = every
        self._pause_s = pause_s
        self._n = 0

    def tick(self) -> None:
        self._n += 1
        if self._n % self._every == 0:
            time.sleep(self._pause_s)
