"""Plugins' HTTP routes on the gateway's HTTP server, against real gateways and
sandboxes (tests/plugins/relay): the gateway's token is asked for (and never handed to
the plugin), `auth: "plugin"` only where the operator allowed it, a route that hangs
is answered 504 at its deadline while the gateway answers everything else, a bad
answer is a 502 that says why, a dead plugin's routes are a 503 (to a caller with the
token: without it every path but an open route is the same 404), and one plugin's
routes take a bounded share of the channel's connections."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import time
from typing import Any

import pytest

from tests.conftest import Gateway
from clawsup.supervisor.messages.http_routes import MAX_IN_FLIGHT
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


def held_request(gw: Gateway, path: str, body: bytes, token: str | None = TOKEN) -> socket.socket:
    """A POST whose handler is in flight, reading its body: the gateway's `100
    Continue` is written by the same step of its loop that enters the handler, which
    runs on until it awaits the body that is held back here (all but its last byte;
    `release` sends it)."""
    sock = socket.create_connection(("127.0.0.1", http_port(gw)), timeout=30)
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode() + body[:-1])
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 100"), got
    return sock


def release(sock: socket.socket, body: bytes) -> tuple[int, bytes]:
    """The held request's last byte sent; its status and what follows the head."""
    sock.sendall(body[-1:])
    got = b""
    with sock:
        while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < int(got.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]):
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
    head, rest = got.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), rest


@pytest.fixture(scope="module")
def gw(module_gateways: Any) -> Gateway:
    cfg = relay_config()
    cfg["plugins"]["entries"]["relay"]["http"] = {"timeoutSeconds": DEADLINE_S}
    g: Gateway = module_gateways("routes", cfg)
    return g


def test_a_route_answers_with_the_token_and_the_plugin_never_sees_it(gw: Gateway) -> None:
    status, headers, body = fetch(gw, "POST", "/plugins/relay/hello?a=1&b=two&a=3", "ping é".encode(), **{"X-Custom": "yes", "Cookie": "other-service=secret"})
    assert (status, headers["X-Relay"], headers["Content-Type"]) == (201, "yes", "application/json")
    # A plugin's page runs sandboxed, and is never sniffed into anything else.
    assert (headers["X-Content-Type-Options"], headers["Content-Security-Policy"]) == ("nosniff", "sandbox")
    seen = json.loads(body)
    assert (seen["method"], seen["path"], seen["query"], seen["body"], seen["bodyBase64"]) == ("POST", "hello", {"a": "1", "b": "two"}, "ping é", None)
    assert seen["headers"]["X-Custom"] == "yes"
    # Neither the gateway's token nor the host's cookies (a gateway-auth route).
    assert not any(k.lower() in ("authorization", "cookie") for k in seen["headers"])
    assert TOKEN not in body.decode() and "secret" not in body.decode()


def test_a_body_that_is_not_utf8_reaches_the_plugin_byte_for_byte(gw: Gateway) -> None:
    # Bytes a webhook's signature is computed over must not be "repaired"; and a
    # binary body at the cap must not swell past what one gRPC message carries.
    # (`hello` echoes the request, in an answer of at most 1 MiB.)
    for raw in (b"ping \xff\xfe \x00", bytes(range(256)) * 2048):
        status, _, body = fetch(gw, "POST", "/plugins/relay/hello", raw)
        assert status == 201
        seen = json.loads(body)
        assert seen["body"] is None and base64.b64decode(seen["bodyBase64"]) == raw
    # UTF-8 made of control characters (six times its size as JSON) goes as bytes too.
    status, _, body = fetch(gw, "POST", "/plugins/relay/hello", b"\x01" * (512 * 1024))
    assert status == 201 and json.loads(body)["bodyBase64"] == base64.b64encode(b"\x01" * (512 * 1024)).decode()
    # A binary body at the cap reaches the plugin, which answers (badly, here).
    status, _, body = fetch(gw, "POST", "/plugins/relay/bad?kind=none", b"\xff" * (1024 * 1024))
    assert status == 502 and b"route /plugins/relay/bad answered badly" in body, body[:300]


def test_a_route_without_the_token_is_not_found(gw: Gateway) -> None:
    # The same answer as for no route at all: a caller without the token cannot tell
    # which plugins there are.
    for token in (None, "wrong-token-0123456789"):
        for path in ("/plugins/relay/hello", "/plugins/relay/nothing", "/plugins/nobody/hello"):
            status, _, body = fetch(gw, "GET", path, token=token)
            assert (status, body) == (404, b"no such route\n"), (path, token)


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


def test_one_plugins_routes_take_a_bounded_share_of_the_connections(gw: Gateway) -> None:
    body = b"held"
    held = [held_request(gw, "/plugins/relay/hello", body) for _ in range(MAX_IN_FLIGHT)]
    try:
        status, headers, text = fetch(gw, "GET", "/plugins/relay/hello")
        assert (status, headers.get("Retry-After")) == (503, "1"), text
        assert b"too many requests to this plugin's routes at once" in text
        # The gateway's own endpoints are not held up by it.
        assert result(gw.call("echo", {"text": "still here"})) == "still here"
    finally:
        answers = [release(sock, body) for sock in held]
    assert {status for status, _ in answers} == {201}
    assert fetch(gw, "GET", "/plugins/relay/hello")[0] == 201  # the share is given back


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
    # And a caller without the token is not told of the route at all.
    assert fetch(gw, "GET", f"/plugins/relay/bad?kind={kind}", token=None)[:3:2] == (404, b"no such route\n")


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
    # An open route that fails tells its callers (who have no token) nothing of why;
    # its log does (the handler adds a str to a body that came as bytes).
    for token in (None, TOKEN):
        assert fetch(gw, "POST", "/plugins/relay/webhook", b"\xff", token=token)[:3:2] == (502, b"the plugin could not answer; see its log\n")
    assert gw.wait_log("relay", "route /plugins/relay/webhook: http route 'webhook' of plugin 'relay' raised")
    # A request whose body is still being read when its plugin dies is not handed to
    # what the plugin's registration has become.
    sock = held_request(gw, "/plugins/relay/hello", b"late")
    assert not gw.call("relay_die")["ok"]
    gw.wait("relay", "failed")
    assert release(sock, b"late") == (503, b"plugin 'relay' changed while the request was read; try again later\n")
    for path in ("/plugins/relay/hello", "/plugins/relay/webhook"):
        status, _, body = fetch(gw, "GET", path)
        assert (status, body) == (503, b"plugin 'relay' is not running (failed); try again later\n")
        # Without the token, a plugin that is down is no route at all.
        assert fetch(gw, "GET", path, token=None)[:3:2] == (404, b"no such route\n")
    assert fetch(gw, "GET", "/plugins/relay/secret")[0] == 404
    assert result(gw.call("echo", {"text": "still here"})) == "still here"
