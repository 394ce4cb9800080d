"""Plugin channels, against real gateways and sandboxes (tests/plugins/relay): a
message the plugin hands in is routed to a session like any other channel's, answered
by the offline model, and the answer goes back through the plugin's `send`; a plugin
that speaks for a channel it does not hold (`http`, `cli`, one the operator did not
enable, another plugin's) is refused and the refusal is in its log; a delivery that
fails, or a plugin that dies, costs the delivery, never the reply in its session."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.supervisor.messages.session_store import file_name, read_session
from tests.conftest import TEST_PLUGINS, Gateway, make_config, require_bwrap

RELAY = TEST_PLUGINS / "relay"
TOKEN = "test-token-0123456789"


def relay_config(*plugins: Path, backend: str = "process", **overrides: Any) -> dict[str, Any]:
    cfg = make_config(**overrides)
    cfg["sandbox"]["defaults"]["backend"] = backend
    cfg["plugins"]["load"]["paths"] += [str(RELAY), *map(str, plugins)]
    for pid in ("relay", *(p.name for p in plugins)):
        # The process backend runs trusted plugins only; bwrap contains the untrusted.
        cfg["plugins"]["entries"][pid] = {"trust": "trusted" if backend == "process" else "untrusted"}
    cfg["agents"]["list"] = [{"id": "main", "default": True}, {"id": "work"}]
    cfg["bindings"] = [{"agentId": "work", "match": {"channel": "relay", "peer": {"kind": "direct", "id": "vip"}}}]
    cfg["session"] = {"dmScope": "per-channel-peer"}
    cfg["channels"] = {
        "http": {"enabled": True, "port": 0, "token": TOKEN},
        "relay": {"enabled": True, "owners": ["boss-1"]},
        "relay2": {"enabled": True},
        "unlit": {"enabled": False},
    }
    return cfg


@pytest.fixture(scope="module")
def relay2() -> Iterator[Path]:
    """A copy of relay under the id `relay2`, serving channel `relay2` only (in a
    folder the sandbox's own uid can read)."""
    d = Path(tempfile.mkdtemp(prefix="cs-plugin-", dir="/tmp"))
    os.chmod(d, 0o755)
    folder = d / "relay2"
    shutil.copytree(RELAY, folder, ignore=shutil.ignore_patterns("__pycache__"))
    os.chmod(folder, 0o755)
    manifest = json.loads((RELAY / "clawsup.plugin.json").read_text())
    manifest.update(id="relay2", contracts={"channels": ["relay2"]})
    (folder / "clawsup.plugin.json").write_text(json.dumps(manifest))
    yield folder
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def gw(module_gateways: Any, relay2: Path) -> Gateway:
    g: Gateway = module_gateways("relay", relay_config(relay2))
    return g


def result(resp: dict[str, Any]) -> Any:
    assert resp["ok"], resp
    return resp["data"]["result"]


def session(gw: Gateway, key: str) -> list[dict[str, Any]]:
    return read_session(gw.state / "sessions" / file_name(key))


def first_line(text: str) -> str:
    return text.splitlines()[0]


def round_trip(gw: Gateway) -> None:
    route = result(gw.call("relay_inject", {"peer": "Alice", "text": "hello over relay", "sender": "alice-1"}))
    assert (route["agentId"], route["matchedBy"], route["sessionKey"], route["accountId"]) == ("main", "default", "agent:main:relay:direct:alice", "default")
    [reply] = result(gw.call("relay_outbox", {"peer": "Alice", "finals": 1}))
    assert first_line(reply["text"]) == "[main] received in agent:main:relay:direct:alice: hello over relay"
    assert reply["peer"] == {"kind": "direct", "id": "Alice"}
    assert (reply["accountId"], reply["threadId"], reply["sessionKey"], reply["agentId"]) == ("default", None, route["sessionKey"], "main")
    assert (reply["inReplyTo"], reply["progress"], reply["final"]) == (route["messageId"], False, True)
    recs = session(gw, route["sessionKey"])
    assert [(r["role"], r["channel"] if r["role"] == "user" else r["inReplyTo"]) for r in recs] == [("user", "relay"), ("assistant", route["messageId"])]
    assert recs[0]["peer"] == {"kind": "direct", "id": "Alice"} and recs[0]["text"] == "hello over relay"


def test_a_plugin_channel_delivers_a_message_and_the_answer_comes_back_through_it(gw: Gateway) -> None:
    round_trip(gw)
    # Bindings, threads and accounts work for it as for the built-in channels.
    route = result(gw.call("relay_inject", {"peer": "vip", "text": "for work", "thread": "T-1"}))
    assert (route["agentId"], route["matchedBy"], route["sessionKey"]) == ("work", "binding.peer", "agent:work:relay:direct:vip:thread:t-1")
    [reply] = result(gw.call("relay_outbox", {"peer": "vip", "finals": 1}))
    assert (reply["threadId"], reply["accountId"], reply["agentId"]) == ("T-1", "default", "work")
    # The binding names the default account: another account's vip is not bound.
    route = result(gw.call("relay_inject", {"peer": "vip", "text": "other account", "account": " Team "}))
    assert (route["agentId"], route["matchedBy"], route["accountId"]) == ("main", "default", "team")
    assert first_line(result(gw.call("relay_outbox", {"peer": "vip", "finals": 2}))[-1]["text"]).endswith("other account")
    # A group: the session is the group's, whoever wrote.
    route = result(gw.call("relay_inject", {"peer": "room-9", "kind": "group", "sender": "carol", "text": "hi all"}))
    assert route["sessionKey"] == "agent:main:relay:group:room-9"


def test_stop_from_a_plugin_channel_stops_its_sessions_turn(gw: Gateway) -> None:
    held = result(gw.call("relay_inject", {"peer": "sloth", "text": "/sleep 30"}))
    [note] = result(gw.call("relay_outbox", {"peer": "sloth", "notes": 1}))
    assert (note["text"], note["progress"], note["final"]) == ("working for 30 s…", True, False)
    stop = result(gw.call("relay_inject", {"peer": "sloth", "text": "/stop"}))
    assert stop["sessionKey"] == held["sessionKey"]
    replies = {m["inReplyTo"]: m["text"] for m in result(gw.call("relay_outbox", {"peer": "sloth", "finals": 2})) if m["final"]}
    assert replies == {held["messageId"]: "stopped.", stop["messageId"]: "stopping the turn in flight."}


def test_a_plugin_channel_round_trip_on_bwrap(gateway_factory: Any) -> None:
    require_bwrap()
    gw = gateway_factory(relay_config(backend="bwrap"))
    assert gw.status("relay")["backend"] == "bwrap"
    round_trip(gw)


@pytest.mark.parametrize(
    ("channel", "why"),
    [
        ("http", "may not speak for channel 'http': it is built in"),
        ("cli", "may not speak for channel 'cli': it is built in"),
        ("unlit", "may not speak for channel 'unlit': it holds no such channel"),
        ("relay2", "may not speak for channel 'relay2': plugin 'relay2' serves it"),
        ("nowhere", "may not speak for channel 'nowhere': it holds no such channel"),
    ],
)
def test_a_plugin_cannot_speak_for_a_channel_it_does_not_hold(gw: Gateway, channel: str, why: str) -> None:
    refused = result(gw.call("relay_speak_for", {"channel": channel}))["refused"]
    assert f"plugin 'relay' {why}" in refused
    assert gw.wait_log("relay", f"refused request 'channel.inbound': plugin 'relay' {why}")
    assert not list((gw.state / "sessions").glob("*mallory*"))


def test_channels_the_operator_did_not_enable_or_that_are_built_in_are_refused_at_registration(gw: Gateway) -> None:
    log = gw.log("relay")
    assert "plugin 'relay' may not offer channel 'unlit': the operator has not enabled it (channels.unlit in the config)" in log
    assert "plugin 'relay' may not offer channel 'http': that channel is built in" in log
    shown = {p["id"]: p for p in gw.request(op="plugins")["data"]["plugins"]}
    assert [r["name"] for r in shown["relay"]["offers"]["channels"]["registered"]] == ["relay"]
    assert [r["name"] for r in shown["relay2"]["offers"]["channels"]["registered"]] == ["relay2"]


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        # The owner flag is the operator's config, never the plugin's word.
        ({"isOwner": True}, "isOwner: Extra inputs are not permitted"),
        ({"peerKind": "robot"}, "peerKind: String should match pattern"),
        ({"text": "x" * 100_001}, "text: String should have at most 100000 characters"),
        ({"peerId": "a\nb"}, "peerId: must be a non-blank string without control characters"),
        ({"senderId": "   "}, "senderId: must be a non-blank string"),
    ],
)
def test_a_malformed_inbound_message_is_refused(gw: Gateway, payload: dict[str, Any], why: str) -> None:
    sent = {"channel": "relay", "peerId": "mallory", "text": "hi", **payload}
    refused = result(gw.call("relay_raw", sent))["refused"]
    assert f"a message for channel 'relay': {why}" in refused, refused
    assert not list((gw.state / "sessions").glob("*mallory*"))


def test_a_failed_delivery_is_logged_and_the_reply_stays_in_its_session(gw: Gateway) -> None:
    route = result(gw.call("relay_inject", {"peer": "bob", "text": "please explode"}))
    line = gw.wait_log("relay", f"(in reply to {route['messageId']}) was not delivered")
    assert "channel 'relay' of plugin 'relay' raised RuntimeError: the outside service refused the message" in line
    assert "it is kept in the session" in line
    recs = session(gw, route["sessionKey"])
    assert recs[-1]["role"] == "assistant" and recs[-1]["inReplyTo"] == route["messageId"] and "please explode" in recs[-1]["text"]
    # The channel and its plugin go on.
    assert gw.status("relay")["state"] == "ready"
    route = result(gw.call("relay_inject", {"peer": "bob", "text": "and now?"}))
    assert any(m["inReplyTo"] == route["messageId"] for m in result(gw.call("relay_outbox", {"peer": "bob", "finals": 1})))


def test_a_dead_channel_plugin_loses_deliveries_not_replies(gateway_factory: Any) -> None:
    cfg = relay_config()
    cfg["session"] = {"dmScope": "main"}  # one session for every direct message, whatever the channel
    cfg["plugins"]["entries"]["relay"]["sandbox"] = {"restart": {"maxRestarts": 0}}
    gw = gateway_factory(cfg)
    held = result(gw.call("relay_inject", {"peer": "zed", "text": "/sleep 30"}))
    queued = result(gw.call("relay_inject", {"peer": "zed", "text": "after the crash"}))
    assert held["sessionKey"] == queued["sessionKey"] == "agent:main:main"
    assert not gw.call("relay_die")["ok"]
    gw.wait("relay", "failed")
    shown = {p["id"]: p for p in gw.request(op="plugins")["data"]["plugins"]}
    assert shown["relay"]["offers"]["channels"]["registered"] == []
    # The operator stops the held turn from another channel (the session is shared):
    # its "stopped." and the next turn's answer have nowhere to go, and say so.
    stop = gw.cli("chat", "-m", "/stop")
    assert "stopping the turn in flight." in stop.stdout, stop.stdout + stop.stderr
    for msg in (held, queued):
        line = gw.wait_log("relay", f"(in reply to {msg['messageId']}) was not delivered")
        assert "no plugin serves it now" in line
    recs = session(gw, "agent:main:main")
    answered = {r["inReplyTo"]: r for r in recs if r["role"] in ("assistant", "system") and "inReplyTo" in r}
    assert answered[held["messageId"]]["text"] == "turn stopped by /stop"
    assert first_line(answered[queued["messageId"]]["text"]).endswith("after the crash")
    assert "was not delivered" in gw.supervisor_log()
    assert result(gw.call("echo", {"text": "still here"})) == "still here"
