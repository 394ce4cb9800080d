"""Plugins' HTTP routes on the gateway's HTTP server, against real gateways and
sandboxes (tests/plugins/relay): the gateway's token is asked for (and never handed to
the plugin), `auth: "plugin"` only where the operator allowed it, a route that hangs
is answered 504 at its deadline while the gateway answers everything else, a bad
answer is a 502 that says why, and a dead plugin's routes are a 503."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

import pytest

from tests.conftest import Gateway
from tests.test_plugin_channels import TOKEN, relay_config, result

DEADLINE_S = 1.0


def http_port(gw: Gateway) -> int:
    return int((gw.state / "run" / "http.port").read_text())


def fetch(gw: Gateway, method: str, path: str, body: bytes | str = b"", token: str | None = TOKEN, **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", http_port(gw), timeout=30)
    try:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body, headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def gw(module_gateways: Any) -> Gateway:
    cfg = relay_config()
    cfg["plugins"]["entries"]["relay"]["http"] = {"timeoutSeconds": DEADLINE_S}
    g: Gateway = module_gateways("routes", cfg)
    return g


def test_a_route_answers_with_the_token_and_the_plugin_never_sees_it(gw: Gateway) -> None:
    status, headers, body = fetch(gw, "POST", "/plugins/relay/hello?a=1&b=two&a=3", "ping é".encode() + b" \xff", **{"X-Custom": "yes"})
    assert (status, headers["X-Relay"], headers["Content-Type"]) == (201, "yes", "application/json")
    seen = json.loads(body)
    assert (seen["method"], seen["path"], seen["query"], seen["body"]) == ("POST", "hello", {"a": "1", "b": "two"}, "ping é \ufffd")
    assert seen["headers"]["X-Custom"] == "yes"
    assert not any(k.lower() == "authorization" for k in seen["headers"])
    assert TOKEN not in body.decode()


def test_a_route_without_the_token_is_refused(gw: Gateway) -> None:
    for token in (None, "wrong-token-0123456789"):
        status, _, body = fetch(gw, "GET", "/plugins/relay/hello", token=token)
        assert (status, body) == (401, b"missing or wrong bearer token\n")


def test_routes_the_supervisor_did_not_register_are_not_found(gw: Gateway) -> None:
    log = gw.log("relay")
    # auth "plugin" without the operator's allowPluginAuth: refused at registration.
    assert "may not offer http route 'webhook': it asks to check its callers itself (auth: plugin), which the operator has not allowed" in log
    assert "may not offer http route 'secret': its manifest does not declare it in contracts.httpRoutes" in log
    for path in ("/plugins/relay/webhook", "/plugins/relay/secret", "/plugins/relay/nothing", "/plugins/nobody/hello", "/plugins/relay/a//b", "/plugins/relay/"):
        for token in (None, TOKEN):
            status, _, _ = fetch(gw, "POST", path, "x", token=token)
            assert status == 404, (path, token, status)


def test_a_route_that_hangs_is_a_504_at_its_deadline_and_the_gateway_goes_on(gw: Gateway) -> None:
    pid = gw.status("relay")["pid"]
    slow: list[Any] = []

    def hang() -> None:
        t0 = time.monotonic()
        status, _, body = fetch(gw, "GET", "/plugins/relay/slow")
        slow.append((status, body.decode(), time.monotonic() - t0))

    t = threading.Thread(target=hang)
    t.start()
    # Everything else is answered meanwhile: another route of the same plugin, a tool
    # call, the chat channel.
    assert fetch(gw, "GET", "/plugins/relay/hello")[0] == 201
    assert result(gw.call("echo", {"text": "still here"})) == "still here"
    t.join(30)
    [(status, body, took)] = slow
    assert status == 504 and "http route 'slow' of plugin 'relay' did not answer within its 1 s deadline" in body
    assert DEADLINE_S <= took < DEADLINE_S + 4
    # The async handler was cancelled: the same child serves on.
    st = gw.status("relay")
    assert (st["state"], st["pid"]) == ("ready", pid)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("header", "headers: Value error, header X-Evil: a value is at most 8192 printable ASCII characters"),
        ("framing", "headers: Value error, Content-Length is the gateway's to set"),
        ("status", "status: Input should be greater than or equal to 200"),
        ("type", "Input should be a valid dictionary"),
        ("none", "Input should be a valid dictionary"),
        ("big", "body: Value error, 1048577 bytes; the most is 1048576"),
    ],
)
def test_a_bad_answer_is_a_502_that_says_why(gw: Gateway, kind: str, why: str) -> None:
    status, headers, body = fetch(gw, "GET", f"/plugins/relay/bad?kind={kind}")
    text = body.decode()
    assert status == 502 and "route /plugins/relay/bad answered badly: " in text, text
    assert why.replace("Value error, ", "") in text, text
    assert "Set-Cookie" not in headers and "smuggled" not in text
    assert gw.wait_log("relay", "route /plugins/relay/bad answered badly")


def test_a_request_past_the_body_cap_is_refused(gw: Gateway) -> None:
    status, _, _ = fetch(gw, "POST", "/plugins/relay/hello", b"x" * (1024 * 1024 + 1))
    assert status == 413


def test_a_route_may_hand_a_message_in_for_its_channel(gw: Gateway) -> None:
    status, _, body = fetch(gw, "POST", "/plugins/relay/inject", json.dumps({"peer": "hooky", "text": "via a webhook"}))
    assert status == 202, body
    route = json.loads(body)
    assert route["sessionKey"] == "agent:main:relay:direct:hooky"
    [reply] = result(gw.call("relay_outbox", {"peer": "hooky", "finals": 1}))
    assert reply["inReplyTo"] == route["messageId"] and "via a webhook" in reply["text"]


def test_plugin_auth_where_allowed_and_a_dead_plugins_routes(gateway_factory: Any) -> None:
    cfg = relay_config()
    cfg["plugins"]["entries"]["relay"]["http"] = {"allowPluginAuth": True}
    cfg["plugins"]["entries"]["relay"]["sandbox"] = {"restart": {"maxRestarts": 0}}
    gw = gateway_factory(cfg)
    # Allowed: any caller reaches the plugin, which judges it (the gateway's token,
    # should a caller send it there, is still not handed on).
    assert fetch(gw, "POST", "/plugins/relay/webhook", "ping", token=None)[:3:2] == (200, b"hooked: ping")
    assert fetch(gw, "POST", "/plugins/relay/webhook", "pong")[:3:2] == (200, b"hooked: pong")
    assert not gw.call("relay_die")["ok"]
    gw.wait("relay", "failed")
    for path in ("/plugins/relay/hello", "/plugins/relay/webhook"):
        status, _, body = fetch(gw, "GET", path)
        assert (status, body) == (503, b"plugin 'relay' is not running (failed); try again later\n")
    assert fetch(gw, "GET", "/plugins/relay/secret")[0] == 404
    assert result(gw.call("echo", {"text": "still here"})) == "still here"
