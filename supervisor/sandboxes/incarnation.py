"""One child process of a sandbox, from launch to reaping, as one async context
manager (`running`): it launches the child, hands out the `Incarnation`, and on the
way out, whatever failed and wherever (a supervision bug, a cancelled gateway, a
stop that overran), runs the kill escalation to its end, shielded from
cancellation, before the child's descriptors are let go. Nothing that a child
started outlives the block that owns it (tests/test_incarnation.py injects a
failure at each point and checks).

Owned by `SupervisedSandbox._run_incarnation`; the connection to the child's host
(`HostClient`) is made inside the block and closed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from loguru import logger

from clawsup.sandbox.launch.launcher import Child, ExitStatus
from clawsup.supervisor.sandboxes.child_output import ChildOutput
from clawsup.supervisor.sandboxes.host_client import CallAborted, HostClient, HostMisbehaved, HostUnreachable
from clawsup.supervisor.sandboxes.log import SandboxLog

SHUTDOWN_RPC_TIMEOUT_S = 0.5
# A child killed for a fault (hung, wedged, bombing) is not going to tidy up: it gets
# this much SIGTERM grace at most, a polite stop the full stop grace.
FAULT_KILL_GRACE_S = 0.5

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Timing:
    """How long each step of an incarnation's life may take: its handshake, its
    heartbeats (supervisor/sandboxes/watches.py) and a polite stop's grace."""

    handshake_timeout_s: float = 10.0
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 1.0
    heartbeat_misses: int = 2
    stop_grace_s: float = 2.0


class Incarnation:
    """One child of a sandbox: its output, its host client, the calls it has in
    flight (through the client) and how it is being killed."""

    def __init__(self, sandbox_id: str, number: int, child: Child, log: SandboxLog, stop_grace_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.sandbox_id = sandbox_id
        self.number = number
        self.child = child
        self.log = log
        self.stop_grace_s = stop_grace_s
        self.output = ChildOutput(child.stdout_fd, child.stderr_fd, log)
        self.died: asyncio.Future[ExitStatus] = loop.create_future()
        """Set by the sandbox once the child has exited and been reclaimed."""
        self.client: HostClient | None = None
        self.kill_reason: str | None = None
        self.kill_task: asyncio.Task[None] | None = None
        self.tg: asyncio.TaskGroup | None = None
        """The group of this incarnation's own tasks (bring-up, heartbeat, stream,
        kill): it ends when the child has died."""
        self.closing = False
        """Set once the child is dead or its block is ending: no call is handed it."""
        self.exit_note: str | None = None
        """How its payload ended, as the child said just before exiting (an MCP
        host: "MCP server 'time' was killed by SIGKILL"); bounded, one clean line.
        Part of the death's reason."""
        self.call_ids = itertools.count(1)
        self.dial_fd: int | None = None
        """An O_PATH descriptor of the child's socket, checked once and dialled as
        /proc/self/fd/N ever after (sandbox/socket_paths.py); closed after the client."""

    def next_call_id(self) -> str:
        return f"{self.number}-{next(self.call_ids)}"

    def declare_dead(self, status: ExitStatus) -> None:
        """Say how the child ended, then end every call still in flight (each raises
        CallAborted, and its caller reads `died`). Once; later calls do nothing."""
        if not self.died.done():
            self.died.set_result(status)
        self.closing = True
        if self.client is not None:
            self.client.abort_all()

    def kill(self, reason: str, *, polite: bool) -> None:
        """Start the kill escalation, once. It runs as a task of the incarnation's
        group, so a cancelled caller cannot leave a half-killed child. Once the group
        has ended (the block is on its way out, and its exit kills) only the reason
        is kept."""
        if self.kill_reason is None:
            self.kill_reason = reason
        if self.kill_task is None and not self.died.done() and self.tg is not None:
            self.log.event(f"killing pid {self.child.pid}: {reason}")
            self.kill_task = self.tg.create_task(self.escalate(polite), name=f"{self.sandbox_id}#{self.number} kill")

    async def escalate(self, polite: bool) -> None:
        """Shutdown RPC (polite only), SIGTERM to the group, then SIGKILL to
        everything the child started; each step waits for the exit, bounded."""
        grace = self.stop_grace_s if polite else min(self.stop_grace_s, FAULT_KILL_GRACE_S)
        exited = self.child.wait()
        if polite and self.client is not None:
            with contextlib.suppress(HostUnreachable, HostMisbehaved, CallAborted):
                # The plugin's services' `stop` get what the grace leaves after the
                # host's own second for the calls in flight (sandbox/host/server.py).
                await self.client.shutdown(self.kill_reason or "", timeout=SHUTDOWN_RPC_TIMEOUT_S, service_stop=max(grace - 1.0, grace / 2))
            if await within(exited, grace):
                return
            self.log.event(f"still running {grace:g} s after the Shutdown RPC; sending SIGTERM to its process group")
        await self.child.signal_group(signal.SIGTERM)
        if await within(exited, grace):
            return
        self.log.event(f"still running {grace:g} s after SIGTERM; sending SIGKILL to everything it started")
        await self.child.kill_all()

    async def _finish(self) -> None:
        """The end of the block: the child dead and swept, every call ended, every
        descriptor closed. Runs to completion even when the block was cancelled."""
        child = self.child
        self.closing = True
        try:
            if not child.wait().done():
                if self.kill_reason is None:
                    self.kill_reason = "its supervision ended"
                self.log.event(f"killing pid {child.pid}: {self.kill_reason}")
                await self.escalate(polite=False)
            # Descendants may outlive the leader (a fork that called setsid, a
            # grandchild still writing): the group and the cgroup go with it.
            await child.kill_all()
        except Exception:
            logger.exception("{}: killing pid {} failed; sweeping what is left", self.sandbox_id, child.pid)
            child.kill_all_now()
        finally:
            # Callers still waiting learn how it ended, if nobody said so yet (the
            # block ended on a failure, not on the child's exit).
            exited = child.wait()
            ended = exited.result() if exited.done() and not exited.cancelled() else ExitStatus()
            self.declare_dead(ExitStatus(code=ended.code, signal=ended.signal, reason=self.kill_reason or ended.reason))
            self.output.close()
            if self.client is not None:
                with contextlib.suppress(Exception):
                    await self.client.close()
            if self.dial_fd is not None:
                os.close(self.dial_fd)
                self.dial_fd = None
            try:
                await child.aclose()
            except Exception:
                # The child is dead and swept; what could not be released (a cgroup
                # folder, a container) is named, and the sandbox restarts as usual.
                logger.exception("{}: releasing pid {} failed", self.sandbox_id, child.pid)


@contextlib.asynccontextmanager
async def running(
    sandbox_id: str, number: int, launch: Callable[[], Awaitable[Child]], log: SandboxLog, stop_grace_s: float
) -> AsyncIterator[Incarnation]:
    """Launch a child and own it for the length of the block. A launch that is
    cancelled or fails cleans up after itself (the launcher's contract); from the
    moment the child exists, leaving the block kills it."""
    child = await launch()
    inc = Incarnation(sandbox_id, number, child, log, stop_grace_s)
    try:
        inc.output.start()
        yield inc
    finally:
        await uncancellable(inc._finish())


async def uncancellable(work: Awaitable[T]) -> T:
    """Run `work` to its end even if we are cancelled meanwhile; a cancellation that
    arrived is raised afterwards. For cleanup that must not stop halfway (a kill
    escalation): its own steps are bounded, so this is too."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
        except BaseException as e:
            if cancelled:  # the cancellation is not lost behind the failure
                raise asyncio.CancelledError() from e
            raise
    if cancelled:
        raise asyncio.CancelledError()
    return result


async def within(fut: asyncio.Future[Any], seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            await asyncio.shield(fut)
        return True
    except TimeoutError:
        return False
