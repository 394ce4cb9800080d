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
from dataclasses import dataclass

READ_CHUNK = 64 * 1024
DRAIN_AFTER_EXIT_S = 1.0
"""After the command and its group are gone, how long a pipe may stay open (held by
something that escaped the group) before we stop reading."""


@dataclass(slots=True)
class ExecOutcome:
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    output_bytes: int = 0


class OutputCap:
    """Keeps at most `cap` bytes of output: the first half is released as it comes,
    the last half is a ring released at the end, after a marker that says how much
    was dropped between them."""

    def __init__(self, cap: int) -> None:
        self.head_left = cap - cap // 2
        self.tail_size = cap // 2
        self.tail = bytearray()
        self.total = 0
        self.dropped = 0

    def feed(self, data: bytes) -> bytes:
        self.total += len(data)
        now = b""
        if self.head_left:
            now, data = data[: self.head_left], data[self.head_left :]
            self.head_left -= len(now)
        if data:
            self.tail += data
            excess = len(self.tail) - self.tail_size
            if excess > 0:
                del self.tail[:excess]
                self.dropped += excess
        return now

    def finish(self) -> bytes:
        if not self.dropped:
            return bytes(self.tail)
        return f"\n[... {self.dropped} bytes of output omitted ...]\n".encode() + bytes(self.tail)

    @property
    def truncated(self) -> bool:
        return self.dropped > 0


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
        self, command: str, *, cwd: str, timeout_s: float, cap: int, emit: Callable[[bytes], Awaitable[None]]
    ) -> ExecOutcome:
        t0 = time.monotonic()
        self._busy += 1
        try:
            return await self._run(command, cwd=cwd, timeout_s=timeout_s, cap=cap, emit=emit, t0=t0)
        finally:
            self._busy -= 1

    async def _run(
        self, command: str, *, cwd: str, timeout_s: float, cap: int, emit: Callable[[bytes], Awaitable[None]], t0: float
    ) -> ExecOutcome:
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
        exited: asyncio.Future[None] = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        assert proc.stdout is not None
        stream = asyncio.StreamReader(limit=READ_CHUNK)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream), proc.stdout)
        out = OutputCap(cap)
        result = ExecOutcome()

        async def pump() -> None:
            while chunk := await stream.read(READ_CHUNK):
                now = out.feed(chunk)
                if now:
                    await emit(now)

        try:
            async with asyncio.TaskGroup() as tg:
                reader = tg.create_task(pump())
                try:
                    async with asyncio.timeout(timeout_s):
                        await asyncio.shield(exited)
                except TimeoutError:
                    result.timed_out = True
                    _killpg(proc.pid, signal.SIGTERM)
                    try:
                        async with asyncio.timeout(self.kill_grace_s):
                            await asyncio.shield(exited)
                    except TimeoutError:
                        pass
                # The group outlives its leader when something ran in the background;
                # the command is over, so is the rest of it.
                _killpg(proc.pid, signal.SIGKILL)
                await exited
                status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
                assert status is not None
                proc.returncode = status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
                self._running.discard(proc.pid)
                if self._busy == 1:
                    self._sweep_orphans()
                try:
                    async with asyncio.timeout(DRAIN_AFTER_EXIT_S):
                        await asyncio.shield(reader)
                except TimeoutError:
                    reader.cancel()
        finally:
            loop.remove_reader(pidfd)
            self._running.discard(proc.pid)
            if proc.returncode is None:
                _killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
                proc.returncode = -signal.SIGKILL
            os.close(pidfd)
            transport.close()
        tail = out.finish()
        if tail:
            await emit(tail)
        rc = proc.returncode
        if rc < 0:
            result.signal = -rc
        else:
            result.exit_code = rc
        result.truncated = out.truncated
        result.output_bytes = out.total
        result.duration_s = time.monotonic() - t0
        return result

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
    me = os.getpid()
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{me}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{me}/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
    return pids


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
