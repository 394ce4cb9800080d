"""A tool's arguments are checked against its input schema in the supervisor, before
any dispatch (supervisor/tools/arguments.py): the error names the path and the rule, the
model and the CLI get it as a tool error, and the handler never runs. A schema that
is not valid JSON Schema, or that refers outside itself, refuses the registration.

The end-to-end tests run tests/plugins/picky, whose handlers each append a line to
calls.log in their workspace: a refused call must leave no line.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from clawsup.supervisor.tools.arguments import COUNTED_PROBLEMS, LOOP_BUDGET_S, check_arguments, check_arguments_async
from clawsup.supervisor.config import parse_config
from clawsup.supervisor.errors import BadToolArguments, ConfigError, RegistrationRefused, ToolFailed
from clawsup.supervisor.sandboxes.plans import build_plans
from clawsup.supervisor.sandboxes.registry import Kind, Registration, Registry
from clawsup.supervisor.tools.schemas import CHECK_BUDGET_S, CompiledSchema, SchemaRefused, compile_schemas
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
    from clawsup.supervisor.messages.session_store import file_name, read_session

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


# -- bounds: what a check costs is the plugin's schema's choice -----------------------


def doubling_refs(depth: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(depth)}
    defs[f"d{depth}"] = {}
    return {"type": "object", "$defs": defs, "allOf": [{"$ref": "#/$defs/d0"}]}


# A $ref cycle under allOf: each level of the arguments doubles the walk, which no
# look at the schema alone can refuse (a tree schema is a $ref cycle too).
CYCLE = {
    "type": "object",
    "$defs": {"n": {"type": "object", "properties": {"c": {"allOf": [{"$ref": "#/$defs/n"}, {"$ref": "#/$defs/n"}]}}}},
    "allOf": [{"$ref": "#/$defs/n"}],
}
CATASTROPHIC = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|aa)+$"}}}
ROWS = {
    "type": "object",
    "properties": {"rows": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
}


def nested(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    node = top
    for _ in range(depth):
        node["c"] = {}
        node = node["c"]
    return top


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"city": "x", "days": float("nan")}, "days: nan is not a number JSON allows"),
        ({"city": "x", "extra": [1, {"deep": float("-inf")}]}, "extra[1].deep: -inf is not a number JSON allows"),
        ('{"city": "x", "days": NaN}', "days: nan is not a number JSON allows"),
        ({"city": "x", "days": 10**5000}, "days: an integer of more than 4,200 digits is too long to pass on"),
        ('{"city": "x", "days": ' + "9" * 5000 + "}", "arguments hold a number that cannot be read"),
    ],
)
def test_numbers_json_cannot_carry_are_refused_by_path(args: Any, says: str) -> None:
    """NaN compares false with `minimum` and `maximum` both, so a schema alone lets it
    through; it is refused wherever it is, whatever the schema."""
    for schema in (FORECAST, {"type": "object"}):
        e = refusal(args, schema)
        assert e.problems.startswith(says), e.problems


def test_a_schema_whose_refs_double_at_each_step_is_refused_at_registration() -> None:
    t0 = time.monotonic()
    r = Registry()
    with pytest.raises(RegistrationRefused, match="its input schema expands to more than 10,000 subschemas once its \\$refs are followed"):
        r.register(Registration(kind=Kind.TOOL, name="t", owner="p", sandbox_id="p", input_schema=doubling_refs(18)), declared=frozenset({"t"}))
    assert time.monotonic() - t0 < 2
    # A few steps of it are fine, and a cycle (a tree) is no expansion. What is
    # asserted is that they are accepted, not how fast: under the full suite's load a
    # 256-fold walk can pass the loop's 20 ms budget (CI on 35ce500).
    check_arguments(registered(doubling_refs(8)), {}, budget_s=5)
    check_arguments(registered(CYCLE), nested(5), budget_s=5)


@pytest.mark.parametrize(("schema", "args"), [(CATASTROPHIC, {"s": "a" * 60 + "!"}), (CYCLE, nested(40))])
def test_a_check_stops_at_its_budget_and_blames_the_schema(schema: dict[str, Any], args: dict[str, Any]) -> None:
    """`^(a|aa)+$` backtracks for hours on 61 characters under `re`; a $ref cycle
    under allOf doubles with each level of the arguments. Either is stopped at the
    check's deadline, and the caller is told the schema is at fault."""
    reg = registered(schema)
    t0 = time.monotonic()
    with pytest.raises(ToolFailed) as caught:
        check_arguments(reg, args)
    took = time.monotonic() - t0
    e = caught.value
    assert not isinstance(e, BadToolArguments) and e.kind == "schema_too_costly", e
    assert str(e).startswith("tool 'forecast' (plugin 'weather') failed: checking these arguments against its input schema took more than 0.02 s"), e
    assert "the schema is too costly to check (tell the plugin's author)" in str(e)
    assert took < 0.5, f"the check held its caller {took:.2f} s"


async def test_the_async_check_holds_the_loop_for_its_slice_only() -> None:
    """Past LOOP_BUDGET_S the check starts again in a worker: the loop answers
    meanwhile; arguments that are big but fit pass (the sync check on the loop must
    refuse them), and a hostile schema fails at CHECK_BUDGET_S."""
    worst = 0.0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.001)
            worst = max(worst, time.monotonic() - t0)

    rows = {"rows": [{"a": "x", "b": i} for i in range(3000)]}
    with pytest.raises(ToolFailed, match="took more than 0.02 s"):
        check_arguments(registered(ROWS), rows)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(ticker())
        await asyncio.sleep(0.01)
        await check_arguments_async(registered(ROWS), rows)
        with pytest.raises(BadToolArguments, match=r"rows\[3000\].b: a required property is missing"):
            await check_arguments_async(registered(ROWS), {"rows": [*rows["rows"], {"a": "x"}]})
        t0 = time.monotonic()
        with pytest.raises(ToolFailed, match=f"took more than {CHECK_BUDGET_S:g} s"):
            await check_arguments_async(registered(CATASTROPHIC), {"s": "a" * 60 + "!"})
        took = time.monotonic() - t0
        stop.set()
    assert CHECK_BUDGET_S * 0.9 < took < CHECK_BUDGET_S + 1.5, took
    assert worst < LOOP_BUDGET_S + 0.15, f"the loop was held {worst * 1000:.0f} ms"


def test_unique_items_and_enum_keep_json_schema_equality() -> None:
    unique = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    assert "has non-unique elements ([0] and [1] are equal)" in refusal({"xs": [1, 1.0]}, unique).problems
    assert "([0] and [1] are equal)" in refusal({"xs": [{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}]}, unique).problems
    check_arguments(registered(unique), {"xs": [1, True, "1", [1], [True], {"a": 1}, {"a": True}, None, 0, False]})
    # 1,200 objects: jsonschema compares them pair by pair (2-3 s); hashed, it is nothing.
    t0 = time.monotonic()
    check_arguments(registered(unique), {"xs": [{"k": i} for i in range(1200)]}, budget_s=5)
    assert time.monotonic() - t0 < 0.5
    one_of = {"type": "object", "properties": {"x": {"enum": [1, "a", None, [1], {"k": 1}]}}}
    for fits in (1, 1.0, "a", None, [1.0], {"k": 1}):
        check_arguments(registered(one_of), {"x": fits})
    for unfit in (True, "b", 2, [True], {"k": 2}):
        assert "is not one of" in refusal({"x": unfit}, one_of).problems, unfit
    assert refusal({"x": "b"}, one_of).problems == "x: 'b' is not one of [1, 'a', None, [1], {'k': 1}]"


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "object", "properties": {"s": {"pattern": "a{4294967296}"}}}, "its input schema has a pattern 'a{4294967296}' that Python cannot compile (OverflowError"),
        ({"type": "object", "properties": {"s": {"pattern": "(?:a{1000}){1000}"}}}, "its input schema has patterns that repeat too much"),
        ({"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False}, "its input schema uses patternProperties with unevaluatedProperties"),
    ],
)
def test_what_cannot_be_compiled_in_bounds_refuses_that_tool_only(schema: dict[str, Any], says: str) -> None:
    """Whatever compiling raises (OverflowError is no re.error) refuses the tool, and
    the registry goes on: it never escapes to take the plugin down."""
    r = Registry()
    with pytest.raises(RegistrationRefused) as caught:
        r.register(Registration(kind=Kind.TOOL, name="bad", owner="p", sandbox_id="p", input_schema=schema), declared=frozenset({"bad", "good"}))
    assert caught.value.reason.startswith(says), caught.value.reason
    r.register(Registration(kind=Kind.TOOL, name="good", owner="p", sandbox_id="p", input_schema=FORECAST), declared=frozenset({"bad", "good"}))
    assert [t.name for t in r.tools()] == ["good"]


def test_patterns_are_matched_with_a_bound() -> None:
    schema = {"type": "object", "patternProperties": {"^x_(a|aa)+$": {"type": "integer"}}, "additionalProperties": False}
    reg = registered(schema)
    check_arguments(reg, {"x_aaa": 1})
    assert "'y' does not match any of the regexes" in refusal({"y": 1}, schema).problems
    with pytest.raises(ToolFailed, match="schema is too costly"):
        check_arguments(reg, {"x_" + "a" * 60 + "!": 1})


def test_a_plugins_schemas_have_a_budget_in_all() -> None:
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 40} for i in range(400)}}
    size = len(json.dumps(big, separators=(",", ":")))
    out = compile_schemas([big, FORECAST, big, FORECAST], max_total_bytes=size + 1000)
    assert isinstance(out[0], CompiledSchema) and isinstance(out[1], CompiledSchema) and isinstance(out[3], CompiledSchema)
    assert isinstance(out[2], SchemaRefused) and str(out[2]).startswith("would take the plugin's input schemas past"), out[2]


def write_plugin(tmp_path: Path, config_schema: dict[str, Any]) -> Path:
    folder = tmp_path / "configured"
    folder.mkdir()
    (folder / "clawsup.plugin.json").write_text(json.dumps({"id": "configured", "version": "1.0.0", "entry": "plugin.py", "configSchema": config_schema}))
    (folder / "plugin.py").write_text("")
    return folder


@pytest.mark.parametrize(
    ("config_schema", "config", "says"),
    [
        (doubling_refs(18), {}, "plugin 'configured': its configSchema expands to more than 10,000 subschemas"),
        ({"type": "object", "properties": {"s": {"pattern": "a{4294967296}"}}}, {"s": "x"}, "plugin 'configured': its configSchema has a pattern 'a{4294967296}' that Python cannot compile"),
        (CATASTROPHIC, {"s": "a" * 60 + "!"}, f"plugin 'configured': its configSchema took more than {CHECK_BUDGET_S:g} s to check the config"),
    ],
)
def test_a_config_schema_has_the_same_bounds(tmp_path: Path, config_schema: dict[str, Any], config: dict[str, Any], says: str) -> None:
    """A plugin's configSchema is checked at the gateway's start: an OverflowError
    there stopped the start with a traceback, and a $ref that doubled 18 times held
    it 12-18 s."""
    folder = write_plugin(tmp_path, config_schema)
    cfg = {"plugins": {"load": {"paths": [str(folder)]}, "entries": {"configured": {"trust": "trusted", "config": config}}}}
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        build_plans(parse_config(json.dumps(cfg), "c"), config_source="c", config_dir=tmp_path, extra_plugins=[], problem_of=lambda b: "")
    assert time.monotonic() - t0 < CHECK_BUDGET_S + 2
    assert any(p.startswith(says) for p in caught.value.problems), caught.value.problems
