"""Attacks on the offers beyond tools (issue 16) from a hostile plugin's side
(tests/plugins/rogue), asserted from the victim's side, against real gateways and
sandboxes. A hole is a test marked `xfail(strict=True)` whose reason says what is
wrong and what would fix it (the suite stays green, and goes red once it is fixed:
then drop the mark); an attack that is held is a plain test.

The plugin runs trusted on the process backend: these attacks are on what the
supervisor believes, parses and forwards, not on the sandbox's walls.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from tests.conftest import TEST_PLUGINS, Gateway, make_config

ROGUE = TEST_PLUGINS / "rogue"
TOKEN = "test-token-0123456789"


def rogue_config(**overrides: Any) -> dict[str, Any]:
    cfg = make_config(**overrides)
    cfg["plugins"]["load"]["paths"].append(str(ROGUE))
    # The operator grants the rogue's after_tool_call only: it may watch results.
    cfg["plugins"]["entries"]["rogue"] = {"trust": "trusted", "hooks": {"allow": ["after_tool_call"], "timeoutSeconds": 5}, "http": {"timeoutSeconds": 5}}
    cfg["session"] = {"dmScope": "per-channel-peer"}
    cfg["channels"] = {"http": {"enabled": True, "port": 0, "token": TOKEN}, "rogue": {"enabled": True, "owners": ["boss"]}}
    return cfg


@pytest.fixture(scope="module")
def gw(module_gateways: Any) -> Gateway:
    g: Gateway = module_gateways("rogue", rogue_config())
    g.wait("rogue", "ready")
    return g


def result(resp: dict[str, Any]) -> Any:
    assert resp["ok"], resp
    return resp["data"]["result"]


def chat(gw: Gateway, text: str, peer: str = "tester") -> str:
    r = gw.cli("chat", "--peer", peer, "-m", text, "--json", timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    return [json.loads(x)["reply"] for x in r.stdout.splitlines() if "reply" in json.loads(x)][-1]


def http_port(gw: Gateway) -> int:
    return int((gw.state / "run" / "http.port").read_text())


def fetch(gw: Gateway, method: str, path: str, body: bytes | str = b"", token: str | None = TOKEN, **headers: str) -> tuple[int, dict[str, str], bytes]:
    """One request, its path sent as written (http.client does not normalise it)."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port(gw), timeout=30)
    try:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body, headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


# -- hooks ---------------------------------------------------------------------------


def test_a_grant_to_watch_results_does_not_let_a_gate_rewrite_other_plugins_calls(gw: Gateway) -> None:
    """Was a hole: a grant of either tool hook widened both. Each is judged by its own."""
    assert result(gw.call("echo", {"text": "hello"})) == "hello"


def test_a_gate_answering_json_nested_too_deep_refuses_the_call_it_guards(gw: Gateway) -> None:
    resp = gw.call("rogue_ping", {"text": "deep"})
    assert not resp["ok"], resp  # the call did not run (see the next test for how it is said)
    assert result(gw.call("rogue_ping", {"text": "after"})) == "pong after"


def test_a_gate_answering_json_nested_too_deep_is_named_as_the_gate_failing(gw: Gateway) -> None:
    resp = gw.call("rogue_ping", {"text": "deep"})
    assert resp["error"]["code"] == "blocked_by_hook", resp
    assert "rogue" in resp["error"]["message"], resp


def test_a_command_answering_json_nested_too_deep_costs_that_command_only(gw: Gateway) -> None:
    answer = chat(gw, "/deep", peer="deep-cmd")
    print("/deep answered:", answer[:300])
    assert "[[[" not in answer, answer[:300]
    # The gateway and that very session go on.
    assert "deep-cmd" in chat(gw, "hello", peer="deep-cmd")


def test_a_route_answering_json_nested_too_deep_is_a_bad_gateway(gw: Gateway) -> None:
    status, _, body = fetch(gw, "GET", "/plugins/rogue/deep")
    assert status == 502, (status, body[:300])
    assert b"route /plugins/rogue/deep: http route 'deep' of plugin 'rogue' answered with JSON nested too deeply to read" in body, body[:300]
    assert gw.wait_log("rogue", "route /plugins/rogue/deep: http route 'deep' of plugin 'rogue' answered with JSON nested too deeply")
    assert fetch(gw, "GET", "/plugins/rogue/mirror")[0] == 200


# -- routes --------------------------------------------------------------------------

TRAVERSALS = [
    "/plugins/rogue/../../v1/messages",
    "/plugins/rogue/%2e%2e/%2e%2e/v1/messages",
    "/plugins/rogue/..%2F..%2Fv1%2Fmessages",
    "/plugins/rogue/mirror/../../../v1/messages",
    "/plugins/rogue//mirror",
    "/plugins/rogue/./mirror",
    "/plugins/rogue/mirror%00",
    "/plugins/rogue/mirror%2F..%2F..%2Fx",
    "/plugins/%2e%2e/v1/messages",
    "/plugins/rogue/%252e%252e/v1/messages",
]


def test_no_path_under_a_plugins_prefix_reaches_anything_but_its_own_routes(gw: Gateway) -> None:
    for path in TRAVERSALS:
        status, _, body = fetch(gw, "POST", path, json.dumps({"text": "hi", "peer": {"kind": "direct", "id": "x"}}))
        if status == 200:
            seen = json.loads(body)  # only the rogue's mirror answers 200 with JSON
            assert seen["path"] == "mirror", (path, seen)
        else:
            # never the messages endpoint (it would answer an event stream or 400/429)
            assert status in (400, 404), (path, status, body[:200])


def test_a_route_never_sees_the_gateways_token(gw: Gateway) -> None:
    status, _, body = fetch(gw, "GET", "/plugins/rogue/mirror", **{"X-Forwarded-Authorization": "x", "Proxy-Authorization": "Bearer y"})
    assert status == 200
    assert TOKEN not in body.decode()


def test_a_route_cannot_set_cookies_on_the_gateways_origin(gw: Gateway) -> None:
    # Cookies are not scoped by port: one planted here would hold for every service
    # on 127.0.0.1. The answer is refused, and said why, in the plugin's log too.
    status, headers, body = fetch(gw, "GET", "/plugins/rogue/cookie")
    assert status == 502, (status, body[:300])
    assert b"Set-Cookie: a route may not set cookies" in body, body[:300]
    assert not any(k.lower() == "set-cookie" for k in headers), headers
    assert gw.wait_log("rogue", "route /plugins/rogue/cookie answered badly: headers: Set-Cookie: a route may not set cookies")
    # Nor is a route (under the gateway's token) sent the cookies of the host, and a
    # page it answers runs sandboxed, never sniffed into HTML.
    status, headers, body = fetch(gw, "GET", "/plugins/rogue/mirror", Cookie="other-service=secret")
    assert status == 200 and b"other-service" not in body, body[:300]
    assert (headers["X-Content-Type-Options"], headers["Content-Security-Policy"]) == ("nosniff", "sandbox")


# -- channels ------------------------------------------------------------------------


def test_a_plugin_cannot_emit_for_the_http_channel_or_with_control_characters_in_an_id(gw: Gateway) -> None:
    out = result(gw.call("rogue_flood", {"count": 1, "text": "hi", "channel": "http"}))
    assert "refused" in out[0] and "built in" in out[0]["refused"], out
    out = result(gw.call("rogue_flood", {"count": 1, "text": "hi", "prefix": "evil\r\nboss"}))
    assert "refused" in out[0], out
    out = result(gw.call("rogue_flood", {"count": 1, "text": "hi", "prefix": "x" * 600}))
    assert "refused" in out[0], out


def test_a_plugin_channel_flood_does_not_make_the_http_channel_busy(gateway_factory: Any) -> None:
    gw: Gateway = gateway_factory(rogue_config(bus={"inboundCapacity": 4}))
    gw.wait("rogue", "ready")
    out = result(gw.call("rogue_flood", {"count": 6, "text": "/sleep 60"}))
    # A plugin channel may hold a quarter of the capacity (here 1): the rest is refused.
    refused = [x for x in out if isinstance(x, dict) and "refused" in x]
    assert len(refused) == 5 and "its share of bus.inboundCapacity" in refused[0]["refused"], out
    status, _, body = fetch(gw, "POST", "/v1/messages", json.dumps({"text": "hi", "peer": {"kind": "direct", "id": "alice"}}), **{"Content-Type": "application/json"})
    assert status != 429, body


# -- commands ------------------------------------------------------------------------


def test_a_command_another_plugin_declares_too_cannot_be_taken_from_its_plugin(gateway_factory: Any) -> None:
    """Was a hole: the holder of a contested command depended on which plugin came up
    first. Now the plugin loaded first holds it (as with tools), whoever is down."""
    cfg = rogue_config()
    cfg["plugins"]["load"]["paths"].insert(0, str(TEST_PLUGINS / "rogue_victim"))
    cfg["plugins"]["entries"]["rogue_victim"] = {"trust": "trusted", "sandbox": {"restart": {"maxRestarts": 0}}}
    gw: Gateway = gateway_factory(cfg)
    gw.wait("rogue", "ready")
    gw.wait("rogue_victim", "ready")
    assert "rogue_victim" in chat(gw, "/dup first")
    assert "command 'dup' will be refused: plugin 'rogue_victim' declares it too and was loaded first" in gw.log("rogue")
    gw.call("victim_die", {})
    gw.wait("rogue_victim", "failed")
    gw.call("rogue_die", {})
    gw.wait_log("rogue", "offers:")
    gw.wait("rogue", "ready")
    # The victim is down; the rogue, up again, still may not take its command.
    answer = chat(gw, "/dup the-owners-secret")
    assert "rogue_victim" in answer and "the-owners-secret" not in answer, answer
    assert "may not offer command 'dup'" in gw.log("rogue")
