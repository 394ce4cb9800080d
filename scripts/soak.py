"""Soak run: a real supervisor with the chaos plugin, faults fired at random for a
while, and the basics plugin called between them. Not a test (it takes minutes);
it exits non-zero if anything an operator relies on broke.

    python scripts/soak.py [--seconds 120] [--seed 1]

Subagent runs are fired among the faults too (`--runs-every N`: one in N): runs that
time out, whose host is SIGKILLed, that are stopped with `/stop`, that fork-bomb
their workspace, and plain ones.

It checks, at the end:
- every `echo` call to the healthy plugin succeeded, and how slow it got;
- every subagent run ended and reported, and none of their sandboxes is left;
- the supervisor's memory did not grow without bound;
- after `clawsup stop`, no process of the run is left (hosts, forks, the warden).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from supervisor.control import ControlClient  # noqa: E402

FAULTS = [
    ("chaos_crash", {"how": "segfault"}, None),
    ("chaos_crash", {"how": "abort"}, None),
    ("chaos_crash", {"how": "exit", "code": 3}, None),
    ("chaos_crash", {"how": "segfault", "delay_ms": 20}, None),
    ("chaos_raise", {"message": "soak"}, None),
    ("chaos_spin", {}, 0.5),
    ("chaos_hang", {}, 0.5),
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


def chat(client: ControlClient, text: str) -> str:
    reply = ""
    for m in client.stream({"op": "chat", "peer": "soak", "text": text}):
        reply = m.get("reply", reply)
    return reply


def spawn(client: ControlClient, **args: object) -> str | None:
    """The run id, or None when the spawn was refused (too many running)."""
    out = chat(client, "/tool sessions_spawn " + json.dumps(args))
    return json.loads(out.split("returned: ", 1)[1])["runId"] if out.startswith("sessions_spawn returned") else None


def run_fault(client: ControlClient, kind: str) -> str:
    """Starts one misbehaving (or healthy) subagent run; returns what was done."""
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
    return f"run {kind}: {'spawned' if rid else 'refused'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the state directory (logs) afterwards")
    ap.add_argument("--runs-every", type=int, default=4, help="one fault in N is a subagent run (0: none)")
    ap.add_argument("--backend", default="process", choices=["process", "bwrap"], help="the plugins' backend (exec uses the workspace default)")
    a = ap.parse_args()
    rng = random.Random(a.seed)

    state = Path(tempfile.mkdtemp(prefix="cs-soak-", dir="/tmp"))
    cfg = {
        "plugins": {
            "load": {"paths": [str(ROOT / "plugins" / "basics"), str(ROOT / "plugins" / "chaos")]},
            # Our own plugins: trusted, so that --backend process may run them. A large
            # budget (its period is raised to fit, see supervisor/plans.py) so that
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
    }
    (state / "clawsup.json").write_text(json.dumps(cfg))
    console = open(state / "console.txt", "w+")
    sup = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "start", "--config", str(state / "clawsup.json"), "--state-dir", str(state)],
        stdout=console, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    client = ControlClient(state / "run" / "control.sock")
    # The console goes to a file (a pipe nobody reads would fill and block the
    # supervisor); readiness comes from the control API's own wait.
    while not (state / "run" / "control.sock").exists():
        if sup.poll() is not None:
            raise SystemExit(f"supervisor exited with {sup.returncode}")
        time.sleep(0.05)  # only while the socket does not exist yet
    client.request({"op": "wait", "sandbox": "chaos", "states": ["ready"], "timeout": 60})
    proc = psutil.Process(sup.pid)
    rss0 = proc.memory_info().rss
    echo_ms: list[float] = []
    echo_failures: list[str] = []
    faults: dict[str, int] = {}
    last_fault = "nothing"
    deadline = time.monotonic() + a.seconds
    try:
        while time.monotonic() < deadline:
            # Fire at ready sandboxes, so that each fault meets a live child.
            for sb in ("basics", "chaos", "workspace-main"):
                client.request({"op": "wait", "sandbox": sb, "states": ["ready"], "timeout": 30})
            if a.runs_every and rng.randrange(a.runs_every) == 0:
                did = last_fault = run_fault(client, rng.choice(RUN_FAULTS))
                faults[did] = faults.get(did, 0) + 1
            else:
                name, args, timeout = rng.choice(FAULTS)
                req = {"op": "call", "name": name, "args": args} | ({"timeout": timeout} if timeout else {})
                resp = client.request(req)
                key = "ok" if resp.get("ok") else resp["error"]["code"]
                last_fault = f"{name} {json.dumps(args)}: {key}"
                faults[f"{name}: {key}"] = faults.get(f"{name}: {key}", 0) + 1
            for _ in range(5):
                t0 = time.perf_counter()
                r = client.request({"op": "call", "name": "echo", "args": {"text": "soak"}})
                echo_ms.append((time.perf_counter() - t0) * 1000)
                if r != {"ok": True, "data": {"result": "soak"}}:
                    echo_failures.append(f"{time.strftime('%H:%M:%S')} after {last_fault}: {r}")
        runs: dict[str, int] = {}
        for session in client.request({"op": "status"})["data"]["runs"]:
            for r in session["runs"]:
                done = client.request({"op": "wait_run", "run": r["runId"], "timeout": 60})
                status = done["data"]["status"] if done.get("ok") else f"never reported ({done['error']['message']})"
                runs[status] = runs.get(status, 0) + 1
        run_sandboxes = [s["id"] for s in client.request({"op": "status"})["data"]["sandboxes"] if s["id"].startswith(("subagent-", "workspace-run-"))]
        rss1 = proc.memory_info().rss
        pids = {p.pid for p in proc.children(recursive=True)}
        client.stop()
        sup.wait(30)
        _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=10)
        leftovers = [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    except Exception:
        console.seek(0)
        print(console.read()[-5000:])
        raise
    finally:
        if sup.poll() is None:
            sup.send_signal(signal.SIGKILL)
        if not a.keep:
            shutil.rmtree(state, ignore_errors=True)

    print(f"faults fired ({sum(faults.values())}):")
    for k in sorted(faults):
        print(f"  {faults[k]:5d}  {k}")
    s = sorted(echo_ms)
    print(f"echo calls: {len(s)}, failed {len(echo_failures)}; p50 {statistics.median(s):.2f} ms, p99 {s[int(0.99 * (len(s) - 1))]:.2f} ms, max {s[-1]:.1f} ms")
    print(f"supervisor RSS: {rss0 / 2**20:.1f} MiB -> {rss1 / 2**20:.1f} MiB")
    print(f"subagent runs by how they ended: {runs}; their sandboxes left: {run_sandboxes}")
    print(f"processes left after stop: {leftovers}")
    reported = all(not k.startswith("never") for k in runs)
    ok = not echo_failures and not leftovers and rss1 - rss0 < 64 * 2**20 and sup.returncode == 0 and reported and not run_sandboxes
    for f in echo_failures[:5]:
        print("  echo failure:", f)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
