"""Soak run: a real supervisor under a mix of work and faults for a while, with its
footprint and an `echo` call's latency sampled from start to end. Not a test (it
takes minutes); it prints a verdict and exits non-zero if anything an operator
relies on broke or grew.

    python scripts/soak.py [--minutes 10 | --seconds 120] [--backend bwrap] [--seed 1]

The mix, each part in its own thread, all at once:
- faults: chaos plugin tools that crash it (segfault, abort, `os._exit`), hang it
  (in a call, or later while idle so that only the heartbeat can notice), spin,
  allocate, flood its output, fork-bomb; misbehaving exec commands; and, one in
  `--runs-every`, a subagent run through `sessions_spawn` with the offline model
  (runs that time out, whose host is SIGKILLed, that are stopped with `/stop`,
  that fork-bomb their workspace, and plain ones);
- chat: `--chatters` senders over `--sessions` sessions (one cli peer each), plain
  messages and `/tool` calls through the offline model, and direct tool calls;
- log following: `clawsup logs SANDBOX -f` processes that come and go, some reading
  everything, some never reading (a stuck terminal), ended by Ctrl-C or killed;
- an `echo` caller, whose latencies are the "under load" figures.

Samples. At the start (before the mix), after the warm-up (`--warmup` seconds, and
every session chatted in once), every `--sample-every` seconds and at the end, the
mix pauses for a quiet window: every part finishes what it was doing, the followers
go, the subagent runs end, the plugins are ready again. In that window `--echo-calls`
echo calls give the quiet p50/p99, and the control `stats` op gives the supervisor's
RSS, open fds, asyncio tasks, sandboxes and threads. Quiet figures are comparable
across samples; the under-load figures (the echo caller's, between two samples, with
this script's own threads competing) are reported beside them.

The verdict compares the end with the warm-up sample (growth of RSS, fds, tasks,
sandboxes) and the quiet echo p99 at the end with the idle one at the start (target:
within `--p99-ratio`, 1.5x). It also checks that every echo and chat answered, every
subagent run ended and reported and left no sandbox, and that after `clawsup stop`
no process of the run is left (hosts, forks, the warden).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clawsup.supervisor.control.api import ControlClient  # noqa: E402

FAULTS = [
    ("chaos_crash", {"how": "segfault"}, None),
    ("chaos_crash", {"how": "abort"}, None),
    ("chaos_crash", {"how": "exit", "code": 3}, None),  # os._exit in the handler
    ("chaos_crash", {"how": "segfault", "delay_ms": 20}, None),
    ("chaos_raise", {"message": "soak"}, None),
    ("chaos_spin", {}, 0.5),
    ("chaos_hang", {}, 0.5),
    # Answers, then blocks its loop while idle: only the heartbeat can find it.
    ("chaos_hang", {"delay_ms": 20}, None),
    ("chaos_sleep", {"seconds": 5}, 0.2),
    ("chaos_alloc", {"mb_per_step": 16}, 10),
    ("chaos_flood", {"mb": 8, "stream": "both"}, 10),
    ("chaos_forkbomb", {}, 1),
    ("chaos_spawn", {"setsid": True}, None),
    # The exec tool, in the default agent's workspace sandbox: commands that slip
    # past the screen and misbehave.
    ("exec", {"command": "python3 -c 'import os\nwhile True:\n  try: os.fork()\n  except OSError: pass'", "timeout": 1}, None),
    ("exec", {"command": "head -c 20000000 /dev/zero | tr '\\0' x", "timeout": 20}, None),
    ("exec", {"command": "sleep 300 & setsid sleep 300 & trap '' TERM; sleep 300", "timeout": 0.5}, None),
    ("exec", {"command": "k=kill; $k -9 -1", "timeout": 5}, None),
    ("exec", {"command": "python3 -c 'x = bytearray(1 << 34)'", "timeout": 10}, None),
]

RUN_FAULTS = ["timeout", "crash", "stop", "forkbomb", "ok"]

# Sandboxes that live for the whole run; the faults aim at them, the quiet windows
# wait for them to be ready again, and the followers follow them.
STANDING = ("basics", "chaos", "workspace-main")


def chat(client: ControlClient, text: str, peer: str = "soak") -> tuple[str, str | None]:
    """The final reply, and the error (None when the message went through)."""
    reply, error = "", None
    for m in client.stream({"op": "chat", "peer": peer, "text": text}, timeout=120):
        reply = m.get("reply", reply)
        if m.get("ok") is False:
            error = f"{m['error']['code']}: {m['error']['message']}"
    return reply, error


def spawn(client: ControlClient, **args: object) -> str | None:
    """The run id, or None when the spawn was refused (too many running)."""
    out, _ = chat(client, "/tool sessions_spawn " + json.dumps(args))
    return json.loads(out.split("returned: ", 1)[1])["runId"] if out.startswith("sessions_spawn returned") else None


def run_fault(client: ControlClient, kind: str) -> str | None:
    """Starts one misbehaving (or healthy) subagent run; its id, None if refused."""
    exec_task = lambda cmd, t: "/tool exec " + json.dumps({"command": cmd, "timeout": t})  # noqa: E731
    if kind == "timeout":
        rid = spawn(client, task="/sleep 10", runTimeoutSeconds=0.5)
    elif kind == "crash":
        rid = spawn(client, task="/sleep 10")
        if rid is not None:
            client.request({"op": "wait", "sandbox": f"subagent-{rid}", "states": ["ready"], "timeout": 30})
            st = {s["id"]: s for s in client.request({"op": "status"})["data"]["sandboxes"]}
            pid = st.get(f"subagent-{rid}", {}).get("pid")
            if pid:
                os.kill(pid, signal.SIGKILL)
    elif kind == "stop":
        rid = spawn(client, task=exec_task("sleep 30", 60))
        chat(client, "/stop")
    elif kind == "forkbomb":
        rid = spawn(client, task=exec_task("python3 -c 'import os\nwhile True:\n  try: os.fork()\n  except OSError: pass'", 1))
    else:
        rid = spawn(client, task="/tool echo " + json.dumps({"text": "from a run"}))
    return rid


def pct(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    if not s:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"n": len(s), "p50": statistics.median(s), "p99": s[int(0.99 * (len(s) - 1))], "max": s[-1]}


class Gate:
    """Lets the mix pause for a quiet window. Each part calls `checkpoint()` between
    two actions; `pause()` returns once every part is parked there. Owned by main();
    the parts are its threads."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._paused = False
        self._over = False
        self._members: set[str] = set()
        self._parked: set[str] = set()

    def join(self, name: str) -> None:
        with self._cv:
            self._members.add(name)

    def leave(self, name: str) -> None:
        with self._cv:
            self._members.discard(name)
            self._cv.notify_all()

    def checkpoint(self, name: str) -> bool:
        """Parks while paused; False once the soak is over."""
        with self._cv:
            if self._paused and not self._over:
                self._parked.add(name)
                self._cv.notify_all()
                self._cv.wait_for(lambda: not self._paused or self._over)
                self._parked.discard(name)
            return not self._over

    def pause(self, timeout: float) -> set[str]:
        """The parts still busy when `timeout` ran out (empty: all parked)."""
        with self._cv:
            self._paused = True
            self._cv.wait_for(lambda: self._members <= self._parked, timeout)
            return self._members - self._parked

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def finish(self) -> None:
        with self._cv:
            self._over = True
            self._cv.notify_all()


@dataclass
class Mix:
    """What the parts share: the client, the gate, and what they saw."""

    client: ControlClient
    state: Path
    gate: Gate
    sessions: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter[str] = field(default_factory=Counter)
    echo_load: list[float] = field(default_factory=list)
    echo_slow: list[tuple[float, float, str]] = field(default_factory=list)
    """The slowest echo calls under load: (ms, when, the last fault fired before)."""
    failures: list[str] = field(default_factory=list)
    runs_pending: list[str] = field(default_factory=list)
    sessions_seen: set[str] = field(default_factory=set)
    peers_left: list[str] = field(default_factory=list)
    """The sessions not yet chatted in this round (all chatters share one round)."""
    last_fault: str = "nothing"

    def next_peer(self, rng: random.Random) -> str:
        """The next session of a shuffled round over all of them."""
        with self.lock:
            if not self.peers_left:
                self.peers_left = [f"soak-{i}" for i in range(self.sessions)]
                rng.shuffle(self.peers_left)
            return self.peers_left.pop()

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(f"{time.strftime('%H:%M:%S')} {what} (last fault: {self.last_fault})")


def part(mix: Mix, name: str, step: Callable[[], None]) -> threading.Thread:
    """One part of the mix: `step` again and again, parked by the gate between two."""

    def body() -> None:
        try:
            while mix.gate.checkpoint(name):
                step()
        except Exception as e:  # a part that dies is a finding, not a reason to stop
            mix.fail(f"{name} stopped: {type(e).__name__}: {e}")
        finally:
            mix.gate.leave(name)

    mix.gate.join(name)
    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    return t


def fault_step(mix: Mix, rng: random.Random, runs_every: int) -> None:
    # Fire at ready sandboxes, so that each fault meets a live child.
    for sb in STANDING:
        mix.client.request({"op": "wait", "sandbox": sb, "states": ["ready"], "timeout": 30})
    if runs_every and rng.randrange(runs_every) == 0:
        kind = rng.choice(RUN_FAULTS)
        mix.last_fault = f"run {kind}"
        rid = run_fault(mix.client, kind)
        mix.count(f"run {kind}: {'spawned' if rid else 'refused'}")
        if rid:
            with mix.lock:
                mix.runs_pending.append(rid)
        return
    name, args, timeout = rng.choice(FAULTS)
    mix.last_fault = f"{name} {json.dumps(args)}"
    resp = mix.client.request({"op": "call", "name": name, "args": args} | ({"timeout": timeout} if timeout else {}))
    mix.count(f"{name}: {'ok' if resp.get('ok') else resp['error']['code']}")


class Chatter:
    """One sender: a message in the next session of the chatters' shared round, or
    now and then a direct tool call; `per_s` of them a second at most (0: as fast
    as answers come)."""

    def __init__(self, mix: Mix, rng: random.Random, per_s: float) -> None:
        self.mix, self.rng = mix, rng
        self.interval = 1 / per_s if per_s > 0 else 0.0
        self.next_at = time.monotonic()

    def step(self) -> None:
        mix = self.mix
        self.next_at = max(self.next_at + self.interval, time.monotonic() - 1)
        n = self.rng.randrange(1 << 30)
        kind = self.rng.choice(["text", "echo", "calc", "call"])
        if kind == "call":
            peer = "-"
            resp = mix.client.request({"op": "call", "name": "calc", "args": {"expression": f"{n} + 1"}})
            ok = resp == {"ok": True, "data": {"result": str(n + 1)}}
            what: object = resp
        else:
            peer = mix.next_peer(self.rng)
            # A plain message's answer names the session it landed in: the peer's own.
            text, want = {
                "text": (f"hello {n}", f"{peer}: hello {n}"),
                "echo": ("/tool echo " + json.dumps({"text": f"m{n}"}), f"echo returned: m{n}"),
                "calc": ("/tool calc " + json.dumps({"expression": f"{n} * 2"}), f"calc returned: {n * 2}"),
            }[kind]
            reply, error = chat(mix.client, text, peer)
            ok = error is None and want in reply
            what = error or reply[:200]
            with mix.lock:
                mix.sessions_seen.add(peer)
        mix.count(f"chat {kind}: {'ok' if ok else 'unexpected'}")
        if not ok:
            mix.fail(f"chat {kind} in {peer}: {what}")
        time.sleep(max(self.next_at - time.monotonic(), 0))


def echo_step(mix: Mix) -> None:
    t0 = time.perf_counter()
    r = mix.client.request({"op": "call", "name": "echo", "args": {"text": "soak"}})
    ms = (time.perf_counter() - t0) * 1000
    with mix.lock:
        mix.echo_load.append(ms)
        mix.echo_slow.append((ms, time.monotonic(), mix.last_fault))
        if len(mix.echo_slow) > 50:
            mix.echo_slow = sorted(mix.echo_slow, reverse=True)[:10]
    if r != {"ok": True, "data": {"result": "soak"}}:
        mix.fail(f"echo under load: {r}")
    time.sleep(0.05)


@dataclass
class Follower:
    proc: subprocess.Popen[bytes]
    sandbox: str
    kind: str
    until: float
    reader: threading.Thread | None = None


class Followers:
    """`clawsup logs SANDBOX -f` processes that come and go. A `reader` reads all it
    gets; a `stuck` one never reads (its pipe fills, the supervisor must not care);
    a `quiet` one writes to /dev/null. Owned by its part of the mix; close_all() is
    called only while that part is parked."""

    def __init__(self, mix: Mix, rng: random.Random, at_once: int) -> None:
        self.mix, self.rng, self.at_once = mix, rng, at_once
        self.live: list[Follower] = []

    def step(self) -> None:
        now = time.monotonic()
        for f in list(self.live):
            if f.proc.poll() is not None:
                self.live.remove(f)
                self._ended(f, by_itself=True)
            elif now >= f.until:
                self.live.remove(f)
                self._end(f)
        if len(self.live) < self.at_once and self.rng.random() < 0.5:
            self._start()
        time.sleep(0.25)

    def close_all(self) -> None:
        while self.live:
            self._end(self.live.pop())

    def _start(self) -> None:
        sandbox = self.rng.choice(STANDING)
        kind = self.rng.choice(["reader", "reader", "stuck", "quiet"])
        cmd = [sys.executable, "-m", "clawsup.supervisor.control.cli", "logs", sandbox, "-f", "-n", "20", "--state-dir", str(self.mix.state)]
        out = subprocess.DEVNULL if kind == "quiet" else subprocess.PIPE
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "300"})
        f = Follower(proc, sandbox, kind, time.monotonic() + self.rng.uniform(2, 20))
        if kind == "reader":
            f.reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
            f.reader.start()
        self.live.append(f)
        self.mix.count(f"follower {kind} started")

    def _read(self, stream: IO[bytes]) -> None:
        lines = markers = 0
        for line in stream:
            lines += 1
            markers += b"dropped" in line or b"skipped" in line
        self.mix.count("followed lines read", lines)
        self.mix.count("followed lines saying some were dropped or skipped", markers)

    def _end(self, f: Follower) -> None:
        # Half end as Ctrl-C would, half vanish (the supervisor sees a reset).
        f.proc.send_signal(signal.SIGINT if self.rng.random() < 0.5 else signal.SIGKILL)
        try:
            f.proc.wait(5)
        except subprocess.TimeoutExpired:  # a stuck one may block on its full pipe
            f.proc.kill()
            f.proc.wait()
        self._ended(f, by_itself=False)

    def _ended(self, f: Follower, by_itself: bool) -> None:
        if f.reader is not None:
            f.reader.join(10)
        err = f.proc.stderr.read().decode(errors="replace") if f.proc.stderr else ""
        for s in (f.proc.stdout, f.proc.stderr):
            if s is not None:
                s.close()
        if by_itself:
            self.mix.count(f"follower ended by itself (exit {f.proc.returncode})")
            self.mix.fail(f"`clawsup logs {f.sandbox} -f` ended by itself with {f.proc.returncode}: {err.strip()[-300:]}")


def fd_kinds(pid: int, state: Path) -> Counter[str]:
    """What the supervisor's descriptors point at, counted by kind (numbers folded),
    so that a growth in fds says what grew."""
    unix = {c.fd: c.raddr or c.laddr for c in psutil.Process(pid).net_connections("unix")}
    out: Counter[str] = Counter()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:"):
            kind = f"unix socket {unix[int(name)] or '(unnamed)'}" if int(name) in unix else "socket, not unix"
        elif target.startswith(("pipe:", "anon_inode:")):
            kind = re.sub(r":\[\d+\]$", "", target)
        else:  # a path; a session file's name is its key, quoted
            kind = urllib.parse.unquote(target)
        kind = kind.replace(str(state), "<state>")
        out[re.sub(r"\d+", "N", re.sub(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{12,}", "<id>", kind))] += 1
    return out


@dataclass
class Sample:
    label: str
    at_s: float
    echo: dict[str, float]
    load: dict[str, float]
    stats: dict[str, Any]
    busy: list[str]
    """Parts that did not pause in time: this sample is not a quiet one."""
    fds: dict[str, int]
    """The supervisor's descriptors by kind (see fd_kinds)."""
    machine_load: float
    """The machine's 1-minute load average: on a shared machine, the p99's noise."""


def quiet_sample(mix: Mix, followers: Followers | None, label: str, t0: float, echo_calls: int, runs: Counter[str]) -> Sample:
    busy = sorted(mix.gate.pause(180))
    try:
        if followers is not None and not busy:
            followers.close_all()
        settle(mix, runs)
        for _ in range(50):  # warm the path; not counted
            mix.client.request({"op": "call", "name": "echo", "args": {"text": "soak"}})
        quiet = []
        for _ in range(echo_calls):
            t1 = time.perf_counter()
            r = mix.client.request({"op": "call", "name": "echo", "args": {"text": "soak"}})
            quiet.append((time.perf_counter() - t1) * 1000)
            if r != {"ok": True, "data": {"result": "soak"}}:
                mix.fail(f"echo in the quiet window: {r}")
        stats = mix.client.request({"op": "stats"})
        if not stats.get("ok"):
            raise SystemExit(f"the control `stats` op failed: {stats}")
        fds = fd_kinds(stats["data"]["pid"], mix.state)
        with mix.lock:
            load, mix.echo_load = mix.echo_load, []
        return Sample(label, time.monotonic() - t0, pct(quiet), pct(load), stats["data"], busy, dict(fds), os.getloadavg()[0])
    finally:
        mix.gate.resume()


def settle(mix: Mix, runs: Counter[str]) -> None:
    """Every run spawned so far has ended and reported, its sandbox is gone, and the
    standing sandboxes are ready."""
    with mix.lock:
        pending, mix.runs_pending = mix.runs_pending, []
    for rid in pending:
        done = mix.client.request({"op": "wait_run", "run": rid, "timeout": 60})
        runs[done["data"]["status"] if done.get("ok") else f"never reported ({done['error']['message']})"] += 1
    for sb in STANDING:
        r = mix.client.request({"op": "wait", "sandbox": sb, "states": ["ready", "failed"], "timeout": 60})
        if r.get("ok") and r["data"]["state"] == "failed":
            # The mix's faults spent its restart budget (`kill -9 -1`, fork bombs in
            # the workspace, several a minute): `failed` is the supervisor doing its
            # job. The soak does what an operator would, and counts it.
            mix.count(f"{sb} failed (restart budget spent by the faults), restarted")
            r = mix.client.request({"op": "restart", "sandbox": sb, "timeout": 60})
            if r.get("ok") and r["data"]["state"] != "ready":
                r = mix.client.request({"op": "wait", "sandbox": sb, "states": ["ready"], "timeout": 60})
        if not r.get("ok"):
            mix.fail(f"{sb} not ready again within 60 s: {r['error']['message']}")
    # A run's sandbox goes after it reported; wait for that, bounded.
    deadline = time.monotonic() + 30
    while (extra := run_sandboxes(mix.client)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if extra:
        mix.fail(f"run sandboxes still there 30 s after their runs reported: {extra}")


def run_sandboxes(client: ControlClient) -> list[str]:
    return [s["id"] for s in client.request({"op": "status"})["data"]["sandboxes"] if s["id"].startswith(("subagent-", "workspace-run-"))]


def print_samples(samples: list[Sample]) -> None:
    print(f"{'sample':<10}{'at s':>7}   {'quiet echo p50/p99 ms':>22}   {'under load p50/p99 ms (n)':>27}{'RSS MiB':>9}{'fds':>6}{'tasks':>7}{'sbx':>5}{'thr':>5}{'loadavg':>9}")
    for s in samples:
        q, ld, st = s.echo, s.load, s.stats
        load = f"{ld['p50']:.2f}/{ld['p99']:.2f} ({ld['n']})" if ld["n"] else "-"
        note = f"  not quiet: {', '.join(s.busy)} still busy" if s.busy else ""
        print(f"{s.label:<10}{s.at_s:>7.0f}   {q['p50']:>11.2f}/{q['p99']:<10.2f}   {load:>27}{st['rss_bytes'] / 2**20:>9.1f}{st['open_fds']:>6}{st['tasks']:>7}{st['sandboxes']:>5}{st['threads']:>5}{s.machine_load:>9.1f}{note}")


def verdict(start: Sample, warm: Sample, end: Sample, a: argparse.Namespace) -> list[tuple[str, bool | None]]:
    """(line, ok) for each growth and the p99; ok is None for a line that only
    informs (what the fds that grew are, the figures under load)."""
    out = []
    for key, name, scale, unit, slack in (
        ("rss_bytes", "RSS", 2**20, " MiB", a.rss_slack_mib),
        ("open_fds", "open fds", 1, "", a.fds_slack),
        ("tasks", "asyncio tasks", 1, "", a.tasks_slack),
        ("sandboxes", "sandboxes", 1, "", 0),
    ):
        w, e = warm.stats[key] / scale, end.stats[key] / scale
        ok = e - w <= slack
        out.append((f"{name:<14}{w:>9.1f} -> {e:.1f}{unit} ({e - w:+.1f}; allowed {slack:+g})", ok))
    grown = Counter(end.fds)
    grown.subtract(warm.fds)
    for kind, n in sorted(grown.items(), key=lambda kv: -abs(kv[1])):
        if n:
            out.append((f"{'':<14}fds {n:+d}: {kind}", None))
    ratio = end.echo["p99"] / start.echo["p99"]
    ok = ratio <= a.p99_ratio
    out.append((f"{'echo p99':<14}idle {start.echo['p99']:.2f} ms at the start, quiet {end.echo['p99']:.2f} ms at the end: {ratio:.2f}x (target {a.p99_ratio:g}x)", ok))
    ld = end.load
    if ld["n"]:
        out.append((f"{'':<14}under load before the end: p50 {ld['p50']:.2f} ms, p99 {ld['p99']:.2f} ms ({ld['p99'] / start.echo['p99']:.2f}x idle; reported, not judged)", None))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    how_long = ap.add_mutually_exclusive_group()
    how_long.add_argument("--seconds", type=float)
    how_long.add_argument("--minutes", type=float)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the state directory (logs) afterwards")
    ap.add_argument("--runs-every", type=int, default=4, help="one fault in N is a subagent run (0: none)")
    ap.add_argument("--backend", default="process", choices=["process", "bwrap"], help="the plugins' backend (exec uses the workspace default)")
    ap.add_argument("--sessions", type=int, default=300, help="cli peers chatting, a session each")
    ap.add_argument("--chatters", type=int, default=2, help="senders chatting at once")
    ap.add_argument("--chat-rate", type=float, default=20, help="messages a second over all chatters, at most (0: as fast as answers come)")
    ap.add_argument("--followers", type=int, default=3, help="`clawsup logs -f` processes at once, at most")
    ap.add_argument("--warmup", type=float, help="seconds before the warm-up sample (default: a quarter of the run, at most 60)")
    ap.add_argument("--sample-every", type=float, default=60, help="seconds between samples after the warm-up")
    ap.add_argument("--echo-calls", type=int, default=1000, help="echo calls in each quiet window")
    ap.add_argument("--p99-ratio", type=float, default=1.5, help="quiet echo p99 at the end over idle at the start, at most")
    ap.add_argument("--rss-slack-mib", type=float, default=16)
    ap.add_argument("--fds-slack", type=int, default=4)
    ap.add_argument("--tasks-slack", type=int, default=4)
    ap.add_argument("--out", help="also write the samples and the verdict as JSON here")
    a = ap.parse_args()
    seconds = a.minutes * 60 if a.minutes is not None else a.seconds if a.seconds is not None else 120.0
    warmup = a.warmup if a.warmup is not None else min(60.0, seconds / 4)

    state = Path(tempfile.mkdtemp(prefix="cs-soak-", dir="/tmp"))
    cfg = {
        "plugins": {
            "load": {"paths": [str(ROOT / "plugins" / "basics"), str(ROOT / "plugins" / "chaos")]},
            # Our own plugins: trusted, so that --backend process may run them. A large
            # budget (its period is raised to fit, see supervisor/sandboxes/plans.py) so that
            # the faults never spend it.
            "entries": {
                "basics": {"trust": "trusted"},
                "chaos": {"trust": "trusted", "sandbox": {"memoryMb": 128, "maxProcesses": 32, "restart": {"maxRestarts": 1000, "periodSeconds": 1, "backoffInitialSeconds": 0.05, "backoffMaxSeconds": 0.2}}},
            },
        },
        # As root, a process child may only drop to its own uid if it can start Python;
        # where it cannot (a 0700 home), trusted code runs as root on purpose.
        "sandbox": {"defaults": {"backend": a.backend}, "heartbeatIntervalSeconds": 0.5, "heartbeatTimeoutSeconds": 0.5, "stopGraceSeconds": 1,
                    **({"runAs": "supervisor"} if a.backend == "process" else {})},
        "tools": {"exec": {"killGraceSeconds": 0.5}},
        "agents": {"defaults": {"subagents": {"maxChildrenPerAgent": 10}}},
        # A session per cli peer, so that the chat part spreads over --sessions.
        "session": {"dmScope": "per-channel-peer"},
    }
    (state / "clawsup.json").write_text(json.dumps(cfg))
    console = open(state / "console.txt", "w+")
    sup = subprocess.Popen(
        [sys.executable, "-m", "clawsup.supervisor.control.cli", "start", "--config", str(state / "clawsup.json"), "--state-dir", str(state)],
        stdout=console, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    client = ControlClient(state / "run" / "control.sock")
    # The console goes to a file (a pipe nobody reads would fill and block the
    # supervisor); readiness comes from the control API's own wait.
    while not (state / "run" / "control.sock").exists():
        if sup.poll() is not None:
            console.seek(0)
            print(console.read()[-5000:])
            raise SystemExit(f"supervisor exited with {sup.returncode}")
        time.sleep(0.05)  # only while the socket does not exist yet
    proc = psutil.Process(sup.pid)
    gate = Gate()
    mix = Mix(client, state, gate, a.sessions)
    runs: Counter[str] = Counter()
    samples: list[Sample] = []
    threads: list[threading.Thread] = []
    followers: Followers | None = None
    try:
        for sb in STANDING:
            r = client.request({"op": "wait", "sandbox": sb, "states": ["ready"], "timeout": 60})
            if not r.get("ok"):
                raise SystemExit(f"{sb} did not come up: {r}")
        t0 = time.monotonic()
        samples.append(quiet_sample(mix, None, "start", t0, a.echo_calls, runs))

        rng = random.Random(a.seed)
        followers = Followers(mix, random.Random(rng.random()), a.followers)
        fault_rng = random.Random(rng.random())
        threads.append(part(mix, "faults", lambda: fault_step(mix, fault_rng, a.runs_every)))
        for i in range(a.chatters):
            threads.append(part(mix, f"chat-{i}", Chatter(mix, random.Random(rng.random()), a.chat_rate / a.chatters).step))
        threads.append(part(mix, "followers", followers.step))
        threads.append(part(mix, "echo", lambda: echo_step(mix)))

        # The warm-up ends once its time is up and every session has been chatted in
        # (per-session state is then all there; what grows after is growth).
        deadline = t0 + seconds
        while time.monotonic() < deadline and (time.monotonic() < t0 + warmup or len(mix.sessions_seen) < a.sessions):
            time.sleep(0.5)
        if len(mix.sessions_seen) < a.sessions:
            print(f"note: the run ended before every session was chatted in ({len(mix.sessions_seen)} of {a.sessions}); growth includes new sessions")
        if time.monotonic() < deadline:
            samples.append(quiet_sample(mix, followers, "warm-up", t0, a.echo_calls, runs))
            next_at = time.monotonic() + a.sample_every
            while time.monotonic() < deadline:
                time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))
                if time.monotonic() >= next_at and deadline - time.monotonic() > a.sample_every / 2:
                    samples.append(quiet_sample(mix, followers, f"t+{time.monotonic() - t0:.0f}s", t0, a.echo_calls, runs))
                    next_at = time.monotonic() + a.sample_every
        samples.append(quiet_sample(mix, followers, "end", t0, a.echo_calls, runs))
        gate.finish()
        for t in threads:
            t.join(180)
        followers.close_all()
        settle(mix, runs)
        left_runs = run_sandboxes(client)
        pids = {p.pid for p in proc.children(recursive=True)}
        client.stop()
        sup.wait(30)
        _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=10)
        leftovers = [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    except BaseException:
        console.seek(0)
        print(console.read()[-5000:])
        raise
    finally:
        gate.finish()
        if followers is not None:
            followers.close_all()
        if sup.poll() is None:
            sup.send_signal(signal.SIGKILL)
        if not a.keep:
            shutil.rmtree(state, ignore_errors=True)

    print(f"soak: {seconds:.0f} s on {a.backend}, {a.sessions} sessions, {a.chatters} chatters, up to {a.followers} followers, seed {a.seed}")
    print(f"what the mix did ({sum(mix.counts.values())}):")
    for k in sorted(mix.counts):
        print(f"  {mix.counts[k]:7d}  {k}")
    print(f"subagent runs by how they ended: {dict(runs)}; their sandboxes left: {left_runs}")
    print(f"processes left after stop: {leftovers}; supervisor exit code {sup.returncode}")
    print()
    print_samples(samples)
    for ms, when, fault in sorted(mix.echo_slow, reverse=True)[:5]:
        print(f"  slow echo under load: {ms:.0f} ms at {when - t0:.0f} s, the last fault fired before it: {fault}")
    print()
    warm = next((s for s in samples if s.label == "warm-up"), samples[0])
    judged = verdict(samples[0], warm, samples[-1], a)
    print(f"verdict, {warm.label} ({warm.at_s:.0f} s) -> end ({samples[-1].at_s:.0f} s):")
    for line, good in judged:
        print(f"  {'    ' if good is None else 'ok  ' if good else 'FAIL'}  {line}")
    not_quiet = [s.label for s in samples if s.busy]
    reported = all(not k.startswith("never") for k in runs)
    ok = all(good is not False for _, good in judged) and not mix.failures and not leftovers and sup.returncode == 0 and reported and not left_runs and not not_quiet
    if not_quiet:
        print(f"  FAIL  samples that were not quiet (a part did not pause within 180 s): {not_quiet}")
    print(f"  {'ok  ' if not mix.failures else 'FAIL'}  failures seen: {len(mix.failures)}")
    for f in mix.failures[:10]:
        print("          ", f)
    if a.out:
        Path(a.out).write_text(json.dumps({
            "seconds": seconds, "backend": a.backend, "sessions": a.sessions, "counts": dict(mix.counts), "runs": dict(runs),
            "samples": [s.__dict__ for s in samples], "verdict": [{"line": line, "ok": ok} for line, ok in judged],
            "failures": mix.failures, "leftovers": leftovers, "ok": ok,
        }, indent=2))  # fmt: skip
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
