"""Subagent runs against a running supervisor, with the offline provider scripted so
that the parent spawns and the child works (`/tool NAME {json}` in the task is what
the child's model does): a successful run and its announce, the depth and children
limits, the agent-to-agent allow list, the timeout kill, a crash, /stop cascading
to nested runs, the subagents tool; and, through the real Anthropic SDK against a
local stub, that no child ever holds the API key while every token is counted.

Each run's sandbox is a real child on the configured backend (bwrap where it
works, as CI has it), killed for real."""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from clawsup.supervisor.messages.session_store import file_name, read_session
from tests.conftest import CLAWSUP, PLUGINS, Gateway, make_config, require_backend, wait_gone
from tests.helpers.model_stubs import Stub
from tests.helpers.sse import read_events

MAIN = "agent:main:main"
STATS = re.compile(r"stats: runs (\d+) \((\d+) succeeded, (\d+) failed\) · duration [\d.]+ s · tokens (\d+) in / (\d+) out")


def stats(text: str) -> tuple[str, ...]:
    """The announce's own statistics line (a result may quote a child's)."""
    return STATS.findall(text)[-1]


def config(**subagents: Any) -> dict[str, Any]:
    cfg = make_config(agents__defaults__sandbox={"scope": "agent"})
    cfg["agents"]["defaults"]["subagents"] = subagents
    return cfg


def chat(gw: Gateway, text: str, peer: str = "tester") -> str:
    r = gw.cli("chat", "--peer", peer, "-m", text, "--json", timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    return [json.loads(x)["reply"] for x in r.stdout.splitlines() if "reply" in x][-1]


def spawn(gw: Gateway, peer: str = "tester", **args: Any) -> dict[str, Any]:
    out = chat(gw, "/tool sessions_spawn " + json.dumps(args), peer)
    assert out.startswith("sessions_spawn returned: "), out
    return json.loads(out.split("returned: ", 1)[1])


def tool_task(name: str, **args: Any) -> str:
    """A task that makes the child's (offline) model call one tool."""
    return f"/tool {name} {json.dumps(args)}"


def wait_run(gw: Gateway, run_id: str, timeout: float = 60) -> dict[str, Any]:
    resp = gw.request(op="wait_run", run=run_id, timeout=timeout)
    assert resp["ok"], resp
    return resp["data"]


def session(gw: Gateway, key: str) -> list[dict[str, Any]]:
    return read_session(gw.state / "sessions" / file_name(key))


def announces(gw: Gateway, key: str) -> list[dict[str, Any]]:
    """Announces of the session's children (a run's own end record has a status)."""
    return [r for r in session(gw, key) if r["role"] == "system" and r.get("text", "").startswith("[subagent run") and "status" not in r]


def host_pid(gw: Gateway, run_id: str) -> int:
    """The run's sandbox host itself (under bwrap, not the bwrap around it)."""
    gw.wait(f"subagent-{run_id}", "ready")
    pids = [p for p in gw.host_pids() if f"subagent-{run_id}" in " ".join(psutil.Process(p).cmdline())]
    assert len(pids) == 1, pids
    return pids[0]


def procs_with(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def running_sandboxes(gw: Gateway) -> set[str]:
    return {s["id"] for s in gw.request(op="status")["data"]["sandboxes"]}


def test_a_run_works_in_the_background_and_announces_its_result_with_statistics(gateway_factory: Any) -> None:
    gw = gateway_factory(config())
    accepted = spawn(gw, task=tool_task("exec", command="echo from-the-run > made-by-run.txt; cat made-by-run.txt"), label="writer")
    assert accepted["status"] == "accepted" and accepted["agentId"] == "main" and accepted["label"] == "writer"
    run_id = accepted["runId"]
    assert re.fullmatch(r"agent:main:subagent:[0-9a-f-]{36}", accepted["childSessionKey"])

    run = wait_run(gw, run_id)
    assert run["status"] == "succeeded" and run["depth"] == 1 and run["parentSessionKey"] == MAIN
    assert "from-the-run" in run["result"] and run["modelCalls"] == 2
    # Its file and exec tools worked on the parent's workspace (the default, inherit).
    assert (gw.workspace("workspace-main") / "made-by-run.txt").read_text() == "from-the-run\n"

    # One announce in the parent session: the result and the statistics line...
    chat(gw, "after the run")  # queued behind the announce's turn: that turn is done
    (note,) = announces(gw, MAIN)
    assert f"[subagent run {run_id} 'writer' succeeded]" in note["text"] and "from-the-run" in note["text"]
    runs, ok, failed, t_in, t_out = map(int, stats(note["text"]))
    assert (runs, ok, failed) == (1, 1, 0) and (t_in, t_out) == (run["tokensIn"], run["tokensOut"]) and t_in > 0 and t_out > 0
    # ... which the parent agent turned into a reply of its own.
    recs = session(gw, MAIN)
    answer = next(r for r in recs if r["role"] == "assistant" and r.get("inReplyTo") == note["id"] and "toolCalls" not in r)
    assert "from-the-run" in answer["text"]

    # The child's own session holds its task, its tool call and its end.
    child = session(gw, accepted["childSessionKey"])
    assert child[0]["role"] == "user" and child[0]["text"].startswith("/tool exec")
    assert [r["name"] for r in child if r["role"] == "tool"] == ["exec"]
    assert child[-1]["role"] == "system" and child[-1]["status"] == "succeeded"
    # Its sandbox is gone, its files too; its log stays readable.
    assert f"subagent-{run_id}" not in running_sandboxes(gw)
    assert not (gw.state / "sandboxes" / f"subagent-{run_id}").exists()
    logs = gw.cli("logs", f"subagent-{run_id}")
    assert logs.returncode == 0 and f"run {run_id}: finished after 2 model call(s)" in logs.stdout


@pytest.mark.parametrize("backend", ["process", "bwrap", "docker"])
def test_a_run_lives_in_a_sandbox_on_its_agents_backend(gateway_factory: Any, backend: str) -> None:
    require_backend(backend)
    cfg = config()
    cfg["agents"]["list"] = [{"id": "main", "default": True, "sandbox": {"backend": backend}}]
    gw = gateway_factory(cfg)
    accepted = spawn(gw, task=tool_task("exec", command="echo via-the-supervisor"))
    run = wait_run(gw, accepted["runId"])
    assert run["status"] == "succeeded" and "via-the-supervisor" in run["result"], run
    log = gw.cli("logs", f"subagent-{accepted['runId']}").stdout
    assert f"(backend {backend})" in log and f"run {accepted['runId']}: finished after 2 model call(s)" in log


def test_a_runs_host_has_no_network_under_bwrap(gateway_factory: Any) -> None:
    require_backend("bwrap")
    gw = gateway_factory(config())
    accepted = spawn(gw, task="/sleep 60")
    pid = host_pid(gw, accepted["runId"])
    interfaces = [line.split(":")[0].strip() for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]
    assert interfaces == ["lo"]
    chat(gw, "/stop")
    assert wait_run(gw, accepted["runId"])["status"] == "cancelled"


def test_a_fresh_workspace_is_the_runs_own_and_goes_with_it(gateway_factory: Any) -> None:
    gw = gateway_factory(config(workspace="fresh"))
    accepted = spawn(gw, task=tool_task("exec", command="pwd; echo mine > only-here.txt; ls"))
    run = wait_run(gw, accepted["runId"])
    fresh = f"workspace-run-{accepted['runId']}"
    assert run["status"] == "succeeded" and run["workspace"] == fresh and "only-here.txt" in run["result"]
    assert not (gw.workspace("workspace-main") / "only-here.txt").exists()
    assert fresh not in running_sandboxes(gw) and not (gw.state / "sandboxes" / fresh).exists()
    assert "exec 'pwd; echo mine > only-here.txt; ls': exit 0" in gw.cli("logs", fresh).stdout


def test_the_answer_to_an_announce_reaches_the_users_open_chat(gateway_factory: Any) -> None:
    """The spawning `clawsup chat` call has ended by the time the run reports; a REPL
    still open prints the agent's answer to the announce when it comes."""
    gw = gateway_factory(config())
    repl = subprocess.Popen(
        [*CLAWSUP, "chat", "--peer", "tester", "--json", "--state-dir", str(gw.state)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert repl.stdin is not None and repl.stdout is not None
    try:
        repl.stdin.write("/tool sessions_spawn " + json.dumps({"task": "/sleep 1", "label": "later"}) + "\n")
        repl.stdin.flush()
        seen: list[dict[str, Any]] = []
        while not any("background" in m for m in seen):
            ready, _, _ = select.select([repl.stdout], [], [], 60)
            assert ready, f"no answer to the announce within 60 s; saw {seen}"
            line = repl.stdout.readline()
            assert line, f"the REPL ended; saw {seen}"
            seen.append(json.loads(line))
        spawned = next(m["reply"] for m in seen if "reply" in m)
        run_id = json.loads(spawned.split("returned: ", 1)[1])["runId"]
        (bg,) = [m["background"] for m in seen if "background" in m]
        assert bg["sessionKey"] == MAIN and f"[subagent run {run_id} 'later' succeeded]" in bg["reply"]
    finally:
        repl.stdin.close()
        repl.wait(30)


def test_the_answer_to_an_announce_reaches_an_http_events_stream(gateway_factory: Any) -> None:
    token = "t" * 24
    cfg = config()
    cfg["channels"] = {"http": {"enabled": True, "port": 0, "token": token}}
    gw = gateway_factory(cfg)
    port = int((gw.state / "run" / "http.port").read_text())
    auth = {"Authorization": f"Bearer {token}"}

    def events(conn: http.client.HTTPConnection) -> Iterator[tuple[str, dict[str, Any]]]:
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        return read_events(resp)

    bad = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    bad.request("GET", "/v1/events?peerId=alice", headers={"Authorization": "Bearer wrong"})
    assert bad.getresponse().status == 401
    watch = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    watch.request("GET", "/v1/events?peerId=alice", headers=auth)
    stream = events(watch)
    assert next(stream) == ("ready", {})
    post = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"text": "/tool sessions_spawn " + json.dumps({"task": "/sleep 0.5", "label": "web"}), "peer": {"kind": "direct", "id": "alice"}}
    post.request("POST", "/v1/messages", json.dumps(body), {**auth, "Content-Type": "application/json"})
    replies = [data for ev, data in events(post) if ev == "reply"]
    run_id = json.loads(replies[0]["text"].split("returned: ", 1)[1])["runId"]
    ev, data = next(stream)  # the answer to the announce, after the POST has ended
    assert ev == "reply" and data["sessionKey"] == MAIN and f"[subagent run {run_id} 'web' succeeded]" in data["text"]
    watch.close()


def test_depth_limit_and_each_level_hears_only_its_own_children(gateway_factory: Any) -> None:
    gw = gateway_factory(config(maxSpawnDepth=2))
    leaf_task = tool_task("sessions_spawn", task="/tool sessions_spawn {\"task\": \"too deep\"}", label="leaf")
    mid = spawn(gw, task=leaf_task, label="mid")
    run = wait_run(gw, mid["runId"])
    assert run["status"] == "succeeded"
    (leaf,) = run["children"]
    assert leaf["depth"] == 2 and leaf["status"] == "succeeded" and leaf["parentSessionKey"] == mid["childSessionKey"]
    # At the deepest level the spawn tools are withheld: the leaf's call was refused.
    leaf_tools = [r for r in session(gw, leaf["childSessionKey"]) if r["role"] == "tool"]
    assert leaf_tools[0]["isError"] and "'sessions_spawn' is not available to this subagent run" in leaf_tools[0]["content"]
    # The leaf reported to the mid run, not to the main session; the main session
    # heard once, from the mid run, whose statistics cover both.
    mid_notes = announces(gw, mid["childSessionKey"])
    assert len(mid_notes) == 1 and f"[subagent run {leaf['runId']} 'leaf' succeeded]" in mid_notes[0]["text"]
    chat(gw, "sync")
    (note,) = announces(gw, MAIN)
    assert f"run {mid['runId']} 'mid'" in note["text"] and leaf["runId"] not in note["text"].splitlines()[0]
    assert stats(note["text"])[:3] == ("2", "2", "0")
    # `clawsup status` draws the runs as a tree under the session.
    out = gw.cli("status").stdout
    lines = out[out.index("subagent runs") :].splitlines()
    i_main = next(i for i, x in enumerate(lines) if MAIN in x)
    i_mid = next(i for i, x in enumerate(lines) if mid["runId"] in x)
    i_leaf = next(i for i, x in enumerate(lines) if leaf["runId"] in x)
    assert i_main < i_mid < i_leaf
    col = lambda line, word: line.index(word)  # noqa: E731
    assert col(lines[i_main], "agent:") < col(lines[i_mid], mid["runId"]) < col(lines[i_leaf], leaf["runId"])


def test_with_the_default_depth_a_subagent_cannot_spawn(gateway_factory: Any) -> None:
    gw = gateway_factory(config())
    accepted = spawn(gw, task=tool_task("sessions_spawn", task="anything"))
    run = wait_run(gw, accepted["runId"])
    assert run["status"] == "succeeded" and run["children"] == []
    assert "'sessions_spawn' is not available to this subagent run" in run["result"]


def test_children_limit_counts_running_runs_and_stop_frees_them(gateway_factory: Any) -> None:
    cfg = config(maxChildrenPerAgent=2)
    cfg["session"] = {"dmScope": "per-peer"}
    gw = gateway_factory(cfg)
    first = spawn(gw, task="/sleep 60")
    second = spawn(gw, task="/sleep 60")
    out = chat(gw, "/tool sessions_spawn " + json.dumps({"task": "/sleep 60"}))
    assert out.startswith("sessions_spawn failed:") and "maxChildrenPerAgent is 2" in out
    # Another session has its own count.
    other = spawn(gw, peer="someone-else", task="/sleep 60")
    assert other["status"] == "accepted"
    assert chat(gw, "/stop") == "cancelled 2 subagent runs (and what they spawned)."
    for r in (first, second):
        assert wait_run(gw, r["runId"])["status"] == "cancelled"
    # The other session's run goes on; a slot is free again here.
    assert gw.request(op="status")["data"]["runs"] and f"subagent-{other['runId']}" in running_sandboxes(gw)
    assert spawn(gw, task="done at once")["status"] == "accepted"
    chat(gw, "/stop", peer="someone-else")
    assert wait_run(gw, other["runId"])["status"] == "cancelled"


def test_the_subagent_policy_layer_narrows_a_runs_tools(gateway_factory: Any) -> None:
    cfg = config()
    cfg["tools"] = {"subagents": {"tools": {"deny": ["exec"]}}}
    gw = gateway_factory(cfg)
    assert gw.exec("echo the-parent-may")["output"] == "the-parent-may\n"
    run = wait_run(gw, spawn(gw, task=tool_task("exec", command="echo the-child-may-not"))["runId"])
    assert run["status"] == "succeeded" and "'exec' is not available to this subagent run" in run["result"]
    assert "the-child-may-not" not in gw.log("workspace-main")
    # Plugin tools go through the supervisor too, to their own sandbox.
    run = wait_run(gw, spawn(gw, task=tool_task("echo", text="through the supervisor"))["runId"])
    assert run["result"] == "echo returned: through the supervisor"


def test_a_plugin_cannot_use_what_a_run_may_ask(gateway_factory: Any) -> None:
    """Model and tool calls over the stream are a run's, bound to it by the
    supervisor; a plugin asking for them is refused."""
    cfg = config()
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    gw = gateway_factory(cfg)
    for method in ("model.complete", "tool.call", "runs.wait"):
        r = gw.call("chaos_ask", {"method": method, "payload": {"messages": [{"role": "user", "text": "spend my tokens"}], "name": "exec", "args": {"command": "id"}}})
        assert r["ok"] and r["data"]["result"]["ok"] is False, r
        assert f"plugin 'chaos' is not allowed to call {method!r}" in r["data"]["result"]["error"]
    assert "refused request 'tool.call'" in gw.log("chaos")


def test_agent_to_agent_allow_list(gateway_factory: Any) -> None:
    cfg = config()
    cfg["agents"]["list"] = [{"id": "main", "default": True}, {"id": "helper"}, {"id": "other"}]
    cfg["tools"] = {"agentToAgent": {"enabled": True, "allow": ["help*"]}}
    gw = gateway_factory(cfg)
    ok = spawn(gw, task="hello helper", agentId="helper")
    assert ok["agentId"] == "helper" and ok["childSessionKey"].startswith("agent:helper:subagent:")
    run = wait_run(gw, ok["runId"])
    assert run["status"] == "succeeded" and run["agentId"] == "helper" and run["result"].startswith("[helper] received in agent:helper:subagent:")
    refused = chat(gw, "/tool sessions_spawn " + json.dumps({"task": "x", "agentId": "other"}))
    assert "agentId is not allowed for sessions_spawn" in refused and "'other'" in refused
    # Identity is the supervisor's: the arguments cannot carry any of it.
    forged = chat(gw, "/tool sessions_spawn " + json.dumps({"task": "x", "depth": 0, "sessionKey": "agent:other:main"}))
    assert forged.startswith("sessions_spawn failed:") and "depth" in forged and "Extra inputs are not permitted" in forged


def test_agent_to_agent_is_off_by_default(gateway_factory: Any) -> None:
    cfg = config()
    cfg["agents"]["list"] = [{"id": "main", "default": True}, {"id": "helper"}]
    gw = gateway_factory(cfg)
    out = chat(gw, "/tool sessions_spawn " + json.dumps({"task": "x", "agentId": "helper"}))
    assert "agentId is not allowed for sessions_spawn" in out
    assert gw.request(op="status")["data"]["runs"] == []


def test_run_timeout_kills_the_child_and_what_it_started(gateway_factory: Any) -> None:
    gw = gateway_factory(config())
    marker = "31.4159"
    accepted = spawn(gw, task=tool_task("exec", command=f"sleep {marker}"), runTimeoutSeconds=3)
    pid = host_pid(gw, accepted["runId"])
    gw.wait_log("workspace-main", f"exec 'sleep {marker}': started")
    run = wait_run(gw, accepted["runId"])
    assert run["status"] == "timed_out" and "did not finish within 3 s (runTimeoutSeconds)" in run["reason"]
    assert 2.9 < run["durationS"] < 10
    assert wait_gone([pid]) == [] and wait_gone(procs_with(f"sleep {marker}")) == []
    chat(gw, "sync")
    (note,) = announces(gw, MAIN)
    assert "timed out]" in note["text"] and stats(note["text"])[:3] == ("1", "0", "1")
    assert "timed_out" in gw.supervisor_log() and f"subagent run {accepted['runId']}" in gw.supervisor_log()


def test_a_crashed_child_is_a_failed_run_and_the_gateway_goes_on(gateway_factory: Any) -> None:
    gw = gateway_factory(config())
    accepted = spawn(gw, task="/sleep 60", label="doomed")
    run_id = accepted["runId"]
    pid = host_pid(gw, run_id)
    os.kill(pid, signal.SIGKILL)
    run = wait_run(gw, run_id)
    # The caller (the parent session) is told clearly...
    assert run["status"] == "failed" and "was killed by SIGKILL" in run["reason"]
    chat(gw, "sync")
    (note,) = announces(gw, MAIN)
    assert f"[subagent run {run_id} 'doomed' failed]" in note["text"] and "killed by SIGKILL" in note["text"]
    # ... what the child held is gone (its sandbox, its files) ...
    assert f"subagent-{run_id}" not in running_sandboxes(gw)
    assert not (gw.state / "sandboxes" / f"subagent-{run_id}").exists()
    assert not any(r["owner"] == f"subagent-{run_id}" for r in gw.request(op="tools")["data"]["tools"])
    # ... the logs say why ...
    assert "killed by SIGKILL" in gw.cli("logs", f"subagent-{run_id}").stdout
    assert re.search(rf"subagent run {run_id} \(doomed\) failed: its sandbox was killed by SIGKILL", gw.supervisor_log())
    # ... and everything else goes on: tools, and a new run.
    assert gw.exec("echo still-here")["output"] == "still-here\n"
    again = spawn(gw, task="second try")
    assert wait_run(gw, again["runId"])["status"] == "succeeded"


def test_runs_the_supervisor_lost_are_reported_when_it_starts_again(gateway_factory: Any) -> None:
    gw = gateway_factory(config())
    killed = spawn(gw, task="/sleep 60", label="lost")
    pid = host_pid(gw, killed["runId"])
    gw.kill()  # SIGKILL: nothing is reported, and the run's host dies with it
    assert wait_gone([pid]) == []
    gw = gateway_factory(config())
    chat(gw, "sync")
    (note,) = announces(gw, MAIN)
    assert f"[subagent run {killed['runId']} 'lost' failed]" in note["text"] and "the gateway stopped while the run was going" in note["text"]
    assert stats(note["text"])[:3] == ("1", "0", "1")
    assert f"subagent run {killed['runId']} (lost) of {MAIN} was not reported" in gw.supervisor_log()

    # A polite stop cannot deliver its runs' reports either; the next start does.
    stopped = spawn(gw, task="/sleep 60", label="stopped")
    host_pid(gw, stopped["runId"])
    assert gw.stop() == 0
    gw = gateway_factory(config())
    chat(gw, "sync")
    notes = announces(gw, MAIN)
    assert len(notes) == 2 and f"[subagent run {stopped['runId']} 'stopped' cancelled]" in notes[1]["text"]
    assert "the gateway is shutting down" in notes[1]["text"] and "reported when the gateway started again" in notes[1]["text"]
    # Each run is reported once: another start says nothing more.
    gw.stop()
    gw = gateway_factory(config())
    chat(gw, "sync")
    assert len(announces(gw, MAIN)) == 2


def test_stop_cascades_to_nested_runs(gateway_factory: Any) -> None:
    gw = gateway_factory(config(maxSpawnDepth=2))
    marker = "27.1828"
    mid = spawn(gw, task=tool_task("sessions_spawn", task=tool_task("exec", command=f"sleep {marker}"), label="leaf"), label="mid")
    gw.wait_log("workspace-main", f"exec 'sleep {marker}': started")
    tree = gw.request(op="status")["data"]["runs"]
    (leaf,) = tree[0]["runs"][0]["children"]
    pids = [host_pid(gw, mid["runId"]), host_pid(gw, leaf["runId"]), *procs_with(f"sleep {marker}")]
    assert len(pids) >= 3
    assert chat(gw, "/stop") == "cancelled 1 subagent run (and what they spawned)."
    mid_run = wait_run(gw, mid["runId"])
    assert mid_run["status"] == "cancelled" and mid_run["reason"] == "/stop in its parent session"
    assert mid_run["children"][0]["status"] == "cancelled" and "its parent run" in mid_run["children"][0]["reason"]
    assert wait_gone(pids) == []
    assert not {f"subagent-{mid['runId']}", f"subagent-{leaf['runId']}"} & running_sandboxes(gw)
    # The main session hears of its own run only.
    chat(gw, "sync")
    (note,) = announces(gw, MAIN)
    assert f"run {mid['runId']} 'mid' cancelled]" in note["text"]


def test_the_subagents_tool_lists_and_kills_only_the_callers_runs(gateway_factory: Any) -> None:
    cfg = config()
    cfg["session"] = {"dmScope": "per-peer"}
    gw = gateway_factory(cfg)
    mine = spawn(gw, task="/sleep 60", label="mine")
    theirs = spawn(gw, peer="bob", task="/sleep 60", label="theirs")
    listed = json.loads(chat(gw, "/tool subagents {}").split("returned: ", 1)[1])
    assert [r["runId"] for r in listed["runs"]] == [mine["runId"]]
    refused = chat(gw, '/tool subagents {"action": "kill", "target": "theirs"}')
    assert "no running run 'theirs' of yours" in refused
    killed = json.loads(chat(gw, '/tool subagents {"action": "kill", "target": "mine"}').split("returned: ", 1)[1])
    assert killed == {"killed": [mine["runId"]]}
    run = wait_run(gw, mine["runId"])
    assert run["status"] == "cancelled" and "subagents tool" in run["reason"]
    assert gw.request(op="status")["data"]["runs"] and f"subagent-{theirs['runId']}" in running_sandboxes(gw)
    chat(gw, '/tool subagents {"action": "kill", "target": "all"}', peer="bob")
    assert wait_run(gw, theirs["runId"])["status"] == "cancelled"


def test_no_child_holds_the_api_key_and_every_token_is_counted(gateway_factory: Any) -> None:
    secret = "sk-ant-test-" + os.urandom(12).hex()
    marker = "23.4567"

    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        first = body["messages"][-1]["content"][0]
        said = first.get("text", "") if first["type"] == "text" else ""
        if "subagent" not in body["system"]:  # the parent's turns
            if said.startswith("please"):
                return [{"tool": "sessions_spawn", "args": {"task": "look around", "label": "keyless"}}]
            return [{"text": "noted"}]
        if said == "look around":  # the child's task
            return [{"tool": "exec", "args": {"command": f"sleep {marker}; echo slept"}}]
        return [{"text": "child done"}]

    with Stub(script, usage=(37, 11)) as stub:
        cfg = config()
        cfg["agents"]["list"] = [{"id": "main", "default": True, "model": "anthropic/claude-stub"}]
        cfg["providers"] = {"anthropic": {"baseUrl": stub.url, "maxRetries": 0}}
        gw = gateway_factory(cfg, env={"ANTHROPIC_API_KEY": secret})
        chat(gw, "please hand this off")
        run_id = gw.request(op="status")["data"]["runs"][0]["runs"][0]["runId"]
        pid = host_pid(gw, run_id)
        gw.wait_log("workspace-main", f"exec 'sleep {marker}; echo slept': started")
        # While it runs: not in its environment, its argv, or any file it has.
        proc = psutil.Process(pid)
        assert secret not in " ".join(f"{k}={v}" for k, v in proc.environ().items())
        assert "ANTHROPIC_API_KEY" not in proc.environ()
        assert secret not in " ".join(proc.cmdline())
        own = [gw.state / "sandboxes" / f"subagent-{run_id}", Path(proc.cwd())]
        for root in own:
            for f in (p for p in root.rglob("*") if p.is_file()):
                assert secret.encode() not in f.read_bytes(), f
        run = wait_run(gw, run_id)
        assert run["status"] == "succeeded" and run["result"] == "child done"
        # The child's model calls were made here, with the key.
        child_calls = [k for k, body in zip(stub.api_keys, stub.requests) if "subagent" in body["system"]]
        assert child_calls == [secret, secret]
        # Tokens: exactly what the API reported, per call and in the announce.
        assert (run["modelCalls"], run["tokensIn"], run["tokensOut"]) == (2, 74, 22)
        chat(gw, "and now?")
        (note,) = announces(gw, MAIN)
        assert stats(note["text"]) == ("1", "1", "0", "74", "22")
        child = session(gw, run["childSessionKey"])
        assert [r["usage"] for r in child if r["role"] == "assistant"] == [{"in": 37, "out": 11}] * 2
        # The parent's own turns are counted in its session the same way: each model
        # call's record has its usage, and each answer its turn's total.
        parent = [r for r in session(gw, MAIN) if r["role"] == "assistant"]
        assert all(r["usage"] == {"in": 37, "out": 11} for r in parent)
        assert [r["turnUsage"] for r in parent if "turnUsage" in r] == [{"in": 74, "out": 22}, {"in": 37, "out": 11}, {"in": 37, "out": 11}]


def test_loop_detection_holds_in_a_run(gateway_factory: Any) -> None:
    """The run's loop is in the child; the counting is the supervisor's."""

    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if "subagent" not in body["system"]:
            return [{"tool": "sessions_spawn", "args": {"task": "loop"}}] if n == 1 else [{"text": "ok"}]
        return [{"tool": "echo", "args": {"text": "again"}, "id": f"toolu_{n}"}]

    with Stub(script) as stub:
        cfg = config()
        cfg["agents"]["list"] = [{"id": "main", "default": True, "model": "anthropic/claude-stub"}]
        cfg["providers"] = {"anthropic": {"baseUrl": stub.url, "maxRetries": 0}}
        gw = gateway_factory(cfg, env={"ANTHROPIC_API_KEY": "sk-test"})
        chat(gw, "go")
        run_id = gw.request(op="status")["data"]["runs"][0]["runs"][0]["runId"]
        run = wait_run(gw, run_id)
        assert run["status"] == "failed" and "stopped: the same tool call kept repeating (loop detection)" in run["reason"]
        # Warned at the third call (the model saw it), stopped before a sixth model call.
        child = [b for b in stub.requests if "subagent" in b["system"]]
        assert len(child) == 5
        texts = [c.get("text", "") for m in child[3]["messages"] for c in m["content"] if isinstance(m["content"], list)]
        assert any("You are repeating the same tool call" in t for t in texts)


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"task": ""}, "task: String should have at least 1 character"),
        ({"task": "x", "runTimeoutSeconds": -1}, "runTimeoutSeconds: Input should be greater than 0"),
        ({"label": "no task"}, "task: Field required"),
        ({"task": "x", "runTimeoutSeconds": 99999}, "runTimeoutSeconds: at most 3600"),
    ],
)
def test_bad_spawn_arguments_are_explained_to_the_model(module_gateways: Any, bad: dict[str, Any], says: str) -> None:
    gw = module_gateways("bad-args", config(), env={"ANTHROPIC_API_KEY": ""})
    out = chat(gw, "/tool sessions_spawn " + json.dumps(bad))
    assert out.startswith("sessions_spawn failed: bad arguments for tool 'sessions_spawn'") and says in out, out
    assert gw.request(op="status")["data"]["runs"] == []


def test_a_model_the_gateway_cannot_use_refuses_the_spawn(module_gateways: Any) -> None:
    gw = module_gateways("bad-args", config(), env={"ANTHROPIC_API_KEY": ""})
    out = chat(gw, "/tool sessions_spawn " + json.dumps({"task": "x", "model": "anthropic/claude-x"}))
    assert out.startswith("sessions_spawn failed:") and "model 'anthropic/claude-x' needs $ANTHROPIC_API_KEY" in out, out
    assert gw.request(op="status")["data"]["runs"] == []
