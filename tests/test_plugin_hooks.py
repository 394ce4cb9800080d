"""Plugins' hooks end to end, against real gateways and hostile test plugins
(tests/plugins/gatekeeper, tests/plugins/usher): a `before_tool_call` gate blocks or
changes a call, and sees other plugins' tools only where granted; a gate that hangs,
raises or crashes refuses the call it guards (fails closed) with a reason naming the
plugin, while the gateway goes on answering, unless the operator set failOpen;
modifying hooks run by priority; observing hooks arrive and never hold up a turn; a
content hook the operator did not grant is refused at registration."""

from __future__ import annotations

import inspect
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from clawsup.sandbox.api import PluginApi
from clawsup.sandbox.manifest import ManifestError, load_manifest
from tests.conftest import TEST_PLUGINS, Gateway, make_config, require_bwrap

GATEKEEPER = TEST_PLUGINS / "gatekeeper"
USHER = TEST_PLUGINS / "usher"
DEADLINE_S = 2
CONTENT = ["before_tool_call", "after_tool_call", "before_agent_start", "agent_end", "message_received", "message_sending"]


def hooks_config(backend: str = "process", *, usher: bool = False, **hooks: Any) -> dict[str, Any]:
    """basics and gatekeeper (and usher) on `backend`; `hooks`: gatekeeper's
    `plugins.entries.gatekeeper.hooks`."""
    cfg = make_config(sandbox__defaults__backend=backend)
    cfg["plugins"]["load"]["paths"].append(str(GATEKEEPER))
    cfg["session"] = {"dmScope": "per-channel-peer"}
    trust = {"trust": "trusted"} if backend == "process" else {}
    cfg["plugins"]["entries"]["gatekeeper"] = {"hooks": {"timeoutSeconds": DEADLINE_S, **hooks}, **trust}
    if usher:
        cfg["plugins"]["load"]["paths"].append(str(USHER))
        cfg["plugins"]["entries"]["usher"] = {"hooks": {"allow": ["before_tool_call", "before_agent_start"], "timeoutSeconds": DEADLINE_S}, **trust}
    return cfg


@pytest.fixture
def gw(module_gateways: Any) -> Gateway:
    """A gateway whose gatekeeper holds every content grant, with usher beside it;
    for the tests that leave its plugins as they found them."""
    return module_gateways("granted", hooks_config(usher=True, allow=CONTENT))


# -- talking to it -------------------------------------------------------------


def refused(resp: dict[str, Any], code: str = "blocked_by_hook") -> str:
    assert not resp["ok"], resp
    assert resp["error"]["code"] == code, resp
    return str(resp["error"]["message"])


def result(resp: dict[str, Any]) -> Any:
    assert resp["ok"], resp
    return resp["data"]["result"]


def chat(gw: Gateway, text: str, peer: str = "tester") -> str:
    """One message on the cli channel; its final reply."""
    r = gw.cli("chat", "--peer", peer, "-m", text, "--json", timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    return [json.loads(x)["reply"] for x in r.stdout.splitlines() if "reply" in json.loads(x)][-1]


def seen(gw: Gateway, hook: str, where: Any = lambda e: True, timeout: float = 10) -> list[dict[str, Any]]:
    """gatekeeper's record of `hook`'s events that match `where`, once there is one
    (observers run in the background); bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        events = [e for e in result(gw.call("gk_seen", {"hook": hook})) if where(e)]
        if events or time.monotonic() > deadline:
            return events
        # Each poll is a round trip through two sandboxes; no sleep needed between them.


def plugin_row(gw: Gateway, pid: str) -> dict[str, Any]:
    return next(p for p in gw.request(op="plugins")["data"]["plugins"] if p["id"] == pid)


def hooks_registered(gw: Gateway, pid: str) -> list[str]:
    return sorted(r["name"] if isinstance(r, dict) else r for r in plugin_row(gw, pid)["offers"]["hooks"]["registered"])


# -- gates -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_a_granted_gate_blocks_and_rewrites_other_plugins_calls(gateway_factory: Any, backend: str) -> None:
    if backend == "bwrap":
        require_bwrap()
    gw = gateway_factory(hooks_config(backend, allow=["before_tool_call"]))
    assert gw.status("gatekeeper")["backend"] == backend
    # basics' echo, guarded by gatekeeper's gate: refused with the gate's reason.
    said = refused(gw.call("echo", {"text": "say a forbidden word"}))
    assert said.startswith("tool 'echo' was refused") and "plugin 'gatekeeper'" in said and said.endswith(": no forbidden words"), said
    assert "no forbidden words" in gw.wait_log("gatekeeper", "hook before_tool_call blocked 'echo'")
    # A call the gate lets by, and one it changes: the tool sees the new arguments.
    assert result(gw.call("echo", {"text": "hello"})) == "hello"
    assert result(gw.call("echo", {"text": "please rewrite this"})) == "please rewritten by gatekeeper this"
    # What the gate was shown: the tool's name and the arguments as called.
    shown = seen(gw, "before_tool_call", lambda e: e["text"] == "please rewrite this")
    assert shown == [{"hook": "before_tool_call", "toolName": "echo", "text": "please rewrite this"}]
    # A change that breaks the tool's schema never reaches the tool.
    assert "text" in refused(gw.call("echo", {"text": "badrewrite"}), "bad_arguments")
    # A gate that raises refuses the call, naming the plugin and the exception.
    said = refused(gw.call("echo", {"text": "raise"}))
    assert "plugin 'gatekeeper'" in said and "RuntimeError" in said and "gate raised on purpose" in said and "fails closed" in said, said
    assert gw.status("gatekeeper")["state"] == "ready"
    # The grant is shown in `plugins show`.
    row = json.loads(gw.cli("plugins", "show", "gatekeeper", "--json").stdout)
    row = row[0] if isinstance(row, list) else row
    assert row["grants"]["hooksAllow"] == ["before_tool_call"] and row["grants"]["failOpen"] is False, row


def test_an_ungranted_gate_sees_only_its_own_tools_and_content_hooks_are_refused(gateway_factory: Any) -> None:
    gw = gateway_factory(hooks_config())
    # Another plugin's tool is not the gate's to see: it passes, the gate never asked.
    assert result(gw.call("echo", {"text": "a forbidden word"})) == "a forbidden word"
    assert result(gw.call("gk_seen", {"hook": "before_tool_call"})) == []
    # Its own tools are gated.
    said = refused(gw.call("gk_echo", {"text": "a forbidden word"}))
    assert said.endswith("no forbidden words"), said
    # The hooks that read sessions' text were refused at registration, and say why.
    row = plugin_row(gw, "gatekeeper")
    registered = hooks_registered(gw, "gatekeeper")
    assert registered == ["after_tool_call", "before_tool_call", "gateway_start", "session_start", "subagent_spawned"], registered
    for hook in ["message_received", "message_sending", "before_agent_start", "agent_end"]:
        why = [r for r in row["refused"] if f"hook {hook!r}" in r]
        assert why and "plugins.entries.gatekeeper.hooks.allow" in why[0], (hook, row["refused"])
    shown = gw.cli("plugins", "show", "gatekeeper")
    assert shown.returncode == 0 and "message_received" in shown.stdout, shown.stdout
    assert "hook 'message_received'" in gw.log("gatekeeper")


def test_a_hung_gate_refuses_at_its_deadline_and_the_gateway_answers_meanwhile(gw: Gateway) -> None:
    out: dict[str, Any] = {}

    def hung_call() -> None:
        t0 = time.monotonic()
        out["resp"] = gw.call("echo", {"text": "hang"})
        out["took"] = time.monotonic() - t0

    t = threading.Thread(target=hung_call)
    t.start()
    # Meanwhile: the control socket, and calls of other tools (one the gate passes).
    assert gw.request(op="status")["ok"]
    assert result(gw.call("echo", {"text": "meanwhile"})) == "meanwhile"
    assert result(gw.call("now", {})) is not None
    t.join(DEADLINE_S + 10)
    assert not t.is_alive()
    said = refused(out["resp"])
    assert "plugin 'gatekeeper'" in said and f"within its {DEADLINE_S} s deadline" in said and "fails closed" in said, said
    assert DEADLINE_S - 0.5 < out["took"] < DEADLINE_S + 3, out["took"]
    gw.wait_log("gatekeeper", "the call to 'echo' is refused (the gate fails closed)")
    assert result(gw.call("echo", {"text": "after"})) == "after"


def test_a_gate_that_answers_nonsense_refuses_the_call(gw: Gateway) -> None:
    said = refused(gw.call("echo", {"text": "nonsense"}))
    assert "plugin 'gatekeeper'" in said and "not an object" in said, said


def test_a_raising_gate_is_logged_with_why(gw: Gateway) -> None:
    said = refused(gw.call("echo", {"text": "raise please"}))
    assert "RuntimeError" in said and "plugin 'gatekeeper'" in said, said
    line = gw.wait_log("gatekeeper", re.compile(r"hook before_tool_call: .*RuntimeError"))
    assert "gate raised on purpose" in line and "the call to 'echo' is refused" in line, line


def test_a_gate_whose_plugin_crashes_refuses_and_while_down_refuses_at_once(gateway_factory: Any) -> None:
    cfg = hooks_config(allow=["before_tool_call"])
    # A long backoff, so that the plugin stays down until the operator restarts it.
    cfg["sandbox"]["defaults"]["restart"].update({"backoffInitialSeconds": 30, "backoffMaxSeconds": 30})
    gw = gateway_factory(cfg)
    # The plugin dies mid-call: the call it guarded is refused.
    said = refused(gw.call("echo", {"text": "crash"}))
    assert "plugin 'gatekeeper'" in said and "fails closed" in said, said
    gw.wait("gatekeeper", "backoff", timeout=10)
    # Its registrations are withdrawn; its duty is not.
    assert hooks_registered(gw, "gatekeeper") == []
    row = plugin_row(gw, "gatekeeper")
    assert row["offers"]["hooks"]["declared"] and not row["offers"]["hooks"]["registered"], row["offers"]
    t0 = time.monotonic()
    said = refused(gw.call("echo", {"text": "while down"}))
    assert time.monotonic() - t0 < 1.5
    assert "plugin 'gatekeeper'" in said and "it is not available: its sandbox is backoff" in said, said
    assert "the gate fails closed (plugins.entries.gatekeeper.hooks.failOpen would let calls through)" in said, said
    # The gateway answers: the control socket, and a turn that calls no tool.
    assert gw.request(op="status")["ok"]
    assert "still talking" in chat(gw, "still talking", peer="down")
    # A turn's tool call is refused the same way, and the turn goes on to answer.
    reply = chat(gw, '/tool echo {"text": "from a turn"}', peer="down")
    assert "plugin 'gatekeeper'" in reply and "backoff" in reply, reply
    # Restarted by the operator: the gate is back and passes what it lets by.
    assert gw.request(op="restart", sandbox="gatekeeper")["ok"]
    gw.wait("gatekeeper", "ready")
    assert result(gw.call("echo", {"text": "back"})) == "back"


def test_fail_open_is_the_operators_and_lets_failed_gates_pass(gateway_factory: Any, tmp_path: Path) -> None:
    gw = gateway_factory(hooks_config(allow=["before_tool_call"], failOpen=True, timeoutSeconds=1))
    # A blocking answer still blocks: failOpen is about failures.
    assert "no forbidden words" in refused(gw.call("echo", {"text": "forbidden"}))
    assert result(gw.call("echo", {"text": "raise"})) == "raise"
    assert "failOpen" in gw.wait_log("gatekeeper", "the call goes on (failOpen)")
    t0 = time.monotonic()
    assert result(gw.call("echo", {"text": "hang"})) == "hang"
    assert 0.5 < time.monotonic() - t0 < 4
    assert result(gw.call("echo", {"text": "crash"})) == "crash"
    assert json.loads(gw.cli("plugins", "show", "gatekeeper", "--json").stdout)  # it still answers
    # A plugin cannot set it: its manifest has no such key...
    folder = tmp_path / "sneaky"
    folder.mkdir()
    manifest = json.loads((GATEKEEPER / "clawsup.plugin.json").read_text())
    (folder / "plugin.py").write_text("")
    for sneaky in ({**manifest, "hooks": {"failOpen": True}}, {**manifest, "contracts": {**manifest["contracts"], "failOpen": True}}):
        (folder / "clawsup.plugin.json").write_text(json.dumps(sneaky))
        with pytest.raises(ManifestError):
            load_manifest(folder)
    # ...and its API none (api.on takes a name, a handler and a priority).
    assert list(inspect.signature(PluginApi.on).parameters) == ["self", "name", "handler", "priority"]


# -- modifying chains ---------------------------------------------------------------


def test_modifying_hooks_run_by_priority_and_merge_in_that_order(gw: Gateway, module_gateways: Any) -> None:
    # usher (priority 10) changes the arguments first, then gatekeeper (0); by name
    # gatekeeper would come first.
    assert result(gw.call("echo", {"text": "chain"})) == "chain+usher+gatekeeper"
    # Both contexts prepended to the turn's system prompt, usher's first.
    prompt = chat(gw, "/system", peer="chain")
    assert "context from usher (priority 10)" in prompt and "context from gatekeeper (priority 0)" in prompt, prompt
    assert prompt.index("context from usher") < prompt.index("context from gatekeeper"), prompt
    # Raised above usher by the operator's config, gatekeeper goes first.
    cfg = hooks_config(usher=True, allow=CONTENT)
    cfg["plugins"]["entries"]["gatekeeper"]["config"] = {"priority": 20}
    high = module_gateways("gatekeeper first", cfg)
    assert result(high.call("echo", {"text": "chain"})) == "chain+gatekeeper+usher"
    prompt = chat(high, "/system", peer="chain")
    assert prompt.index("context from gatekeeper (priority 20)") < prompt.index("context from usher"), prompt


# -- observing hooks -------------------------------------------------------------------


def test_observing_hooks_arrive(gw: Gateway) -> None:
    assert seen(gw, "gateway_start")
    assert result(gw.call("echo", {"text": "observe me"})) == "observe me"
    after = seen(gw, "after_tool_call", lambda e: e["params"] == {"text": "observe me"})
    assert after and after[0]["toolName"] == "echo" and after[0]["result"] == "observe me" and after[0]["error"] is None, after
    chat(gw, "hello observers", peer="watcher")
    key = "agent:main:cli:direct:watcher"
    assert seen(gw, "session_start", lambda e: e["sessionKey"] == key)
    ended = seen(gw, "agent_end", lambda e: e["sessionKey"] == key)
    assert ended and ended[0]["outcome"] == "answered" and "hello observers" in ended[0]["reply"], ended


def test_a_hung_observer_does_not_hold_up_the_turn(gateway_factory: Any) -> None:
    deadline = 20
    gw = gateway_factory(hooks_config(allow=CONTENT, timeoutSeconds=deadline))
    t0 = time.monotonic()
    assert "hello" in chat(gw, "hello", peer="calm")
    usual = time.monotonic() - t0
    t0 = time.monotonic()
    # session_start and agent_end (and message_received) for this peer never answer.
    reply = chat(gw, "hello", peer="observer-hang")
    took = time.monotonic() - t0
    assert took < min(usual + 5, deadline / 2), f"the turn waited for an observer ({took:.1f} s against {usual:.1f} s)"
    assert "hello" in reply
    assert seen(gw, "session_start", lambda e: "observer-hang" in e["sessionKey"])
    # The gateway answers while they hang; then they end at their deadline.
    assert result(gw.call("echo", {"text": "meanwhile"})) == "meanwhile"
    line = gw.wait_log("gatekeeper", "hook session_start:", timeout=deadline + 15)
    assert f"within its {deadline} s deadline" in line, line


def test_message_sending_changes_or_cancels_a_reply_and_message_received_is_observed(gw: Gateway) -> None:
    # gatekeeper's message_sending shouts a reply that says "shout", and cancels one
    # that says "cancel-me" (the offline model repeats the message in its answer).
    assert chat(gw, "please shout", peer="loud").startswith("[MAIN] RECEIVED IN AGENT:MAIN:CLI:DIRECT:LOUD: PLEASE SHOUT")
    withheld = chat(gw, "cancel-me please", peer="quiet")
    assert "cancel-me" not in withheld and "withheld" in withheld, withheld
    assert seen(gw, "message_received", lambda e: "cancel-me please" in json.dumps(e))
