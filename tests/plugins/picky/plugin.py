"""Tools with strict input schemas (and three schemas the supervisor must refuse).
Each handler appends one JSON line to calls.log in the workspace before it answers:
a call whose arguments the supervisor refused must leave no line."""

from __future__ import annotations

import json

from clawsup.sandbox.api import hookimpl

FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "days": {"type": "integer", "minimum": 1, "maximum": 10},
    },
    "required": ["city"],
    "additionalProperties": False,
}
ROUTE = {
    "type": "object",
    "$defs": {"stop": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    "properties": {"stops": {"type": "array", "items": {"$ref": "#/$defs/stop"}, "maxItems": 5}},
    "required": ["stops"],
}
# Valid in draft 4 only (exclusiveMaximum as a boolean): proves `$schema` is honoured.
DRAFT4 = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "type": "object",
    "properties": {"n": {"type": "number", "maximum": 5, "exclusiveMaximum": True}},
}
BAD = {"type": "object", "properties": {"n": {"type": "integr"}}}
DANGLING = {"type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}}


def _handler(name: str):
    def handle(args: dict) -> dict:
        with open("calls.log", "a") as f:
            f.write(json.dumps({"tool": name, "args": args}) + "\n")
        return {"tool": name, "args": args}

    return handle


@hookimpl
def clawsup_register(api) -> None:
    remote = {"type": "object", "properties": {"x": {"$ref": api.config.get("remoteRef", "http://127.0.0.1:9/x.json")}}}
    for name, schema in (
        ("forecast", FORECAST),
        ("picky_route", ROUTE),
        ("picky_draft4", DRAFT4),
        ("picky_bad_schema", BAD),
        ("picky_remote_ref", remote),
        ("picky_dangling_ref", DANGLING),
    ):
        api.register_tool(name=name, description=f"{name}, with a strict schema", input_schema=schema, handler=_handler(name))
