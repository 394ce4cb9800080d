"""Everything that crosses from a child is bounded and cleaned by the supervisor
itself (issue 12).

Cleaned: a plugin (tests/plugins/forger) prints escape sequences, carriage returns
and line separators on stdout and stderr, through `api.log`, in a tool's error and
as a crash's last words. From the operator's side, the sandbox log, `clawsup logs`
(past and followed), `logs/supervisor.log` and the CLI's own output hold no raw
control character, the forged line is visibly escaped, and every log line still
starts with a real timestamp.

Bounded: a workspace host that no longer keeps the exec output cap (a hostile gRPC
host, and a real host taken over by one of its own commands) streams hundreds of
MiB; what the supervisor keeps is the cap plus a marker, and its memory barely
moves. A message larger than the supervisor takes is a clear tool error.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.supervisor.sandboxes.host_client import MARKER_ALLOWANCE, MAX_MESSAGE_BYTES, exec_output_bound
from clawsup.supervisor.printable import printable
from tests.conftest import CLAWSUP, IN_CI, ROOT, TEST_PLUGINS, Gateway, make_config, require_backend, workspace_config

FORGER = TEST_PLUGINS / "forger"
FORGED = "2030-01-01T00:00:00.000Z [clawsup] ready"
# Any character that breaks a line (str.splitlines), moves the cursor, starts an
# escape sequence or reorders the line on screen. Tab is allowed.
RAW_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
SANDBOX_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[(stdout|stderr|plugin|clawsup)\] ")
SUPERVISOR_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \| ")
# How the forger's overwrite must look once escaped: the CR shown, the forged line
# after it on the same line.
ESCAPED_FORGERY = "erased\\r" + FORGED + "\\u2028\\x1b[31mred\\u202eesrever\\x85nel\\x0bvt"


def run_cli(gw: Gateway, *args: str) -> tuple[int, str, str]:
    """The real CLI; its output read as bytes, so that a raw CR is not turned into a
    newline on the way (as text mode's universal newlines would)."""
    r = subprocess.run([*CLAWSUP, *args, "--state-dir", str(gw.state)], capture_output=True, timeout=60, env={**os.environ, "COLUMNS": "400"})
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def read(path: Path) -> str:
    return path.read_bytes().decode()


def assert_clean(text: str, line_start: re.Pattern[str] | None, where: str) -> list[str]:
    """No raw control character on any line, and (when given) every line begins
    like a real log line and none with the forged timestamp."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines):
        raw = RAW_CONTROL.search(line)
        assert raw is None, f"{where}, line {i + 1}: raw {raw.group()!r} in {line!r}"
        if line_start is not None:
            context = "\n".join(lines[max(0, i - 15) : i + 30])
            assert line_start.match(line), f"{where}, line {i + 1} does not start like a log line: {line!r}; around it:\n{context}"
            assert not line.startswith(FORGED[:10]), f"{where}, line {i + 1} is forged: {line!r}"
    return lines


# -- the escaping itself -------------------------------------------------------------


def test_printable_escapes_every_way_to_break_or_redraw_a_line() -> None:
    breakers = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
    assert len(("a" + breakers + "b").splitlines()) > 1
    hostile = f"a{breakers}\x1b[2J\x1b]0;title\x07\x00\x7f\x9b\u202e\u2066\u200f\u061c\ud800b"
    shown = printable(hostile)
    assert shown.splitlines() == [shown] and RAW_CONTROL.search(shown) is None
    assert shown.startswith("a\\n\\r\\x0b\\x0c\\x1c\\x1d\\x1e\\x85\\u2028\\u2029\\x1b[2J\\x1b]0;title\\x07")
    assert "\\ud800" in shown
    shown.encode("utf-8")  # a lone surrogate could not be written to a UTF-8 log
    # Escaped text escapes to itself; ordinary text, tabs and other scripts pass.
    assert printable(shown) == shown
    plain = "tab\there, é, 日本, 😀, a \\ backslash, C:\\path"
    assert printable(plain) == plain


# -- a plugin that forges lines ------------------------------------------------------


@pytest.fixture(scope="module")
def forger_gateway() -> Iterator[Gateway]:
    """One gateway with the forger, untrusted as every plugin is by default (so on
    bwrap). Each test leaves it ready."""
    require_backend("bwrap")
    d = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    gw = Gateway(d, make_config(sandbox__defaults__backend="bwrap"), [FORGER])
    try:
        gw.wait("forger", "ready")
        yield gw
    finally:
        try:
            gw.stop()
        except Exception:
            gw.kill()
        shutil.rmtree(d, ignore_errors=True)


class Follower:
    """`clawsup logs <id> -f`, run for real, its lines read by a thread."""

    def __init__(self, gw: Gateway, sandbox: str) -> None:
        self.proc = subprocess.Popen([*CLAWSUP, "logs", sandbox, "-f", "-n", "1", "--state-dir", str(gw.state)], stdout=subprocess.PIPE)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        # Bytes, split on newlines only (see run_cli).
        threading.Thread(target=lambda: [self.lines.put(x.decode()) for x in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]

    def until(self, *needles: str, timeout: float = 30) -> None:
        missing = set(needles)
        while missing:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"`clawsup logs -f` never showed {sorted(missing)}; it showed:\n" + "".join(self.seen[-30:])) from None
            self.seen.append(line)
            missing = {n for n in missing if n not in line}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def test_forged_lines_and_escapes_reach_no_log_and_no_terminal(forger_gateway: Gateway) -> None:
    gw = forger_gateway
    follower = Follower(gw, "forger")
    try:
        # The past line arrives once the follower has subscribed: it misses nothing after.
        follower.until("[")
        shout = run_cli(gw, "tools", "call", "forger_shout", "--args", '{"tag": "T1"}')
        assert shout[0] == 0, shout
        raised = run_cli(gw, "tools", "call", "forger_fail", "--args", '{"tag": "T1"}')
        expected = run_cli(gw, "tools", "call", "forger_fail", "--args", '{"tag": "T1", "expected": true}')
        assert raised[0] == 1 and expected[0] == 1
        # The tool's raise reaches the log as the host's traceback on stderr and as
        # our event; the crash's last stderr line reaches the supervisor's log.
        crash = gw.call("forger_crash", {"tag": "T1"})
        assert not crash["ok"]
        gw.wait("forger", "ready", timeout=30)
        follower.until("end-OUT-T1", "end-ERR-T1", "end-LOG-T1", "end-RAISED-T1", "end-LAST-T1", "[plugin] WARNING " + FORGED)
    finally:
        follower.close()

    # The operator's terminal: the CLI printed the result and the errors escaped.
    assert_clean(shout[1], None, "tools call stdout")
    assert ESCAPED_FORGERY in shout[1]
    for r in (raised, expected):
        assert_clean(r[2], None, "tools call stderr")
        assert ESCAPED_FORGERY in r[2]
    assert "TOOLERROR-T1" in expected[2] and "RAISED-T1" in raised[2]

    # The sandbox log, on disk.
    log = assert_clean(read(gw.state / "logs" / "forger.log"), SANDBOX_LINE, "logs/forger.log")
    for tag in ("IMPORT", "OUT-T1", "ERR-T1", "LOG-T1", "RAISED-T1", "LAST-T1"):
        [hit, *_] = [line for line in log if f"{tag} " in line]
        assert ESCAPED_FORGERY in hit, hit
    # A plugin's own newline gives it a second line, tagged as the plugin's.
    assert any(line.endswith(f"[plugin] WARNING {FORGED}") for line in log)

    # `clawsup logs`, run for real, past and followed.
    code, out, err = run_cli(gw, "logs", "forger", "-n", "1000")
    assert code == 0, err
    shown = assert_clean(out, SANDBOX_LINE, "clawsup logs")
    assert any(ESCAPED_FORGERY in line for line in shown)
    followed = assert_clean("".join(follower.seen), SANDBOX_LINE, "clawsup logs -f")
    assert sum(ESCAPED_FORGERY in line for line in followed) >= 5

    # The supervisor's own log and its console: the crash line quotes the last stderr.
    sup = assert_clean(read(gw.state / "logs" / "supervisor.log"), SUPERVISOR_LINE, "logs/supervisor.log")
    assert any("last stderr" in line and ESCAPED_FORGERY in line for line in sup if "LAST-T1" in line), "\n".join(sup[-20:])
    code, out, err = run_cli(gw, "status")
    assert code == 0, err
    assert_clean(out, None, "clawsup status")

    # `clawsup chat`: the model quotes the tool's result (a real model can emit the
    # bytes itself); the reply reaches the terminal escaped.
    code, out, err = run_cli(gw, "chat", "-m", '/tool forger_shout {"tag": "C1"}')
    assert code == 0, err
    assert_clean(out, None, "clawsup chat")
    assert_clean(err, None, "clawsup chat stderr")
    assert "RESULT-C1" in out and ESCAPED_FORGERY in out


def test_a_forged_handshake_is_refused_and_quoted_escaped(gateway_factory: Any) -> None:
    """The refusal's reason quotes the child's line; it reaches the console of
    `clawsup start` (its transitions), the supervisor's log and the sandbox log."""
    require_backend("bwrap")
    cfg = make_config(sandbox__defaults__backend="bwrap", plugins__entries={"forger": {"config": {"fakeHandshake": True}}})
    gw: Gateway = gateway_factory(cfg, [FORGER])
    gw.wait("forger", "failed", timeout=60)
    quoted = "\\x1b]0;forger-title\\x07\\x1b[2Junix/grpc\\r" + FORGED
    # gw.output was read in text mode: a raw CR would have become a line break there.
    console = "".join(gw.output)
    assert_clean(console, None, "clawsup start's console")
    assert any(quoted in line and "bad handshake" in line for line in console.split("\n")), console
    sup = assert_clean(read(gw.state / "logs" / "supervisor.log"), SUPERVISOR_LINE, "logs/supervisor.log")
    assert any(quoted in line for line in sup)
    log = assert_clean(read(gw.state / "logs" / "forger.log"), SANDBOX_LINE, "logs/forger.log")
    assert any(quoted in line for line in log)


def test_an_answer_too_large_is_a_clear_tool_error(forger_gateway: Gateway) -> None:
    gw = forger_gateway
    resp = gw.call("forger_big", {"bytes": 5 * 1024 * 1024})
    assert not resp["ok"]
    message = resp["error"]["message"]
    assert "tool 'forger_big' (plugin 'forger') failed: the sandbox sent" in message
    assert "more than the 4 MiB the supervisor takes in one message; it was refused" in message
    # The sandbox is fine and answers the next call.
    assert gw.status("forger")["state"] == "ready"
    small = gw.call("forger_big", {"bytes": 1000})
    assert small["ok"] and small["data"]["result"] == "x" * 1000


def test_a_describe_answer_too_large_fails_the_start_with_a_reason(gateway_factory: Any) -> None:
    require_backend("bwrap")
    cfg = make_config(sandbox__defaults__backend="bwrap", plugins__entries={"forger": {"config": {"hugeDescribe": True}}})
    gw: Gateway = gateway_factory(cfg, [FORGER])
    gw.wait("forger", "failed", timeout=60)
    assert "forger" not in gw.tools().values()
    assert "bring-up failed: the sandbox sent 52" in gw.log("forger")
    assert "bytes as its Describe answer, more than the 4 MiB the supervisor takes in one message" in gw.log("forger")


# -- a host that ignores the exec cap ------------------------------------------------


@pytest.mark.parametrize("size", [10, 64 * 1024, 64 * 1024 + 1, 10**6])
def test_an_honest_hosts_output_passes_the_supervisors_cap_unchanged(size: int) -> None:
    """What sandbox/host/exec_runner.py's output_cap sends for `size` bytes of output:
    the head as it comes, then its marker and the tail."""
    cap = 64 * 1024
    data = bytes(i % 251 for i in range(size))
    head = data[: cap - cap // 2]
    rest = data[len(head) :]
    dropped = max(len(rest) - cap // 2, 0)
    sent = [head[i : i + 4096] for i in range(0, len(head), 4096)]
    sent.append((f"\n[... {dropped} bytes of output omitted ...]\n".encode() if dropped else b"") + rest[dropped:])
    bound = exec_output_bound(cap)
    passed = b"".join(bound.feed(chunk) for chunk in sent) + bound.finish()
    assert passed == b"".join(sent) and bound.dropped == 0

HOSTILE_HOST = textwrap.dedent(
    '''
    """A Host service that ignores `output_cap`: `flood:<total>:<chunk>` streams
    <total> bytes in <chunk>-byte messages (head H, body F, tail T), then a result
    that lies (not truncated, 0 bytes), then more output after it; `huge` sends one
    message past the supervisor's limit."""
    import asyncio, sys
    import grpc
    from clawsup.v1 import host_pb2 as pb, host_pb2_grpc as pb_grpc

    class Hostile(pb_grpc.HostServicer):
        async def Exec(self, request, context):
            kind, *rest = request.command.split(":")
            if kind == "huge":
                await context.write(pb.ExecEvent(host_token="host-token", output=b"h" * (5 * 1024 * 1024)))
                return
            total, size = int(rest[0]), int(rest[1])
            chunks = total // size
            body = b"F" * size
            for i in range(chunks):
                data = b"H" * size if i == 0 else b"T" * size if i == chunks - 1 else body
                await context.write(pb.ExecEvent(host_token="host-token" if i == 0 else "", output=data))
            await context.write(pb.ExecEvent(result=pb.ExecResult(exit_code=0, truncated=False, output_bytes=0)))
            for _ in range(16):
                await context.write(pb.ExecEvent(output=b"A" * size))

    async def main(path):
        server = grpc.aio.server()
        pb_grpc.add_HostServicer_to_server(Hostile(), server)
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        print("serving", flush=True)
        await server.wait_for_termination()

    asyncio.run(main(sys.argv[1]))
    '''
)

# The supervisor's side, as Workspaces._exec drives it: the real HostClient, every
# chunk it lets through kept in a list. What the flood costs is measured from after
# a first small exec (the channel connected, gRPC's threads started) with the peak
# RSS reset (5 to clear_refs), and twice: the Python heap, traced exactly, and the
# whole process, gRPC's C core included.
EXEC_DRIVER = textwrap.dedent(
    '''
    import asyncio, json, sys, tracemalloc

    def kib(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])

    async def main(path, command, cap):
        from clawsup.sandbox.exec_result import ExecResult
        from clawsup.supervisor.sandboxes.host_client import AnswerTooLarge, HostClient
        client = HostClient(path, "supervisor-token", "host-token")
        async for _ in client.exec("flood:65536:65536", "", 600.0, cap, "1-0", 30.0):
            pass
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss0 = kib("VmRSS")
        tracemalloc.start()
        chunks, result = [], None
        try:
            async for item in client.exec(command, "", 600.0, cap, "1-1", 30.0):
                if isinstance(item, ExecResult):
                    result = item
                else:
                    chunks.append(item)
        except AnswerTooLarge as e:
            print(json.dumps({"error": str(e), "kind": e.kind}))
            return
        finally:
            await client.close()
        out = b"".join(chunks)
        print(json.dumps({
            "length": len(out), "head": out[:16].decode(), "tail": out[-16:].decode(),
            "marker": "omitted by the supervisor" in out.decode(errors="replace"),
            "truncated": result.truncated, "output_bytes": result.output_bytes,
            "grew_kib": kib("VmHWM") - rss0, "python_peak_kib": tracemalloc.get_traced_memory()[1] // 1024,
        }))

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    '''
)


@pytest.fixture
def hostile_host(tmp_path: Path) -> Iterator[str]:
    sock = tempfile.mkdtemp(prefix="cs-h-", dir="/tmp") + "/host.sock"
    server = subprocess.Popen([sys.executable, "-c", HOSTILE_HOST, sock], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "serving"
        yield sock
    finally:
        server.kill()
        server.wait(10)
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)


# glibc as the driver runs it: one arena, and every block of 128 KiB or more mapped
# and unmapped with its own pages. By default a freed 4 MiB message raises malloc's
# mmap threshold and stays cached for reuse, in an arena per thread that touched it,
# and how many of gRPC's threads take part depends on scheduling: 25 to 30 MiB more
# here, none of it in use, and CI once measured 65,980 KiB against a 64 MiB bound.
# Pinned, the RSS is what is in use.
BYTES_IN_USE_MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def drive(sock: str, command: str, cap: int) -> dict[str, Any]:
    env = {**os.environ, **BYTES_IN_USE_MALLOC}
    r = subprocess.run([sys.executable, "-c", EXEC_DRIVER, sock, command, str(cap)], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# What reading one message costs beyond the cap. In Python (traced): two copies of
# it at most, the event's output as bytes and the slice the cap keeps or the
# serialized message before it; plus the loop's own small objects (measured: 40-50 KiB).
PYTHON_SLACK = 1024 * 1024
# In the whole process: the message several times over at once (gRPC's received
# frames, cygrpc's bytes, the parsed event, its output as bytes, the event before it
# still bound to the loop's variable) and what the transport reads ahead within its
# flow-control window, which gRPC sizes from its bandwidth-delay estimate (up to
# 4 MiB here). Measured 13 to 39 MiB for 4 MiB messages on 2 loaded cores; a
# supervisor that kept the flood would hold its 500 MiB.
READ_ALLOWANCE = 12 * MAX_MESSAGE_BYTES


@pytest.mark.parametrize("chunk", [64 * 1024, 4 * 1024 * 1024 - 64], ids=["64KiB-chunks", "4MiB-chunks"])
def test_a_host_flooding_exec_output_is_capped_by_the_supervisor(hostile_host: str, chunk: int) -> None:
    cap = 64 * 1024
    total = (500 * 1024 * 1024 // chunk) * chunk
    r = drive(hostile_host, f"flood:{total}:{chunk}", cap)
    # The cap, the room for an honest host's marker, and our own marker.
    assert r["length"] <= cap + MARKER_ALLOWANCE + 120, r
    assert r["marker"] and r["head"] == "H" * 16 and r["tail"] == "T" * 16
    # The host's lies about the result do not stand; what came after it is dropped.
    assert r["truncated"] is True and r["output_bytes"] == total
    flood = f"reading a {total >> 20} MiB flood in {chunk} byte messages"
    python_bound = cap + MARKER_ALLOWANCE + 2 * chunk + PYTHON_SLACK
    assert r["python_peak_kib"] * 1024 < python_bound, f"the supervisor's Python heap peaked at {r['python_peak_kib']} KiB {flood} (bound {python_bound >> 10} KiB)"
    assert r["grew_kib"] * 1024 < cap + READ_ALLOWANCE, f"the supervisor's side grew by {r['grew_kib']} KiB {flood} (bound {(cap + READ_ALLOWANCE) >> 10} KiB)"


def test_an_exec_message_past_the_limit_is_refused_with_a_reason(hostile_host: str) -> None:
    r = drive(hostile_host, "huge", 64 * 1024)
    assert r["kind"] == "too_large"
    assert r["error"].startswith("the sandbox sent 5242") and "as a chunk of exec output, more than the 4 MiB" in r["error"]


# A real workspace host, taken over by one of its own commands: on the process
# backend the command runs as the host's user, attaches to it with gdb and replaces
# its exec runner with one that ignores the cap. (On bwrap the host is not dumpable
# after its uid drop, so ptrace is refused; the test below shows the supervisor's
# side holds even when a host has fallen.)
HIJACK = textwrap.dedent(
    '''
    from clawsup.sandbox.exec_result import ExecResult
    from clawsup.sandbox.host import exec_runner

    async def flood(self, command, *, cwd, timeout_s, cap, emit):
        size = 1024 * 1024
        for i in range(500):
            await emit((b"H" if i == 0 else b"T" if i == 499 else b"F") * size)
        return ExecResult(exit_code=0, output_bytes=0)

    exec_runner.ExecRunner.run = flood
    '''
)


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def test_a_workspace_host_hijacked_by_its_command_cannot_fill_the_supervisor(gateway_factory: Any) -> None:
    if shutil.which("gdb") is None:
        if IN_CI:
            pytest.fail("this test needs gdb to take over a workspace host")
        pytest.skip("gdb is not installed")
    cap = 64 * 1024
    # The host stands still while gdb holds it: heartbeats get time enough for that.
    cfg = workspace_config("process", sandbox__runAs="supervisor", tools__exec__maxOutputBytes=cap)
    cfg["sandbox"].update(heartbeatIntervalSeconds=1, heartbeatTimeoutSeconds=5, heartbeatMisses=10)
    # The supervisor runs with malloc pinned as the driver above does, so its RSS
    # counts what is in use and not the arenas glibc keeps (CI once measured 103 MiB
    # of those against the bound below).
    gw: Gateway = gateway_factory(cfg, env=BYTES_IN_USE_MALLOC)
    gw.wait("workspace-main", "ready")
    # While the host is honest, its own cut passes through untouched.
    honest = gw.exec("echo FIRST; head -c 3000000 /dev/zero | tr '\\0' a; echo; echo LAST", timeout=60)
    assert honest["truncated"] and honest["output"].startswith("FIRST\n") and honest["output"].endswith("LAST\n")
    assert "bytes of output omitted ...]" in honest["output"] and "by the supervisor" not in honest["output"]

    (gw.workspace() / "hijack.py").write_text(HIJACK)
    take_over = (
        "gdb -nx -p $PPID -batch -ex 'call (int)PyGILState_Ensure()' "
        "-ex 'call (int)PyRun_SimpleString(\"exec(open(\\\"'$PWD'/hijack.py\\\").read())\")' "
        "-ex 'call (void)PyGILState_Release($1)' 2>&1 | grep -E '^\\$[0-9]+ ='"
    )
    r = gw.exec(take_over, timeout=120)
    assert r["exit_code"] == 0 and "$2 = 0" in r["output"], f"the take-over did not run: {r['output']}"

    # The peak is reset, so the honest 3 MB exec above does not count.
    Path(f"/proc/{gw.proc.pid}/clear_refs").write_text("5")
    rss0 = _kib(gw.proc.pid, "VmRSS")
    flood = gw.exec("true", timeout=300)
    grew = _kib(gw.proc.pid, "VmHWM") - rss0
    out = flood["output"]
    assert flood["truncated"] is True and flood["output_bytes"] == 500 * 1024 * 1024
    assert len(out) <= cap + 128 + 120 and out.startswith("H" * 1000) and out.endswith("T" * 1000)
    assert "omitted by the supervisor" in out
    assert grew < 64 * 1024, f"the supervisor grew by {grew} KiB while its workspace host sent 500 MiB in 1 MiB messages"
    assert "output cut" in gw.log("workspace-main")


# -- the supervisor's own log --------------------------------------------------------

SUPERVISOR_LOGGING = textwrap.dedent(
    '''
    import sys
    from pathlib import Path
    from loguru import logger
    from clawsup.supervisor.control.gateway import setup_logging
    from clawsup.supervisor.paths import StatePaths

    paths = StatePaths(Path(sys.argv[1]))
    paths.logs.mkdir(parents=True, exist_ok=True)
    setup_logging(paths, console=True)
    forged = "erased\\r2030-01-01 00:00:00.000 | INFO     | forged\\u2028\\x1b[2J\\x1b]0;title\\x07"
    logger.warning("tool {!s} refused: {}", "t\\x1b[31m", forged)
    try:
        try:
            raise KeyError(forged)
        except KeyError as e:
            raise RuntimeError("child said: " + forged + "\\nsecond line") from e
    except RuntimeError:
        logger.exception("answering failed: {}", forged)
    logger.info("after")
    '''
)


def test_the_supervisor_log_escapes_messages_and_exceptions(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", SUPERVISOR_LOGGING, str(tmp_path)], capture_output=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    text = read(tmp_path / "logs" / "supervisor.log")
    lines = assert_clean(text, None, "supervisor.log")
    assert_clean(r.stderr.decode(), None, "the supervisor's console")
    assert not any(line.startswith("2030") for line in lines), text
    # Each record starts with a timestamp; the traceback's own lines follow indented
    # or as Python writes them, and no line is the forged one.
    assert all(SUPERVISOR_LINE.match(line) or not line[:1].isdigit() for line in lines), text
    assert sum(bool(SUPERVISOR_LINE.match(line)) for line in lines) == 3
    assert "tool t\\x1b[31m refused: erased\\r2030-01-01" in text
    assert "RuntimeError: child said: erased\\r2030-01-01 00:00:00.000 | INFO     | forged\\u2028\\x1b[2J\\x1b]0;title\\x07\\nsecond line" in text
    assert "Traceback (most recent call last):" in text and "The above exception was the direct cause" in text
    assert lines[-1].endswith("after")
