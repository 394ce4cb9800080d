"""The operator's view: `clawsup` commands against a real running supervisor."""

from __future__ import annotations

import json
import os
import queue
import stat
import subprocess
import threading

from tests.conftest import CLAWSUP, PLUGINS, Gateway, make_config


def with_chaos() -> dict:
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    return cfg


def test_status_json_has_every_field(gateway_factory) -> None:
    gw: Gateway = gateway_factory()
    r = gw.cli("status", "--json")
    assert r.returncode == 0, r.stderr
    [sb] = json.loads(r.stdout)["sandboxes"]
    assert set(sb) >= {"id", "plugin", "backend", "state", "pid", "restarts", "uptime_s", "rss_bytes", "tools", "last_exit"}
    assert sb["id"] == "basics" and sb["state"] == "ready" and sb["backend"] == "process"
    assert sb["pid"] in gw.host_pids() and sb["rss_bytes"] > 1_000_000 and sb["uptime_s"] >= 0
    assert sorted(sb["tools"]) == ["calc", "echo", "now"] and sb["last_exit"] is None
    human = gw.cli("status")
    assert human.returncode == 0 and "basics" in human.stdout and "ready" in human.stdout
    assert "FAILED" not in human.stdout


def test_status_marks_a_failed_sandbox_so_it_cannot_be_missed(gateway_factory) -> None:
    """A plugin that crashes at every start spends its restart budget and is failed
    until an operator acts: status says so in capitals, with the reason of its last
    exit and the command that retries it, in colour on a terminal and in plain words
    through a pipe, however narrow."""
    cfg = with_chaos()
    restart = {"maxRestarts": 1, "backoffInitialSeconds": 0.05, "backoffMaxSeconds": 0.05}
    cfg["plugins"]["entries"]["chaos"] = {"config": {"onRegister": "crash"}, "sandbox": {"restart": restart}}
    gw = gateway_factory(cfg)
    assert gw.wait("chaos", "failed", timeout=30) == "failed"
    assert gw.status("chaos")["last_exit"]["text"].startswith("was killed by SIGSEGV")

    summary = "FAILED: sandbox chaos was killed by SIGSEGV"
    hint = "and will not restart by itself; `clawsup restart chaos` tries again, `clawsup logs chaos` shows why."
    for columns in ("400", "80"):
        env = {**os.environ, "COLUMNS": columns}
        plain = subprocess.run([*CLAWSUP, "status", "--state-dir", str(gw.state)], capture_output=True, text=True, timeout=60, env=env)
        assert plain.returncode == 0, plain.stderr
        assert "\x1b[" not in plain.stdout
        lines = plain.stdout.splitlines()
        states = [cell for r in lines if r.startswith("│ ") and (cell := r.split("│")[2].strip())]
        assert states == ["ready", "FAILED"]
        # One line under the table, whole even at 80 columns.
        [line] = [line for line in lines if line.startswith("FAILED:")]
        assert line.startswith(summary) and line.endswith(hint), line
        assert lines.index(line) > next(i for i, r in enumerate(lines) if r.startswith("└"))

    coloured = subprocess.run(
        [*CLAWSUP, "status", "--state-dir", str(gw.state)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "400", "FORCE_COLOR": "1", "TERM": "xterm-256color"},
    )  # fmt: skip
    assert "\x1b[1;31mFAILED\x1b[0m" in coloured.stdout and "\x1b[1;31mFAILED:\x1b[0m sandbox chaos" in coloured.stdout
    # The JSON keeps the state's name; the other plugin is untouched.
    states = {s["id"]: s["state"] for s in json.loads(gw.cli("status", "--json").stdout)["sandboxes"]}
    assert states == {"basics": "ready", "chaos": "failed"}
    assert gw.call("echo", {"text": "still here"})["data"]["result"] == "still here"


def test_tools_list_json(gateway_factory) -> None:
    gw = gateway_factory()
    tools = json.loads(gw.cli("tools", "list", "--json").stdout)["tools"]
    core = {name: "core" for name in ("exec", "read", "write", "edit", "list_dir", "sessions_spawn", "subagents", "cron")}
    assert {t["name"]: t["owner"] for t in tools} == {"calc": "basics", "echo": "basics", "now": "basics", **core}
    assert all(t["description"] for t in tools)


def test_tools_call_success_and_failure(gateway_factory) -> None:
    gw = gateway_factory()
    ok = gw.cli("tools", "call", "calc", "--args", '{"expression": "6 * 7"}')
    assert ok.returncode == 0 and ok.stdout.strip() == "42"
    js = gw.cli("tools", "call", "now", "--args", '{"timezone": "UTC"}', "--json")
    body = json.loads(js.stdout)
    assert js.returncode == 0 and body["ok"] is True and body["result"]["timezone"] == "UTC"

    bad = gw.cli("tools", "call", "calc", "--args", '{"expression": "__import__(1)"}')
    assert bad.returncode == 1 and "tool 'calc' (plugin 'basics') failed" in bad.stderr
    badjs = gw.cli("tools", "call", "nope", "--json")
    assert badjs.returncode == 1
    assert json.loads(badjs.stdout) == {"ok": False, "error": "no tool named 'nope' is registered; available tools: calc, cron, echo, edit, exec, list_dir, now, read, sessions_spawn, subagents, write"}
    usage = gw.cli("tools", "call", "echo", "--args", "{not json")
    assert usage.returncode == 2 and "--args is not valid JSON" in usage.stderr


def test_logs_tail_and_follow(gateway_factory) -> None:
    gw = gateway_factory(with_chaos())
    r = gw.cli("logs", "chaos", "-n", "2")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2
    unknown = gw.cli("logs", "chaso")
    assert unknown.returncode == 1 and "no sandbox named 'chaso'; known: basics, chaos" in unknown.stderr

    follower = subprocess.Popen([*CLAWSUP, "logs", "chaos", "-f", "-n", "1", "--state-dir", str(gw.state)], stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in follower.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        # The past line arrives after the follower subscribed: from here on it misses nothing.
        assert "ready" in lines.get(timeout=30)
        # The plugin logs through the child's stream; the follower sees it live.
        resp = gw.call("chaos_ask", {"method": "log", "payload": {"level": "warning", "message": "marker-4711"}})
        assert resp["data"]["result"] == {"ok": True, "reply": {}}
        while True:
            line = lines.get(timeout=20)
            if "marker-4711" in line:
                break
        assert "[plugin] WARNING marker-4711" in line
    finally:
        follower.terminate()
        follower.wait(10)


def test_child_stream_refuses_methods_it_may_not_call(gateway_factory) -> None:
    gw = gateway_factory(with_chaos())
    resp = gw.call("chaos_ask", {"method": "read_api_keys"})["data"]["result"]
    assert resp["ok"] is False
    assert "SupervisorRefused: plugin 'chaos' is not allowed to call 'read_api_keys'" in resp["error"]
    assert "refused request 'read_api_keys'" in gw.log("chaos")


def test_control_socket_is_private(gateway_factory) -> None:
    gw = gateway_factory()
    sock = gw.state / "run" / "control.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE((gw.state / "run").stat().st_mode) == 0o700
    # Children running as their own uids reach their socket folder by name through an
    # enter-only parent; as the supervisor's user it sits inside the private run/.
    own_uid = gw.status("basics")["uid"] is not None
    hosts = gw.state / ("hosts" if own_uid else "run/hosts")
    assert stat.S_IMODE(hosts.stat().st_mode) == (0o711 if own_uid else 0o700)
    assert stat.S_IMODE((hosts / "basics").stat().st_mode) == 0o700


def test_bad_control_request_names_the_field(gateway_factory) -> None:
    gw = gateway_factory()
    resp = gw.request(op="call", name="echo", args=[1, 2])
    assert resp["ok"] is False and resp["error"]["code"] == "bad_request"
    assert "call.args" in resp["error"]["message"]
    assert gw.request(op="dance")["error"]["code"] == "bad_request"


def test_second_supervisor_on_same_state_is_refused(gateway_factory) -> None:
    gw = gateway_factory()
    r = subprocess.run([*CLAWSUP, "start", "--state-dir", str(gw.state)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "already runs" in r.stderr
    assert gw.call("echo", {"text": "x"})["ok"]


def test_stop_then_commands_without_supervisor(gateway_factory) -> None:
    gw = gateway_factory()
    hosts = gw.host_pids()
    r = gw.cli("stop")
    assert r.returncode == 0 and "stopped" in r.stdout
    assert gw.proc.wait(10) == 0
    assert all(not os.path.exists(f"/proc/{p}") or open(f"/proc/{p}/stat").read().split()[2] == "Z" for p in hosts)
    st = gw.cli("status")
    assert st.returncode == 3 and "no supervisor is running" in st.stderr
    # Logs stay readable after the supervisor is gone.
    logs = gw.cli("logs", "basics", "-n", "5")
    assert logs.returncode == 0 and "draining → stopped" in logs.stdout


def test_sigterm_stops_cleanly(gateway_factory) -> None:
    gw = gateway_factory()
    assert gw.stop() == 0
    assert "clawsup supervisor stopped" in "".join(gw.output)


def test_plugin_flag_loads_a_folder(gateway_factory) -> None:
    gw = gateway_factory(make_config(), plugins=[PLUGINS / "chaos"])
    assert gw.tools()["chaos_ok"] == "chaos"


def test_start_without_config_runs_the_bundled_default(gateway_factory) -> None:
    """The README's first command: no --config, no API key, no network."""
    gw = gateway_factory(None, env={"ANTHROPIC_API_KEY": "", "OPENAI_API_KEY": ""})
    assert set(gw.tools()) == {"calc", "echo", "now", "exec", "read", "write", "edit", "list_dir", "sessions_spawn", "subagents", "cron"}
    r = gw.cli("tools", "call", "echo", "--args", '{"text": "hello"}')
    assert r.returncode == 0 and r.stdout.strip() == "hello"
    # The default agent's workspace sandbox starts with the gateway.
    assert gw.status("workspace-main")["state"] == "ready"
    r = gw.cli("tools", "call", "exec", "--args", '{"command": "echo from-the-sandbox"}')
    assert r.returncode == 0 and "from-the-sandbox" in r.stdout, r.stderr
    assert "chaos" not in gw.tools().values()
