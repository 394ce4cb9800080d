"""Which workspace sandbox serves a core tool call: by agent, by session, or one for
all, as configured, and never by the tool's arguments; and how a session's sandbox
is discarded when idle (supervisor/tools/workspaces.py, SandboxManager.discard)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from clawsup.supervisor.config import load_config
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.tools.workspaces import IDLE_STOP_TIMEOUT_S, workspace_sandbox_id
from tests.conftest import CLAWSUP, Gateway, make_config, require_backend, wait_gone


def call(gw: Any, name: str, args: dict[str, Any], **who: str) -> Any:
    resp = gw.request(op="call", name=name, args=args, **who)
    assert resp["ok"], resp
    return resp["data"]["result"]


def sandbox_ids(gw: Gateway) -> list[str]:
    return [s["id"] for s in gw.request(op="status")["data"]["sandboxes"]]


def session_sandbox(session: str) -> str:
    return workspace_sandbox_id("session", "main", session)


def stats(gw: Gateway) -> dict[str, Any]:
    resp = gw.request(op="stats")
    assert resp["ok"], resp
    return resp["data"]


def wait_row_gone(gw: Gateway, sid: str, timeout: float = 30.0) -> None:
    """Until `sid` has left `clawsup status`. The control API has no event for a row
    going, so this checks the condition, bounded."""
    deadline = time.monotonic() + timeout
    while sid in sandbox_ids(gw):
        assert time.monotonic() < deadline, f"{sid} still in status {timeout:g} s on: {gw.status(sid)}"
        time.sleep(0.05)


def wait_stats(gw: Gateway, want: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """The stats once open_fds and tasks are back at `want` (bounded: the last of a
    discard's descriptors close a moment after its row goes)."""
    deadline = time.monotonic() + timeout
    while True:
        now = stats(gw)
        if (now["open_fds"], now["tasks"]) == (want["open_fds"], want["tasks"]) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def test_agent_scope_gives_each_agent_its_own_workspace(gateway_factory) -> None:
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "agent", "backend": "process"}))
    gw.wait("workspace-main", "ready")
    call(gw, "write", {"path": "who.txt", "content": "main"})
    call(gw, "write", {"path": "who.txt", "content": "ops"}, agent="ops")
    assert call(gw, "read", {"path": "who.txt"}) == "main"
    assert call(gw, "read", {"path": "who.txt"}, agent="ops") == "ops"
    assert gw.status("workspace-ops")["state"] == "ready"
    assert (gw.workspace("workspace-ops") / "who.txt").read_text() == "ops"


def test_shared_scope_is_one_workspace_for_all(gateway_factory) -> None:
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "shared", "backend": "process"}))
    call(gw, "write", {"path": "note.txt", "content": "from main"})
    assert call(gw, "read", {"path": "note.txt"}, agent="ops", session="s9") == "from main"
    assert set(sandbox_ids(gw)) == {"workspace", "basics"}


def test_idle_session_sandbox_is_discarded_and_its_files_kept(gateway_factory) -> None:
    """An idle session's sandbox leaves nothing behind in the supervisor (no row, no
    task, no open file: a gateway with many peers used to run out of descriptors),
    its log stays readable, and its next call starts afresh on the same files."""
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "session", "backend": "process", "idleStopSeconds": 1}))
    assert sandbox_ids(gw) == ["basics"]
    # A first session and its discard, so that what the first sandbox of all sets up
    # for good (the gRPC runtime's own descriptors and threads) is in the baseline.
    call(gw, "exec", {"command": "true"}, session="warm-up")
    wait_row_gone(gw, session_sandbox("warm-up"))
    before = stats(gw)

    out = call(gw, "exec", {"command": "echo from-chat-1 > note.txt && echo wrote"}, session="chat-1")
    assert out["exit_code"] == 0 and "wrote" in out["output"], out
    sid = session_sandbox("chat-1")
    old_pid = gw.status(sid)["pid"]
    old_host = psutil.Process(old_pid)
    during = stats(gw)
    assert during["open_fds"] > before["open_fds"] and during["tasks"] > before["tasks"], (before, during)
    other = call(gw, "exec", {"command": "cat note.txt 2>&1 || true"}, session="chat-2")
    assert "from-chat-1" not in other["output"]
    # Someone follows its log: the discard ends the follow, it does not hang.
    follower = subprocess.Popen([*CLAWSUP, "logs", sid, "-f", "--state-dir", str(gw.state)], stdout=subprocess.PIPE, text=True)

    wait_row_gone(gw, sid)
    followed, _ = follower.communicate(timeout=20)
    assert follower.returncode == 0
    assert "[clawsup: the sandbox was discarded; its log ends here]" in followed, followed
    wait_row_gone(gw, session_sandbox("chat-2"))
    after = wait_stats(gw, before)
    assert (after["open_fds"], after["tasks"], after["sandboxes"]) == (before["open_fds"], before["tasks"], before["sandboxes"]), (before, after)
    assert not old_host.is_running() or old_host.status() == psutil.STATUS_ZOMBIE

    logs = gw.cli("logs", sid)
    assert logs.returncode == 0, logs.stderr
    assert "exec 'echo from-chat-1 > note.txt && echo wrote': exit 0" in logs.stdout
    assert "idle for 1 s" in logs.stdout, logs.stdout

    again = call(gw, "exec", {"command": "cat note.txt"}, session="chat-1")
    assert again["output"] == "from-chat-1\n", again
    assert gw.status(sid)["state"] == "ready" and gw.status(sid)["pid"] != old_pid


def test_a_call_in_flight_keeps_its_sandbox_past_the_idle_time(gateway_factory) -> None:
    """Idle means no call for the idle time, not a call that started long ago."""
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "session", "backend": "process", "idleStopSeconds": 1}))
    out = call(gw, "exec", {"command": "sleep 3; echo done"}, session="long")
    assert out["output"] == "done\n" and out["exit_code"] == 0, out
    lines = gw.log(session_sandbox("long")).splitlines()
    [end] = [i for i, line in enumerate(lines) if "exec 'sleep 3; echo done': exit 0" in line]
    assert not [line for line in lines[:end] if "draining" in line or "killing" in line], lines


def test_stop_grace_has_a_ceiling(tmp_path: Path) -> None:
    """A stop grace has a maximum (60 s): an idle stop is cut at its own bound anyway
    (the next test runs at that maximum)."""
    path = tmp_path / "clawsup.json"
    path.write_text(json.dumps(make_config(sandbox__stopGraceSeconds=61)))
    with pytest.raises(ConfigError, match=r"stopGraceSeconds.*60"):
        load_config(path)


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_idle_stop_of_a_wedged_sandbox_kills_it_and_the_gateway_serves_on(gateway_factory, backend: str) -> None:
    """A session's sandbox goes idle with its host frozen (SIGSTOP: it cannot answer
    Shutdown, and SIGTERM waits) and a command that ignores SIGTERM, under the longest
    stop grace the config allows. Its idle stop overruns its bound: everything it
    started is killed, the supervisor log says so, and meanwhile the gateway serves
    other calls, and a call for that very session waits for the discard and gets a
    fresh sandbox. (This overrun used to fail the gateway's task group.)"""
    require_backend(backend)
    gw = gateway_factory(
        make_config(
            agents__defaults__sandbox={"scope": "session", "backend": backend, "idleStopSeconds": 1},
            sandbox__stopGraceSeconds=60,
            # The heartbeat would kill the frozen host as hung first; this is about the idle stop.
            sandbox__heartbeatIntervalSeconds=120,
        )
    )
    command = {"op": "call", "name": "exec", "session": "stuck", "stream": True, "args": {"command": "trap '' TERM; echo up; exec sleep 300"}}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(gw.client.path))
        conn.sendall(json.dumps(command).encode() + b"\n")
        first = json.loads(conn.makefile("rb").readline())
        assert first == {"output": "up\n"}, first
        sid = session_sandbox("stuck")
        old = psutil.Process(gw.status(sid)["pid"])
        # "up" is written before the shell execs sleep: wait (bounded) for the exec.
        deadline = time.monotonic() + 10
        while True:
            tree = [old, *old.children(recursive=True)]
            if any(p.name() == "sleep" for p in tree) or time.monotonic() > deadline:
                break
        [host] = [p for p in tree if "clawsup.sandbox.host" in " ".join(p.cmdline()) and p.name() != "bwrap"]
        assert any(p.name() == "sleep" for p in tree), [p.cmdline() for p in tree]
        os.kill(host.pid, signal.SIGSTOP)
        # Hanging up ends the call on the supervisor's side; the frozen host never
        # hears of it, so the command runs on.
    pids = [p.pid for p in tree]
    try:
        assert gw.wait(sid, "draining", timeout=15) == "draining"
        fresh: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: fresh.update(call(gw, "exec", {"command": "echo fresh"}, session="stuck")))
        waiter.start()
        # Served while the stuck one is still being stopped; and another session's
        # sandbox, idle meanwhile, is discarded without waiting for it.
        assert call(gw, "echo", {"text": "still here"}) == "still here"
        assert call(gw, "exec", {"command": "echo other"}, session="other")["output"] == "other\n"
        wait_row_gone(gw, workspace_sandbox_id("session", "main", "other"))
        assert gw.status(sid)["state"] == "draining" and gw.status(sid)["pid"] == old.pid

        waiter.join(IDLE_STOP_TIMEOUT_S + 40)
        assert fresh.get("output") == "fresh\n", fresh
        assert wait_gone(pids) == [], [p.cmdline() for p in tree if p.is_running()]
    finally:
        for p in tree:  # never leave a frozen process behind, whatever failed
            with contextlib.suppress(psutil.Error):
                p.kill()  # psutil checks that the pid still names this process
    said = [line for line in gw.supervisor_log().splitlines() if sid in line and "did not stop" in line]
    assert said and f"did not stop within {IDLE_STOP_TIMEOUT_S:g} s (idle for 1 s); killing everything it started" in said[0], said
    assert "Traceback" not in gw.supervisor_log()
    ended = gw.log(sid)  # the fresh sandbox's lines follow the stuck one's
    assert f"killing pid {old.pid}: idle for 1 s" in ended and f"did not stop within {IDLE_STOP_TIMEOUT_S:g} s; killing everything it started" in ended
    assert re.search(rf"pid {old.pid} .*SIGKILL", ended), ended
    # The fresh exec ran in a new sandbox (itself idle and discarded by now, maybe).
    started = [int(pid) for pid in re.findall(r"started pid (\d+)", ended)]
    assert started[-1] != old.pid and ended.rindex("exec 'echo fresh': exit 0") > ended.rindex(f"killing pid {old.pid}"), ended
    assert gw.proc.poll() is None
    assert call(gw, "echo", {"text": "after"}) == "after"
