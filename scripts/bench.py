"""clawsup benchmarks. A script, not a test: it prints p50/p90/p99 for each figure next
to a baseline measured in the same run (these machines are noisy; compare ratios),
and writes the numbers as JSON to --out.

    python scripts/bench.py [--out bench.json] [--calls 2000] [--starts 30] [--crashes 50]
    python scripts/bench.py --only g|h|i|m|n|ab|mcp|p|q   (one figure)
    python scripts/bench.py --only cron   (issue 17's figures (r) and (s): scripts/bench_cron.py)

Figures (see issue 2):
  (a) warm tool call, supervisor -> plugin -> supervisor, through ToolDispatcher.invoke
      baseline: a bare grpc.aio unary echo over a unix socket, same payload
  (b) cold start, spawn -> ready (handshake, health, Describe, registered)
      baseline: spawning the same interpreter running `import grpc`
  (c) crash -> registrations reclaimed (SIGKILL of the child to registry empty of it)
      baseline: SIGKILL of an idle bare grpc.aio server child -> its pidfd readable
  (d) unique memory (USS) of an idle sandbox
      baseline: USS of an idle bare grpc.aio server child
Figures (issue 12: plugins start on bwrap by default):
  (a') and (b'): (a) and (b) with the plugin on the bwrap backend, with the same
      baselines, measured in the same run
Figures (issue 3):
  (e) the exec tool running `true`, end to end through ToolDispatcher.invoke (screen,
      workspace sandbox on the process backend, Exec stream, result)
      baseline: asyncio.create_subprocess_exec('/bin/true') and wait, in this process
  (f) the same on the bwrap backend (skipped, and said, when bwrap is unavailable)
Figure (issue 4):
  (g) messages through channel (the cli adapter, in process), bus, router, session
      append and reply, with the placeholder agent, over 1, 10, 100 and 1,000 sessions
      (`--g-sessions`; issue 13 added 1,000), each sender waiting for its reply before
      the next, at least two messages per session: messages/s and p50/p99 latency,
      with fsync `always` (the default) and `never`; messages refused busy are counted
      baseline: the bare bus, an inbound and an outbound asyncio.Queue with an echo
      consumer between them, driven the same way
Figures (issue 5):
  (h) turn overhead: a full turn through the agent loop with the offline provider and
      one tool call (`echo`), minus that tool call's own time (measured alone, through
      ToolDispatcher.invoke, in the same run)
  (i) one tool-policy decision (what `clawsup tools explain` computes) over 200 tools
      with every layer set
Figure (issue 7):
  (m) a subagent run end to end: sessions_spawn -> its sandbox host up -> RunAgent ->
      one (offline) model call over the host's stream -> the sandbox stopped -> the
      announce on the bus; on process, and on bwrap where it works
      baseline: stopping and starting a workspace sandbox (the same host runtime, no
      plugin) on the same backend, what any run must pay for a child's whole life;
      interleaved
Figure (issue 13):
  (n) the control `status` op (what `clawsup status` asks) of a real supervisor while
      ten plugin sandboxes restart in a loop (a `restart` op after another on each),
      p50/p90/p99, and the `clawsup status` command once that way and once idle
      baseline: the same op with nothing restarting, in interleaved blocks
Figure (issue 15), `--only mcp`; the server is mcp-server-time, installed on first
use into a venv under /var/tmp/clawsup-bench:
  (o) an MCP server's sandbox on bwrap (untrusted) and on process (trusted):
      cold start, a start asked of the manager -> ready (host up, server initialized
      and listed, its tools registered), `--mcp-starts` times
      baseline: the `mcp` SDK's stdio_client + ClientSession starting the same server
      (spawn, initialize, tools/list until the list returns); beside it, the cold start
      of the plain basics plugin's sandbox on the same backend (the sandbox's own
      start), interleaved round by round; the target is
      (clawsup - sandbox start) / direct <= 1.3
      warm call, one tools/call through ToolDispatcher.invoke, `--mcp-calls` times
      baseline: the same SDK session's call_tool to the same server, in interleaved
      blocks; target <= 1.3x
Figures (issue 16), `--only p` and `--only q` (plugins in scripts/bench_plugins):
  (p) one `before_tool_call` gate (benchgate, granted hooks.allow, answering None) on a
      warm call of basics' echo through ToolDispatcher.invoke: with - without, on
      process and bwrap, the gate a plain function and a coroutine; beside it
      Hooks.before_tool_call alone; interleaved blocks, `--gate-calls` each way
      baseline: the bare grpc.aio unary echo of (a); target: added <= 1.3x it
  (q) a message's round trip through a plugin channel (benchchan) of a real gateway,
      emit_message to the final reply's send, timed in the sandbox; on process and
      bwrap, `--channel-messages` each way
      baseline: the same gateway's http channel, POST /v1/messages to the `reply`
      event, in interleaved blocks
Figures (issue 6), skipped (and said) without an engine and the image:
  (j) docker cold start, spawn to ready; floor: `docker run --rm IMAGE /bin/true`
      through the same SDK
  (k) a warm tool call into a container, next to the process backend's, interleaved
  (l) docker kill to registrations reclaimed; floor: kill of a plain container to its
      wait returning
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import psutil
from loguru import logger

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clawsup.sandbox.launch.cgroup import CgroupRoot  # noqa: E402
from clawsup.sandbox.launch.launcher import Limits, MiB  # noqa: E402
from clawsup.sandbox.launch.bwrap import BwrapLauncher, bwrap_problem  # noqa: E402
from clawsup.sandbox.launch.process import ProcessLauncher, Warden  # noqa: E402
from clawsup.supervisor.sandboxes.lifecycle import SandboxState, Transition  # noqa: E402
from clawsup.supervisor.sandboxes.restarts import RestartPolicy  # noqa: E402
from clawsup.supervisor.sandboxes.manager import SandboxManager  # noqa: E402
from clawsup.supervisor.paths import StatePaths  # noqa: E402
from clawsup.supervisor.sandboxes.registry import Registry  # noqa: E402
from clawsup.supervisor.sandboxes.plans import SandboxPlan  # noqa: E402
from clawsup.supervisor.sandboxes.incarnation import Timing  # noqa: E402
from clawsup.supervisor.tools.core import CORE_TOOLS, register_core_tools  # noqa: E402
from clawsup.supervisor.tools.dispatch import ToolDispatcher  # noqa: E402
from clawsup.supervisor.tools.workspace_settings import WorkspaceSettings  # noqa: E402
from clawsup.supervisor.tools.workspaces import Workspaces  # noqa: E402

PAYLOAD = "x" * 100

ECHO_SERVER = r"""
import asyncio, sys, grpc
async def main(path):
    async def echo(request, context):
        return request
    handler = grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("unix:" + path)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
asyncio.run(main(sys.argv[1]))
"""


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99), "mean": statistics.fmean(xs)}


async def bare_echo_server(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    path = str(tmp / "echo.sock")
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, path], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = await asyncio.to_thread(proc.stdout.readline)
    assert line.strip() == "ready", line
    return proc, path


async def bench_bare_echo(path: str, calls: int, warmup: int) -> list[float]:
    async with grpc.aio.insecure_channel(f"unix:{path}") as ch:
        echo = ch.unary_unary("/bench.Echo/Echo")
        body = json.dumps({"text": PAYLOAD}).encode()
        out = []
        for i in range(warmup + calls):
            t0 = time.perf_counter()
            await echo(body, timeout=5)
            if i >= warmup:
                out.append((time.perf_counter() - t0) * 1000)
        return out


async def bench_calls(manager: SandboxManager, calls: int, warmup: int) -> list[float]:
    out = []
    args = {"text": PAYLOAD}
    tools = ToolDispatcher(manager, None)
    for i in range(warmup + calls):
        t0 = time.perf_counter()
        r = await tools.invoke("echo", args)
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
        assert r.text == PAYLOAD
    return out


def bench_import_grpc(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-c", "import grpc"], check=True)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def bench_cold_start(manager: SandboxManager, n: int) -> list[float]:
    [sb] = [sb for sb in manager.sandboxes.values() if sb.plan.plugin_id == "basics"]
    out = []
    for _ in range(n):
        await sb.stop("bench", 30)
        t0 = time.perf_counter()
        state = await sb.start(30)
        out.append((time.perf_counter() - t0) * 1000)
        assert state is SandboxState.READY, state
    return out


async def bench_kill_floor(tmp: Path, n: int) -> list[float]:
    """SIGKILL of an idle bare grpc.aio server child until its pidfd is readable: the
    kernel's own cost of tearing down a process of the same shape as a host."""
    loop = asyncio.get_running_loop()
    out = []
    # A folder of its own: a server here binds `echo.sock`, and one bound over (a)'s
    # left (a') dialling a dead socket.
    (tmp / "kill-floor").mkdir(exist_ok=True)
    for _ in range(n):
        p, _ = await bare_echo_server(tmp / "kill-floor")
        fd = os.pidfd_open(p.pid)
        done: asyncio.Future[float] = loop.create_future()
        loop.add_reader(fd, lambda: done.done() or done.set_result(time.perf_counter()))
        t0 = time.perf_counter()
        os.kill(p.pid, signal.SIGKILL)
        t1 = await done
        loop.remove_reader(fd)
        os.close(fd)
        p.wait()
        out.append((t1 - t0) * 1000)
    return out


async def bench_crash_reclaim(manager: SandboxManager, n: int, kill: Any = None) -> list[float]:
    sb = manager.sandboxes["basics"]
    reclaimed: dict[str, float] = {}

    def on(t: Transition) -> None:
        # CRASHED is entered right after registry.reclaim() in the same callback.
        if t.new is SandboxState.CRASHED:
            assert not manager.registry.owned_by("basics")
            reclaimed["t"] = time.perf_counter()

    sb.lc.listeners.append(on)
    out = []
    for _ in range(n):
        assert sb.inc is not None and sb.lc.state is SandboxState.READY
        seq = sb.lc.seq
        reclaimed.clear()
        t0 = time.perf_counter()
        if kill is None:
            os.kill(sb.inc.child.pid, signal.SIGKILL)
        else:
            await asyncio.to_thread(kill, sb.inc.child)
        await sb.wait_state(frozenset({SandboxState.CRASHED, SandboxState.BACKOFF}), 10, after=seq)
        out.append((reclaimed["t"] - t0) * 1000)
        await sb.wait_state(frozenset({SandboxState.READY}), 30)
    sb.lc.listeners.remove(on)
    return out


async def bench_docker(process_manager: SandboxManager, tmp: Path, a: Any) -> dict[str, Any]:
    from clawsup.sandbox.launch.container import DockerLauncher, docker_problem
    from clawsup.sandbox.launch.image import image_tag

    if problem := docker_problem():
        return {"skipped": problem}
    import docker as docker_sdk

    state = tmp / "docker"
    paths = StatePaths(state)
    paths.ensure()
    m = SandboxManager(registry=Registry(), launchers={"docker": DockerLauncher(state)}, paths=paths, timing=Timing(heartbeat_interval_s=2.0), env_allowlist=["PATH", "LANG"])
    m.add(
        SandboxPlan(
            sandbox_id="basics", plugin_id="basics", plugin_dir=ROOT / "plugins" / "basics", plugin_version="1", entry="plugin.py",
            declared_tools=frozenset({"echo", "now", "calc"}), plugin_config={}, limits=Limits(memory_bytes=256 * MiB),
            restart=RestartPolicy(max_restarts=10**6, period_s=1, backoff_initial_s=0.0, backoff_max_s=0.0), backend="docker",
        )
    )  # fmt: skip
    client = docker_sdk.from_env()
    image = image_tag()

    def floor_run() -> float:
        t0 = time.perf_counter()
        client.containers.run(image, entrypoint=["/bin/true"], remove=True)
        return (time.perf_counter() - t0) * 1000

    def floor_kill() -> float:
        c = client.containers.run(image, entrypoint=["/bin/sleep", "300"], detach=True)
        t0 = time.perf_counter()
        c.kill()
        c.wait()
        took = (time.perf_counter() - t0) * 1000
        c.remove(force=True)
        return took

    out: dict[str, Any] = {}
    ready, stop = asyncio.Event(), asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(m.run(ready, stop, start_timeout=60, stop_timeout=10))
            await ready.wait()
            n = max(a.starts // 2, 5)
            out["j_docker_cold_start_ms"] = {
                "figure": summary(await bench_cold_start(m, n)),
                "baseline": summary([await asyncio.to_thread(floor_run) for _ in range(n)]),
                "baseline_name": "docker run --rm IMAGE /bin/true (SDK)",
            }
            calls, base = [], []
            block = max(a.calls // 10, 1)
            for _ in range(10):
                base += await bench_calls(process_manager, block, 20)
                calls += await bench_calls(m, block, 20)
            out["k_docker_warm_call_ms"] = {"figure": summary(calls), "baseline": summary(base), "baseline_name": "the same call on the process backend"}
            out["l_docker_kill_to_reclaimed_ms"] = {
                "figure": summary(await bench_crash_reclaim(m, max(a.crashes // 2, 5), kill=lambda child: child.container.kill())),
                "baseline": summary([await asyncio.to_thread(floor_kill) for _ in range(max(a.crashes // 2, 5))]),
                "baseline_name": "docker kill of a plain container to its wait returning",
            }
            stop.set()
    finally:
        await m.aclose()
        client.close()
    return out


async def bench_spawn_true(n: int, warmup: int, *, shell: bool = False) -> list[float]:
    out = []
    for i in range(n + warmup):
        t0 = time.perf_counter()
        proc = await (asyncio.create_subprocess_shell("true") if shell else asyncio.create_subprocess_exec("/bin/true"))
        await proc.wait()
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
    return out


async def bench_exec_true(tools: ToolDispatcher, agent: str, n: int, warmup: int) -> list[float]:
    out = []
    for i in range(n + warmup):
        t0 = time.perf_counter()
        r = await tools.invoke("exec", {"command": "true"}, agent=agent)
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
        assert r.value()["exit_code"] == 0, r.text
    return out


async def _drive(sessions: int, total: int, one: Any) -> dict[str, Any]:
    """`sessions` senders, each sending its share one after another (waiting for the
    reply); per-message latency and overall throughput. A message `one` says was
    refused (False: the gateway or its session was busy) is counted, not timed."""
    lat: list[float] = []
    refused = 0
    per = max(total // sessions, 1)

    async def sender(s: int) -> None:
        nonlocal refused
        for k in range(per):
            t0 = time.perf_counter()
            if await one(s, k) is False:
                refused += 1
                continue
            lat.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for s in range(sessions):
            tg.create_task(sender(s))
    wall = time.perf_counter() - t0
    return {"sessions": sessions, "messages": len(lat), "refused": refused, "per_s": len(lat) / wall, "latency_ms": summary(lat)}


G_SESSIONS = (1, 10, 100, 1000)


async def bench_messages(total: int, session_counts: tuple[int, ...] = G_SESSIONS) -> dict[str, Any]:
    """Figure (g). Each count of sessions gets at least two messages per session (at
    1,000 sessions: 2,000 messages, each session's first a cold one)."""
    from clawsup.supervisor.messages.bus import Busy, MessageBus
    from clawsup.supervisor.config import ClawsupConfig
    from clawsup.supervisor.messages.assembly import Messaging
    from clawsup.supervisor.messages.routing import Route

    out: dict[str, Any] = {"baseline": {}, "always": {}, "never": {}}
    for n in session_counts:
        # The bare bus: an inbound and an outbound queue, an echo consumer between.
        bus = MessageBus()
        waiting: dict[int, asyncio.Future[str]] = {}

        async def echo() -> None:
            while True:
                key, text = await bus.inbound.get()  # type: ignore[misc]
                await bus.outbound.put((key, text))  # type: ignore[arg-type]

        async def deliver() -> None:
            while True:
                key, text = await bus.outbound.get()  # type: ignore[misc]
                waiting.pop(key).set_result(text)

        counter = iter(range(10**9))

        async def bare(s: int, k: int) -> None:
            key = next(counter)
            fut = asyncio.get_running_loop().create_future()
            waiting[key] = fut
            await bus.inbound.put((key, f"s{s} m{k}"))  # type: ignore[arg-type]
            await fut

        async with asyncio.TaskGroup() as tg:
            pumps = [tg.create_task(echo()), tg.create_task(deliver())]
            out["baseline"][n] = await _drive(n, max(total, 2 * n), bare)
            for p in pumps:
                p.cancel()

        for fsync in ("always", "never"):
            state = Path(tempfile.mkdtemp(prefix="cs-bench-msg-", dir="/tmp"))
            paths = StatePaths(state)
            paths.ensure()
            cfg = ClawsupConfig.model_validate({"sessionStore": {"fsync": fsync}, "session": {"dmScope": "per-channel-peer"}})
            m = Messaging.from_config(cfg, paths, source="bench")
            cli = m.cli
            assert cli is not None

            async def through(s: int, k: int) -> bool:
                try:
                    async for item in cli.chat(f"message {k}", peer=f"peer{s}", agent=None, thread=None):
                        if not isinstance(item, Route) and item.final:
                            return True
                except Busy:
                    return False
                raise AssertionError(f"no final reply to message {k} of peer{s}")

            stop, up = asyncio.Event(), asyncio.Event()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(m.run(stop, up))
                await up.wait()
                out[fsync][n] = await _drive(n, max(total, 2 * n), through)
                stop.set()
            await m.aclose()
            shutil.rmtree(state, ignore_errors=True)
    return out


def print_messages(g: dict[str, Any]) -> None:
    print("(g) messages: channel -> bus -> router -> session append -> reply (placeholder agent)")
    print(f"{'sessions':>10}{'fsync':>8}{'msg/s':>10}{'p50 ms':>9}{'p99 ms':>9}   {'bare bus msg/s':>15}{'p50 ms':>9}{'p99 ms':>9}{'msg/s ratio':>13}{'p50 ratio':>11}{'p99 ratio':>11}")
    for n in g["baseline"]:
        b = g["baseline"][n]
        for fsync in ("always", "never"):
            f = g[fsync][n]
            fl, bl = f["latency_ms"], b["latency_ms"]
            refused = f"   {f['refused']} refused (busy)" if f.get("refused") else ""
            print(f"{n:>10}{fsync:>8}{f['per_s']:>10.0f}{fl['p50']:>9.3f}{fl['p99']:>9.3f}   {b['per_s']:>15.0f}{bl['p50']:>9.3f}{bl['p99']:>9.3f}{f['per_s'] / b['per_s']:>12.3f}x{fl['p50'] / bl['p50']:>10.1f}x{fl['p99'] / bl['p99']:>10.1f}x{refused}")


async def bench_turn(manager: SandboxManager, tmp: Path, n: int) -> dict[str, Any]:
    """A turn = the session's history (read from its file on a session's first turn,
    kept in memory after), policy, offline model, one echo call, model again, store;
    through AgentLoop.turn as the session lanes call it. The echo call alone is
    measured in interleaved blocks and subtracted (medians)."""
    from clawsup.supervisor.agents.loop import AgentLoop
    from clawsup.supervisor.agents.models import Models
    from clawsup.supervisor.agents.subagents import build_subagents
    from clawsup.supervisor.messages.bus import InboundMessage, MessageBus, ReplyTarget
    from clawsup.supervisor.config import ClawsupConfig
    from clawsup.supervisor.messages.routing import Peer, Route, RouteInput
    from clawsup.supervisor.messages.session_store import SessionStore

    store = SessionStore(tmp / "bench-sessions", fsync="never")
    cfg = ClawsupConfig()
    models = Models(cfg)
    workspaces = Workspaces(manager, WorkspaceSettings(scope="agent", backend="process"))
    tools = ToolDispatcher(manager, None)
    spawn = build_subagents(cfg, models=models, sandboxes=manager, workspaces=workspaces, tools=tools, store=store, sessions=MessageBus().inbound, backends={"main": "process"}, journal=None)
    loop = AgentLoop(cfg, models=models, tools=tools, spawn=spawn, store=store)
    peer = Peer.of("direct", "bench")
    route = Route(agent_id="main", matched_by="default", session_key="agent:main:bench", main_session_key="agent:main:main", account_id="default")

    async def nothing(_: str) -> None:
        return None

    async def one_turn(i: int) -> None:
        # A new session every 20 turns keeps the history short, as a fresh session's
        # would be (the agent loop keeps it in memory, so the file is read once).
        at = dataclasses.replace(route, session_key=f"{route.session_key}-{i // 20}")
        msg = InboundMessage(source=RouteInput(channel="cli", peer=peer), text='/tool echo {"text": "x"}', reply_to=ReplyTarget(channel="cli", account_id="default", peer=peer))
        await store.append(at.session_key, {"role": "user", "id": msg.id, "text": msg.text})
        out = (await loop.turn(at, msg, nothing)).text
        assert out == "echo returned: x", out
        await store.append(at.session_key, {"role": "assistant", "text": out, "inReplyTo": msg.id})

    turns, tool = [], []
    block = max(n // 10, 1)
    for _ in range(10):
        for i in range(block):
            t0 = time.perf_counter()
            await tools.invoke("echo", {"text": "x"})
            tool.append((time.perf_counter() - t0) * 1000)
        for i in range(block):
            t0 = time.perf_counter()
            await one_turn(i)
            turns.append((time.perf_counter() - t0) * 1000)
    store.close()
    t, c = summary(turns), summary(tool)
    return {"turn": t, "tool_call": c, "overhead_p50": t["p50"] - c["p50"]}


async def bench_subagent(manager: SandboxManager, tmp: Path, n: int, backend: str) -> dict[str, Any]:
    from clawsup.supervisor.messages.bus import InboundMessage, MessageBus, ReplyTarget
    from clawsup.supervisor.config import ClawsupConfig
    from clawsup.supervisor.agents.models import Models
    from clawsup.supervisor.messages.routing import Peer, Route, RouteInput
    from clawsup.supervisor.messages.session_store import SessionStore
    from clawsup.supervisor.agents.runs import Origin
    from clawsup.supervisor.agents.spawn_tools import SpawnArgs
    from clawsup.supervisor.agents.subagents import build_subagents
    from clawsup.supervisor.agents.tool_policy import Caller

    workspaces = Workspaces(manager, WorkspaceSettings(scope="agent", backend=backend))
    store = SessionStore(tmp / f"bench-runs-{backend}", fsync="never")
    bus = MessageBus()
    cfg = ClawsupConfig()
    subs = build_subagents(cfg, models=Models(cfg), sandboxes=manager, workspaces=workspaces, tools=ToolDispatcher(manager, workspaces), store=store, sessions=bus.inbound, backends={"main": backend}, journal=None)
    peer = Peer.of("direct", "bench")
    route = Route(agent_id="main", matched_by="default", session_key="agent:main:bench", main_session_key="agent:main:main", account_id="default")
    msg = InboundMessage(source=RouteInput(channel="cli", peer=peer), text="spawn", reply_to=ReplyTarget(channel="cli", account_id="default", peer=peer))
    origin = Origin(session_key=route.session_key, agent_id="main", caller=Caller(agent="main", owner=True), allowed=frozenset(), message=msg, route=route)
    # The baseline: a host of the same runtime with no plugin either (a workspace
    # sandbox), stopped and started again.
    host = await workspaces.sandbox(f"bench-runs-{backend}", None)  # its own, not (e)'s
    stop = asyncio.Event()
    figure, base = [], []
    async with asyncio.TaskGroup() as tg:
        tg.create_task(subs.run(stop))
        await asyncio.sleep(0)  # let it open its task group
        block = max(n // 5, 1)
        for _ in range(5):
            for _ in range(block):
                t0 = time.perf_counter()
                accepted = subs.spawn(SpawnArgs(task="hello"), origin)
                run = await subs.wait(accepted["runId"], 60)
                figure.append((time.perf_counter() - t0) * 1000)
                assert run["status"] == "succeeded", run
                bus.inbound.get_nowait()
            for _ in range(block):
                t0 = time.perf_counter()
                await host.stop("bench", 30)
                state = await host.start(30)
                assert state is SandboxState.READY, (state, host.lc.last_exit, list(host.log.stderr_tail))
                base.append((time.perf_counter() - t0) * 1000)
        stop.set()
    store.close()
    return {"figure": summary(figure), "baseline": summary(base), "baseline_name": f"stop + start of a workspace sandbox (same runtime, no plugin) on {backend}"}


PING_PLUGIN = """from clawsup.sandbox.api import hookimpl


@hookimpl
def clawsup_register(api):
    api.register_tool(name="{tool}", description="Answers pong.", handler=lambda args: "pong")
"""


def ping_plugins(root: Path, n: int) -> list[Path]:
    """`n` one-tool plugins (ping0 ... ping{n-1}), each its own sandbox."""
    dirs = []
    for i in range(n):
        d = root / f"ping{i}"
        d.mkdir(parents=True)
        manifest = {"id": f"ping{i}", "version": "1.0.0", "description": "Bench: one tool.", "entry": "plugin.py", "contracts": {"tools": [f"ping{i}_pong"]}}
        (d / "clawsup.plugin.json").write_text(json.dumps(manifest))
        (d / "plugin.py").write_text(PING_PLUGIN.format(tool=f"ping{i}_pong"))
        dirs.append(d)
    return dirs


def bench_status(calls: int, backend: str, sandboxes: int = 10) -> dict[str, Any]:
    """Figure (n): the control `status` op (what `clawsup status` asks) of a real
    supervisor while `sandboxes` plugin sandboxes restart in a loop (each a thread
    calling the `restart` op again and again), against the same op idle, in
    interleaved blocks; and the `clawsup status` command itself, once each way."""
    from clawsup.supervisor.control.api import ControlClient

    state = Path(tempfile.mkdtemp(prefix="cs-bench-status-", dir="/tmp"))
    dirs = ping_plugins(state / "plugins", sandboxes)
    cfg = {
        "plugins": {"load": {"paths": [str(d) for d in dirs]}, "entries": {d.name: {"trust": "trusted"} for d in dirs}},
        "sandbox": {"defaults": {"backend": backend}, **({"runAs": "supervisor"} if backend == "process" else {})},
    }
    (state / "clawsup.json").write_text(json.dumps(cfg))
    console = open(state / "console.txt", "w+")
    sup = subprocess.Popen(
        [sys.executable, "-m", "clawsup.supervisor.control.cli", "start", "--config", str(state / "clawsup.json"), "--state-dir", str(state)],
        stdout=console, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    client = ControlClient(state / "run" / "control.sock")
    cli = [sys.executable, "-m", "clawsup.supervisor.control.cli", "status", "--state-dir", str(state)]

    def status_ms(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = client.request({"op": "status"})
            out.append((time.perf_counter() - t0) * 1000)
            assert r.get("ok") and len(r["data"]["sandboxes"]) >= sandboxes, r
        return out

    def cli_ms() -> float:
        t0 = time.perf_counter()
        r = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return (time.perf_counter() - t0) * 1000

    restarts: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    looping_s = [0.0]  # how long the restart loops ran, for their rate

    def restarting(sid: str, stop: threading.Event, started: threading.Barrier) -> None:
        started.wait()
        while not stop.is_set():
            t0 = time.perf_counter()
            r = client.request({"op": "restart", "sandbox": sid, "timeout": 60})
            ms = (time.perf_counter() - t0) * 1000
            if r.get("ok") and r["data"]["state"] == "ready":
                with lock:
                    restarts.append(ms)
                continue
            log = client.request({"op": "logs", "sandbox": sid, "n": 12})
            tail = "\n        ".join(log["data"]["lines"]) if log.get("ok") else log
            with lock:
                failures.append(f"{sid}: {r}; its log ends:\n        {tail}")

    class Restarts:
        """The ten restart loops, for the length of a `with` block."""

        def __enter__(self) -> None:
            self.stop = threading.Event()
            started = threading.Barrier(sandboxes + 1)
            self.threads = [threading.Thread(target=restarting, args=(f"ping{i}", self.stop, started)) for i in range(sandboxes)]
            for t in self.threads:
                t.start()
            started.wait()
            self.t0 = time.perf_counter()

        def __exit__(self, *_: object) -> None:
            self.stop.set()
            for t in self.threads:
                t.join()
            looping_s[0] += time.perf_counter() - self.t0

    try:
        while not (state / "run" / "control.sock").exists():
            if sup.poll() is not None:
                console.seek(0)
                raise SystemExit(f"(n): the supervisor exited with {sup.returncode}:\n{console.read()[-3000:]}")
            time.sleep(0.05)  # only while the socket does not exist yet
        for i in range(sandboxes):
            r = client.request({"op": "wait", "sandbox": f"ping{i}", "states": ["ready"], "timeout": 60})
            assert r.get("ok"), r
        status_ms(50)  # warm
        idle, busy = [], []
        block = max(calls // 5, 1)
        for _ in range(5):
            idle += status_ms(block)
            with Restarts():
                busy += status_ms(block)
        cli_idle = cli_ms()
        with Restarts():
            cli_busy = cli_ms()
        client.stop()
        sup.wait(30)
    except BaseException:
        console.seek(0)
        print(console.read()[-5000:])
        raise
    finally:
        if sup.poll() is None:
            sup.kill()
        shutil.rmtree(state, ignore_errors=True)
    return {
        "figure": summary(busy),
        "baseline": summary(idle),
        "baseline_name": "the same `status` op, nothing restarting, interleaved",
        "backend": backend,
        "sandboxes": sandboxes,
        "restarts": summary(restarts) if restarts else {"n": 0, "p50": float("nan"), "p99": float("nan")},
        "restarts_per_s": len(restarts) / looping_s[0] if looping_s[0] else 0.0,
        "restart_failures": failures[:10],
        "cli_ms": {"restarting": cli_busy, "idle": cli_idle},
    }


def print_status(n: dict[str, Any]) -> None:
    f, b, c = n["figure"], n["baseline"], n["cli_ms"]
    print(f"(n) `status` op while {n['sandboxes']} sandboxes ({n['backend']}) restart in a loop, ms")
    print(f"{'':<6}{'':<12}{'p50':>9}{'p90':>9}{'p99':>9}")
    print(f"{'':<6}{'restarting':<12}{f['p50']:>9.3f}{f['p90']:>9.3f}{f['p99']:>9.3f}")
    print(f"{'':<6}{'idle':<12}{b['p50']:>9.3f}{b['p90']:>9.3f}{b['p99']:>9.3f}    (baseline: {n['baseline_name']})")
    print(f"{'':<6}{'ratio':<12}{f['p50'] / b['p50']:>8.2f}x{f['p90'] / b['p90']:>8.2f}x{f['p99'] / b['p99']:>8.2f}x")
    r = n["restarts"]
    print(f"{'':<6}restarts meanwhile: {r['n']} ({n['restarts_per_s']:.1f}/s), each p50 {r['p50']:.0f} ms, p99 {r['p99']:.0f} ms; failed: {len(n['restart_failures'])}")
    print(f"{'':<6}`clawsup status` (the command, once each): {c['restarting']:.0f} ms while restarting, {c['idle']:.0f} ms idle ({c['restarting'] / c['idle']:.2f}x)")
    for x in n["restart_failures"]:
        print(f"{'':<6}restart failed: {x}")


def bench_policy(n_tools: int = 200, reps: int = 2000) -> dict[str, Any]:
    from clawsup.supervisor.agents.tool_policy import Caller, decide

    available = {"exec": "core", "read": "core", "write": "core", "edit": "core", "list_dir": "core"}
    for i in range(n_tools - len(available)):
        available[f"p{i % 20}_tool_{i}"] = f"plugin{i % 20}"
    cfg = {
        "profile": "coding", "alsoAllow": ["group:plugins"], "allow": ["*"], "deny": ["p3_*"],
        "byProvider": {"anthropic": {"deny": ["group:plugin:plugin7"]}},
        "byChannel": {"http": {"deny": ["p5_tool_*"], "groups": {"g1": {"deny": ["write"]}}}},
        "bySender": {"http:eve": {"deny": ["exec"]}}, "sandbox": {"tools": {"deny": ["p9_tool_9"]}},
        "ownerOnly": ["edit"],
    }  # fmt: skip
    agent = {"deny": ["p1_*"], "byProvider": {"anthropic": {"deny": ["p2_tool_2"]}}}
    caller = Caller(agent="main", provider="anthropic/x", channel="http", group_id="g1", sender="eve")
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        d = decide(cfg, agent, caller, available)
        out.append((time.perf_counter() - t0) * 1000)
    return {"figure": summary(out), "tools_left": len(d.tools), "tools": n_tools}


def print_turn(h: dict[str, Any]) -> None:
    t, c = h["turn"], h["tool_call"]
    print(f"(h) turn with one tool call, ms   p50 {t['p50']:.3f}  p99 {t['p99']:.3f};  the tool call alone p50 {c['p50']:.3f}  p99 {c['p99']:.3f};  overhead p50 {h['overhead_p50']:.3f}")


def print_docker(d: dict[str, Any]) -> None:
    if "skipped" in d:
        print(f"(j)-(l) docker: skipped: {d['skipped']}")
        return
    for key, label in (("j_docker_cold_start_ms", "(j) docker cold start, ms"), ("k_docker_warm_call_ms", "(k) docker warm tool call, ms"), ("l_docker_kill_to_reclaimed_ms", "(l) docker kill to reclaimed, ms")):
        f, b = d[key]["figure"], d[key]["baseline"]
        print(f"{label:<34}{f['p50']:>9.3f}{f['p90']:>9.3f}{f['p99']:>9.3f}   {b['p50']:>8.3f}/{b['p90']:.3f}/{b['p99']:.3f}{'':<6}{f['p50'] / b['p50']:>8.2f}x")
        print(f"{'':<34}baseline: {d[key]['baseline_name']}")


def print_policy(i: dict[str, Any]) -> None:
    f = i["figure"]
    print(f"(i) policy decision, {i['tools']} tools, every layer set, ms   p50 {f['p50']:.3f}  p99 {f['p99']:.3f}  ({i['tools_left']} left)")


def uss(pid: int) -> int:
    return psutil.Process(pid).memory_full_info().uss



async def figure_a(manager: SandboxManager, echo_path: str, calls_n: int) -> dict[str, Any]:
    """A warm call, interleaved in blocks with the bare echo so that machine noise
    hits both alike."""
    calls, base = [], []
    block = max(calls_n // 10, 1)
    for _ in range(10):
        base += await bench_bare_echo(echo_path, block, 50)
        calls += await bench_calls(manager, block, 50)
    return {"figure": summary(calls), "baseline": summary(base), "baseline_name": "bare grpc.aio unary echo, unix socket"}


async def figure_b(manager: SandboxManager, starts: int) -> dict[str, Any]:
    return {
        "figure": summary(await bench_cold_start(manager, starts)),
        "baseline": summary(await asyncio.to_thread(bench_import_grpc, starts)),
        "baseline_name": "spawn `python -I -c 'import grpc'` to exit",
    }


async def _all_in_manager(a: Any, manager: SandboxManager, launchers: dict[str, Any], tmp: Path, echo_proc: Any, echo_path: str, results: dict[str, Any]) -> None:
    """Figures (a)-(f), (h), (j)-(l), in one running manager."""
    results["a_warm_call_ms"] = await figure_a(manager, echo_path, a.calls)

    # (d) idle USS, after the calls settled
    await asyncio.sleep(1.0)
    sb = manager.sandboxes["basics"]
    assert sb.inc is not None
    results["d_idle_uss_mib"] = {
        "figure": uss(sb.inc.child.pid) / MiB,
        "baseline": uss(echo_proc.pid) / MiB,
        "baseline_name": "idle bare grpc.aio server child",
    }

    results["b_cold_start_ms"] = await figure_b(manager, a.starts)

    # (c)
    results["c_crash_to_reclaimed_ms"] = {
        "figure": summary(await bench_crash_reclaim(manager, a.crashes)),
        "baseline": summary(await bench_kill_floor(tmp, a.crashes)),
        "baseline_name": "SIGKILL of an idle bare grpc.aio server to its pidfd readable",
    }

    # (h)
    results["h_turn_overhead_ms"] = await bench_turn(manager, tmp, a.turns)

    # (j), (k), (l)
    results["docker"] = await bench_docker(manager, tmp, a)

    # (e), (f)
    for key, backend in (("e_exec_true_process_ms", "process"), ("f_exec_true_bwrap_ms", "bwrap")):
        if backend not in launchers:
            results[key] = {"skipped": bwrap_problem()}
            continue
        tools = ToolDispatcher(manager, Workspaces(manager, WorkspaceSettings(scope="agent", backend=backend)))
        figure, base, shell = [], [], []
        block = max(a.execs // 10, 1)
        for _ in range(10):
            base += await bench_spawn_true(block, 20)
            shell += await bench_spawn_true(block, 20, shell=True)
            figure += await bench_exec_true(tools, f"bench-{backend}", block, 20)
        results[key] = {
            "figure": summary(figure),
            "baseline": summary(base),
            "baseline_name": "asyncio.create_subprocess_exec('/bin/true') + wait",
            # For scale: what an unsandboxed exec tool does in-process.
            "shell_spawn": summary(shell),
            "shell_spawn_name": "asyncio.create_subprocess_shell('true') + wait",
        }


def basics_plan(backend: str, sandbox_id: str = "basics") -> SandboxPlan:
    return SandboxPlan(
        sandbox_id=sandbox_id,
        plugin_id="basics",
        plugin_dir=ROOT / "plugins" / "basics",
        plugin_version="1",
        entry="plugin.py",
        declared_tools=frozenset({"echo", "now", "calc"}),
        plugin_config={},
        limits=Limits(memory_bytes=256 * MiB),
        restart=RestartPolicy(max_restarts=10**6, period_s=1, backoff_initial_s=0.0, backoff_max_s=0.0),
        backend=backend,
        trusted=backend == "process",
    )


async def _bwrap_plugin_figures(a: Any, launchers: dict[str, Any], tmp: Path, echo_path: str, results: dict[str, Any]) -> None:
    """(a') and (b'): the plugin on bwrap, in a manager of its own (its own registry
    and state folder), beside the same baselines as (a) and (b)."""
    if "bwrap" not in launchers:
        results["a_warm_call_bwrap_ms"] = results["b_cold_start_bwrap_ms"] = {"skipped": bwrap_problem()}
        return
    paths = StatePaths(tmp / "bw")
    paths.ensure()
    registry = Registry(reserved=frozenset(CORE_TOOLS))
    manager = SandboxManager(registry=registry, launchers={"bwrap": launchers["bwrap"]}, paths=paths, timing=Timing(heartbeat_interval_s=2.0), env_allowlist=["PATH", "LANG"])
    # Its own sandbox id: the two managers share this process's cgroup root, and a
    # cgroup is named after the sandbox (a stop would kill the other's children).
    manager.add(basics_plan("bwrap", "basics-bwrap"))
    ready, stop = asyncio.Event(), asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(manager.run(ready, stop, start_timeout=60, stop_timeout=10))
        await ready.wait()
        results["a_warm_call_bwrap_ms"] = await figure_a(manager, echo_path, a.calls)
        results["b_cold_start_bwrap_ms"] = await figure_b(manager, a.starts)
        stop.set()


async def _bench_runs(a: Any, manager: SandboxManager, launchers: dict[str, Any], tmp: Path, results: dict[str, Any]) -> None:
    """Figure (m), on each backend there is."""
    for backend in ("process", "bwrap"):
        key = f"m_subagent_run_{backend}_ms"
        results[key] = await bench_subagent(manager, tmp, a.runs, backend) if backend in launchers else {"skipped": bwrap_problem()}


# -- (o) an MCP server in a sandbox (issue 15) -----------------------------------------

MCP_VENV = Path("/var/tmp/clawsup-bench/mcp-server-time")
"""Where the bench installs the server it measures, on first use (kept between runs;
outside the bench's temporary folder, and outside HOME, which no sandbox may see)."""
MCP_ARGS = ["--local-timezone", "UTC"]
"""The same argv for both sides; a fixed zone also spares the server guessing it."""
MCP_TOOL = "get_current_time"
MCP_TOOL_ARGS = {"timezone": "UTC"}


def mcp_server_command() -> str:
    """`mcp-server-time` (the reference servers' own, on the same `mcp` SDK as clawsup),
    installed with pip into a venv of the bench's own if it is not there yet."""
    exe = MCP_VENV / "bin" / "mcp-server-time"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(MCP_VENV)], check=True)
        subprocess.run([str(MCP_VENV / "bin" / "pip"), "install", "-q", "mcp-server-time"], check=True)
    return str(exe)


async def mcp_direct_start(command: str) -> float:
    """The baseline of a cold start: the official SDK's stdio client spawns the server,
    initializes and lists its tools; the clock stops when the list returns (closing
    the server afterwards is not counted)."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    t0 = time.perf_counter()
    async with stdio_client(StdioServerParameters(command=command, args=MCP_ARGS)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        took = (time.perf_counter() - t0) * 1000
    assert MCP_TOOL in {t.name for t in listed.tools}, listed
    return took


async def mcp_direct_calls(session: Any, n: int, warmup: int) -> list[float]:
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        r = await session.call_tool(MCP_TOOL, MCP_TOOL_ARGS)
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
        assert not r.is_error, r
    return out


async def mcp_clawsup_calls(tools: ToolDispatcher, name: str, n: int, warmup: int) -> list[float]:
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        r = await tools.invoke(name, MCP_TOOL_ARGS)
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
        assert r.value()["timezone"] == "UTC", r.text
    return out


async def mcp_timed_start(sb: Any) -> float:
    """Stop (not counted), then ask for a start and wait for `ready`: the host up, the
    server initialized and listed, the tools judged and registered."""
    await sb.stop("bench", 30)
    t0 = time.perf_counter()
    state = await sb.start(30)
    took = (time.perf_counter() - t0) * 1000
    assert state is SandboxState.READY, f"{sb.id}: {state} ({sb.lc.why})"
    return took


def mcp_plan(command: str, backend: str, tmp: Path) -> SandboxPlan:
    """The plan the gateway would make of one `mcpServers` entry (untrusted on bwrap,
    trusted on process), with the bench's restart policy (stops and starts without
    end), as basics_plan has."""
    from clawsup.supervisor.config import ClawsupConfig
    from clawsup.supervisor.sandboxes.mcp_plans import build_mcp_plans

    entry: dict[str, Any] = {"command": command, "args": MCP_ARGS, "sandbox": {"backend": backend}}
    if backend == "process":
        entry["trust"] = "trusted"
    cfg = ClawsupConfig.model_validate({"mcpServers": {"time": entry}})
    [plan] = build_mcp_plans(cfg, config_dir=tmp, state_dir=tmp)
    return dataclasses.replace(plan, restart=basics_plan(backend).restart)


async def bench_mcp(a: Any, launchers: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Figure (o), on bwrap and on process (trusted): an MCP server's cold start
    (start asked -> ready, its tools registered) beside the SDK's own client starting
    the same server (spawn, initialize, tools/list) and beside the cold start of a
    plain plugin sandbox on the same backend; and a warm tools/call through
    ToolDispatcher.invoke beside the SDK client's call_tool. Each backend's sandboxes
    in a manager of their own; starts interleaved round by round, calls in blocks."""
    command = await asyncio.to_thread(mcp_server_command)
    backends = [b for b in ("bwrap", "process") if b in launchers]
    out: dict[str, Any] = {}
    if "bwrap" not in launchers:
        out["o_mcp_cold_start_bwrap_ms"] = out["o_mcp_warm_call_bwrap_ms"] = {"skipped": bwrap_problem()}
    managers: dict[str, SandboxManager] = {}
    ids: dict[str, tuple[str, str]] = {}  # each backend's (plugin sandbox, MCP sandbox)
    for backend in backends:
        paths = StatePaths(tmp / f"mcp-{backend}")
        paths.ensure()
        m = SandboxManager(registry=Registry(reserved=frozenset(CORE_TOOLS)), launchers={backend: launchers[backend]}, paths=paths, timing=Timing(heartbeat_interval_s=2.0), env_allowlist=["PATH", "LANG"])
        # Sandbox ids of their own: every manager here shares this process's cgroup root.
        plugin = m.add(basics_plan(backend, f"basics-{backend}-o"))
        plan = await asyncio.to_thread(mcp_plan, command, backend, tmp)
        server = m.add(dataclasses.replace(plan, sandbox_id=f"{plan.sandbox_id}-{backend}"))
        managers[backend], ids[backend] = m, (plugin.id, server.id)
    stop = asyncio.Event()
    direct: list[float] = []
    starts: dict[str, dict[str, list[float]]] = {b: {"plugin": [], "mcp": []} for b in backends}
    calls: dict[str, dict[str, list[float]]] = {b: {"direct": [], "clawsup": []} for b in backends}
    try:
        async with asyncio.TaskGroup() as tg:
            for m in managers.values():
                ready = asyncio.Event()
                tg.create_task(m.run(ready, stop, start_timeout=60, stop_timeout=10))
                await ready.wait()
            for _ in range(a.mcp_starts):
                direct.append(await mcp_direct_start(command))
                for backend, m in managers.items():
                    plugin, server = ids[backend]
                    starts[backend]["plugin"].append(await mcp_timed_start(m.sandboxes[plugin]))
                    starts[backend]["mcp"].append(await mcp_timed_start(m.sandboxes[server]))

            from mcp.client.session import ClientSession
            from mcp.client.stdio import StdioServerParameters, stdio_client

            block = max(a.mcp_calls // 10, 1)
            async with stdio_client(StdioServerParameters(command=command, args=MCP_ARGS)) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                for backend, m in managers.items():
                    spec = m.sandboxes[ids[backend][1]].plan.mcp
                    assert spec is not None
                    name = spec.served_name(MCP_TOOL)
                    tools = ToolDispatcher(m, None)
                    for _ in range(10):
                        calls[backend]["direct"] += await mcp_direct_calls(session, block, 20)
                        calls[backend]["clawsup"] += await mcp_clawsup_calls(tools, name, block, 20)
            stop.set()
    finally:
        for m in managers.values():
            await m.aclose()
    d = summary(direct)
    for backend in backends:
        f, s = summary(starts[backend]["mcp"]), summary(starts[backend]["plugin"])
        out[f"o_mcp_cold_start_{backend}_ms"] = {
            "figure": f,
            "baseline": d,
            "baseline_name": "mcp SDK stdio_client + ClientSession: spawn, initialize, tools/list",
            "sandbox_start": s,
            "sandbox_start_name": f"cold start of the basics plugin's sandbox on {backend} ((b)), same rounds",
            # The target: (clawsup - the sandbox's own start) / direct <= 1.3.
            "less_sandbox_over_direct": {p: (f[p] - s[p]) / d[p] for p in ("p50", "p99")},
        }
        c = calls[backend]
        out[f"o_mcp_warm_call_{backend}_ms"] = {
            "figure": summary(c["clawsup"]),
            "baseline": summary(c["direct"]),
            "baseline_name": "mcp SDK ClientSession.call_tool over stdio, same server",
        }
    return out


def print_mcp(r: dict[str, Any]) -> None:
    print(f"(o) MCP server `mcp-server-time {' '.join(MCP_ARGS)}`, tool {MCP_TOOL}")
    print(f"{'':<40}{'p50':>10}{'p99':>10}   ratio p50 / p99")
    for backend in ("bwrap", "process"):
        cold, warm = r.get(f"o_mcp_cold_start_{backend}_ms"), r.get(f"o_mcp_warm_call_{backend}_ms")
        if cold is None or warm is None:
            continue
        if "skipped" in cold:
            print(f"  {backend}: skipped: {cold['skipped']}")
            continue
        where = "bwrap" if backend == "bwrap" else "process (trusted)"
        f, b, s, less = cold["figure"], cold["baseline"], cold["sandbox_start"], cold["less_sandbox_over_direct"]
        label = f"{where}, cold start, ms ({f['n']})"
        print(f"  {label:<38}{f['p50']:>10.1f}{f['p99']:>10.1f}   {f['p50'] / b['p50']:.2f}x / {f['p99'] / b['p99']:.2f}x")
        print(f"  {'  direct: SDK stdio_client':<38}{b['p50']:>10.1f}{b['p99']:>10.1f}")
        own = "  the sandbox's own start (basics)"
        print(f"  {own:<38}{s['p50']:>10.1f}{s['p99']:>10.1f}")
        print(f"  {'  (clawsup - sandbox start) / direct':<38}{'':>20}   {less['p50']:.2f}x / {less['p99']:.2f}x   (target <= 1.3x)")
        f, b = warm["figure"], warm["baseline"]
        label = f"{where}, warm call, ms ({f['n']})"
        print(f"  {label:<38}{f['p50']:>10.3f}{f['p99']:>10.3f}   {f['p50'] / b['p50']:.2f}x / {f['p99'] / b['p99']:.2f}x   (target <= 1.3x)")
        print(f"  {'  direct: SDK call_tool':<38}{b['p50']:>10.3f}{b['p99']:>10.3f}")


# -- (p) a before_tool_call gate, (q) a plugin channel (issue 16) ---------------------

BENCH_PLUGINS = ROOT / "scripts" / "bench_plugins"


def gate_plans(backend: str, variant: str, tmp: Path) -> list[SandboxPlan]:
    """basics and benchgate as the gateway would plan them from a config, with the
    operator's grant that lets the gate guard other plugins' tools
    (`plugins.entries.benchgate.hooks.allow`); on process both are trusted. `variant`
    "sync": the gate a plain function (run in a worker thread of its host); "async":
    a coroutine (on the host's loop). Sandbox
    ids of their own (the managers here share this process's cgroup root), and the
    bench's restart policy."""
    from clawsup.supervisor.config import ClawsupConfig
    from clawsup.supervisor.sandboxes.plans import build_plans

    trust = "trusted" if backend == "process" else "untrusted"
    cfg = ClawsupConfig.model_validate({
        "plugins": {
            "load": {"paths": [str(ROOT / "plugins" / "basics"), str(BENCH_PLUGINS / "benchgate")]},
            "entries": {"basics": {"trust": trust}, "benchgate": {"trust": trust, "hooks": {"allow": ["before_tool_call"]}, "config": {"async": variant == "async"}}},
        },
        "sandbox": {"defaults": {"backend": backend}},
    })  # fmt: skip
    plans = build_plans(cfg, config_source="bench", config_dir=tmp, extra_plugins=[])
    return [dataclasses.replace(p, sandbox_id=f"{p.sandbox_id}-{backend}-{variant}-p", restart=basics_plan(backend).restart) for p in plans]


async def bench_gated_calls(tools: ToolDispatcher, n: int, warmup: int) -> list[float]:
    out = []
    args = {"text": PAYLOAD}
    for i in range(warmup + n):
        t0 = time.perf_counter()
        r = await tools.invoke("echo", args, agent="main", session="agent:main:bench")
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
        assert r.text == PAYLOAD
    return out


async def bench_gate_alone(hooks: Any, n: int, warmup: int) -> list[float]:
    out = []
    args = {"text": PAYLOAD}
    for i in range(warmup + n):
        t0 = time.perf_counter()
        given = await hooks.before_tool_call("echo", "basics", args, agent="main", session="agent:main:bench")
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
        assert given is args
    return out


GATE_RUNS = (("process", "sync"), ("process", "async"), ("bwrap", "sync"), ("bwrap", "async"))


async def bench_gate(a: Any, launchers: dict[str, Any], tmp: Path, echo_path: str) -> dict[str, Any]:
    """Figure (p), on process and on bwrap, with a sync and an async gate: the warm
    call of basics' `echo` through ToolDispatcher.invoke without hooks and with one
    `before_tool_call` gate (a plugin of its own, granted to guard other plugins'
    tools, answering None), and
    the bare grpc.aio unary echo, in interleaved blocks. The gate's cost is the
    difference (with - without, per percentile); for scale, Hooks.before_tool_call
    alone (one CallOffer to the gate's sandbox) is timed in the same blocks."""
    from clawsup.supervisor.hooks import Hooks

    out: dict[str, Any] = {}
    for backend, variant in GATE_RUNS:
        key = f"p_gate_{backend}_{variant}_ms"
        if backend not in launchers:
            out[key] = {"skipped": bwrap_problem()}
            continue
        paths = StatePaths(tmp / f"gate-{backend}-{variant}")
        paths.ensure()
        m = SandboxManager(registry=Registry(reserved=frozenset(CORE_TOOLS)), launchers={backend: launchers[backend]}, paths=paths, timing=Timing(heartbeat_interval_s=2.0), env_allowlist=["PATH", "LANG"])
        for plan in await asyncio.to_thread(gate_plans, backend, variant, tmp):
            m.add(plan)
        hooks = Hooks(m.sandboxes, m.registry)
        plain, gated = ToolDispatcher(m, None), ToolDispatcher(m, None, hooks)
        without, with_gate, alone, base = [], [], [], []
        ready, stop = asyncio.Event(), asyncio.Event()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(m.run(ready, stop, start_timeout=60, stop_timeout=10))
                await ready.wait()
                block = max(a.gate_calls // 10, 1)
                for _ in range(10):
                    base += await bench_bare_echo(echo_path, block, 50)
                    without += await bench_gated_calls(plain, block, 50)
                    with_gate += await bench_gated_calls(gated, block, 50)
                    alone += await bench_gate_alone(hooks, block, 50)
                stop.set()
        finally:
            await m.aclose()
        w, wo, b = summary(with_gate), summary(without), summary(base)
        added = {p: w[p] - wo[p] for p in ("p50", "p90", "p99")}
        out[key] = {
            "figure": w,
            "without": wo,
            "gate_alone": summary(alone),
            "baseline": b,
            "baseline_name": "bare grpc.aio unary echo, unix socket",
            "added": added,
            # The target: the gate adds <= 1.3x a bare gRPC unary call.
            "added_over_baseline": {p: added[p] / b[p] for p in ("p50", "p99")},
        }
    return out


def print_gate(r: dict[str, Any]) -> None:
    print("(p) one before_tool_call gate on a warm call of basics' echo (ToolDispatcher.invoke), ms")
    print(f"  {'':<38}{'p50':>9}{'p90':>9}{'p99':>9}")
    for backend, variant in GATE_RUNS:
        g = r.get(f"p_gate_{backend}_{variant}_ms")
        if g is None:
            continue
        if "skipped" in g:
            print(f"  {backend}: skipped: {g['skipped']}")
            continue
        rows = (("with the gate", g["figure"]), ("without", g["without"]), ("added (with - without)", g["added"]), ("Hooks.before_tool_call alone", g["gate_alone"]), ("bare gRPC unary (baseline)", g["baseline"]))
        print(f"  {backend}, {variant} gate ({g['figure']['n']} calls each)")
        for label, x in rows:
            print(f"    {label:<36}{x['p50']:>9.3f}{x['p90']:>9.3f}{x['p99']:>9.3f}")
        q = g["added_over_baseline"]
        print(f"    {'added / bare unary':<36}{q['p50']:>8.2f}x{'':>9}{q['p99']:>8.2f}x   (target <= 1.3x)")


CHANNEL_TOKEN = "bench-token-0123456789"


def bench_channel(messages: int, backend: str) -> dict[str, Any]:
    """Figure (q): a message's round trip through a plugin channel (benchchan, on
    `backend`) of a real gateway (`clawsup start`), from the adapter's
    `emit_message` to its `send` of the final reply, timed in the plugin's sandbox;
    against the built-in http channel of the same gateway, from POST /v1/messages to
    the `reply` event, timed here (one kept-alive connection). The placeholder agent
    answers both; interleaved blocks, a new peer (so a new, short session) each block."""
    import http.client

    from clawsup.supervisor.control.api import ControlClient

    state = Path(tempfile.mkdtemp(prefix="cs-bench-chan-", dir="/tmp"))
    # A copy the sandbox's own uid can read, wherever the checkout is.
    plugin = state / "plugins" / "benchchan"
    shutil.copytree(BENCH_PLUGINS / "benchchan", plugin, ignore=shutil.ignore_patterns("__pycache__"))
    for d in (state / "plugins", plugin):
        os.chmod(d, 0o755)
    cfg = {
        "plugins": {"load": {"paths": [str(plugin)]}, "entries": {"benchchan": {"trust": "trusted" if backend == "process" else "untrusted"}}},
        "sandbox": {"defaults": {"backend": backend}, **({"runAs": "supervisor"} if backend == "process" else {})},
        "session": {"dmScope": "per-channel-peer"},
        "sessionStore": {"fsync": "never"},
        "channels": {"http": {"enabled": True, "port": 0, "token": CHANNEL_TOKEN}, "benchchan": {"enabled": True}},
    }
    (state / "clawsup.json").write_text(json.dumps(cfg))
    console = open(state / "console.txt", "w+")
    sup = subprocess.Popen(
        [sys.executable, "-m", "clawsup.supervisor.control.cli", "start", "--config", str(state / "clawsup.json"), "--state-dir", str(state)],
        stdout=console, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    client = ControlClient(state / "run" / "control.sock")
    conn: http.client.HTTPConnection | None = None

    def http_one(peer: str, text: str) -> float:
        assert conn is not None
        body = json.dumps({"text": text, "peer": {"kind": "direct", "id": peer}})
        t0 = time.perf_counter()
        conn.request("POST", "/v1/messages", body, {"Authorization": f"Bearer {CHANNEL_TOKEN}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, (resp.status, resp.read())
        took, event = None, None
        for raw in resp:  # to the stream's end, so that the connection is free again
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
                if event == "reply" and took is None:
                    took = (time.perf_counter() - t0) * 1000
            elif event == "error":
                raise AssertionError(line)
        assert took is not None, "no reply event"
        return took

    def plugin_block(peer: str, n: int) -> list[float]:
        r = client.request({"op": "call", "name": "benchchan_round_trips", "args": {"n": n, "peer": peer}, "timeout": 300})
        assert r.get("ok"), r
        times = json.loads(r["data"]["result"]) if isinstance(r["data"]["result"], str) else r["data"]["result"]
        assert len(times) == n, times
        return [float(t) for t in times]

    try:
        while not (state / "run" / "control.sock").exists() or not (state / "run" / "http.port").exists():
            if sup.poll() is not None:
                console.seek(0)
                raise SystemExit(f"(q): the gateway exited with {sup.returncode}:\n{console.read()[-3000:]}")
            time.sleep(0.05)  # only while the gateway is not up yet
        r = client.request({"op": "wait", "sandbox": "benchchan", "states": ["ready"], "timeout": 60})
        assert r.get("ok"), r
        conn = http.client.HTTPConnection("127.0.0.1", int((state / "run" / "http.port").read_text()), timeout=60)
        plugin_block("warm", 20)
        for i in range(20):
            http_one("warm", f"warm {i}")
        via_plugin, via_http = [], []
        block = max(messages // 10, 1)
        for b in range(10):
            via_http += [http_one(f"h{b}", f"message {k}") for k in range(block)]
            via_plugin += plugin_block(f"p{b}", block)
        client.stop()
        sup.wait(30)
    except BaseException:
        console.seek(0)
        print(console.read()[-5000:])
        raise
    finally:
        if conn is not None:
            conn.close()
        if sup.poll() is None:
            sup.kill()
        shutil.rmtree(state, ignore_errors=True)
    return {
        "figure": summary(via_plugin),
        "baseline": summary(via_http),
        "baseline_name": "the built-in http channel, same gateway: POST /v1/messages to the `reply` event (SSE), kept-alive connection",
        "backend": backend,
    }


def print_channel(r: dict[str, Any]) -> None:
    print("(q) a message's round trip through a channel, placeholder agent, ms")
    print(f"  {'':<44}{'p50':>9}{'p90':>9}{'p99':>9}")
    for backend in ("process", "bwrap"):
        q = r.get(f"q_channel_{backend}_ms")
        if q is None:
            continue
        if "skipped" in q:
            print(f"  {backend}: skipped: {q['skipped']}")
            continue
        f, b = q["figure"], q["baseline"]
        for label, x in ((f"plugin channel, {backend} ({f['n']})", f), (f"http channel ({b['n']})", b)):
            print(f"  {label:<44}{x['p50']:>9.3f}{x['p90']:>9.3f}{x['p99']:>9.3f}")
        print(f"  {'ratio plugin / http':<44}{f['p50'] / b['p50']:>8.2f}x{f['p90'] / b['p90']:>8.2f}x{f['p99'] / b['p99']:>8.2f}x")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench.json")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--starts", type=int, default=30)
    ap.add_argument("--crashes", type=int, default=50)
    ap.add_argument("--execs", type=int, default=500)
    ap.add_argument("--messages", type=int, default=2000, help="per (g) run, spread over the sessions (at least 2 per session)")
    ap.add_argument("--g-sessions", default=",".join(map(str, G_SESSIONS)), help="the counts of sessions (g) runs over")
    ap.add_argument("--only", choices=["g", "h", "i", "m", "n", "ab", "mcp", "p", "q", "cron"], help="run only this figure (ab: (a) and (b) on process and bwrap; mcp: (o))")
    ap.add_argument("--channel-messages", type=int, default=500, help="(q): messages each way (plugin channel, http channel), per backend")
    ap.add_argument("--gate-calls", type=int, default=2000, help="(p): warm calls each way (with the gate, without, the gate alone, bare gRPC), per backend")
    ap.add_argument("--mcp-starts", type=int, default=20, help="(o): cold starts each way")
    ap.add_argument("--mcp-calls", type=int, default=500, help="(o): warm calls each way, per backend")
    ap.add_argument("--status-calls", type=int, default=1000, help="(n): `status` calls each way, restarting and idle")
    ap.add_argument("--status-backend", choices=["process", "bwrap"], help="(n): the ten sandboxes' backend (default: bwrap where it works)")
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--runs", type=int, default=50, help="subagent runs per backend (m)")
    a = ap.parse_args()
    logger.remove()

    if a.only == "cron":
        # Its own script: this one is long enough.
        sys.argv = [sys.argv[0], *(["--out", str(a.out)] if a.out else [])]
        import bench_cron

        bench_cron.main()
        return
    if a.only == "g":
        results = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "g_messages": await bench_messages(a.messages, tuple(int(x) for x in a.g_sessions.split(",")))}
        Path(a.out).write_text(json.dumps(results, indent=2))
        print_messages(results["g_messages"])
        return
    if a.only == "n":
        results = {"n_status_while_restarting_ms": bench_status(a.status_calls, a.status_backend or ("process" if bwrap_problem() else "bwrap"))}
        Path(a.out).write_text(json.dumps(results, indent=2))
        print_status(results["n_status_while_restarting_ms"])
        return
    if a.only == "q":
        results = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
        for backend in ("process", "bwrap"):
            skip = bwrap_problem() if backend == "bwrap" else ""
            results[f"q_channel_{backend}_ms"] = {"skipped": skip} if skip else bench_channel(a.channel_messages, backend)
        Path(a.out).write_text(json.dumps(results, indent=2))
        print(f"machine: {results['machine']}")
        print_channel(results)
        return
    if a.only == "i":
        results = {"i_policy_200_tools_ms": bench_policy()}
        Path(a.out).write_text(json.dumps(results, indent=2))
        print_policy(results["i_policy_200_tools_ms"])
        return
    tmp = Path(tempfile.mkdtemp(prefix="cs-bench-", dir="/tmp"))
    paths = StatePaths(tmp)
    paths.ensure()
    cgroups = CgroupRoot.create()
    warden = Warden()
    launchers: dict[str, Any] = {"process": ProcessLauncher(cgroups, warden)}
    if not bwrap_problem():
        launchers["bwrap"] = BwrapLauncher(cgroups, warden)
    registry = Registry(reserved=frozenset(CORE_TOOLS))
    register_core_tools(registry)
    manager = SandboxManager(
        registry=registry,
        launchers=launchers,
        paths=paths,
        timing=Timing(heartbeat_interval_s=2.0),
        env_allowlist=["PATH", "LANG"],
    )
    manager.add(basics_plan("process"))
    ready, stop = asyncio.Event(), asyncio.Event()
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "grpc": grpc.__version__, "cgroup": cgroups is not None}}
    echo_proc, echo_path = await bare_echo_server(tmp)
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(manager.run(ready, stop, start_timeout=60, stop_timeout=10))
            await ready.wait()
            if a.only == "mcp":
                results |= await bench_mcp(a, launchers, tmp)
            elif a.only == "p":
                results |= await bench_gate(a, launchers, tmp, echo_path)
            elif a.only == "ab":
                results["a_warm_call_ms"] = await figure_a(manager, echo_path, a.calls)
                results["b_cold_start_ms"] = await figure_b(manager, a.starts)
                await _bwrap_plugin_figures(a, launchers, tmp, echo_path, results)
            elif a.only != "m":
                await _all_in_manager(a, manager, launchers, tmp, echo_proc, echo_path, results)
                await _bwrap_plugin_figures(a, launchers, tmp, echo_path, results)
                results |= await bench_mcp(a, launchers, tmp)
            if a.only not in ("ab", "mcp", "p"):
                await _bench_runs(a, manager, launchers, tmp, results)
            stop.set()
    finally:
        echo_proc.kill()
        echo_proc.wait()
        await manager.aclose()
        warden.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if a.only in ("m", "ab", "mcp", "p"):
        Path(a.out).write_text(json.dumps(results, indent=2))
        if a.only == "mcp":
            print(f"machine: {results['machine']}")
            print_mcp(results)
        elif a.only == "p":
            print(f"machine: {results['machine']}")
            print_gate(results)
        else:
            print_table(results)
        return

    results["g_messages"] = await bench_messages(a.messages, tuple(int(x) for x in a.g_sessions.split(",")))
    results["i_policy_200_tools_ms"] = bench_policy()
    results["n_status_while_restarting_ms"] = bench_status(a.status_calls, a.status_backend or ("process" if bwrap_problem() else "bwrap"))
    Path(a.out).write_text(json.dumps(results, indent=2))
    print_table(results)
    print_messages(results["g_messages"])
    print_turn(results["h_turn_overhead_ms"])
    print_policy(results["i_policy_200_tools_ms"])
    print_docker(results["docker"])
    print_status(results["n_status_while_restarting_ms"])
    print_mcp(results)
    print(f"\nJSON written to {a.out}")


def print_table(r: dict[str, Any]) -> None:
    print(f"machine: {r['machine']}")
    print(f"{'figure':<34}{'p50':>9}{'p90':>9}{'p99':>9}   {'baseline p50/p90/p99':<28}{'p50 ratio':>10}")
    for key, label in (
        ("a_warm_call_ms", "(a) warm tool call, ms"),
        ("b_cold_start_ms", "(b) cold start to ready, ms"),
        ("a_warm_call_bwrap_ms", "(a') warm tool call, bwrap, ms"),
        ("b_cold_start_bwrap_ms", "(b') cold start, bwrap, ms"),
        ("c_crash_to_reclaimed_ms", "(c) crash to reclaimed, ms"),
        ("e_exec_true_process_ms", "(e) exec `true`, process, ms"),
        ("f_exec_true_bwrap_ms", "(f) exec `true`, bwrap, ms"),
        ("m_subagent_run_process_ms", "(m) subagent run, process, ms"),
        ("m_subagent_run_bwrap_ms", "(m) subagent run, bwrap, ms"),
    ):
        if key not in r:
            continue
        if "skipped" in r[key]:
            print(f"{label:<34}skipped: {r[key]['skipped']}")
            continue
        f, b = r[key]["figure"], r[key]["baseline"]
        print(f"{label:<34}{f['p50']:>9.3f}{f['p90']:>9.3f}{f['p99']:>9.3f}   {b['p50']:>8.3f}/{b['p90']:.3f}/{b['p99']:.3f}{'':<6}{f['p50'] / b['p50']:>8.2f}x")
        print(f"{'':<34}baseline: {r[key]['baseline_name']}")
        if "shell_spawn" in r[key]:
            sh = r[key]["shell_spawn"]
            print(f"{'':<34}for scale: {r[key]['shell_spawn_name']}: p50 {sh['p50']:.3f} ms ({f['p50'] / sh['p50']:.2f}x)")
    if "d_idle_uss_mib" not in r:
        return
    d = r["d_idle_uss_mib"]
    print(f"{'(d) idle sandbox USS, MiB':<34}{d['figure']:>9.1f}{'':>18}   {d['baseline']:>8.1f}{'':<20}{d['figure'] / d['baseline']:>8.2f}x")
    print(f"{'':<34}baseline: {d['baseline_name']}")


if __name__ == "__main__":
    asyncio.run(main())
