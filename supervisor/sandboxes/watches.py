"""The watches on a ready incarnation: its heartbeat (a host that stops answering,
or says NOT_SERVING, is killed) and its workspace's disk (past the limit, killed at
once). Each runs as a task of the incarnation's group, started when it is ready
(SupervisedSandbox._bring_up_and_serve), and ends with the child.
"""

from __future__ import annotations

import asyncio
import contextlib

from clawsup.supervisor.sandboxes.disk_usage import WorkspaceDisk
from clawsup.supervisor.sandboxes.host_client import HostMisbehaved, HostUnreachable
from clawsup.supervisor.sandboxes.incarnation import Incarnation, Timing


async def heartbeat(inc: Incarnation, timing: Timing) -> None:
    """A Health call every interval; `heartbeat_misses` unanswered in a row, or one
    NOT_SERVING (a handler overran and cannot be interrupted), kill the child."""
    t = timing
    misses = 0
    while True:
        await asyncio.sleep(t.heartbeat_interval_s)
        assert inc.client is not None
        try:
            serving = await inc.client.health(timeout=t.heartbeat_timeout_s)
        except (HostUnreachable, HostMisbehaved):
            misses += 1
            if misses >= t.heartbeat_misses:
                inc.kill(f"hung: missed {misses} heartbeats ({t.heartbeat_timeout_s:g} s each)", polite=False)
                return
            continue
        misses = 0
        if not serving:
            inc.kill("host reported NOT_SERVING (a handler overran its timeout and cannot be interrupted)", polite=False)
            return


class DiskWatch:
    """The disk limit of one sandbox's workspace, measured at READY, then every
    heartbeat interval and after each call (`poke`). Created with its
    SupervisedSandbox and owned by it for the supervisor's life."""

    def __init__(self, disk: WorkspaceDisk, interval_s: float) -> None:
        self._disk = disk
        self._interval_s = interval_s
        self._poked = asyncio.Event()

    def poke(self) -> None:
        """A call has ended: measure now, not at the next interval."""
        self._poked.set()

    async def watch(self, inc: Incarnation) -> None:
        """Past its limit the child is killed at once, reported as a memory kill is
        (tests/test_sandbox_walls.py)."""
        while True:
            if (reason := await self._disk.over()) is not None:
                inc.kill(reason, polite=False)
                await inc.child.kill_all()  # no grace: a writer would go on writing
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._poked.wait()
            self._poked.clear()
