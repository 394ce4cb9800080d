"""Runs one shell command for the `exec` tool, inside a workspace sandbox host.

The command gets its own process group (a new session), stdin from /dev/null, the
host's scrubbed environment, and a working directory inside the workspace. Its
output (stdout and stderr merged, in order) is read to EOF with bounded memory: the
head streams to the caller as it comes, the tail is kept in a ring, and what lies
between is dropped and counted. At the deadline the group gets SIGTERM, then SIGKILL
after a grace. When the command ends, whatever it left running is killed: its group,
and (the host being a child subreaper) any orphan that escaped the group with setsid.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from clawsup.sandbox.exec_result import ExecResult
from clawsup.sandbox.output_cap import HeadTail

READ_CHUNK = 64 * 1024
READS_PER_WAKEUP = 16
FINISH_ROUNDS = 20
DRAIN_AFTER_EXIT_S = 1.0
"""After the command and its group are gone, how long a pipe may stay open (held by
something that escaped the group) before we stop reading."""


def output_cap(cap: int) -> HeadTail:
    """Keeps at most `cap` bytes of output (sandbox/output_cap.py), with a marker that
    says how much was dropped between the head and the tail."""
    return HeadTail(cap, marker=lambda n: f"\n[... {n} bytes of output omitted ...]\n")


class _Output:
    """The command's pipe, read by the event loop as data arrives (a reader
    callback, no task): each chunk goes through the cap at once, so memory stays
    bounded however slowly the caller takes the head."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, cap: HeadTail) -> None:
        self.loop = loop
        self.fd = fd
        self.cap = cap
        self.ready: list[bytes] = []
        self.eof: asyncio.Future[None] = loop.create_future()
        self._kick: asyncio.Future[None] | None = None
        loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        # A bounded number of reads per wake-up: a command that writes as fast as we
        # read must not keep the loop from the host's other work (its health checks).
        for _ in range(READS_PER_WAKEUP):
            try:
                chunk = os.read(self.fd, READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                self.close()
                if not self.eof.done():
                    self.eof.set_result(None)
                break
            now = self.cap.feed(chunk)
            if now:
                self.ready.append(now)
        if self.ready and self._kick is not None and not self._kick.done():
            self._kick.set_result(None)

    async def relay_until(self, fut: asyncio.Future[None], timeout: float, emit: Callable[[bytes], Awaitable[None]]) -> bool:
        """Pass output on to `emit` until `fut` is done (True) or `timeout` passes
        (False)."""
        deadline = self.loop.time() + timeout
        while True:
            if self.ready:
                data, self.ready = b"".join(self.ready), []
                await emit(data)
                continue
            if fut.done():
                return True
            left = deadline - self.loop.time()
            if left <= 0:
                return False
            self._kick = self.loop.create_future()
            await asyncio.wait((fut, self._kick), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            self._kick = None

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            self.fd = -1


def become_subreaper() -> None:
    """Orphans of our commands (a daemon that double-forked, or left its session)
    become our children rather than init's, so that we can find and kill them."""
    PR_SET_CHILD_SUBREAPER = 36
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class ExecRunner:
    """One per workspace host. Lives as long as the host."""

    def __init__(self, *, shell: str, kill_grace_s: float, env: dict[str, str]) -> None:
        self.shell = shell
        self.kill_grace_s = kill_grace_s
        self.env = env
        self._running: set[int] = set()
        self._busy = 0
        """Commands being started or running. A sweep needs it to be ours alone: a
        command being spawned is our child before its pid is in `_running`."""

    async def run(
        self, command: str, *, cwd: str | None, timeout_s: float, cap: int, emit: Callable[[bytes], Awaitable[None]]
    ) -> ExecResult:
        """`cwd` None: the host's own, which is the workspace."""
        t0 = time.monotonic()
        self._busy += 1
        try:
            return await self._run(command, cwd=cwd, timeout_s=timeout_s, cap=cap, emit=emit, t0=t0)
        finally:
            self._busy -= 1

    async def _run(
        self, command: str, *, cwd: str | None, timeout_s: float, cap: int, emit: Callable[[bytes], Awaitable[None]], t0: float
    ) -> ExecResult:
        # Popen and a pidfd rather than asyncio's subprocess: its wait() returns only
        # once every pipe is closed, and a daemon that escaped the group would hold
        # ours for as long as it lives. (No child-watcher thread, either.)
        loop = asyncio.get_running_loop()
        proc = subprocess.Popen(
            [self.shell, "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=self.env,
            start_new_session=True,
            close_fds=True,
        )
        self._running.add(proc.pid)
        pidfd = os.pidfd_open(proc.pid)
        assert proc.stdout is not None
        pipe = proc.stdout.fileno()
        os.set_blocking(pipe, False)
        io = _Output(loop, pipe, output_cap(cap))
        exited: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_exit)
        timed_out = False
        try:
            if not await io.relay_until(exited, timeout_s, emit):
                timed_out = True
                _killpg(proc.pid, signal.SIGTERM)
                await io.relay_until(exited, self.kill_grace_s, emit)
            # The group outlives its leader when something ran in the background;
            # the command is over, so is the rest of it.
            _killpg(proc.pid, signal.SIGKILL)
            await exited
            status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
            assert status is not None
            proc.returncode = status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
            self._running.discard(proc.pid)
            await self._finish_group(proc.pid)
            await io.relay_until(io.eof, DRAIN_AFTER_EXIT_S, emit)
        finally:
            loop.remove_reader(pidfd)
            io.close()
            self._running.discard(proc.pid)
            if proc.returncode is None:
                # Cancelled (the caller went away): the command goes too.
                _killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
                proc.returncode = -signal.SIGKILL
                if self._busy == 1:
                    self._sweep_orphans()
            os.close(pidfd)
            proc.stdout.close()
        tail = io.cap.finish()
        if tail:
            await emit(tail)
        rc = proc.returncode
        return ExecResult(
            exit_code=rc if rc >= 0 else None,
            signal=-rc if rc < 0 else None,
            timed_out=timed_out,
            truncated=io.cap.truncated,
            duration_s=time.monotonic() - t0,
            output_bytes=io.cap.total,
        )

    async def _finish_group(self, pgid: int) -> None:
        """Kill what is left of the command: its group, then the orphans reparented
        to us. A few rounds, yielding between them, because a process that was
        forking when the group was killed can leave a child that the first kill did
        not see (a fork bomb does little else)."""
        for _ in range(FINISH_ROUNDS):
            alive = True
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                alive = False
            except PermissionError:
                pass
            orphans = self._busy == 1 and bool(_children_of_self() - self._running)
            if orphans:
                self._sweep_orphans()
            if not alive and not orphans:
                return
            await asyncio.sleep(0.005)

    def _sweep_orphans(self) -> None:
        """Kill and reap every child of ours that is not a running command: orphans
        that were reparented to us. Only our own children are touched, and only
        when no command is running (we could not tell whose orphan it is)."""
        # An orphan's own children are reparented to us when it dies: a few rounds.
        for _ in range(4):
            pids = _children_of_self() - self._running
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    pgid = os.getpgid(pid)
                    if pgid != os.getpgrp():
                        os.killpg(pgid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def _children_of_self() -> set[int]:
    # Orphans are reparented to the subreaper's first live thread, the main one
    # (kernel/exit.c find_new_reaper), and commands are spawned from it too.
    me = os.getpid()
    with contextlib.suppress(OSError), open(f"/proc/{me}/task/{me}/children") as f:
        return {int(p) for p in f.read().split()}
    return set()


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
