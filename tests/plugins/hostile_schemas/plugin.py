"""Schemas that are valid JSON Schema, small (a few hundred bytes), and cost the
supervisor's validator seconds of its event loop per call. Every handler that runs
appends a line to calls.log in the workspace, so a test can see what got through."""

from __future__ import annotations

import json
import os

from clawsup.sandbox.api import hookimpl


def doubling_refs(depth: int) -> dict:
    """d0 -> (d1 and d1) -> ... : one call walks 2**depth subschemas, whatever the
    arguments are ({} will do)."""
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(depth)}
    defs[f"d{depth}"] = {}
    return {"type": "object", "$defs": defs, "allOf": [{"$ref": "#/$defs/d0"}]}


PATTERN = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
UNIQUE = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
BOUNDED = {"type": "object", "properties": {"n": {"type": "number", "minimum": 1, "maximum": 10}}, "required": ["n"], "additionalProperties": False}
OVERFLOW = {"type": "object", "properties": {"s": {"type": "string", "pattern": "a{4294967296}"}}}


def heavy_schema() -> dict:
    """About 31 KB of plain properties, under the registry's 32 KB; the random
    `$comment` makes it new text at every start."""
    props = {}
    schema = {"type": "object", "$comment": os.urandom(8).hex(), "properties": props}
    i = 0
    while len(json.dumps(schema)) < 31 * 1024:
        props[f"p{i}"] = {"type": "string", "minLength": 1, "description": "d"}
        i += 1
    return schema


def _handler(name: str):
    def handle(args: dict) -> str:
        with open("calls.log", "a") as f:
            f.write(json.dumps({"tool": name, "args": repr(args)[:200]}) + "\n")
        return f"{name} ran with {repr(args)[:200]}"

    return handle


@hookimpl
def clawsup_register(api) -> None:
    tools = [
        ("hostile_ping", {"type": "object"}),
        ("hostile_refs", doubling_refs(int(api.config.get("refDepth", 15)))),
        ("hostile_pattern", PATTERN),
        ("hostile_unique", UNIQUE),
        ("hostile_bounded", BOUNDED),
    ]
    if api.config.get("overflow"):
        tools.append(("hostile_overflow", OVERFLOW))
    tools += [(f"hostile_heavy_{i}", heavy_schema()) for i in range(int(api.config.get("heavy", 0)))]
    for name, schema in tools:
        api.register_tool(name=name, description=f"{name}: a hostile input schema", input_schema=schema, handler=_handler(name))
