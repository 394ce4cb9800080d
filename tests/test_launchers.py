"""The launchers on their own, from an asyncio test: real backends, no supervisor.

What the supervisor relies on and cannot check itself: a launch cancelled at any
point leaves nothing behind (no process, no cgroup folder, no container: asserted
from the host's side); a slow launch does not stall the event loop; a stopped
sandbox's cgroup folder is gone once its child is closed; a container's usage is
sampled, not asked of the engine at every status poll."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from clawsup.sandbox.launch.cgroup import CgroupRoot
from clawsup.sandbox.handshake import GatePayload
from clawsup.sandbox.launch.launcher import Child, ChildUser, Launcher, Limits, LaunchSpec
from tests.conftest import cgroups_available, require_backend, wait_gone

MAX_LAG_S = 0.05
# A uid of no user of this machine, for a child the workspace is handed to.
CHILD_UID = 1_999_000_000 + os.getpid() % 100_000


@pytest.fixture
def root() -> Any:
    # Short: unix socket paths hold 108 bytes.
    d = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    (d / "ws").mkdir()
    (d / "run").mkdir(mode=0o700)
    (d / "private").mkdir(mode=0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_spec(root: Path, sandbox_id: str, run_as: ChildUser | None = None, workspace: Path | None = None) -> LaunchSpec:
    """A workspace host: no plugin, the core tools on the workspace."""
    gate = GatePayload(
        sandbox_id=sandbox_id, supervisor_token="s", host_token="h", plugin_id="", plugin_version="", entry="", plugin_config={}, role="workspace"
    )
    return LaunchSpec(
        sandbox_id=sandbox_id, plugin_dir=None, workspace=workspace or root / "ws", run_dir=root / "run", limits=Limits(),
        env={"PATH": os.environ["PATH"]}, gate=gate, run_as=run_as, private_dir=root / "private",
    )  # fmt: skip


@contextlib.asynccontextmanager
async def launcher_for(backend: str, root: Path) -> AsyncIterator[tuple[Any, CgroupRoot | None]]:
    require_backend(backend)
    cgroups = await asyncio.to_thread(CgroupRoot.create) if backend != "docker" else None
    if backend == "docker":
        from clawsup.sandbox.launch.container import DockerLauncher

        launcher: Launcher = await asyncio.to_thread(DockerLauncher, root)
    elif backend == "bwrap":
        from clawsup.sandbox.launch.bwrap import BwrapLauncher

        launcher = await asyncio.to_thread(BwrapLauncher, cgroups)
    else:
        from clawsup.sandbox.launch.process import ProcessLauncher

        launcher = await asyncio.to_thread(ProcessLauncher, cgroups)
    try:
        yield launcher, cgroups
    finally:
        await launcher.aclose()


async def handshake(child: Child, timeout: float = 30) -> bytes:
    """The child's first line on stdout (event-driven, bounded)."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[bytes] = loop.create_future()
    buf = bytearray()

    def readable() -> None:
        try:
            data = os.read(child.stdout_fd, 4096)
        except BlockingIOError:
            return
        buf.extend(data)
        if (b"\n" in buf or not data) and not got.done():
            got.set_result(bytes(buf))

    loop.add_reader(child.stdout_fd, readable)
    try:
        return await asyncio.wait_for(got, timeout)
    finally:
        loop.remove_reader(child.stdout_fd)


def processes_of(root: Path) -> list[int]:
    """Every process on the machine started for this test's sandboxes: their command
    lines (the host's, bwrap's, its shell's) name our folder."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if str(root) in " ".join(p.info["cmdline"] or []):
            out.append(p.pid)
    return out


def cgroup_dirs(cgroups: CgroupRoot | None, sandbox_id: str) -> list[Path]:
    if cgroups is None:
        return []
    return [base / sandbox_id for base in cgroups.bases.values() if (base / sandbox_id).exists()]


def containers_of(root: Path) -> list[str]:
    import docker

    from clawsup.sandbox.launch.container import STATE_LABEL

    client = docker.from_env()
    try:
        return [c.name for c in client.containers.list(all=True, filters={"label": f"{STATE_LABEL}={root}"})]
    finally:
        client.close()


def _cpu_waits_s() -> dict[int, float]:
    """How long each thread of this process has waited, runnable, for a CPU
    (schedstat's run delay), by thread id."""
    waits: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                waits[int(tid)] = int(f.read().split()[1]) / 1e9
    return waits


async def max_loop_lag(during: Awaitable[Any]) -> tuple[Any, float]:
    """Run `during`, ticking every 5 ms beside it; returns its result and the longest
    the loop was late for a tick. What a loaded machine (2 cores shared by a dozen
    busy processes here) does is not counted: time the loop's thread spent runnable
    but waiting for a CPU (30-100 ms with no launch at all), and time it waited for
    the GIL while the thread holding it waited for a CPU. A launch runs its work in
    worker threads (the walk, the engine's HTTP), whose Python code holds the GIL
    between syscalls; a holder taken off its CPU keeps it until it runs again, and
    the loop, idle, waits in a futex meanwhile (Pacer makes that rarer and cannot
    prevent it): 10 to 40 ms a tick here under load, and the docker case once failed
    at 119 ms under a full suite's. Which thread holds the GIL the kernel does not
    say, so the loop's time asleep beyond the tick is credited with at most what our
    other threads waited for a CPU meanwhile. The loop's own running always counts
    in full (a walk on the loop is that), and so does a blocking call, but for any
    such wait of other threads beside it."""
    worst = 0.0
    done = asyncio.Event()
    me = threading.get_native_id()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            t, ran, before = time.monotonic(), time.thread_time(), _cpu_waits_s()
            await asyncio.sleep(0.005)
            late = time.monotonic() - t - 0.005
            after = _cpu_waits_s()
            waited = after[me] - before[me]
            asleep = max(0.0, late - waited - (time.thread_time() - ran))
            others = sum(w - before.get(tid, 0.0) for tid, w in after.items() if tid != me)
            worst = max(worst, late - waited - min(asleep, others))

    async with asyncio.TaskGroup() as tg:
        tg.create_task(ticker())
        try:
            result = await during
        finally:
            done.set()
    return result, worst


# -- a launch cancelled midway ----------------------------------------------------

# (step, how): held at the step, or cancelled while the step's work (a thread) is in
# flight. A process launch does no more work after "return".
PROCESS_POINTS = [(s, h) for s in ("prepare", "spawn", "gate") for h in ("at", "during")] + [("return", "at")]
DOCKER_POINTS = [(s, h) for s in ("prepare", "create", "attach", "start", "return") for h in ("at", "during")]


async def cancel_launch(launcher: Any, spec: LaunchSpec, step: str, how: str) -> None:
    """Launch, and cancel the launch from outside when it reaches `step`: while it
    is held there (`at`), or while the step's own work is in flight (`during`)."""
    reached = asyncio.Event()
    held = asyncio.Event()

    async def checkpoint(name: str) -> None:
        if name == step:
            reached.set()
            if how == "at":
                await held.wait()  # until cancelled

    launcher.checkpoint = checkpoint
    task = asyncio.create_task(launcher.launch(spec))
    waiter = asyncio.create_task(reached.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED, timeout=60)
    waiter.cancel()
    assert reached.is_set(), f"the launch never reached {step!r}: {task.exception() if task.done() else 'still running'}"
    task.cancel()
    try:
        child = await task
    except asyncio.CancelledError:
        return
    # The work finished before the cancellation could land: the caller owns the child.
    await child.kill_all()
    await child.aclose()
    pytest.fail(f"the launch was not cancelled at {step!r} ({how})")


@pytest.mark.parametrize(("step", "how"), PROCESS_POINTS)
@pytest.mark.parametrize("backend", ["process", "bwrap"])
async def test_a_cancelled_launch_leaves_no_process_and_no_cgroup(backend: str, step: str, how: str, root: Path) -> None:
    if not cgroups_available():
        pytest.skip("needs a writable cgroup to check for leftovers")
    async with launcher_for(backend, root) as (launcher, cgroups):
        sid = f"cancel-{step}-{how}"
        await cancel_launch(launcher, make_spec(root, sid), step, how)
        assert wait_gone(processes_of(root), timeout=10) == []
        assert cgroup_dirs(cgroups, sid) == []
        # The launcher is still usable: the next launch of the same sandbox starts.
        launcher.checkpoint = None
        child = await launcher.launch(make_spec(root, sid))
        try:
            assert (await handshake(child)).startswith(b"CLAWSUP|")
        finally:
            await child.kill_all()
            await child.wait()
            await child.aclose()
        assert wait_gone(processes_of(root), timeout=10) == []
        assert cgroup_dirs(cgroups, sid) == []


@pytest.mark.parametrize(("step", "how"), DOCKER_POINTS)
async def test_a_cancelled_container_launch_leaves_no_container(step: str, how: str, root: Path) -> None:
    async with launcher_for("docker", root) as (launcher, _):
        await cancel_launch(launcher, make_spec(root, f"cancel-{step}"), step, how)
        assert containers_of(root) == []
        assert not (root / "private" / "gate").exists()


# -- the loop stays responsive --------------------------------------------------------


@pytest.fixture
def big_workspace() -> Any:
    """20,000 entries, on tmpfs: on this machine's disk, making them took a minute."""
    d = Path(tempfile.mkdtemp(prefix="cs-ws-", dir="/dev/shm"))
    for i in range(100):
        sub = d / f"d{i}"
        sub.mkdir()
        for j in range(200):
            os.close(os.open(sub / f"f{j}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_a_slow_launch_does_not_stall_the_loop(backend: str, root: Path, big_workspace: Path) -> None:
    """The workspace is handed to the child's uid: a walk of 20,000 entries, which
    held the loop for the whole walk (over half a second) when it ran there."""
    if os.geteuid() != 0:
        pytest.skip("handing a workspace to another uid needs root")
    require_backend(backend)
    async with launcher_for(backend, root) as (launcher, _):
        t0 = time.monotonic()
        spec = make_spec(root, "slow", ChildUser("t", CHILD_UID, CHILD_UID), workspace=big_workspace)
        child, lag = await max_loop_lag(launcher.launch(spec))
        took = time.monotonic() - t0
        try:
            assert (await handshake(child)).startswith(b"CLAWSUP|")
            # It did the slow work, and the loop went on meanwhile.
            assert os.stat(big_workspace / "d99" / "f199").st_uid == CHILD_UID
            assert took > 4 * MAX_LAG_S, f"the launch took {took:.3f} s: too quick to tell anything"
            assert lag < MAX_LAG_S, f"the loop was held for {lag * 1000:.0f} ms during a launch of {took:.2f} s"
            _, lag = await max_loop_lag(child.kill_all())
            assert lag < MAX_LAG_S, f"kill_all held the loop for {lag * 1000:.0f} ms"
            await child.wait()
        finally:
            await child.kill_all()
            _, lag = await max_loop_lag(child.aclose())
        assert lag < MAX_LAG_S, f"aclose held the loop for {lag * 1000:.0f} ms"


async def test_container_usage_is_sampled_at_most_once_a_second(root: Path) -> None:
    """`clawsup status` polled in a tight loop: the engine is asked for stats at most
    once a second per container, and no poll waits on it once a sample exists."""
    async with launcher_for("docker", root) as (launcher, _):
        child = await launcher.launch(make_spec(root, "usage"))
        try:
            await handshake(child)
            asked: list[float] = []
            client = launcher._client  # type: ignore[attr-defined]
            # Observing the real client's HTTP exchanges (requests' response hook).
            hook: Callable[..., None] = lambda r, *a, **k: asked.append(time.monotonic()) if "/stats" in r.url else None  # noqa: E731
            client.api.hooks["response"].append(hook)
            first: Any = await child.usage()
            assert first is not None and first["memory_bytes"] > 0 and first["cpu_seconds"] >= 0
            assert child.rss_bytes() == first["memory_bytes"]

            async def poll() -> float:
                slowest = 0.0
                end = time.monotonic() + 2.5
                while time.monotonic() < end:
                    t = time.monotonic()
                    u = await child.usage()
                    slowest = max(slowest, time.monotonic() - t)
                    assert u is not None and u["container"] == child.container_id  # type: ignore[attr-defined]
                    await asyncio.sleep(0.01)
                return slowest

            slowest, lag = await max_loop_lag(poll())
            assert slowest < MAX_LAG_S, f"a status poll waited {slowest * 1000:.0f} ms for the engine"
            assert lag < MAX_LAG_S
            # About 250 polls; 1 + 2.5 s worth of samples at most (plus one in flight).
            assert 1 <= len(asked) <= 5, len(asked)
            client.api.hooks["response"].remove(hook)
        finally:
            await child.kill_all()
            await child.wait()
            await child.aclose()
        assert containers_of(root) == []
        assert await child.usage() == {"container": child.container_id}  # type: ignore[attr-defined]


# -- cgroup folders after a stop ----------------------------------------------------------

HOG = "import mmap, sys; m = mmap.mmap(-1, 200 << 20); m.write(b'x' * (200 << 20)); print('ready', flush=True); sys.stdin.read()"


async def test_stops_leave_no_cgroup_folder(root: Path) -> None:
    """30 starts and stops of a bwrap sandbox, politely or by kill. Every third one
    also holds 200 MiB in a process of its cgroup, whose exit takes the kernel a
    while: an rmdir straight after the kill found the cgroup still populated (EBUSY)
    and left the empty folder behind, in 9 of 10 such stops."""
    if not cgroups_available():
        pytest.skip("needs a writable cgroup")
    async with launcher_for("bwrap", root) as (launcher, cgroups):
        assert cgroups is not None
        left: list[str] = []
        for i in range(30):
            sid = f"cycle-{i}"
            child = await launcher.launch(make_spec(root, sid))
            hog = None
            try:
                await handshake(child)
                dirs = cgroup_dirs(cgroups, sid)
                assert len(dirs) == len(cgroups.bases)
                if i % 3 == 0:
                    # A process of the sandbox's that holds a lot of memory (started
                    # here and joined to its cgroup, as a descendant would be).
                    hog = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                    for d in dirs:
                        (d / "cgroup.procs").write_text(str(hog.pid))
                    assert hog.stdout is not None
                    assert await asyncio.to_thread(hog.stdout.readline) == b"ready\n"
                if i % 2:
                    await child.signal_group(signal.SIGTERM)
                else:
                    await child.kill_all()
                await asyncio.wait_for(child.wait(), 30)
            finally:
                await child.aclose()
                if hog is not None:
                    await asyncio.to_thread(hog.wait, 30)
            left += [str(d) for d in cgroup_dirs(cgroups, sid)]
        assert left == []
        assert wait_gone(processes_of(root), timeout=10) == []
