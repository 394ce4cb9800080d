"""Event-loop discipline (issue 13, item 2): nothing clawsup runs on the supervisor's
loop may hold it 50 ms or more, under a busy mix of what an operator does at once:
status polled while docker and bwrap sandboxes restart, 100 sessions chatting, a
plugin flooding its log and a follower reading it. The supervisor runs with
CLAWSUP_LOOP_DEBUG_MS=50 (supervisor/control/loop_watch.py): asyncio's debug mode reports each
callback that took 50 ms or more, and the watch adds what the loop thread did
meanwhile and where it was.

What counts against us, and why. On this 2-core machine shared with other test runs,
a callback's wall time often passes 50 ms because the supervisor was preempted, or
waited for the GIL while one of its threads was, not because the callback blocked.
Thread CPU time alone cannot tell these apart (the thread is off CPU in each). So the
watch takes the wait for a CPU from the kernel (schedstat `run_delay`), credits time
off CPU to a blocking call only when its sampler caught the thread asleep in one (a
thread waiting for the GIL cannot be sampled: the sampler needs the GIL too), and sets
the garbage collector's pauses apart. A report fails the test when the watch says the
callback held the loop (50 ms of CPU, or of CPU and a blocking call) and the time went
to clawsup's code: its sampled stacks reach a frame under supervisor/ or sandbox/
(grpc's internals and asyncio's own machinery are not ours to fix here). The first
test proves the measure on a loop of its own: a blocking sleep and a CPU-bound
callback count; a small computation preempted for 400 ms, or stalled by another
thread holding the GIL, or slowed by debug mode itself, does not.

asyncio's debug mode costs time of its own (each handle and task records where it was
created, some 50 µs under load): a callback would have to schedule about a thousand
handles to reach 50 ms that way, which would be a finding in itself. Every report is
printed, by callback and by site, for whoever fixes the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import cycle
from typing import Any

from clawsup.supervisor.control.api import ControlClient
from tests.conftest import PLUGINS, ROOT, Gateway, require_bwrap, require_docker, workspace_config

LOOP_MS = 50
OURS = (str(ROOT / "supervisor") + "/", str(ROOT / "sandbox") + "/")


@dataclass
class SlowCallback:
    """One report of supervisor/control/loop_watch.py, as read back from supervisor.log."""

    text: str
    data: dict[str, Any]

    @property
    def own_s(self) -> float:
        return self.data["own_s"]

    @property
    def ours(self) -> bool:
        """Whether the time went to clawsup's code: the sampled stacks say so when
        there are samples (the callback's own frames are on them); without any (a
        stall the sampler could not catch: C code holding the GIL throughout), the
        callback's own code does."""
        if self.data["where"]:
            return True
        if self.data["samples"]:
            return False
        return bool(self.data["callback"]) and self.data["callback"][0].startswith(OURS)

    @property
    def held_the_loop(self) -> bool:
        """The watch's verdict (supervisor/control/loop_watch.py `Measure.held`): CPU time,
        less the collector's, reached the limit; or own time did, with a sample
        asleep in a blocking call."""
        return self.data["held"]

    def blame(self) -> str:
        """The innermost clawsup frame, and below it the call that took the time."""
        where = self.data["where"]
        if not where and self.data["samples"]:
            inner = self.data["samples"][0]["stack"][:1]
            return f"outside clawsup's frames: {_short(inner[0][0])}:{inner[0][1]} in {inner[0][2]}" if inner else "outside any Python frame"
        if not where:
            cb = self.data["callback"]
            return f"no sample; the callback is {_short(cb[0])}:{cb[1]} {cb[2]}" if cb else "no sample, no source"
        path, line, fn = where[0]
        below = ""
        for s in self.data["samples"]:
            stack = [tuple(f) for f in s["stack"]]
            if tuple(where[0]) in stack:
                inner = stack[0]
                if tuple(inner) != tuple(where[0]):
                    below = f" -> {_short(inner[0])}:{inner[1]} in {inner[2]}"
                break
        return f"{_short(path)}:{line} in {fn}{below}"

    def summary(self) -> str:
        d = self.data
        asleep = f" asleep in {', '.join(sorted(set(d['asleep'])))}" if d["asleep"] else ""
        return (
            f"{('HELD ' if self.held_the_loop else 'ours ') if self.ours else 'other'} {d['wall_s'] * 1000:4.0f} ms wall: {d['cause']}; "
            f"own {d['own_s'] * 1000:.0f} ms (cpu {d['cpu_s'] * 1000:.0f}, off cpu {d['off_cpu_s'] * 1000:.0f}{asleep}), gc {d['gc_s'] * 1000:.0f} ms, debug {d['debug_s'] * 1000:.0f} ms, "
            f"waiting for a CPU {(d['waiting_for_cpu_s'] or 0) * 1000:.0f} ms; {len(d['samples'])} sample(s): {self.blame()}\n"
            f"        {self.text.split(' [')[0][:300]}"
        )


def _short(path: str) -> str:
    return path[len(str(ROOT)) + 1 :] if path.startswith(OURS) else re.sub(r"^.*/site-packages/", "", path)


def by_site(reports: list[SlowCallback]) -> dict[str, list[SlowCallback]]:
    """Reports grouped by the innermost clawsup function they name."""
    out: dict[str, list[SlowCallback]] = {}
    for cb in reports:
        where = cb.data["where"]
        site = f"{_short(where[0][0])} in {where[0][2]}" if where else ("(not clawsup's) " if not cb.ours else "") + cb.blame().split(" -> ")[0]
        out.setdefault(site, []).append(cb)
    return out


def slow_callbacks(log: str) -> list[SlowCallback]:
    out = []
    for line in log.splitlines():
        if " | loop_watch {" in line:
            text, _, payload = line.partition(" | loop_watch ")
            out.append(SlowCallback(text=text.split("asyncio: ", 1)[-1], data=json.loads(payload)))
    return out


# -- the measure itself ---------------------------------------------------------------

WATCHED_LOOP = r"""
import asyncio, os, subprocess, sys, threading, time
from loguru import logger
from clawsup.supervisor.control.loop_watch import LoopWatch

logger.remove()
logger.add(sys.stdout, format="{message}")
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})  # before the sampler thread starts: it inherits this
HOG = f"import os, time; os.sched_setaffinity(0, {{{cpu}}}); print('on', flush=True)\nwhile time.thread_time() < 0.4: pass"


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def blocking_sleep():
    time.sleep(0.12)


def computing():
    spin(0.08)


def preempted():
    spin(0.02)


def scheduling_many():
    # Cheap, but for debug mode's recording where each handle and future was created
    # (format_helpers' and traceback's extract_stack), until 0.1 s of CPU has gone,
    # whatever this machine's speed: without that recording set apart, this would
    # hold the loop. The watch tells the recording's share from its samples. Handles
    # alone (5000 of them, 130 to 230 ms of CPU under load) were sampled wherever the
    # GIL's switch interval fell, a tenth of the time in call_soon's own checks,
    # which take 3% of it; from 20 samples or fewer that noise once made 62 ms of
    # "computing". A future's recording reads the source lines, after which every
    # recording checks their files (a stat, the GIL let go): the samples land there,
    # as in a gateway, whose loop makes futures all the time.
    loop = asyncio.get_running_loop()
    end = time.thread_time() + 0.1
    while time.thread_time() < end:
        for _ in range(20):
            loop.call_soon(int)
            loop.create_future()


def waiting_for_the_gil():
    # Another thread in one long C call, which keeps the GIL throughout.
    threading.Thread(target=sum, args=(range(10_000_000),)).start()
    spin(0.01)


async def main():
    loop = asyncio.get_running_loop()
    LoopWatch(loop, 0.05).install()
    for callback in (blocking_sleep, computing, scheduling_many, waiting_for_the_gil):
        loop.call_soon(callback)
        await asyncio.sleep(0)
    # A busy process on our one CPU, and ourselves at the lowest priority: the next
    # callback waits for a CPU most of its wall time.
    hog = await asyncio.create_subprocess_exec(sys.executable, "-c", HOG, stdout=subprocess.PIPE)
    await hog.stdout.readline()
    os.nice(19)
    loop.call_soon(preempted)
    await hog.wait()


asyncio.run(main())
"""


def test_the_watch_counts_a_blocking_call_and_not_a_preemption() -> None:
    r = subprocess.run([sys.executable, "-c", WATCHED_LOOP], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    reports = {m.group(1): cb for cb in slow_callbacks(r.stdout) if (m := re.search(r"<Handle (\w+)\(\)", cb.text))}
    assert set(reports) == {"blocking_sleep", "computing", "scheduling_many", "waiting_for_the_gil", "preempted"}, r.stdout

    sleep = reports["blocking_sleep"]
    assert sleep.own_s >= 0.1 and sleep.data["cpu_s"] < 0.05, sleep.summary()
    assert sleep.held_the_loop and sleep.data["cause"] == "blocking call" and set(sleep.data["asleep"]) == {"hrtimer_nanosleep"}, sleep.summary()
    assert all(s["stack"][0][2] == "blocking_sleep" for s in sleep.data["samples"]), sleep.summary()

    computing = reports["computing"]
    assert computing.held_the_loop and computing.data["cause"] == "computing" and computing.data["cpu_s"] >= 0.075, computing.summary()
    assert any(s["stack"][:2] and s["stack"][1][2] == "computing" for s in computing.data["samples"]), computing.summary()

    many = reports["scheduling_many"]
    assert many.data["debug_s"] > many.data["cpu_s"] and not many.held_the_loop, many.summary()

    gil = reports["waiting_for_the_gil"]
    assert gil.data["off_cpu_s"] >= 0.05 and not gil.data["asleep"] and not gil.held_the_loop, gil.summary()

    preempted = reports["preempted"]
    assert preempted.data["wall_s"] >= 0.2 and preempted.data["waiting_for_cpu_s"] >= 0.15, preempted.summary()
    assert preempted.data["cause"] == "waiting for a CPU" and preempted.own_s < LOOP_MS / 1000 and not preempted.held_the_loop, preempted.summary()


def test_a_bad_debug_value_is_refused_with_the_variable_named(state_dir) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "clawsup.supervisor.control.cli", "start", "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "CLAWSUP_LOOP_DEBUG_MS": "fast"},
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "CLAWSUP_LOOP_DEBUG_MS must be a number of milliseconds" in r.stderr and "'fast'" in r.stderr


# -- the busy mix ---------------------------------------------------------------------

SESSIONS = 100
MIX_BOUND_S = 45.0
ENOUGH = {"basics": 2, "chaos": 2, "workspace-main": 2, "floods": 2}
"""The least of each kind the mix does before it ends (chats aside)."""


def mix_config() -> dict[str, Any]:
    """basics and chaos on bwrap (chaos floods), the agent's workspace on docker; one
    session per peer, the offline model."""
    cfg = workspace_config("docker", sandbox__defaults__backend="bwrap")
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    cfg["agents"]["list"] = [{"id": "main", "default": True, "model": "offline"}]
    cfg["session"] = {"dmScope": "per-peer"}
    return cfg


class Mix:
    """The load, each kind from its own thread, until `stop`."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.stop = threading.Event()
        self.enough = threading.Event()
        self.status_s: list[float] = []
        self.done: dict[str, int] = {}
        self.failures: list[str] = []

    def _count(self, what: str) -> None:
        self.done[what] = self.done.get(what, 0) + 1
        if all(self.done.get(k, 0) >= n for k, n in ENOUGH.items()):
            self.enough.set()

    def run(self, what: str, fn: Any, *args: Any) -> threading.Thread:
        def guarded() -> None:
            try:
                fn(*args)
            except Exception as e:  # reported by the test, with the rest
                self.failures.append(f"{what}: {type(e).__name__}: {e}")
                self.stop.set()
                self.enough.set()

        t = threading.Thread(target=guarded, name=what, daemon=True)
        t.start()
        return t

    def poll_status(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            resp = self.gw.request(op="status")
            self.status_s.append(time.monotonic() - t0)
            assert resp["ok"], resp
            if len(self.status_s) % 5 == 0:
                assert self.gw.request(op="logs", sandbox="chaos", n=500)["ok"]

    def restart(self, *sandboxes: str) -> None:
        for sandbox in cycle(sandboxes):
            if self.stop.is_set():
                return
            resp = self.gw.request(op="restart", sandbox=sandbox, timeout=60)
            assert resp["ok"], resp
            self._count(sandbox)

    def flood(self) -> None:
        while not self.stop.is_set():
            # Fails while chaos restarts; the flood goes on with the next incarnation.
            if self.gw.call("chaos_flood", {"mb": 2, "stream": "stdout"}, timeout=30)["ok"]:
                self._count("floods")

    def follow(self) -> None:
        """A `clawsup logs chaos -f` through the flood (again after each restart)."""
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                for _ in ControlClient(self.gw.client.path).stream({"op": "logs", "sandbox": "chaos", "n": 10, "follow": True}, timeout=1):
                    if self.stop.is_set():
                        return


def chat(gw: Gateway, peer: str, text: str) -> str:
    replies = []
    for msg in ControlClient(gw.client.path).stream({"op": "chat", "text": text, "peer": peer}, timeout=60):
        if "reply" in msg:
            replies.append(msg["reply"])
        elif "ok" in msg:
            assert msg["ok"], msg
    assert replies, f"no reply to {text!r} from {peer}"
    return replies[-1]


def converse(gw: Gateway, n: int) -> list[str]:
    """Two turns of one session: a plugin tool on bwrap, then a plain message (odd
    sessions), a command in the docker workspace (one in ten) or another tool."""
    peer = f"peer{n}"
    second = '/tool exec {"command": "echo from-docker"}' if n % 10 == 0 else "how are you" if n % 2 else '/tool calc {"expression": "6 * 7"}'
    return [chat(gw, peer, f'/tool echo {{"text": "{peer} says hi"}}'), chat(gw, peer, second)]


def test_a_busy_mix_never_holds_the_loop_in_our_code(gateway_factory: Any) -> None:
    require_bwrap()
    require_docker()
    t0 = time.monotonic()
    gw = gateway_factory(mix_config(), env={"CLAWSUP_LOOP_DEBUG_MS": str(LOOP_MS)})
    assert "asyncio debug mode" in gw.supervisor_log()
    mix = Mix(gw)
    started = time.monotonic()
    threads = [
        mix.run("status", mix.poll_status),
        mix.run("bwrap restarts", mix.restart, "basics", "chaos"),
        mix.run("docker restarts", mix.restart, "workspace-main"),
        mix.run("flood", mix.flood),
        mix.run("follow", mix.follow),
    ]
    with ThreadPoolExecutor(max_workers=20) as pool:
        chats = [pool.submit(converse, gw, n) for n in range(SESSIONS)]
        answers = [f.result(timeout=max(1.0, MIX_BOUND_S - (time.monotonic() - started))) for f in chats]
    chats_s = time.monotonic() - started
    mix.enough.wait(max(1.0, MIX_BOUND_S - (time.monotonic() - started)))
    mix.stop.set()
    for t in threads:
        t.join(60)
    mix_s = time.monotonic() - started
    assert gw.stop() == 0
    stop_s = time.monotonic() - started - mix_s
    reports = slow_callbacks(gw.supervisor_log())

    polls = sorted(mix.status_s)
    print(f"\nstart {started - t0:.1f} s, stop {stop_s:.1f} s, mix of {mix_s:.1f} s: {SESSIONS} sessions chatted in {chats_s:.1f} s; {len(polls)} status polls, p50 {polls[len(polls) // 2] * 1000:.0f} ms, "
          f"worst {polls[-1] * 1000:.0f} ms; done {mix.done}; {len(reports)} slow callback(s):")  # fmt: skip
    for cb in sorted(reports, key=lambda c: -c.own_s):
        print("  " + cb.summary())
    print("by site (count, worst own time, causes):")
    for site, cbs in sorted(by_site(reports).items(), key=lambda kv: -max(c.own_s for c in kv[1])):
        print(f"  {len(cbs):3d} x {max(c.own_s for c in cbs) * 1000:4.0f} ms  {site}  ({', '.join(sorted({c.data['cause'] for c in cbs}))})")

    assert not mix.failures, mix.failures
    assert not [t.name for t in threads if t.is_alive()]
    # The mix happened: every session answered, bwrap and docker sandboxes restarted
    # while the flood ran.
    assert len(answers) == SESSIONS
    assert all(a[0].startswith(("echo returned: peer", "echo failed: ")) for a in answers), [a[0] for a in answers][:5]
    for n, (_, second) in enumerate(answers):
        expected = ("exec returned: ", "exec failed: ") if n % 10 == 0 else (f"[main] received in agent:main:direct:peer{n}: how are you",) if n % 2 else ("calc returned: 42", "calc failed: ")
        assert second.startswith(expected), (n, second)
    assert all(mix.done.get(k, 0) >= n for k, n in ENOUGH.items()), f"the mix did too little in {MIX_BOUND_S:.0f} s: {mix.done}"
    offences = [cb for cb in reports if cb.ours and cb.held_the_loop]
    assert not offences, "callbacks in clawsup's code held the loop 50 ms or more:\n" + "\n".join(cb.summary() for cb in offences)
