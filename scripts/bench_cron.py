"""Cron figures (issue 17), each against a baseline measured in the same run:

  (r) drift: 1,000 jobs due in the same minute (one-off `at` jobs 60 ms apart; then
      1,000 due at the same instant, a burst), in a
      real gateway (`clawsup start`, offline model, automation.cron.maxConcurrentRuns
      as given). For each run, from its record: fired - due (the timer's lateness)
      and started - due (the turn has begun: a slot, the session's lane, the message
      in its session). Baseline: a bare asyncio program's `loop.call_at` lateness
      for 1,000 timers spread the same way, run just before.
  (s) supervisor CPU while 10,000 idle jobs are armed (every 1h, none due in the
      window), over `--idle-s` seconds, against the same gateway with no job, measured
      the same way right before (psutil CPU times of the supervisor process).

    python scripts/bench_cron.py [--jobs 1000] [--slots 64] [--idle-jobs 10000] [--idle-s 30] [--out cron.json]
    python scripts/bench.py --only cron      (the same)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clawsup.supervisor.automation.jobs import Job  # noqa: E402
from clawsup.supervisor.automation.schedule import make_schedule  # noqa: E402
from clawsup.supervisor.control.api import ControlClient  # noqa: E402

SPACING_S = 0.06
LEAD_S = 15.0
"""Time from the last job added to the first one due: the adds must be done by then."""

BARE_TIMERS = r"""
import asyncio, json, sys, time
async def main(n, spacing, lead):
    loop = asyncio.get_running_loop()
    start = time.time() + lead
    late, done = [], asyncio.Event()
    def fire(due):
        late.append((time.time() - due) * 1000)
        if len(late) == n:
            done.set()
    for i in range(n):
        due = start + i * spacing
        loop.call_at(loop.time() + (due - time.time()), fire, due)
    await done.wait()
    print(json.dumps(late))
asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])))
"""


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99), "max": max(xs), "mean": statistics.fmean(xs)}


class Gateway:
    def __init__(self, cfg: dict[str, Any], state: Path) -> None:
        self.state = state
        (state / "clawsup.json").write_text(json.dumps(cfg))
        self.console = open(state / "console.txt", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "clawsup.supervisor.control.cli", "start", "--config", str(state / "clawsup.json"), "--state-dir", str(state)],
            stdout=self.console, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"},
        )  # fmt: skip
        self.client = ControlClient(state / "run" / "control.sock", timeout=600)
        while not (state / "run" / "control.sock").exists():
            if self.proc.poll() is not None:
                self.console.seek(0)
                raise SystemExit(f"the gateway exited with {self.proc.returncode}:\n{self.console.read()[-3000:]}")
            time.sleep(0.05)  # only while the gateway is not up yet
        self.cron("list")  # served: the scheduler has loaded

    def cron(self, action: str, **kw: Any) -> Any:
        r = self.client.request({"op": "cron", "action": action, **kw})
        assert r.get("ok"), r
        return r["data"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.client.stop()
            self.proc.wait(60)


def config(slots: int) -> dict[str, Any]:
    return {"sessionStore": {"fsync": "never"}, "automation": {"cron": {"maxConcurrentRuns": slots}}, "agents": {"defaults": {"sandbox": {"scope": "session"}}}}


def bench_drift(jobs: int, slots: int, spacing_s: float = SPACING_S) -> dict[str, Any]:
    bare = subprocess.run([sys.executable, "-c", BARE_TIMERS, str(jobs), str(spacing_s), "2"], capture_output=True, text=True, check=True, timeout=600)
    baseline = json.loads(bare.stdout)
    state = Path(tempfile.mkdtemp(prefix="cs-bench-cron-", dir="/tmp"))
    gw = Gateway(config(slots), state)
    try:
        t_add = time.perf_counter()
        start = time.time() + LEAD_S + jobs * 0.01
        ids = []
        for i in range(jobs):
            due = start + i * spacing_s
            at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(due)) + f".{int((due % 1) * 1e6):06d}Z"
            ids.append(gw.cron("add", job={"name": f"j{i}", "at": at, "message": "drift"})["job"]["id"])
        added_s = time.perf_counter() - t_add
        assert time.time() < start, f"adding {jobs} jobs took {added_s:.1f} s, past the first due time; raise LEAD_S"
        last = ids[-1]
        gw.cron("wait", id=last, count=1, timeout=start + jobs * spacing_s - time.time() + 600)
        fired, started, status = [], [], {}
        for jid in ids:
            (r,) = gw.cron("wait", id=jid, count=1, timeout=600)["runs"]
            status[r["status"]] = status.get(r["status"], 0) + 1
            fired.append((r["firedAt"] - r["due"]) * 1000)
            if r.get("startedAt"):
                started.append((r["startedAt"] - r["due"]) * 1000)
        gw.stop()
    finally:
        if gw.proc.poll() is None:
            gw.proc.kill()
        shutil.rmtree(state, ignore_errors=True)
    return {"fired": summary(fired), "started": summary(started), "baseline": summary(baseline), "statuses": status, "slots": slots, "add_s": added_s, "spacing_s": spacing_s}


def idle_jobs_file(state: Path, n: int) -> None:
    """n jobs, every 1h, none due within the next half hour, written as the store
    writes them (adding 10,000 through the API would cost 10,000 fsyncs)."""
    now = time.time()
    (state / "cron").mkdir(parents=True)
    with open(state / "cron" / "jobs.jsonl", "w") as f:
        for i in range(n):
            j = Job(id=f"idle{i:05d}", name=f"idle {i}", agent="main", schedule=make_schedule(every="1h", now=now - 600 + (i % 1000) * 0.5), message="x", created_at=now)
            f.write(json.dumps({"op": "put", "job": j.to_json()}) + "\n")


def _on_cpu_ns(pid: int) -> int:
    """Time on a CPU of every thread of `pid`, in ns (schedstat: finer than the 10 ms
    ticks of cpu_times, which read 0 for a process this idle)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


def cpu_over(pid: int, seconds: float) -> float:
    t0, c0 = time.monotonic(), _on_cpu_ns(pid)
    time.sleep(seconds)  # the measurement window itself
    return 100 * (_on_cpu_ns(pid) - c0) / 1e9 / (time.monotonic() - t0)


def bench_idle(n: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, jobs in (("baseline", 0), ("figure", n)):
        state = Path(tempfile.mkdtemp(prefix="cs-bench-idle-", dir="/tmp"))
        if jobs:
            idle_jobs_file(state, jobs)
        gw = Gateway(config(4), state)
        try:
            listed = len(gw.cron("list")["jobs"])
            assert listed == jobs, (listed, jobs)
            time.sleep(2)  # let start-up settle before the window
            pct = cpu_over(gw.proc.pid, seconds)
            out[label] = {"jobs": jobs, "cpu_percent": pct, "cpu_ms": pct / 100 * seconds * 1000, "rss_mib": psutil.Process(gw.proc.pid).memory_info().rss / 2**20}
            gw.stop()
        finally:
            if gw.proc.poll() is None:
                gw.proc.kill()
            shutil.rmtree(state, ignore_errors=True)
    out["seconds"] = seconds
    return out


def print_drift(r: dict[str, Any]) -> None:
    how = f"{r['spacing_s'] * 1000:g} ms apart" if r["spacing_s"] else "all at the same instant"
    print(f"(r) drift, {r['fired']['n']} jobs due {how}, maxConcurrentRuns {r['slots']}, ms after the due time")
    print(f"  {'':<44}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    b = r["baseline"]
    for label, x in (("fired (the timer)", r["fired"]), ("started (the turn has begun)", r["started"]), ("bare asyncio call_at (baseline)", b)):
        print(f"  {label:<44}{x['p50']:>9.2f}{x['p90']:>9.2f}{x['p99']:>9.2f}{x['max']:>9.2f}")
    print(f"  statuses {r['statuses']}; {r['fired']['n']} adds took {r['add_s']:.1f} s")


def print_idle(r: dict[str, Any]) -> None:
    print(f"(s) supervisor CPU over {r['seconds']:g} s idle")
    for label in ("baseline", "figure"):
        x = r[label]
        print(f"  {x['jobs']:>6} jobs armed: {x['cpu_ms']:8.2f} ms of CPU ({x['cpu_percent']:.4f} % of a core), RSS {x['rss_mib']:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--idle-jobs", type=int, default=10_000)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    drift = bench_drift(a.jobs, a.slots)
    print_drift(drift)
    burst = bench_drift(a.jobs, a.slots, spacing_s=0.0)
    print_drift(burst)
    idle = bench_idle(a.idle_jobs, a.idle_s)
    print_idle(idle)
    if a.out:
        a.out.write_text(json.dumps({"r_drift_ms": drift, "r_burst_ms": burst, "s_idle_cpu": idle}, indent=2))


if __name__ == "__main__":
    main()
