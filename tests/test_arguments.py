"""A tool's arguments are checked against its input schema in the supervisor, before
any dispatch (supervisor/arguments.py): the error names the path and the rule, the
model and the CLI get it as a tool error, and the handler never runs. A schema that
is not valid JSON Schema, or that refers outside itself, refuses the registration.

The end-to-end tests run tests/plugins/picky, whose handlers each append a line to
calls.log in their workspace: a refused call must leave no line.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.arguments import COUNTED_PROBLEMS, check_arguments
from supervisor.errors import BadToolArguments, RegistrationRefused, ToolFailed
from supervisor.registry import Kind, Registration, Registry
from tests.conftest import PLUGINS, TEST_PLUGINS, Gateway, make_config

PICKY = TEST_PLUGINS / "picky"
FORECAST = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}, "days": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["city"],
    "additionalProperties": False,
}


# -- the check itself, on a registry ---------------------------------------------------


def registered(schema: dict[str, Any], name: str = "forecast") -> Registration:
    r = Registry()
    return r.register(Registration(kind=Kind.TOOL, name=name, owner="weather", sandbox_id="weather", input_schema=schema), declared=frozenset({name}))


def refusal(args: Any, schema: dict[str, Any] = FORECAST) -> BadToolArguments:
    reg = registered(schema)
    with pytest.raises(BadToolArguments) as caught:
        check_arguments(reg, args)
    return caught.value


def test_the_error_names_the_path_and_the_rule() -> None:
    e = refusal({"city": "Paris", "days": 50})
    assert str(e) == "bad arguments for tool 'forecast': days: 50 is greater than the maximum of 10"
    assert (e.code, e.kind, e.tool, e.owner) == ("bad_arguments", "invalid_arguments", "forecast", "weather")
    assert isinstance(e, ToolFailed)
    assert str(refusal({})) == "bad arguments for tool 'forecast': city: a required property is missing"
    assert "'Paris' is not of type 'integer'" in str(refusal({"city": "x", "days": "Paris"}))
    assert "('cwd' was unexpected)" in str(refusal({"city": "x", "cwd": "/"}))


def test_nested_paths_and_how_many_more() -> None:
    route = {
        "type": "object",
        "$defs": {"stop": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
        "properties": {"stops": {"type": "array", "items": {"$ref": "#/$defs/stop"}}},
    }
    e = refusal({"stops": [{"name": "a"}, {}, {"name": 3}]}, route)
    assert e.problems == "stops[1].name: a required property is missing (and 1 more problem)"
    many = refusal({"stops": [{}] * 500}, route)
    assert many.problems.endswith(f"(and at least {COUNTED_PROBLEMS} more problems)")
    assert refusal({"city": 1, "days": 0, "x": 1}).problems.endswith("(and 2 more problems)")


def test_a_huge_value_is_not_quoted_whole() -> None:
    e = refusal({"city": "x", "days": "y" * 1_000_000})
    assert len(str(e)) < 500 and str(e).startswith("bad arguments for tool 'forecast': days: 'yyy")


def test_arguments_that_are_not_an_object_are_refused() -> None:
    assert refusal([1, 2]).problems == "arguments must be a JSON object, not an array"
    assert refusal("[1, 2]").problems == "arguments must be a JSON object, not an array"
    assert refusal("null").problems == "arguments must be a JSON object, not null"
    assert refusal("{nope").problems.startswith("arguments are not valid JSON: ")
    # Text that fits passes, and an empty text is no arguments.
    check_arguments(registered(FORECAST), '{"city": "Paris"}')
    check_arguments(registered({"type": "object"}), "")


def test_a_tool_without_a_schema_takes_any_object_and_only_an_object() -> None:
    for schema in ({}, {"type": "object", "properties": {}}, {"type": "object", "description": "anything"}):
        check_arguments(registered(schema), {"whatever": [1, {"x": None}]})
        assert refusal([1], schema).problems == "arguments must be a JSON object, not an array"
    # An empty `properties` with a rule beside it is still checked.
    closed = {"type": "object", "properties": {}, "additionalProperties": False}
    assert "('a' was unexpected)" in refusal({"a": 1}, closed).problems


def test_the_schema_is_compiled_once_at_registration() -> None:
    r = Registry()
    r.register(Registration(kind=Kind.TOOL, name="forecast", owner="weather", sandbox_id="w", input_schema=FORECAST), declared=frozenset({"forecast"}))
    reg = r.get(Kind.TOOL, "forecast")
    assert reg is not None and reg.arguments is not None
    check = reg.arguments
    for _ in range(3):
        check_arguments(r.get(Kind.TOOL, "forecast"), {"city": "Paris"})  # type: ignore[arg-type]
    assert r.get(Kind.TOOL, "forecast").arguments is check  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "object", "properties": {"n": {"type": "integr"}}}, "its input schema is not a valid JSON Schema: properties.n.type: 'integr' is not valid"),
        ({"type": "object", "properties": {"n": {"pattern": "(["}}}, "its input schema is not a valid JSON Schema: properties.n.pattern: '([' is not a 'regex'"),
        ({"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:9/x.json"}}}, "its input schema refers outside itself ('http://127.0.0.1:9/x.json')"),
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}, "its input schema has a reference '#/$defs/missing' that points at nothing inside it"),
        ({"$schema": "http://example.com/my-dialect", "type": "object"}, "its input schema names 'http://example.com/my-dialect' in $schema"),
    ],
)
def test_an_invalid_schema_refuses_the_registration(schema: dict[str, Any], says: str) -> None:
    r = Registry()
    with pytest.raises(RegistrationRefused) as caught:
        r.register(Registration(kind=Kind.TOOL, name="t", owner="p", sandbox_id="p", input_schema=schema), declared=frozenset({"t"}))
    assert caught.value.reason.startswith(says), caught.value.reason
    assert r.tools() == []


@pytest.mark.parametrize("depth", [300, 5000])
def test_a_deeply_nested_schema_is_refused_not_crashed_on(depth: int) -> None:
    schema: dict[str, Any] = {"type": "object"}
    node = schema
    for _ in range(depth):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    r = Registry()
    with pytest.raises(RegistrationRefused, match="its input schema is nested too deeply to check"):
        r.register(Registration(kind=Kind.TOOL, name="t", owner="p", sandbox_id="p", input_schema=schema), declared=frozenset({"t"}))


def test_dialect_is_taken_from_the_schema() -> None:
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object", "properties": {"n": {"type": "number", "maximum": 5, "exclusiveMaximum": True}}}
    check_arguments(registered(draft4), {"n": 4.5})
    assert "5 is greater than or equal to the maximum of 5" in refusal({"n": 5}, draft4).problems


# -- through the real supervisor -----------------------------------------------------


def listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.setblocking(False)
    return s


def picky_gateway(gateway_factory: Any, remote_ref: str = "http://127.0.0.1:9/x.json", **overrides: Any) -> Gateway:
    cfg = make_config(**overrides)
    cfg["plugins"]["load"]["paths"].append(str(PICKY))
    cfg["plugins"]["entries"]["picky"] = {"trust": "trusted", "config": {"remoteRef": remote_ref}}
    return gateway_factory(cfg)


def calls_log(gw: Gateway) -> Path:
    return gw.workspace("picky") / "calls.log"


def test_arguments_outside_the_schema_never_reach_the_handler(gateway_factory: Any) -> None:
    gw = picky_gateway(gateway_factory)
    pid = gw.status("picky")["pid"]
    for args, says in (
        ({}, "city: a required property is missing"),
        ({"city": "Paris", "days": 50}, "days: 50 is greater than the maximum of 10"),
        ({"city": "Paris", "days": "3"}, "days: '3' is not of type 'integer'"),
        ({"city": "Paris", "cwd": "/"}, "Additional properties are not allowed ('cwd' was unexpected)"),
    ):
        resp = gw.call("forecast", args)
        assert not resp["ok"], resp
        assert resp["error"]["code"] == "bad_arguments"
        assert resp["error"]["message"] == f"bad arguments for tool 'forecast': {says}" or says in resp["error"]["message"], resp
    resp = gw.call("picky_route", {"stops": [{"name": "a"}, {}, {"name": 3}]})
    assert resp["error"]["message"] == "bad arguments for tool 'picky_route': stops[1].name: a required property is missing (and 1 more problem)"
    assert "5 is greater than or equal to the maximum of 5" in gw.call("picky_draft4", {"n": 5})["error"]["message"]
    # None of them ran: the handler writes its line before it answers.
    assert not calls_log(gw).exists()
    # The sandbox was never bothered, and arguments that fit go through.
    assert gw.status("picky")["pid"] == pid
    assert gw.call("forecast", {"city": "Paris", "days": 3}) == {"ok": True, "data": {"result": {"tool": "forecast", "args": {"city": "Paris", "days": 3}}}}
    assert gw.call("picky_draft4", {"n": 4.5})["ok"]
    lines = [json.loads(x) for x in calls_log(gw).read_text().splitlines()]
    assert [x["tool"] for x in lines] == ["forecast", "picky_draft4"]
    assert gw.call("echo", {"text": "others fine"}) == {"ok": True, "data": {"result": "others fine"}}


def test_the_cli_exits_1_with_the_reason(gateway_factory: Any) -> None:
    gw = picky_gateway(gateway_factory)
    r = gw.cli("tools", "call", "forecast", "--args", '{"days": 50}')
    assert r.returncode == 1, r.stdout + r.stderr
    assert "bad arguments for tool 'forecast': city: a required property is missing (and 1 more problem)" in r.stderr
    r = gw.cli("tools", "call", "forecast", "--args", '{"city": "Oslo", "days": 11}', "--json")
    assert r.returncode == 1 and json.loads(r.stdout) == {"ok": False, "error": "bad arguments for tool 'forecast': days: 11 is greater than the maximum of 10"}
    # The core tools take the same path.
    r = gw.cli("tools", "call", "read", "--args", '{"path": 5}')
    assert r.returncode == 1 and "bad arguments for tool 'read': path: 5 is not of type 'string'" in r.stderr
    assert not calls_log(gw).exists()


def test_the_model_gets_it_as_a_tool_error(gateway_factory: Any) -> None:
    from supervisor.session_store import file_name, read_session

    gw = picky_gateway(gateway_factory, agents__list=[{"id": "main", "default": True, "model": "offline"}])
    r = gw.cli("chat", "--peer", "tester", "-m", '/tool forecast {"city": "Paris", "days": 50}', "--json", timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    reply = [json.loads(x)["reply"] for x in r.stdout.splitlines() if "reply" in json.loads(x)][-1]
    assert reply.startswith("forecast failed: bad arguments for tool 'forecast': days: 50 is greater than the maximum of 10"), reply
    tool = next(x for x in read_session(gw.state / "sessions" / file_name("agent:main:main")) if x["role"] == "tool")
    assert tool["isError"] is True and tool["content"] == "bad arguments for tool 'forecast': days: 50 is greater than the maximum of 10"
    assert not calls_log(gw).exists()


def test_an_invalid_schema_refuses_that_registration_only(gateway_factory: Any) -> None:
    net = listener()
    try:
        port = net.getsockname()[1]
        gw = picky_gateway(gateway_factory, remote_ref=f"http://127.0.0.1:{port}/x.json")
        tools = gw.tools()
        assert {"forecast", "picky_route", "picky_draft4"} <= set(tools)
        assert not {"picky_bad_schema", "picky_remote_ref", "picky_dangling_ref"} & set(tools), tools
        [picky] = [p for p in gw.request(op="plugins")["data"]["plugins"] if p["id"] == "picky"]
        refused = "\n".join(picky["refused"])
        assert "tool 'picky_bad_schema': its input schema is not a valid JSON Schema: properties.n.type: 'integr' is not valid" in refused
        assert f"tool 'picky_remote_ref': its input schema refers outside itself ('http://127.0.0.1:{port}/x.json')" in refused
        assert "tool 'picky_dangling_ref': its input schema has a reference '#/$defs/missing' that points at nothing inside it" in refused
        shown = gw.cli("plugins", "show", "picky")
        assert shown.returncode == 0 and "picky_bad_schema" in shown.stdout and "not a valid JSON Schema" in shown.stdout, shown.stdout
        assert "may not register tool 'picky_bad_schema': its input schema is not a valid JSON Schema" in gw.log("picky")
        # The supervisor never fetched the remote schema.
        with pytest.raises(BlockingIOError):
            net.accept()
        resp = gw.call("picky_bad_schema", {})
        assert resp["error"]["code"] == "tool_not_found"
    finally:
        net.close()


def test_checking_costs_little_per_call() -> None:
    """One compiled validation per call: a thousand checks of the echo schema take
    well under a second (the call itself costs about 0.5 ms)."""
    reg = registered({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    t0 = time.perf_counter()
    for _ in range(1000):
        check_arguments(reg, {"text": "x" * 100})
    assert time.perf_counter() - t0 < 1.0
