"""One incarnation, one owner: a failure injected at each point of a sandbox's life,
and of the gateway's, leaves no process behind (supervisor/sandboxes/incarnation.py).

These run the gateway in the test's own event loop (`run_gateway`), so that a
failure can be injected between two of its awaits; the children are real (the
chaos plugin on the process backend, with a cgroup where the machine has one), and
what is left is judged from the host's process table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from loguru import logger

from clawsup.supervisor.errors import ClawsupError, SandboxDied, SandboxUnavailable
from clawsup.supervisor.control.gateway import GatewayOptions, run_gateway
from clawsup.supervisor.sandboxes.lifecycle import SandboxState, Transition
from clawsup.supervisor.sandboxes.manager import SandboxManager
from clawsup.supervisor.tools.dispatch import ToolDispatcher
from clawsup.supervisor.sandboxes.supervised import SupervisedSandbox
from tests.conftest import PLUGINS, Gateway, make_config, open_paths_wrap, wait_gone

S = SandboxState
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs trusted plugins as the supervisor's user, which the suite does as root")


def _config(state: Path) -> Path:
    cfg = make_config(sandbox__runAs="supervisor")
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    cfg["plugins"]["entries"] = {"basics": {"trust": "trusted"}, "chaos": {"trust": "trusted"}}
    path = state.parent / f"{state.name}.json"
    path.write_text(json.dumps(cfg))
    return path


def _ours(state: Path) -> list[int]:
    """Every live process whose command line names this state directory (the hosts:
    their socket lives there)."""
    mine = str(state)
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(mine in a for a in p.info["cmdline"] or []):
            found.append(p.pid)
    return [pid for pid in found if pid != os.getpid()]


class Logs:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._id = logger.add(lambda m: self.lines.append(str(m)), level="DEBUG", format="{level} {message}")

    def close(self) -> None:
        logger.remove(self._id)

    def text(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def logs() -> AsyncIterator[Logs]:
    seen = Logs()
    yield seen
    seen.close()


async def _gateway(state: Path, on_ready: Callable[[SandboxManager, ToolDispatcher], Awaitable[None]]) -> asyncio.Task[int]:
    opts = GatewayOptions(config_path=_config(state), state_dir=state, on_ready=on_ready)
    return asyncio.create_task(run_gateway(opts), name="gateway under test")


async def _spawned(manager: SandboxManager, tools: ToolDispatcher) -> list[int]:
    """The chaos host, and two grandchildren: one in its group, one that left it."""
    pids = [manager.sandboxes["chaos"].inc.child.pid]  # type: ignore[union-attr]
    for setsid in (False, True):
        r = await tools.invoke("chaos_spawn", {"setsid": setsid})
        pids.append(r.value()["pid"])
    return pids


async def _until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.02)


async def test_a_failing_gateway_task_kills_every_child(state_dir: Path, logs: Logs, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any task of the gateway failing (here the subagent runs' task) ends the
    gateway; every child, and what the children started, is dead by the time
    run_gateway returns: nothing waits for a cgroup or a warden to sweep up later."""
    armed = asyncio.Event()
    from clawsup.supervisor.agents import subagents

    async def failing_run(self: Any, stop: asyncio.Event) -> None:
        await armed.wait()
        raise RuntimeError("injected: a gateway task failed")

    monkeypatch.setattr(subagents.Subagents, "run", failing_run)
    pids: list[int] = []

    async def on_ready(manager: SandboxManager, tools: ToolDispatcher) -> None:
        pids.extend(await _spawned(manager, tools))
        pids.append(manager.sandboxes["basics"].inc.child.pid)  # type: ignore[union-attr]
        armed.set()

    gw = await _gateway(state_dir, on_ready)
    with pytest.raises(BaseException) as raised:
        await asyncio.wait_for(gw, 60)
    assert "injected: a gateway task failed" in repr(raised.value)
    assert len(pids) == 4
    # Killed, not left for later: at most the kernel's reaping of a zombie remains.
    assert wait_gone(pids, timeout=2) == []
    assert _ours(state_dir) == []


async def test_a_supervision_crash_kills_that_child_and_nothing_else(state_dir: Path, logs: Logs, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in one sandbox's supervision that escapes its incarnation (not one the
    incarnation's own tasks catch) kills that child and what it started, withdraws
    its tools, and leaves the other sandboxes serving."""
    boom = asyncio.Event()
    original = SupervisedSandbox._life

    async def life(self: SupervisedSandbox, inc: Any) -> None:
        if self.id != "chaos":
            return await original(self, inc)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(original(self, inc))
            await boom.wait()
            raise RuntimeError("injected: a supervision bug")

    monkeypatch.setattr(SupervisedSandbox, "_life", life)
    result: dict[str, Any] = {}

    async def on_ready(manager: SandboxManager, tools: ToolDispatcher) -> None:
        pids = await _spawned(manager, tools)
        # A call in flight when supervision fails is told its sandbox went away, at
        # once: not a transport error, not a wait for its own timeout.
        in_flight = asyncio.create_task(tools.invoke("chaos_sleep", {"seconds": 30}))
        await _until(lambda: bool(manager.sandboxes["chaos"].inc and manager.sandboxes["chaos"].inc.client and manager.sandboxes["chaos"].inc.client._inflight))
        boom.set()
        try:
            async with asyncio.timeout(5):
                await in_flight
        except SandboxDied as e:
            result["in_flight"] = str(e)
        chaos = manager.sandboxes["chaos"]
        await _until(lambda: "supervision failed" in logs.text())
        result["gone"] = await asyncio.to_thread(wait_gone, pids, 5)
        result["tools"] = [r.name for r in manager.registry.tools()]
        result["echo"] = (await tools.invoke("echo", {"text": "still here"})).value()
        try:
            await tools.invoke("chaos_ok", {})
        except SandboxUnavailable as e:
            result["error"] = str(e)
        result["state"] = chaos.lc.state
        os.kill(os.getpid(), 2)  # SIGINT: the gateway's own stop

    gw = await _gateway(state_dir, on_ready)
    assert await asyncio.wait_for(gw, 60) == 0
    assert result["gone"] == []
    assert "chaos" in result["in_flight"] and "its supervision ended" in result["in_flight"], result["in_flight"]
    assert not [t for t in result["tools"] if t.startswith("chaos_")]
    assert result["echo"] == "still here"
    assert "chaos" in result.get("error", "")
    assert "injected: a supervision bug" in logs.text()
    assert _ours(state_dir) == []


async def test_a_stop_that_overruns_its_timeout_still_kills(state_dir: Path, logs: Logs) -> None:
    """The caller of a stop gives up at its timeout; the kill escalation does not:
    a wedged child, and its grandchildren, are still killed."""
    result: dict[str, Any] = {}

    async def on_ready(manager: SandboxManager, tools: ToolDispatcher) -> None:
        chaos = manager.sandboxes["chaos"]
        pids = await _spawned(manager, tools)
        # Wedged: it can answer neither the Shutdown RPC nor SIGTERM.
        os.kill(pids[0], signal.SIGSTOP)
        with pytest.raises(TimeoutError):
            await chaos.stop("test: stop with a short timeout", timeout=0.05)
        result["stopping"] = chaos.lc.state
        result["gone"] = await asyncio.to_thread(wait_gone, pids, 10)
        await chaos.wait_state(frozenset({S.STOPPED}), 10)
        chaos.log.flush()
        result["log"] = chaos.log.path.read_text()
        result["echo"] = (await tools.invoke("echo", {"text": "fine"})).value()
        os.kill(os.getpid(), 2)

    gw = await _gateway(state_dir, on_ready)
    assert await asyncio.wait_for(gw, 60) == 0
    assert result["stopping"] is S.DRAINING
    assert result["gone"] == []
    assert result["echo"] == "fine"
    assert "sending SIGKILL to everything it started" in result["log"]
    assert _ours(state_dir) == []


@pytest.mark.parametrize("delay_ms", [0, 1, 3, 10, 30, 100])
async def test_cancelled_during_launch_leaves_nothing(state_dir: Path, logs: Logs, delay_ms: int) -> None:
    """The gateway is cancelled while a sandbox is being launched (a restart's launch,
    caught at several moments after it began): no process of it is left."""
    result: dict[str, Any] = {}

    async def on_ready(manager: SandboxManager, tools: ToolDispatcher) -> None:
        chaos = manager.sandboxes["chaos"]
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()

        def on_transition(t: Transition) -> None:
            if t.sandbox_id == "chaos" and t.new is S.STARTING and "incarnation 2" in t.why:
                result["armed"] = True
                loop.call_later(delay_ms / 1000, me.cancel)

        chaos.lc.listeners.append(on_transition)
        result["first"] = chaos.inc.child.pid  # type: ignore[union-attr]
        with contextlib.suppress(ClawsupError):
            await tools.invoke("chaos_crash", {})
        await asyncio.sleep(3600)  # cancelled from the listener

    gw = await _gateway(state_dir, on_ready)
    with pytest.raises(BaseException):
        await asyncio.wait_for(gw, 60)
    assert result.get("armed"), "the restart's launch never began"
    assert await asyncio.to_thread(lambda: wait_gone(_ours(state_dir), 2)) == []
    assert _ours(state_dir) == []


def _without_cgroups() -> list[str]:
    """The supervisor in a mount namespace where /sys/fs/cgroup is an empty read-only
    tmpfs: as on a machine that gives clawsup no cgroup."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs -o ro none /sys/fs/cgroup && exec "$@"', "sh", *open_paths_wrap()]


@pytest.mark.parametrize("how", ["restart", "restart of a child that ignores SIGTERM", "gateway stop"])
def test_without_a_cgroup_what_left_the_group_still_goes(how: str, state_dir: Path) -> None:
    """No cgroup to sweep: a grandchild that called setsid is found as the host's
    descendant (the host is a subreaper there) and ended, by the host at its
    shutdown or by the supervisor's kill through a pidfd, on every way out."""
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    gw = Gateway(state_dir, cfg, [], wrap=_without_cgroups())
    try:
        assert "no writable cgroup" in gw.supervisor_log()
        spawned = [gw.call("chaos_spawn", {"setsid": setsid})["data"]["result"]["pid"] for setsid in (True, False)]
        host = gw.status("chaos")["pid"]
        if how == "restart of a child that ignores SIGTERM":
            assert gw.call("chaos_ignore_sigterm")["ok"]
            os.kill(host, signal.SIGSTOP)  # nor can it answer the Shutdown RPC
        if how == "gateway stop":
            assert gw.stop(timeout=30) == 0
        else:
            assert gw.request(op="restart", sandbox="chaos", timeout=30)["ok"]
            assert gw.call("chaos_ok")["ok"]
        assert wait_gone([host, *spawned], timeout=10) == []
    finally:
        if gw.proc.poll() is None:
            gw.stop(timeout=30)
