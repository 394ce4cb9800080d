"""MCP servers end to end, through real supervisors: each server in a sandbox of its
own, driven as an operator and a model would.

- `mcp-server-time` from PyPI (installed into a venv of its own, as an operator
  would: tests/mcp_fixtures.py), on bwrap, docker and (trusted) the process backend:
  its tools listed under `mcp:time`, called, their arguments checked against its
  schema, its process killed from outside and its tools withdrawn, then back;
- tests/mcp_servers/unruly.py, a server that misbehaves on request: crashes, hangs
  (politely and not), floods stdout, answers hugely, changes its tool list, fails,
  answers with images and resources, hangs in `initialize`;
- tests/mcp_servers/remote.py, a streamable-HTTP server on 127.0.0.1 with a bearer
  token, reached from a sandbox granted the network;
- the agent loop (the offline model calling an MCP tool), the tool policy's
  `group:mcp:<id>`, `clawsup mcp list` and `clawsup logs mcp-<id>`.

The fault tests check what tests/test_faults.py checks for a plugin: the gateway
still answers other calls; the dead server's registrations are gone; the caller got a
clear error; the log says why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from clawsup.sandbox.host.mcp_bridge import SERVER_GONE_EXIT
from tests.conftest import Gateway, make_config, require_backend, wait_gone

MCP_SERVERS = Path(__file__).resolve().parent / "mcp_servers"
UNRULY = MCP_SERVERS / "unruly.py"
REMOTE = MCP_SERVERS / "remote.py"
TIME_TOOLS = {"time_get_current_time": "mcp:time", "time_convert_time": "mcp:time"}
SECRET = "s3cret-value-that-must-stay-in-its-sandbox"


def mcp_config(servers: dict[str, dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    """make_config() (the basics plugin on the process backend, trusted) plus
    `mcpServers`; each entry names its own backend in its `sandbox`."""
    cfg = make_config(**overrides)
    cfg["mcpServers"] = servers
    return cfg


def time_entry(exe: Path, backend: str, **extra: Any) -> dict[str, Any]:
    """The block an operator pastes for mcp-server-time, with clawsup's own keys.
    The backoff is long enough that a test sees the sandbox down after a kill."""
    sandbox = {"backend": backend, "restart": {"maxRestarts": 5, "backoffInitialSeconds": 4, "backoffMaxSeconds": 4}}
    return {"command": str(exe), "args": ["--local-timezone", "UTC"], "sandbox": sandbox, **extra}


def owned_by(gw: Gateway, owner: str) -> dict[str, str]:
    return {n: o for n, o in gw.tools().items() if o == owner}


def assert_others_fine(gw: Gateway) -> None:
    assert gw.call("echo", {"text": "still here"}) == {"ok": True, "data": {"result": "still here"}}


def error_of(resp: dict[str, Any]) -> dict[str, Any]:
    assert not resp["ok"], resp
    return resp["error"]


def process_tree(gw: Gateway, sandbox: str, backend: str) -> list[psutil.Process]:
    """Every process of the sandbox's child, found from the host side: under the
    supervisor (process, bwrap), or in its container (docker)."""
    if backend == "docker":
        import docker

        client = docker.from_env()
        try:
            from clawsup.sandbox.launch.container import STATE_LABEL

            [c] = [c for c in client.containers.list(filters={"label": f"{STATE_LABEL}={gw.state}"}) if c.labels.get("clawsup.sandbox") == sandbox]
            root = psutil.Process(c.attrs["State"]["Pid"])
        finally:
            client.close()
        return [root, *root.children(recursive=True)]
    host = gw.status(sandbox)["pid"]
    assert host is not None, gw.status(sandbox)
    root = psutil.Process(host)
    return [root, *root.children(recursive=True)]


def server_pid(gw: Gateway, sandbox: str, backend: str, marker: str) -> int:
    """The MCP server process: the one whose argv holds `marker` (a script's path)
    as a whole argument (bwrap's own argv names the venv, never the script)."""
    found = []
    for p in process_tree(gw, sandbox, backend):
        try:
            if marker in p.cmdline() and "clawsup.sandbox.host" not in p.cmdline():
                found.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    assert len(found) == 1, f"looked for {marker} under {sandbox}: {found}"
    return found[0]


# -- mcp-server-time, from PyPI ----------------------------------------------------------


def check_time_server(gw: Gateway, exe: Path, backend: str) -> None:
    """List, call, argument checks, a kill from outside, the restart."""
    assert gw.wait("mcp-time", "ready", timeout=60) == "ready"
    assert owned_by(gw, "mcp:time") == TIME_TOOLS
    listed = gw.cli("tools", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {t["name"]: t for t in json.loads(listed.stdout)["tools"]}
    assert rows["time_get_current_time"]["owner"] == "mcp:time"
    assert rows["time_get_current_time"]["description"] == "Get current time in a specific timezone"
    assert rows["time_convert_time"]["description"] == "Convert time between timezones"

    # Structured content with its JSON text beside it: the JSON itself.
    now = gw.call("time_get_current_time", {"timezone": "UTC"})
    assert now["ok"], now
    got = now["data"]["result"]
    assert got["timezone"] == "UTC" and got["day_of_week"] in ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    assert abs(datetime.fromisoformat(got["datetime"]) - datetime.now(UTC)) < timedelta(minutes=5)
    conv = gw.call("time_convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
    assert conv["ok"], conv
    assert conv["data"]["result"]["target"]["datetime"][11:16] == "21:00"
    assert conv["data"]["result"]["time_difference"] == "+9.0h"

    # Arguments are checked against the server's own schema, in the supervisor.
    bad = error_of(gw.call("time_get_current_time", {"timezone": 5}))
    assert bad["code"] == "bad_arguments" and bad["message"] == "bad arguments for tool 'time_get_current_time': timezone: 5 is not of type 'string'"
    missing = error_of(gw.call("time_convert_time", {"source_timezone": "UTC", "time": "12:00"}))
    assert missing["code"] == "bad_arguments" and "target_timezone: a required property is missing" in missing["message"]
    # What only the server can judge comes back as its isError: a tool error, in its words.
    mars = error_of(gw.call("time_get_current_time", {"timezone": "Mars/Olympus_Mons"}))
    assert mars["code"] == "tool_failed" and "Invalid timezone" in mars["message"] and "Mars/Olympus_Mons" in mars["message"]

    # Killed from outside: its tools are withdrawn, a call says which server ended how.
    pid = server_pid(gw, "mcp-time", backend, str(exe))
    restarts = gw.status("mcp-time")["restarts"]
    os.kill(pid, signal.SIGKILL)
    assert gw.wait("mcp-time", "backoff", timeout=30) == "backoff"
    assert owned_by(gw, "mcp:time") == {}
    assert_others_fine(gw)
    down = error_of(gw.call("time_get_current_time", {"timezone": "UTC"}))
    assert down["code"] == "sandbox_unavailable", down
    assert "MCP server 'time' was killed by SIGKILL" in down["message"] and "mcp-time" in down["message"]
    last = gw.status("mcp-time")["last_exit"]
    assert last["code"] == SERVER_GONE_EXIT and "MCP server 'time' was killed by SIGKILL" in last["reason"]
    log = gw.log("mcp-time")
    assert f"exited with code {SERVER_GONE_EXIT} (MCP server 'time' was killed by SIGKILL" in log
    assert re.search(r"withdrew (time_convert_time, time_get_current_time|time_get_current_time, time_convert_time)", log), log[-3000:]

    # Back, with a new server process.
    assert gw.wait("mcp-time", "ready", timeout=60) == "ready"
    assert gw.status("mcp-time")["restarts"] == restarts + 1
    assert owned_by(gw, "mcp:time") == TIME_TOOLS
    again = gw.call("time_get_current_time", {"timezone": "Europe/Paris"})
    assert again["ok"] and again["data"]["result"]["timezone"] == "Europe/Paris", again
    assert server_pid(gw, "mcp-time", backend, str(exe)) != pid


@pytest.fixture(scope="module")
def bwrap_gateway(module_gateways: Any, mcp_server_time: Path) -> Gateway:
    """One gateway for the bwrap tests that can share it: `time` (the server under
    test), `clock` (the same program under another id: the policy denies it, and it
    alone gets a secret in its env), `bad` (the same program with an argument it
    refuses: it exits before initialize, every time). The offline model as the
    default agent. Each test leaves it as it found it."""
    require_backend("bwrap")
    servers = {
        "time": time_entry(mcp_server_time, "bwrap"),
        "clock": time_entry(mcp_server_time, "bwrap", env={"CLOCK_SECRET": "${HTEST_CLOCK_SECRET}", "TZ_NOTE": "${HTEST_UNSET:-a default}"}),
        "bad": {
            "command": str(mcp_server_time),
            "args": ["--local-timezone", "Mars/Base"],
            "sandbox": {"backend": "bwrap", "restart": {"maxRestarts": 1, "backoffInitialSeconds": 0.1, "backoffMaxSeconds": 0.1}},
        },
    }
    cfg = mcp_config(servers, tools={"deny": ["group:mcp:clock"]})
    cfg["agents"]["list"] = [{"id": "main", "default": True, "model": "offline"}]
    cfg["agentLoop"] = {"maxIterations": 4}
    gw: Gateway = module_gateways("bwrap-time", cfg, {"HTEST_CLOCK_SECRET": SECRET})
    for sandbox in ("mcp-time", "mcp-clock"):
        gw.wait(sandbox, "ready", timeout=60)
    return gw


def test_time_server_end_to_end_on_bwrap(bwrap_gateway: Gateway, mcp_server_time: Path) -> None:
    check_time_server(bwrap_gateway, mcp_server_time, "bwrap")


def test_time_server_end_to_end_on_docker(gateway_factory: Any, mcp_server_time: Path) -> None:
    require_backend("docker")
    gw = gateway_factory(mcp_config({"time": time_entry(mcp_server_time, "docker")}))
    check_time_server(gw, mcp_server_time, "docker")
    assert_others_fine(gw)


def test_time_server_end_to_end_on_process_when_trusted(gateway_factory: Any, mcp_server_time: Path) -> None:
    gw = gateway_factory(mcp_config({"time": time_entry(mcp_server_time, "process", trust="trusted")}))
    check_time_server(gw, mcp_server_time, "process")
    # Not root: the sandbox's own uid (sandbox.runAs on this root machine), which
    # can still run an install an operator made for everyone.
    if os.geteuid() == 0:
        pid = server_pid(gw, "mcp-time", "process", str(mcp_server_time))
        assert psutil.Process(pid).uids().effective != 0


def test_an_untrusted_server_is_refused_the_process_backend(gateway_factory: Any, mcp_server_time: Path, state_dir: Path) -> None:
    with pytest.raises(AssertionError) as refused:
        gateway_factory(mcp_config({"time": time_entry(mcp_server_time, "process")}))
    assert "mcpServers.time" in str(refused.value) and "MCP server 'time'" in str(refused.value)


# -- the agent loop, policy, the operator's view ---------------------------------------------


def chat(gw: Gateway, text: str) -> list[dict[str, Any]]:
    r = gw.cli("chat", "--peer", "tester", "-m", text, "--json", timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    return [json.loads(x) for x in r.stdout.splitlines()]


def reply(events: list[dict[str, Any]]) -> str:
    return [e["reply"] for e in events if "reply" in e][-1]


def test_the_offline_model_calls_an_mcp_tool(bwrap_gateway: Gateway) -> None:
    gw = bwrap_gateway
    gw.wait("mcp-time", "ready", timeout=60)
    events = chat(gw, '/tool time_get_current_time {"timezone": "UTC"}')
    assert {"progress": "calling time_get_current_time…"} in events
    out = reply(events)
    assert out.startswith("time_get_current_time returned:"), out
    assert json.loads(out.split("returned: ", 1)[1])["timezone"] == "UTC"


def test_a_policy_group_hides_one_server_from_the_model(bwrap_gateway: Gateway) -> None:
    gw = bwrap_gateway
    gw.wait("mcp-time", "ready", timeout=60)
    # `tools.deny: ["group:mcp:clock"]`: registered, but never offered nor run.
    assert owned_by(gw, "mcp:clock") == {"clock_get_current_time": "mcp:clock", "clock_convert_time": "mcp:clock"}
    out = reply(chat(gw, '/tool clock_get_current_time {"timezone": "UTC"}'))
    assert out == "clock_get_current_time failed: tool 'clock_get_current_time' is not available in this turn (removed by the global layer)"
    shown = reply(chat(gw, "hello"))
    assert "time_get_current_time" in shown and "clock_" not in shown


def test_mcp_list_shows_each_server_and_no_secret(bwrap_gateway: Gateway) -> None:
    gw = bwrap_gateway
    assert gw.wait("mcp-bad", "failed", timeout=60) == "failed"
    r = gw.cli("mcp", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout
    servers = {s["id"]: s for s in json.loads(r.stdout)["servers"]}
    assert sorted(servers) == ["bad", "clock", "time"]
    clock = servers["clock"]
    assert {k: clock[k] for k in ("sandbox", "owner", "state", "transport", "backend", "trust", "prefix")} == {
        "sandbox": "mcp-clock", "owner": "mcp:clock", "state": "ready", "transport": "stdio", "backend": "bwrap",
        "trust": "untrusted", "prefix": "clock_",
    }  # fmt: skip
    assert clock["tools"] == ["clock_convert_time", "clock_get_current_time"] and clock["restarts"] == 0
    assert clock["network"] is False  # a command gets sandbox.defaults.network
    bad = servers["bad"]
    assert bad["state"] == "failed" and bad["tools"] == [] and bad["restarts"] == 1
    assert "MCP server 'bad' exited with code 1 before initialize finished" in bad["last_exit"]["reason"]
    assert "invalid --local-timezone 'Mars/Base'" in bad["last_exit"]["reason"]
    table = gw.cli("mcp", "list")
    assert table.returncode == 0 and "mcp-clock" in table.stdout and "FAILED" in table.stdout and SECRET not in table.stdout

    # The server's stderr is the sandbox's log, followed by `clawsup logs`.
    logs = gw.cli("logs", "mcp-bad", "-n", "200")
    assert logs.returncode == 0, logs.stderr
    assert "[stderr] Error: invalid --local-timezone 'Mars/Base': not a known IANA timezone name" in logs.stdout
    # Started, retried with backoff, then failed under the intensity rule.
    assert logs.stdout.count("before initialize finished") >= 2

    # The secret went to its server alone: nowhere in any log or in the state dir's text.
    for path in (gw.state / "logs").glob("*"):
        assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in "".join(gw.output)


def test_env_reaches_its_server_alone(bwrap_gateway: Gateway, mcp_server_time: Path) -> None:
    gw = bwrap_gateway
    for sandbox in ("mcp-time", "mcp-clock"):
        gw.wait(sandbox, "ready", timeout=60)
    clock = psutil.Process(server_pid(gw, "mcp-clock", "bwrap", str(mcp_server_time))).environ()
    assert clock["CLOCK_SECRET"] == SECRET and clock["TZ_NOTE"] == "a default"
    others = [psutil.Process(server_pid(gw, "mcp-time", "bwrap", str(mcp_server_time))), *(psutil.Process(p) for p in gw.host_pids())]
    for p in others:
        assert "CLOCK_SECRET" not in p.environ() and SECRET not in " ".join(p.environ().values()), p.cmdline()


# -- the unruly server: a misbehaving stdio server of our own ---------------------------------


@pytest.fixture(scope="module")
def unruly_exe() -> Iterator[Path]:
    """tests/mcp_servers/unruly.py installed as an operator installs a script: an
    executable with its interpreter on the `#!` line, in a folder of its own that
    every uid may read (never inside a state directory, which is never shown to a
    sandbox)."""
    folder = Path(tempfile.mkdtemp(prefix="mcp-unruly-", dir="/tmp"))
    os.chmod(folder, 0o755)
    exe = folder / "unruly"
    exe.write_text(f"#!{sys.executable}\n" + UNRULY.read_text())
    exe.chmod(0o755)
    yield exe
    shutil.rmtree(folder, ignore_errors=True)


HANDSHAKE_S = 10
"""The unruly gateway's handshake timeout; the host gives a server's initialize what
is left of it after its own start (supervisor/sandboxes/mcp_plans.py)."""


@pytest.fixture(scope="module")
def unruly_gateway(module_gateways: Any, unruly_exe: Path) -> Gateway:
    """`unruly` (prints a banner of non-MCP lines, then serves; restarts quickly and
    often, so that the tests that kill it can share it) and `stuck` (never answers
    initialize; one restart, then failed)."""
    require_backend("bwrap")
    quick = {"maxRestarts": 20, "periodSeconds": 60, "backoffInitialSeconds": 0.1, "backoffMaxSeconds": 0.5}
    servers = {
        "unruly": {"command": str(unruly_exe), "args": ["--banner"], "sandbox": {"backend": "bwrap", "restart": quick}},
        "stuck": {
            "command": str(unruly_exe),
            "args": ["--hang-initialize"],
            "sandbox": {"backend": "bwrap", "restart": {"maxRestarts": 1, "backoffInitialSeconds": 0.1, "backoffMaxSeconds": 0.1}},
        },
    }
    gw: Gateway = module_gateways("bwrap-unruly", mcp_config(servers, sandbox__handshakeTimeoutSeconds=HANDSHAKE_S))
    gw.wait("mcp-unruly", "ready", timeout=60)
    return gw


UNRULY_TOOLS = {
    f"unruly_{name}"
    for name in ("echo", "structured", "crash", "hang", "hang_hard", "flood", "long_line", "huge", "change_tools", "fail", "image", "resource", "shout")
}


def unruly_ready(gw: Gateway, after: int | None = None) -> int:
    """Waits for the unruly sandbox (a test before may have killed it); its host pid.
    `after`: a host pid seen to die from outside (its process gone), whose death the
    supervisor may not have taken in yet; until it has, the sandbox still says `ready`."""
    if after is not None:
        gw.wait_log("mcp-unruly", re.compile(rf"pid {after} (exited|was killed|ended)"), timeout=20)
    assert gw.wait("mcp-unruly", "ready", timeout=60) == "ready"
    assert set(owned_by(gw, "mcp:unruly")) >= UNRULY_TOOLS
    pid = gw.status("mcp-unruly")["pid"]
    assert pid is not None
    return int(pid)


def unruly_pid(gw: Gateway, exe: Path) -> int:
    return server_pid(gw, "mcp-unruly", "bwrap", str(exe))


def assert_unruly_gone(gw: Gateway) -> None:
    """Its registrations were reclaimed with it (a restart takes the host's start
    and the server's initialize, well over the time this check takes)."""
    assert not [n for n in owned_by(gw, "mcp:unruly")], gw.tools()


def test_results_are_mapped_and_bounded(unruly_gateway: Gateway, unruly_exe: Path) -> None:
    gw = unruly_gateway
    host = unruly_ready(gw)
    assert gw.call("unruly_echo", {"text": "plain text"})["data"]["result"] == "plain text"
    assert gw.call("unruly_structured")["data"]["result"] == {"answer": 42, "items": ["a", "b"]}
    failed = error_of(gw.call("unruly_fail"))
    assert failed["code"] == "tool_failed" and "the unruly server failed on purpose" in failed["message"], failed
    assert gw.call("unruly_image")["data"]["result"] == "[image: image/png, 70 bytes]"
    assert gw.call("unruly_resource")["data"]["result"] == (
        "resources follow\n"
        "[resource: file:///unruly/notes.txt (text/plain), 31 bytes]\n"
        "[resource: file:///unruly/blob.bin (application/octet-stream), 1000 bytes]\n"
        "[resource link: file:///unruly/big.bin big.bin]"
    )

    # 3 MiB of text: cut at 1 MiB with a marker saying how much was left out.
    huge = gw.call("unruly_huge", {"n_bytes": 3 * 1024 * 1024}, timeout=60)
    assert huge["ok"], str(huge)[:500]
    text = huge["data"]["result"]
    assert len(text.encode()) <= 1024 * 1024 and text.startswith("x" * 1000)
    marker = re.search(r"\[… result cut: (\d+) of its 3145728 bytes left out; the limit is 1024 KiB\]$", text)
    assert marker is not None, text[-300:]
    assert int(marker.group(1)) + text.index("\n[…") == 3 * 1024 * 1024

    # A bad argument is refused by the supervisor, naming what is wrong: the server
    # never hears of it (its stderr, the sandbox log, has the next call but not it).
    bad = error_of(gw.call("unruly_shout", {"text": ["never-shouted-9931"]}))
    assert bad["code"] == "bad_arguments" and "text: ['never-shouted-9931'] is not of type 'string'" in bad["message"], bad
    assert gw.call("unruly_shout", {"text": "shouted-after-9931"})["data"]["result"] == "shouted"
    gw.wait_log("mcp-unruly", "shouted-after-9931")
    assert "never-shouted-9931" not in gw.log("mcp-unruly")
    # The same child served all of it.
    assert gw.status("mcp-unruly")["pid"] == host
    assert_others_fine(gw)


@pytest.mark.fault
def test_a_crash_in_a_call_fails_it_naming_the_server(unruly_gateway: Gateway, unruly_exe: Path) -> None:
    gw = unruly_gateway
    unruly_ready(gw)
    t0 = time.monotonic()
    killed = error_of(gw.call("unruly_crash", {"how": "kill"}, timeout=60))
    assert time.monotonic() - t0 < 10  # at once, not at the deadline
    assert_unruly_gone(gw)
    assert killed["code"] == "sandbox_died", killed
    assert "MCP server 'unruly' was killed by SIGKILL" in killed["message"] and "mcp-unruly" in killed["message"]
    assert_others_fine(gw)
    assert re.search(r"pid \d+ exited with code 75 \(MCP server 'unruly' was killed by SIGKILL\); withdrew ", gw.log("mcp-unruly"))

    unruly_ready(gw)
    exited = error_of(gw.call("unruly_crash", {"how": "exit"}, timeout=60))
    assert_unruly_gone(gw)
    assert exited["code"] == "sandbox_died" and "MCP server 'unruly' exited with code 3" in exited["message"], exited
    assert gw.status("mcp-unruly")["last_exit"]["code"] == SERVER_GONE_EXIT
    assert_others_fine(gw)
    assert "(MCP server 'unruly' exited with code 3)" in gw.log("mcp-unruly")
    unruly_ready(gw)


@pytest.mark.fault
def test_a_hung_call_is_cancelled_and_the_server_stays(unruly_gateway: Gateway, unruly_exe: Path) -> None:
    gw = unruly_gateway
    host = unruly_ready(gw)
    server = unruly_pid(gw, unruly_exe)
    late = error_of(gw.call("unruly_hang", timeout=1))
    assert late["code"] == "tool_timeout", late
    # notifications/cancelled reached the server, which stopped the handler.
    gw.wait_log("mcp-unruly", "unruly: hang cancelled", timeout=10)
    assert gw.call("unruly_echo", {"text": "next"})["data"]["result"] == "next"
    assert gw.status("mcp-unruly")["pid"] == host and unruly_pid(gw, unruly_exe) == server
    assert_others_fine(gw)


@pytest.mark.fault
def test_a_server_that_ignores_the_cancel_is_killed(unruly_gateway: Gateway, unruly_exe: Path) -> None:
    gw = unruly_gateway
    host = unruly_ready(gw)
    server = unruly_pid(gw, unruly_exe)
    late = error_of(gw.call("unruly_hang_hard", timeout=1))
    assert late["code"] == "tool_timeout", late
    # Its loop is blocked: the ping after the cancel goes unanswered, so it is killed,
    # and the sandbox with it.
    line = gw.wait_log("mcp-unruly", "did not stop after notifications/cancelled", timeout=20)
    assert "MCP server 'unruly'" in line and "(unruly_hang_hard)" in line
    assert wait_gone([server, host]) == []
    assert_others_fine(gw)
    assert unruly_ready(gw, after=host) != host
    assert gw.call("unruly_echo", {"text": "back"})["data"]["result"] == "back"


@pytest.mark.fault
def test_a_server_whose_handlers_never_stop_is_killed(unruly_gateway: Gateway, unruly_exe: Path) -> None:
    """A sync tool runs in one of the server's worker threads, so the server answers
    the ping after each cancel while its threads fill up. Three such calls in a row,
    none finished between: killed, and the sandbox restarts."""
    gw = unruly_gateway
    host = unruly_ready(gw)
    server = unruly_pid(gw, unruly_exe)
    for _ in range(2):
        assert error_of(gw.call("unruly_hang_sync", timeout=1))["code"] == "tool_timeout"
    assert unruly_pid(gw, unruly_exe) == server  # two are a slow server, not a stuck one
    assert error_of(gw.call("unruly_hang_sync", timeout=1))["code"] == "tool_timeout"
    line = gw.wait_log("mcp-unruly", "calls in a row after notifications/cancelled", timeout=20)
    assert "MCP server 'unruly' did not finish 3 calls in a row" in line and "unruly_hang_sync" in line
    assert wait_gone([server, host]) == []
    assert_others_fine(gw)
    unruly_ready(gw, after=host)
    assert gw.call("unruly_echo", {"text": "back"})["data"]["result"] == "back"


@pytest.mark.fault
def test_stdout_noise_is_dropped_and_counted(unruly_gateway: Gateway, unruly_exe: Path) -> None:
    gw = unruly_gateway
    host = unruly_ready(gw)
    # Non-MCP lines while a call is in flight and after: the calls still work.
    flooded = gw.call("unruly_flood", {"lines": 5000}, timeout=60)
    assert flooded == {"ok": True, "data": {"result": "flooded 5000 lines"}}, flooded
    assert gw.call("unruly_echo", {"text": "after the flood"})["data"]["result"] == "after the flood"
    assert gw.status("mcp-unruly")["pid"] == host
    assert_others_fine(gw)
    # Logged, bounded: the first lines shown, the rest counted.
    gw.wait_log("mcp-unruly", "non-MCP stdout lines dropped so far")
    log = gw.log("mcp-unruly")
    assert "wrote a line on stdout that is not MCP (dropped): 'unruly banner: hello, this is not MCP'" in log
    assert "unruly noise line 0: this is not JSON-RPC" in log
    assert "unruly noise line 4000" not in log
    assert sum("unruly noise line" in line for line in log.splitlines()) <= 20


@pytest.mark.fault
def test_a_stdout_line_past_the_bound_kills_the_server(unruly_gateway: Gateway, unruly_exe: Path) -> None:
    gw = unruly_gateway
    unruly_ready(gw)
    resp = error_of(gw.call("unruly_long_line", timeout=60))
    assert resp["code"] == "sandbox_died", resp
    assert "longer than 16 MiB" in resp["message"] and "MCP server 'unruly'" in resp["message"]
    assert_unruly_gone(gw)
    assert_others_fine(gw)
    assert "longer than 16 MiB" in gw.log("mcp-unruly")
    unruly_ready(gw)


def test_a_changed_tool_list_is_swapped_atomically(unruly_gateway: Gateway, unruly_exe: Path) -> None:
    gw = unruly_gateway
    unruly_ready(gw)
    stable = set(owned_by(gw, "mcp:unruly"))
    assert "unruly_added_tool" not in stable
    snapshots: list[set[str]] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            snapshots.append(set(owned_by(gw, "mcp:unruly")))

    def until(present: bool) -> None:
        deadline = time.monotonic() + 20
        while ("unruly_added_tool" in owned_by(gw, "mcp:unruly")) != present:
            assert time.monotonic() < deadline, f"unruly_added_tool never {'came' if present else 'went'}: {gw.log('mcp-unruly')[-2000:]}"

    with ThreadPoolExecutor(1) as pool:
        poller = pool.submit(poll)
        try:
            # A burst of three notifications: coalesced, and the last list wins.
            assert gw.call("unruly_change_tools", {"notifications": 3})["data"]["result"] == "added added_tool"
            until(present=True)
            assert gw.tools()["unruly_added_tool"] == "mcp:unruly"
            assert gw.call("unruly_added_tool")["data"]["result"] == "added"
            assert gw.call("unruly_change_tools")["data"]["result"] == "removed added_tool"
            until(present=False)
            assert error_of(gw.call("unruly_added_tool"))["code"] == "tool_not_found"
        finally:
            done.set()
            poller.result(timeout=30)
    # Every snapshot, taken while the lists changed, had every tool that did not change.
    assert len(snapshots) > 10
    assert all(s in (stable, stable | {"unruly_added_tool"}) for s in snapshots), [sorted(s ^ stable) for s in snapshots if s not in (stable, stable | {"unruly_added_tool"})][:5]
    assert any("unruly_added_tool" in s for s in snapshots)
    log = gw.log("mcp-unruly")
    assert "changed its tools: added unruly_added_tool; removed none" in log
    assert "changed its tools: added none; removed unruly_added_tool" in log
    assert_others_fine(gw)


@pytest.mark.fault
def test_a_server_that_never_initializes_is_killed_then_failed(unruly_gateway: Gateway) -> None:
    from clawsup.supervisor.sandboxes.mcp_plans import initialize_timeout

    gw = unruly_gateway
    limit = initialize_timeout(HANDSHAKE_S)
    assert gw.wait("mcp-stuck", "failed", timeout=120) == "failed"
    st = gw.status("mcp-stuck")
    assert st["restarts"] == 1
    said = f"MCP server 'stuck' did not finish initialize within {limit:g} s; killed it"
    assert said in st["last_exit"]["reason"], st
    assert owned_by(gw, "mcp:stuck") == {}
    assert_others_fine(gw)
    log = gw.log("mcp-stuck")
    # Killed at the host's deadline each time (not the supervisor's silent "no
    # handshake"), retried with backoff, then failed under the intensity rule.
    assert log.count(said) >= 2 and "no handshake within" not in log
    assert "crashed → backoff" in log and "crashed → failed" in log


@pytest.mark.fault
def test_the_unruly_server_on_docker(gateway_factory: Any, unruly_exe: Path) -> None:
    """The two endings of a call that matter most, in a container: a hang cancelled
    (the server stays), a crash in flight (the call fails naming the server)."""
    require_backend("docker")
    slow = {"backoffInitialSeconds": 30, "backoffMaxSeconds": 30}
    gw = gateway_factory(mcp_config({"unruly": {"command": str(unruly_exe), "sandbox": {"backend": "docker", "restart": slow}}}))
    host = unruly_ready(gw)
    assert error_of(gw.call("unruly_hang", timeout=1))["code"] == "tool_timeout"
    gw.wait_log("mcp-unruly", "unruly: hang cancelled", timeout=10)
    assert gw.call("unruly_echo", {"text": "still serving"})["data"]["result"] == "still serving"
    assert gw.status("mcp-unruly")["pid"] == host

    killed = error_of(gw.call("unruly_crash", {"how": "kill"}, timeout=60))
    assert killed["code"] == "sandbox_died" and "MCP server 'unruly' was killed by SIGKILL" in killed["message"], killed
    assert gw.wait("mcp-unruly", "backoff") == "backoff"
    assert_unruly_gone(gw)
    assert_others_fine(gw)
    assert "(MCP server 'unruly' was killed by SIGKILL)" in gw.log("mcp-unruly")


# -- a remote server, over streamable HTTP ---------------------------------------------------


@pytest.fixture(scope="module")
def remote_server() -> Iterator[tuple[str, str]]:
    """tests/mcp_servers/remote.py on 127.0.0.1: (its url, its token)."""
    token = "tok-" + os.urandom(12).hex()
    proc = subprocess.Popen(
        [sys.executable, str(REMOTE), "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env={**os.environ, "MCP_TEST_TOKEN": token}, text=True,
    )  # fmt: skip
    ready: list[str] = []
    got = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("READY "):
                ready.append(line.split()[1])
                got.set()
        got.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert got.wait(60) and ready, f"remote.py did not say READY: {proc.poll()} {proc.stderr.read() if proc.poll() is not None and proc.stderr else ''}"
        yield f"http://127.0.0.1:{ready[0]}/mcp", token
    finally:
        proc.kill()
        proc.wait(10)


def test_a_remote_server_with_a_bearer_token(gateway_factory: Any, remote_server: tuple[str, str]) -> None:
    require_backend("bwrap")
    url, token = remote_server
    wrong = "wrong-" + os.urandom(12).hex()
    headers = {"Authorization": "Bearer ${MCP_TEST_TOKEN}"}
    servers = {
        "remote": {"url": url, "headers": headers, "sandbox": {"backend": "bwrap"}},
        "wrong": {
            "type": "http", "url": url, "headers": {"Authorization": "Bearer ${MCP_WRONG_TOKEN}"},
            "sandbox": {"backend": "bwrap", "restart": {"maxRestarts": 0}},
        },
    }  # fmt: skip
    gw = gateway_factory(mcp_config(servers), env={"MCP_TEST_TOKEN": token, "MCP_WRONG_TOKEN": wrong})
    assert gw.wait("mcp-remote", "ready", timeout=60) == "ready"
    assert owned_by(gw, "mcp:remote") == {"remote_echo": "mcp:remote", "remote_whoami": "mcp:remote"}
    assert gw.call("remote_echo", {"text": "over http"}) == {"ok": True, "data": {"result": "over http"}}
    seen = json.loads(gw.call("remote_whoami")["data"]["result"])
    assert seen["authorization"] == "Bearer <the test token>"  # (remote.py hides the right one)

    # The wrong token: refused by the server, and the operator is told so.
    assert gw.wait("mcp-wrong", "failed", timeout=60) == "failed"
    reason = gw.status("mcp-wrong")["last_exit"]["reason"]
    assert "MCP server 'wrong'" in reason and "HTTP 401 Unauthorized" in reason, reason
    assert owned_by(gw, "mcp:wrong") == {}
    assert "HTTP 401" in gw.log("mcp-wrong")

    listed = gw.cli("mcp", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    servers_seen = {s["id"]: s for s in json.loads(listed.stdout)["servers"]}
    assert servers_seen["remote"]["transport"] == "http" and servers_seen["remote"]["network"] is True
    assert servers_seen["remote"]["tools"] == ["remote_echo", "remote_whoami"]
    assert servers_seen["wrong"]["state"] == "failed"
    # Neither token anywhere an operator looks: logs, `mcp list`, the supervisor's output.
    shown = [listed.stdout, gw.cli("mcp", "list").stdout, "".join(gw.output), *(p.read_text(errors="replace") for p in (gw.state / "logs").glob("*"))]
    for secret in (token, wrong):
        assert not [text[:200] for text in shown if secret in text]
    assert_others_fine(gw)
