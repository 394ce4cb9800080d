"""One sandbox's lifecycle, in-process and on virtual time: the real driver
(`SupervisedSandbox`) with a fake launcher, whose children are stand-ins that live
until the test ends them, and a virtual clock on which its restarts are counted
and its backoffs waited out. No process, no real sleeping: it runs in milliseconds.

Its children never hand-shake, so each incarnation stays `starting` until the test
ends it; a death then is a crash like any other (the real children's side is
tests/test_faults.py). What is proved here is the driver's restart loop: the backoff
grows and is capped, too many deaths in the period end in `failed` (which stays),
deaths outside the period are forgotten, and an operator's restart forgives past
deaths.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clawsup.sandbox.launch.launcher import ExitStatus, LaunchSpec, Limits
from clawsup.supervisor.sandboxes.bring_up import SandboxDirs
from clawsup.supervisor.sandboxes.incarnation import Timing
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.plans import SandboxPlan
from clawsup.supervisor.sandboxes.registry import Registry
from clawsup.supervisor.sandboxes.restarts import RestartPolicy
from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox

S = SandboxState
# Bounds for waiting on the driver, which answers within a few loop turns; never
# reached when the test passes.
QUICK_S = 2.0


class VirtualClock:
    """Time moves only when the test says (`advance`); a sleeper wakes once its
    deadline is reached."""

    def __init__(self) -> None:
        self.t = 1000.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._slept = asyncio.Event()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.t + seconds, fut)
        self._sleepers.append(entry)
        self._slept.set()
        try:
            await fut
        finally:
            self._sleepers.remove(entry)

    def sleeping(self) -> list[float]:
        """What each sleeper still has to wait."""
        return [deadline - self.t for deadline, fut in self._sleepers if not fut.done()]

    async def sleeper(self) -> float:
        """Waits for the one sleeper (the driver starts its timer a loop turn after it
        enters `backoff`); what it still has to wait."""
        async with asyncio.timeout(QUICK_S):
            while not self.sleeping():
                self._slept.clear()
                await self._slept.wait()
        [left] = self.sleeping()
        return left

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for deadline, fut in self._sleepers:
            if deadline <= self.t and not fut.done():
                fut.set_result(None)


class FakeChild:
    """A child that runs no process: its output pipes are real (the incarnation reads
    them) and it exits when the test, or a kill, says so."""

    def __init__(self, pid: int, spec: LaunchSpec) -> None:
        self.pid = pid
        self.spec = spec
        self.socket_path = str(spec.run_dir / "host.sock")
        self.stdout_fd, self._stdout_w = os.pipe()
        self.stderr_fd, self._stderr_w = os.pipe()
        os.set_blocking(self.stdout_fd, False)
        os.set_blocking(self.stderr_fd, False)
        self._exit: asyncio.Future[ExitStatus] = asyncio.get_running_loop().create_future()
        self._open = [self.stdout_fd, self._stdout_w, self.stderr_fd, self._stderr_w]

    def exit(self, *, code: int | None = None, sig: int | None = None) -> None:
        if self._exit.done():
            return
        for fd in (self._stdout_w, self._stderr_w):
            self._close(fd)
        self._exit.set_result(ExitStatus(code=code, signal=sig))

    def wait(self) -> asyncio.Future[ExitStatus]:
        return self._exit

    async def signal_group(self, sig: int) -> None:
        self.exit(sig=sig)

    async def kill_all(self) -> None:
        self.exit(sig=signal.SIGKILL)

    def kill_all_now(self) -> None:
        self.exit(sig=signal.SIGKILL)

    async def diagnose(self) -> str:
        return ""

    async def usage(self) -> dict[str, object] | None:
        return None

    def rss_bytes(self) -> int | None:
        return None

    async def aclose(self) -> None:
        for fd in tuple(self._open):
            self._close(fd)

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.remove(fd)
            os.close(fd)


class FakeLauncher:
    name = "fake"

    def __init__(self) -> None:
        self.launched: asyncio.Queue[FakeChild] = asyncio.Queue()
        self._pids = iter(range(40_000, 50_000))

    async def launch(self, spec: LaunchSpec) -> FakeChild:
        child = FakeChild(next(self._pids), spec)
        self.launched.put_nowait(child)
        return child

    async def aclose(self) -> None:
        pass


class Model:
    """One supervised sandbox on the fake launcher and the virtual clock."""

    def __init__(self, sb: SupervisedSandbox, launcher: FakeLauncher, clock: VirtualClock) -> None:
        self.sb = sb
        self.launcher = launcher
        self.clock = clock

    async def next_child(self) -> FakeChild:
        """The child of the incarnation the driver starts next."""
        async with asyncio.timeout(QUICK_S):
            return await self.launcher.launched.get()

    async def crash(self, child: FakeChild) -> SandboxState:
        """End `child` as a crash; the state the driver settles in (backoff or failed)."""
        seq = self.sb.lc.seq
        child.exit(code=1)
        return await self.sb.wait_state(frozenset({S.BACKOFF, S.FAILED}), QUICK_S, after=seq)

    async def backoff(self) -> float:
        """The delay of the backoff now being waited out."""
        assert self.sb.lc.state is S.BACKOFF
        return await self.clock.sleeper()

    async def after_backoff(self) -> FakeChild:
        """Let the backoff's time pass; the child of the restart."""
        self.clock.advance(await self.backoff())
        return await self.next_child()


@contextlib.asynccontextmanager
async def model(tmp_path: Path, policy: RestartPolicy) -> AsyncIterator[Model]:
    (tmp_path / "sandboxes").mkdir()
    (tmp_path / "run").mkdir()
    plan = SandboxPlan(
        sandbox_id="model", plugin_id="model", plugin_dir=None, plugin_version="0", entry="",
        declared_tools=frozenset(), plugin_config={}, limits=Limits(), restart=policy, backend="fake",
    )  # fmt: skip
    launcher, clock = FakeLauncher(), VirtualClock()
    log = SandboxLog(tmp_path / "model.log")
    sb = SupervisedSandbox(
        plan,
        launcher=launcher,
        registry=Registry(),
        # Its children never hand-shake; the test ends each long before this.
        timing=Timing(handshake_timeout_s=600),
        dirs=SandboxDirs(workspace=tmp_path / "sandboxes" / "model" / "workspace", run_dir=tmp_path / "run" / "model"),
        log=log,
        env={},
        run_as=None,
        clock=clock,
    )
    try:
        async with asyncio.TaskGroup() as tg:
            supervision = tg.create_task(sb.supervise(), name="supervise model")
            yield Model(sb, launcher, clock)
            supervision.cancel()
    finally:
        log.close()


async def test_backoff_doubles_until_capped(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=10, period_s=1000, backoff_initial_s=0.5, backoff_max_s=3)
    async with model(tmp_path, policy) as m:
        m.sb.request_start()
        child = await m.next_child()
        delays = []
        for _ in range(6):
            assert await m.crash(child) is S.BACKOFF
            delays.append(await m.backoff())
            # Not a moment before its time: just short of it, nothing has started.
            m.clock.advance(await m.backoff() - 0.01)
            assert m.sb.lc.state is S.BACKOFF and m.clock.sleeping() == [pytest.approx(0.01)] and m.launcher.launched.empty()
            child = await m.after_backoff()
        assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
        assert m.sb.lc.restarts == 6 and (await m.sb.status())["pid"] == child.pid


async def test_too_many_deaths_within_the_period_fail_and_it_stays_failed(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=2, period_s=60, backoff_initial_s=0.5, backoff_max_s=30)
    async with model(tmp_path, policy) as m:
        m.sb.request_start()
        child = await m.next_child()
        assert await m.crash(child) is S.BACKOFF and await m.backoff() == 0.5
        child = await m.after_backoff()
        assert await m.crash(child) is S.BACKOFF and await m.backoff() == 1.0
        child = await m.after_backoff()
        assert await m.crash(child) is S.FAILED
        assert "2 restarts within 60 s" in m.sb.lc.why
        # Failed is for an operator to end: no timer, no launch, however long it waits.
        m.clock.advance(3600)
        status = await m.sb.status()
        assert status["state"] == "failed" and status["pid"] is None
        assert m.clock.sleeping() == [] and m.launcher.launched.empty()
        assert m.sb.lc.restarts == 2


async def test_deaths_outside_the_period_are_forgotten(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=1, period_s=60, backoff_initial_s=0.5, backoff_max_s=30)
    async with model(tmp_path, policy) as m:
        m.sb.request_start()
        child = await m.next_child()
        assert await m.crash(child) is S.BACKOFF and await m.backoff() == 0.5
        child = await m.after_backoff()
        # This child lives past the period: the first death has left the window, so
        # this one is again the first, with the first delay, and not the budget's end.
        m.clock.advance(61)
        assert await m.crash(child) is S.BACKOFF and await m.backoff() == 0.5
        assert (await m.sb.status())["restarts_left"] == 0
        child = await m.after_backoff()
        # Two inside the window now: past a budget of one.
        assert await m.crash(child) is S.FAILED


async def test_operator_restart_forgives_past_deaths(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=2, period_s=60, backoff_initial_s=0.5, backoff_max_s=30)
    async with model(tmp_path, policy) as m:
        m.sb.request_start()
        child = await m.next_child()
        assert await m.crash(child) is S.BACKOFF
        child = await m.after_backoff()
        assert await m.crash(child) is S.BACKOFF
        child = await m.after_backoff()
        assert await m.crash(child) is S.FAILED
        # All three deaths are inside the period still; the operator restarts.
        restarted = asyncio.create_task(m.sb.restart(QUICK_S))
        child = await m.next_child()
        assert await m.crash(child) is S.BACKOFF
        assert await restarted is S.CRASHED
        # Forgiven: the initial backoff again, and the whole budget.
        assert await m.backoff() == 0.5
        assert (await m.sb.status())["restarts_left"] == 1
        child = await m.after_backoff()
        assert await m.crash(child) is S.BACKOFF and await m.backoff() == 1.0
        child = await m.after_backoff()
        assert await m.crash(child) is S.FAILED


async def test_a_stop_cuts_the_backoff_short(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=5, period_s=60, backoff_initial_s=10, backoff_max_s=30)
    async with model(tmp_path, policy) as m:
        m.sb.request_start()
        assert await m.crash(await m.next_child()) is S.BACKOFF
        await m.sb.stop("test: stop during backoff", QUICK_S)
        assert m.sb.lc.state is S.STOPPED and m.sb.lc.why == "stopped during backoff"
        assert m.clock.sleeping() == [] and m.launcher.launched.empty()
        assert m.clock.now() == 1000.0  # no time had to pass
