"""Issue 13's new bounds, attacked: a hostile plugin (tests/plugins/hostile_*), a
hostile model (the offline model's `/tool`, as any model may be steered) and a
hostile HTTP client try to stall the supervisor's event loop, get past argument
checks, forge what the operator reads, grow memory or descriptors, or make a kill
take longer than its bound. Each test asserts the claim from the victim's side:
another caller's latency, the operator's view, the supervisor's own footprint.

A test that fails here names a hole; see the report on issue 13 for each.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from clawsup.supervisor.tools.arguments import check_arguments
from clawsup.supervisor.control.api import ControlClient
from clawsup.supervisor.errors import BadToolArguments
from clawsup.supervisor.sandboxes.registry import Kind, Registration, Registry
from clawsup.supervisor.sandboxes.log import BUDGET_BYTES_PER_S
from clawsup.supervisor.messages.session_store import file_name, read_session
from clawsup.supervisor.tools.workspaces import workspace_sandbox_id
from tests.conftest import TEST_PLUGINS, Gateway, make_config, open_paths_wrap, require_bwrap, wait_gone
from tests.helpers.sse import read_events

HOSTILE_SCHEMAS = TEST_PLUGINS / "hostile_schemas"
TOKEN = "hostile-token-0123456789"
# What another caller may wait while a hostile call is checked: a healthy echo takes
# milliseconds; a second is generous on a loaded 2-core machine.
VICTIM_BOUND_S = 1.0
# hostile_schemas tools with 31 KB schemas, new at every start.
HEAVY = 8


def http_config(cfg: dict[str, Any]) -> dict[str, Any]:
    cfg["channels"] = {"http": {"enabled": True, "port": 0, "token": TOKEN}}
    cfg["session"] = {"dmScope": "per-channel-peer"}
    return cfg


def http_port(gw: Gateway) -> int:
    return int((gw.state / "run" / "http.port").read_text())


def post(gw: Gateway, peer: str, text: str, timeout: float = 60) -> list[tuple[str, dict[str, Any]]]:
    conn = http.client.HTTPConnection("127.0.0.1", http_port(gw), timeout=timeout)
    try:
        body = json.dumps({"text": text, "peer": {"kind": "direct", "id": peer}})
        conn.request("POST", "/v1/messages", body, {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return [("http", {"status": resp.status, **json.loads(resp.read())})]
        return list(read_events(resp))
    finally:
        conn.close()


def worst_latency_during(work: Callable[[], Any], probe: Callable[[], Any]) -> tuple[float, float, Any]:
    """Run `work` in a thread; meanwhile time `probe` (another caller) back to back.
    Returns (worst probe latency, how long `work` took, what it returned)."""
    out: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        t0 = time.monotonic()
        try:
            out["value"] = work()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["value"] = e
        out["took"] = time.monotonic() - t0
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    worst = 0.0
    while not done.is_set():
        t0 = time.monotonic()
        probe()
        worst = max(worst, time.monotonic() - t0)
        done.wait(0.02)
    t.join(10)
    return worst, out["took"], out["value"]


def calls_log(gw: Gateway, sandbox: str) -> list[dict[str, Any]]:
    f = gw.state / "sandboxes" / sandbox / "workspace" / "calls.log"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


# -- 1. argument validation -----------------------------------------------------------


@pytest.fixture(scope="module")
def schemas_gw(module_gateways: Any) -> Gateway:
    require_bwrap()
    cfg = http_config(make_config())
    cfg["plugins"]["load"]["paths"].append(str(HOSTILE_SCHEMAS))
    cfg["plugins"]["entries"]["hostile_schemas"] = {"sandbox": {"backend": "bwrap"}, "config": {"refDepth": 16, "heavy": HEAVY}}
    gw = module_gateways("schemas", cfg)
    gw.wait("hostile_schemas", "ready", timeout=30)
    return gw


def echo_probe(gw: Gateway) -> Callable[[], Any]:
    def probe() -> None:
        r = gw.call("echo", {"text": "victim"}, timeout=60)
        assert r == {"ok": True, "data": {"result": "victim"}}, r

    return probe


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        # Any arguments at all: the schema alone doubles 16 times.
        ("hostile_refs", {}),
        # 26 characters from the model.
        ("hostile_pattern", {"s": "a" * 26 + "!"}),
        # 1,200 small objects, 16 KB of JSON.
        ("hostile_unique", {"xs": [{"k": i} for i in range(1200)]}),
    ],
)
def test_a_hostile_schema_does_not_stall_other_callers(schemas_gw: Gateway, tool: str, args: dict[str, Any]) -> None:
    """The plugin's schema sets what checking the arguments costs (these took 2.4-3.4 s
    when the check ran on the event loop unbounded): another caller's echo must not
    wait for it."""
    gw = schemas_gw
    worst, took, resp = worst_latency_during(lambda: gw.call(tool, args, timeout=60), echo_probe(gw))
    assert isinstance(resp, dict), resp
    assert worst < VICTIM_BOUND_S, f"another caller's echo waited {worst:.2f} s while {tool}'s arguments were checked (the call took {took:.2f} s)"


def test_a_remote_user_cannot_stall_the_gateway_through_the_model(schemas_gw: Gateway) -> None:
    """The same, from an HTTP client: the model is asked to call the tool (as any
    model can be steered to), and every other session waits."""
    gw = schemas_gw
    text = "/tool hostile_pattern " + json.dumps({"s": "a" * 26 + "!"})

    def probe() -> None:
        events = post(gw, "bystander", "hello")
        assert events[-1][0] == "reply", events

    worst, took, events = worst_latency_during(lambda: post(gw, "mallory", text), probe)
    assert isinstance(events, list) and events[-1][0] == "reply", events
    assert worst < VICTIM_BOUND_S + 1, f"another session's turn waited {worst:.2f} s while the model's call was checked (mallory's turn took {took:.2f} s)"


def test_a_plugins_registration_does_not_stall_other_callers(schemas_gw: Gateway) -> None:
    """Each schema is compiled at registration, and the cache is keyed by the schema's
    text: a plugin whose schemas change at every start (a random `$comment`) pays the
    metaschema check, about a third of a second per 31 KB schema, at every start.
    Done in one synchronous pass on the loop (now `ToolAcceptance.judge`), that held an echo 2.8 s."""
    gw = schemas_gw
    worst, took, resp = worst_latency_during(lambda: gw.request(op="restart", sandbox="hostile_schemas", timeout=60), echo_probe(gw))
    assert isinstance(resp, dict) and resp["ok"], resp
    gw.wait("hostile_schemas", "ready", timeout=30)
    heavy = [t for t in gw.tools() if t.startswith("hostile_heavy_")]
    assert len(heavy) == HEAVY, heavy
    assert worst < VICTIM_BOUND_S, f"another caller's echo waited {worst:.2f} s while hostile_schemas registered {HEAVY} tools (its restart took {took:.2f} s)"


def test_nan_does_not_get_past_minimum_and_maximum(schemas_gw: Gateway) -> None:
    """`{"n": NaN}` (the control API and the offline model take it; Python's json
    reads and writes it) compares false with both bounds, so a number declared
    1..10 reaches the handler as nan."""
    gw = schemas_gw
    resp = gw.call("hostile_bounded", {"n": float("nan")})
    ran = [c for c in calls_log(gw, "hostile_schemas") if c["tool"] == "hostile_bounded"]
    assert not resp["ok"] and resp["error"]["code"] == "bad_arguments", resp
    assert ran == [], ran


def test_no_path_skips_the_argument_check(schemas_gw: Gateway) -> None:
    """The CLI, the control API and the model each try arguments outside the schema
    (past the maximum, not an object): each is refused and the handler never runs."""
    gw = schemas_gw
    ran_before = len(calls_log(gw, "hostile_schemas"))
    r = gw.cli("tools", "call", "hostile_bounded", "--args", '{"n": 50}')
    assert r.returncode == 1 and "n: 50 is greater than the maximum of 10" in r.stdout + r.stderr, r
    r = gw.cli("tools", "call", "hostile_bounded", "--args", "[1]")
    assert r.returncode != 0, r
    raw = gw.client.request({"op": "call", "name": "hostile_bounded", "args": [1]})
    assert not raw["ok"] and raw["error"]["code"] == "bad_request", raw
    reply = post(gw, "model", "/tool hostile_bounded " + json.dumps({"n": 11, "extra": True}))[-1]
    assert reply[0] == "reply" and "hostile_bounded failed: bad arguments" in reply[1]["text"], reply
    assert len(calls_log(gw, "hostile_schemas")) == ran_before


def test_a_huge_integer_is_a_clear_tool_error() -> None:
    """check_arguments takes arguments as text too (no caller passes text today):
    an integer of 5,000 digits makes json.loads raise ValueError (Python's
    int-to-text limit), not JSONDecodeError; the caller must get a tool error, not
    an internal one."""

    r = Registry()
    reg = r.register(
        Registration(kind=Kind.TOOL, name="t", owner="p", sandbox_id="p", input_schema={"type": "object", "properties": {"n": {"type": "integer"}}}),
        declared=frozenset({"t"}),
    )
    with pytest.raises(BadToolArguments):
        check_arguments(reg, '{"n": ' + "9" * 5000 + "}")


def test_a_pattern_re_cannot_compile_refuses_that_tool_only(gateway_factory: Any) -> None:
    """`a{4294967296}` passes for a regex in jsonschema's eyes until re.compile
    raises OverflowError, which is not re.error: let out of Registry.register, it
    had the sandbox killed as a supervisor error, its other tools with it, restart
    after restart."""
    require_bwrap()
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(HOSTILE_SCHEMAS))
    cfg["plugins"]["entries"]["hostile_schemas"] = {
        "sandbox": {"backend": "bwrap", "restart": {"maxRestarts": 1, "backoffInitialSeconds": 0.1}},
        "config": {"refDepth": 2, "overflow": True},
    }
    gw = gateway_factory(cfg)
    state = gw.wait("hostile_schemas", "ready", "failed", timeout=30)
    tools = gw.tools()
    assert state == "ready" and tools.get("hostile_ping") == "hostile_schemas", (state, gw.status("hostile_schemas")["last_exit"])
    assert "hostile_overflow" not in tools
    assert "supervisor error" not in gw.supervisor_log()


# -- 2. the load error line -----------------------------------------------------------

HOSTILE_NOISE = TEST_PLUGINS / "hostile_noise"
FORGED_LINE_START = "2099-01-01T00:00:00.000Z"


def noise_config(mode: str = "serve", **plugin_config: Any) -> dict[str, Any]:
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(HOSTILE_NOISE))
    cfg["plugins"]["entries"]["hostile_noise"] = {
        "sandbox": {"backend": "bwrap", "restart": {"maxRestarts": 2, "backoffInitialSeconds": 0.1}},
        "config": {"mode": mode, **plugin_config},
    }
    return cfg


def unsafe_in(text: str) -> list[str]:
    """What a child's text must never bring to a terminal or a log: raw escapes,
    carriage returns, bidi overrides, or a line of its own."""
    found = [c for c in ("\x1b", "\r", "\u202e", "\u2028", "\x07") if c in text]
    found += [line for line in text.splitlines() if line.startswith(FORGED_LINE_START)]
    return found


def test_a_load_error_cannot_drive_the_terminal_or_forge_a_line(gateway_factory: Any) -> None:
    require_bwrap()
    gw = gateway_factory(noise_config("escape"))
    assert gw.wait("hostile_noise", "failed", timeout=20) == "failed"
    said = gw.status("hostile_noise")["last_exit"]["text"]
    assert "could not load: RuntimeError" in said, said
    status = gw.cli("status")
    assert "FAILED" in status.stdout, status.stdout
    for where, text in (
        ("clawsup status", status.stdout + status.stderr),
        ("the start output", "".join(gw.output)),
        ("supervisor.log", gw.supervisor_log()),
        ("the sandbox log", gw.log("hostile_noise")),
        ("clawsup logs", gw.cli("logs", "hostile_noise", "-n", "200").stdout),
    ):
        assert unsafe_in(text) == [], f"{where}: {unsafe_in(text)}"


def marked(marker: str) -> list[Any]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in (p.info["cmdline"] or []):
            out.append(p)
    return out


def test_a_plugin_that_loaded_cannot_pass_for_one_that_could_not(gateway_factory: Any) -> None:
    """It prints a load error line, loads, starts a detached process, and exits with
    the load error code right after its handshake: the supervisor believes the line
    (its state is still `starting`), so `status` tells the operator a made-up story
    (a module to pip install) about a plugin whose code ran, and no restart is
    counted. What it started must be gone either way."""
    require_bwrap()
    marker = f"hostile-noise-{time.monotonic_ns()}"
    gw = gateway_factory(noise_config("forge", marker=marker))
    state = gw.wait("hostile_noise", "failed", "crashed", "ready", timeout=20)
    log = gw.log("hostile_noise")
    assert "handshake: CLAWSUP|1|unix|" in log, log[-2000:]
    assert wait_gone([p.pid for p in marked(marker)], timeout=10) == []
    said = (gw.status("hostile_noise")["last_exit"] or {}).get("text", "")
    assert "hostile_noise_dep" not in said, f"state {state}; the operator reads: {said}"


# -- 3. log following -----------------------------------------------------------------


@pytest.fixture(scope="module")
def noise_gw(module_gateways: Any) -> Gateway:
    require_bwrap()
    gw = module_gateways("noise", noise_config())
    gw.wait("hostile_noise", "ready", timeout=30)
    return gw


def log_text(gw: Gateway, sandbox: str) -> str:
    logs = gw.state / "logs"
    return "".join(f.read_text(errors="replace") for f in [logs / f"{sandbox}.log.{i}" for i in (3, 2, 1)] + [logs / f"{sandbox}.log"] if f.exists())


class Follow:
    """`clawsup logs -f` on a raw socket: `read` counts what comes in a thread, or
    nothing is ever read (a stalled follower). `close` ends either."""

    def __init__(self, gw: Gateway, sandbox: str, *, read: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(gw.client.path))
        self.sock.sendall(json.dumps({"op": "logs", "sandbox": sandbox, "n": 0, "follow": True}).encode() + b"\n")
        self.messages: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._read, daemon=True) if read else None
        if self.thread is not None:
            self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in self.sock.makefile("rb"):
                self.messages.append(json.loads(raw))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.thread is not None:
            self.thread.join(10)


def test_a_flood_of_empty_lines_is_held_to_the_log_budget(noise_gw: Gateway) -> None:
    """The budget is charged by each line's own characters: an empty line costs
    nothing, yet each is a timestamped line in the file, a line offered to every
    follower and a pass through the splitter on the loop. Three seconds of them,
    with one follower reading and one not: the budget must drop lines (and say so
    within a second of the flood's end), and another plugin's echo must not wait."""
    gw = noise_gw
    before = gw.request(op="stats")["data"]
    reading, stalled = Follow(gw, "hostile_noise", read=True), Follow(gw, "hostile_noise", read=False)
    try:
        assert gw.call("noise_newlines", {"seconds": 3})["ok"]
        t_end = time.monotonic() + 3
        worst = 0.0
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            echo_probe(gw)()
            worst = max(worst, time.monotonic() - t0)
        after = gw.request(op="stats")["data"]
        while "dropped" not in log_text(gw, "hostile_noise") and time.monotonic() < t_end + 3:
            threading.Event().wait(0.1)
        text = log_text(gw, "hostile_noise")
    finally:
        stalled.close()
        reading.close()
    written = text.count("[stdout] \n")
    problems = []
    if "dropped" not in text:
        problems.append(f"no line dropped, none counted: the log files hold {written} empty lines ({written * 35 // 2**20} MiB with their timestamps) after 3 s at a budget of {BUDGET_BYTES_PER_S // 2**20} MiB/s")
    if worst >= VICTIM_BOUND_S:
        problems.append(f"an echo waited {worst:.2f} s during the flood")
    if "started pid" not in text:
        problems.append("the flood rotated the sandbox's own history (its start) out of its log")
    assert not problems, "; ".join(problems)
    assert after["rss_bytes"] - before["rss_bytes"] < 64 * 2**20, (before, after)


def test_a_plugin_cannot_forge_what_a_follower_or_the_cli_prints(gateway_factory: Any) -> None:
    # A gateway of its own: the shared one's log budget may be spent by the flood
    # test just before, and the forged lines would then be dropped, not shown.
    require_bwrap()
    gw = gateway_factory(noise_config())
    gw.wait("hostile_noise", "ready", timeout=30)
    follow = Follow(gw, "hostile_noise", read=True)
    try:
        assert gw.call("noise_forge")["ok"]
        deadline = time.monotonic() + 10
        while sum("ready: all is well" in m.get("line", "") for m in follow.messages) < 4 and time.monotonic() < deadline:
            threading.Event().wait(0.05)
    finally:
        follow.close()
    assert follow.messages and follow.messages[0].get("ok"), follow.messages[:1]
    msgs = follow.messages[1:]
    assert sum("ready: all is well" in m.get("line", "") for m in msgs) == 4, msgs
    assert all(set(m) == {"line"} for m in msgs), [m for m in msgs if set(m) != {"line"}]
    for m in msgs:
        assert m["line"].split(" ", 2)[1] in ("[stdout]", "[stderr]", "[clawsup]"), m
        assert unsafe_in(m["line"]) == [], m
    out = gw.cli("logs", "hostile_noise", "-n", "50").stdout
    assert unsafe_in(out) == [] and not any(line.startswith("[clawsup:") for line in out.splitlines()), out


# -- 4. backpressure --------------------------------------------------------------------


def test_idle_unauthenticated_connections_do_not_take_the_gateways_descriptors(gateway_factory: Any) -> None:
    """Anyone on the machine may connect to the http channel's port; the token is
    asked only once a request comes. Connections that send nothing stay open (an
    hour: aiohttp's keepalive_timeout) and are not counted: under the common soft
    limit of 1,024 descriptors, a thousand of them leave the gateway unable to
    restart a sandbox or answer its operator."""
    gw = gateway_factory(http_config(make_config()), wrap=["prlimit", "--nofile=1024:1024", *open_paths_wrap()])
    port = http_port(gw)
    pid = gw.request(op="stats")["data"]["pid"]
    socks = []
    try:
        for _ in range(1000):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(os.listdir(f"/proc/{pid}/fd")) < 1000:
            threading.Event().wait(0.05)
        held = len(os.listdir(f"/proc/{pid}/fd"))
        operator = ControlClient(gw.client.path, timeout=10)
        try:
            restarted = operator.request({"op": "restart", "sandbox": "basics", "timeout": 10})
            echoed = operator.request({"op": "call", "name": "echo", "args": {"text": "still here"}})
        except (OSError, ConnectionError) as e:
            restarted = echoed = {"ok": False, "error": repr(e)}
        assert restarted["ok"] and echoed == {"ok": True, "data": {"result": "still here"}}, f"with {held} descriptors held by idle connections: {restarted} {echoed}"
    finally:
        for s in socks:
            s.close()


def test_abandoned_requests_release_what_they_held(gateway_factory: Any) -> None:
    """Clients that hang up right after the acknowledgement: their turns run to the
    end, then the gateway's count, tasks and descriptors are back where they were,
    and a full capacity of new messages is taken."""
    cfg = http_config(make_config())
    cfg["bus"] = {"inboundCapacity": 10}
    cfg["sessionStore"] = {"maxOpenFiles": 4}  # session files kept open by design: at most 4
    gw = gateway_factory(cfg)
    post(gw, "warmup", "hello")
    before = gw.request(op="stats")["data"]
    for i in range(10):
        conn = http.client.HTTPConnection("127.0.0.1", http_port(gw), timeout=30)
        conn.request("POST", "/v1/messages", json.dumps({"text": "/sleep 1", "peer": {"kind": "direct", "id": f"gone{i}"}}), {"Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert next(read_events(resp))[0] == "ack"
        conn.close()
    deadline = time.monotonic() + 30
    def answered() -> int:
        return sum(any(r["role"] == "assistant" for r in read_session(gw.state / "sessions" / file_name(f"agent:main:http:direct:gone{i}"))) for i in range(10))
    while answered() < 10 and time.monotonic() < deadline:
        threading.Event().wait(0.1)
    assert answered() == 10
    after = gw.request(op="stats")["data"]
    assert after["tasks"] <= before["tasks"] + 2 and after["open_fds"] <= before["open_fds"] + 4 + 2, (before, after)
    results: list[str] = []
    threads = [threading.Thread(target=lambda i=i: results.append(post(gw, f"new{i}", "/sleep 0.5")[-1][0])) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == ["reply"] * 10, results


def test_a_torn_big_record_does_not_cost_the_session_its_history(gateway_factory: Any, state_dir: Path) -> None:
    """A crash tore the session's last record, a big one (a tool's result may be
    megabytes). The torn-tail check looks for the last newline in the last MiB
    only; finding none it cuts the file to nothing, and every whole record before
    the torn one leaves the session (they survive only in the `.torn-` file)."""
    key = "agent:main:http:direct:torn"
    sessions = state_dir / "sessions"
    sessions.mkdir(parents=True)
    path = sessions / file_name(key)
    good = [{"role": "user", "id": f"m-old{i}", "text": f"remember {i}", "ts": 1.0} for i in range(3)]
    torn = json.dumps({"role": "tool", "toolCallId": "x", "name": "big", "content": "z" * (1536 * 1024)})[: 1400 * 1024]
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in good) + torn.encode())
    gw = gateway_factory(http_config(make_config()))
    assert post(gw, "torn", "hello again")[-1][0] == "reply"
    texts = [r.get("text") for r in read_session(path)]
    assert texts[:3] == ["remember 0", "remember 1", "remember 2"], texts


# -- 5. the incarnation block ---------------------------------------------------------

HOSTILE_STUBBORN = TEST_PLUGINS / "hostile_stubborn"


def test_a_stubborn_plugin_cannot_stretch_its_kill_or_delay_others(gateway_factory: Any) -> None:
    """Its host ignores Shutdown and SIGTERM; it left a SIGTERM-proof process in a
    session of its own, a stopped one and a plain child. With a 1 s stop grace its
    restart takes at most the escalation's bounds, another sandbox's restart meanwhile
    takes its usual time, nothing it started survives, and the gateway's stop is
    bounded too."""
    require_bwrap()
    marker = f"hostile-stubborn-{time.monotonic_ns()}"
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(HOSTILE_STUBBORN))
    cfg["plugins"]["entries"]["hostile_stubborn"] = {"sandbox": {"backend": "bwrap"}, "config": {"marker": marker}}
    gw = gateway_factory(cfg)
    gw.wait("hostile_stubborn", "ready", timeout=30)
    first = marked(marker)
    assert len(first) == 3, [p.info["cmdline"] for p in first]

    took: dict[str, float] = {}

    def restart(sid: str) -> None:
        t0 = time.monotonic()
        r = gw.request(op="restart", sandbox=sid, timeout=30)
        assert r["ok"], r
        took[sid] = time.monotonic() - t0

    stubborn = threading.Thread(target=restart, args=("hostile_stubborn",))
    stubborn.start()
    gw.wait("hostile_stubborn", "draining", "stopped", "starting", timeout=10)
    restart("basics")
    stubborn.join(30)
    # It did hold out to the end of the escalation (else this proves nothing).
    assert "after SIGTERM; sending SIGKILL" in gw.log("hostile_stubborn"), gw.log("hostile_stubborn")[-3000:]
    # Shutdown RPC 0.5 s + grace 1 s + SIGTERM grace 1 s + the cgroup sweep's 2 s + a start.
    assert took["hostile_stubborn"] < 8, took
    assert took["basics"] < 3, took
    assert wait_gone([p.pid for p in first], timeout=5) == []
    second = marked(marker)
    assert len(second) == 3
    t0 = time.monotonic()
    gw.stop(timeout=30)
    stopped_in = time.monotonic() - t0
    assert stopped_in < 8, f"the gateway took {stopped_in:.2f} s to stop"
    assert wait_gone([p.pid for p in second], timeout=5) == []


# -- 6. idle session discard ------------------------------------------------------------


def test_a_discarded_session_sandbox_keeps_no_process_and_delays_no_other(gateway_factory: Any) -> None:
    require_bwrap()
    marker = f"hostile-session-{time.monotonic_ns()}"
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "session", "backend": "bwrap", "idleStopSeconds": 1}))

    def exec_in(session: str, command: str) -> dict[str, Any]:
        r = gw.request(op="call", name="exec", session=session, args={"command": command})
        assert r["ok"], r
        return json.loads(r["data"]["result"]) if isinstance(r["data"]["result"], str) else r["data"]["result"]

    stay = "trap '' TERM HUP INT; while :; do sleep 1; done"
    # While another command of the session runs, the host cannot tell whose orphans
    # are whose and sweeps none: the escapees outlive their own command.
    slow = threading.Thread(target=lambda: exec_in("evil", "sleep 2"))
    slow.start()
    exec_in("evil", f"setsid -f sh -c \"{stay}\" {marker}; nohup sh -c \"{stay}\" {marker} >/dev/null 2>&1 & (sh -c \"{stay}\" {marker} &) ; echo started")
    left = marked(marker)
    slow.join(30)
    sid = workspace_sandbox_id("session", "main", "evil")
    worst = 0.0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        assert exec_in("bystander", "echo ok")["output"] == "ok\n"
        worst = max(worst, time.monotonic() - t0)
        if not any(s["id"] == sid for s in gw.request(op="status")["data"]["sandboxes"]):
            break
    else:
        raise AssertionError(f"{sid} was not discarded within 30 s")
    assert wait_gone([p.pid for p in left], timeout=5) == []
    assert worst < 3, f"another session's exec waited {worst:.2f} s while {sid} was discarded"
