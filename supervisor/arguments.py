"""A tool's arguments, checked against its input schema in the supervisor before any
dispatch: the handler of a call whose arguments do not fit is never called.

The schema is compiled once, when the registry accepts the registration
(`compile_arguments`, called by `Registry.register`), and the compiled check travels
on the `Registration`; a call pays one validation, never a compile
(tests/test_arguments.py). `SandboxManager.invoke`, the one path every tool call
takes, calls `check_arguments`.

A schema is the plugin's data and is judged like any other: it must be a valid JSON
Schema (Draft 2020-12 unless its `$schema` names another draft clawsup knows), and a
`$ref` resolves inside it or not at all. The validator is built on an empty
reference registry, so nothing is ever fetched (jsonschema's default fetches remote
`$ref`s over HTTP, which would block the event loop and let a plugin make the
supervisor reach any address; supervisor/plans.py holds configSchema to the same rule).
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema
import referencing
import referencing.exceptions
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator

from supervisor.errors import BadToolArguments, ToolFailed

if TYPE_CHECKING:
    from supervisor.registry import Registration

DEFAULT_DIALECT: type[Validator] = jsonschema.Draft202012Validator
# Problems past the first are counted this far ("and 3 more problems"): a huge array
# of wrong items must not cost a validation of all of it to say so.
COUNTED_PROBLEMS = 50
# What one problem may weigh in the message: jsonschema quotes the offending value,
# which may be a megabyte string the model wrote.
MAX_PROBLEM_CHARS = 300
_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
_ID_KEYS = ("$id", "id")


class SchemaRefused(ValueError):
    """A tool's input schema the supervisor will not use. Its text completes "its
    input schema ..." (`is not a valid JSON Schema: ...`), for the plugin's author;
    `Registry.register` turns it into RegistrationRefused."""


@dataclass(frozen=True, eq=False)
class ArgumentsCheck:
    """A compiled input schema. Created by `compile_arguments` when a tool
    registers; held by its `Registration`, and gone with it. Validators are
    immutable, so one serves every call."""

    validator: Validator
    any_object: bool = False
    """The schema takes any object (a tool registered without one gets
    `{"type": "object", "properties": {}}`): nothing to run per call."""

    def problems(self, args: dict[str, Any]) -> str | None:
        """None when `args` fit, else what is wrong: the most relevant problem, named
        by its path and rule, and how many more there are."""
        if self.any_object:
            return None
        errors = list(itertools.islice(self.validator.iter_errors(args), COUNTED_PROBLEMS + 1))
        if not errors:
            return None
        best = best_match(errors)
        assert best is not None
        text = describe(best)
        more = len(errors) - 1
        if more > COUNTED_PROBLEMS - 1:
            text += f" (and at least {COUNTED_PROBLEMS} more problems)"
        elif more:
            text += f" (and {more} more problem{'s' if more != 1 else ''})"
        return text


def compile_arguments(schema: Any) -> ArgumentsCheck:
    """Check `schema` and compile it, or raise SchemaRefused saying why. A sandbox
    registers the same schemas at every restart: each is compiled once (checking a
    plugin's dozen schemas cost some 20 ms of the loop, at every restart)."""
    if not isinstance(schema, dict):
        raise SchemaRefused(f"must be a JSON object, not {type(schema).__name__}")
    try:
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return _compile(schema)
    outcome = _compiled_by_text(key)
    if isinstance(outcome, SchemaRefused):
        raise SchemaRefused(str(outcome))
    return outcome


@functools.lru_cache(maxsize=1024)
def _compiled_by_text(text: str) -> ArgumentsCheck | SchemaRefused:
    try:
        return _compile(json.loads(text))
    except SchemaRefused as e:
        return e


def _compile(schema: dict[str, Any]) -> ArgumentsCheck:
    dialect = schema.get("$schema")
    if dialect is None:
        cls = DEFAULT_DIALECT
    else:
        known = jsonschema.validators.validator_for(schema, default=None) if isinstance(dialect, str) else None  # type: ignore[arg-type]
        if known is None:
            raise SchemaRefused(f"names {str(dialect)[:100]!r} in $schema, which is no JSON Schema draft clawsup knows; leave $schema out for Draft 2020-12")
        cls = known
    try:
        outside = sorted(outside_refs(schema))
        if outside:
            raise SchemaRefused(f"refers outside itself ({', '.join(repr(r[:100]) for r in outside[:3])}); only local references such as '#/$defs/x' are followed")
        cls.check_schema(schema)
        validator = cls(schema, registry=referencing.Registry())
        _resolve_local_refs(validator, schema)
    except jsonschema.SchemaError as e:
        raise SchemaRefused(f"is not a valid JSON Schema: {describe(e, root='(root)')}") from None
    except RecursionError:
        raise SchemaRefused("is nested too deeply to check") from None
    return ArgumentsCheck(validator, any_object=_takes_any_object(schema))


def _takes_any_object(schema: dict[str, Any]) -> bool:
    """Whether every JSON object fits `schema`: only annotations, `type: object`, and
    no property described. (The caller has checked that the arguments are an object.)"""
    annotations = {"$schema", "$id", "title", "description", "$comment", "examples", "default"}
    return schema.get("type", "object") == "object" and not schema.get("properties") and set(schema) <= annotations | {"type", "properties"}


def check_arguments(reg: Registration, args: dict[str, Any] | str) -> None:
    """Raise BadToolArguments unless `args` fit `reg`'s input schema. `args` as text
    (JSON) is parsed to be checked; the caller sends it on as it came."""
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except json.JSONDecodeError as e:
            raise BadToolArguments(reg.name, f"arguments are not valid JSON: {e.msg} at position {e.pos}", owner=reg.owner) from None
        except RecursionError:
            raise BadToolArguments(reg.name, "arguments are nested too deeply", owner=reg.owner) from None
    if not isinstance(args, dict):
        raise BadToolArguments(reg.name, f"arguments must be a JSON object, not {_json_type(args)}", owner=reg.owner)
    check = reg.arguments
    if check is None:
        # Only a Registration built by hand and never registered has none.
        return
    try:
        problems = check.problems(args)
    except RecursionError:
        raise BadToolArguments(reg.name, "arguments are nested too deeply to check", owner=reg.owner) from None
    except referencing.exceptions.Unresolvable as e:
        raise ToolFailed(reg.name, reg.owner, "invalid_schema", f"its input schema has a reference that does not resolve inside it ({e}); tell the plugin's author") from None
    if problems is not None:
        raise BadToolArguments(reg.name, problems, owner=reg.owner)


def describe(err: ValidationError | jsonschema.SchemaError, *, root: str = "arguments") -> str:
    """`days: 50 is greater than the maximum of 10`; a missing property is named as
    its own path (`city: a required property is missing`)."""
    path = list(err.absolute_path)
    message = err.message
    if err.validator == "required" and isinstance(err.validator_value, list):
        missing = next((p for p in err.validator_value if isinstance(p, str) and message == f"{p!r} is a required property"), None)
        if missing is not None:
            path.append(missing)
            message = "a required property is missing"
    return f"{_path(path) or root}: {_cut(message)}"


def outside_refs(schema: Any) -> set[str]:
    """Every `$ref` (and dynamic or recursive ref) that does not point inside the
    schema itself. Walks without recursion: a schema's depth is the plugin's choice."""
    found: set[str] = set()
    for node, _ in _nodes(schema):
        for key in _REF_KEYS:
            ref = node.get(key)
            if isinstance(ref, str) and not ref.startswith("#"):
                found.add(ref)
    return found


def _resolve_local_refs(validator: Validator, schema: dict[str, Any]) -> None:
    """Refuse a `$ref: "#/$defs/x"` that points at nothing, now rather than at the
    first call that reaches it. Refs under a nested `$id` resolve against that id
    and are left to the call (which then fails as `invalid_schema`)."""
    resource = referencing.jsonschema.specification_with(
        validator.META_SCHEMA.get("$schema", DEFAULT_DIALECT.META_SCHEMA["$schema"]), default=referencing.jsonschema.DRAFT202012
    ).create_resource(schema)
    resolver = referencing.Registry().with_resource("", resource).resolver()
    for node, under_id in _nodes(schema):
        ref = node.get("$ref")
        if under_id or not isinstance(ref, str) or not ref.startswith("#"):
            continue
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            raise SchemaRefused(f"has a reference {ref[:100]!r} that points at nothing inside it") from None


def _nodes(schema: Any) -> Iterable[tuple[dict[str, Any], bool]]:
    """Every object in `schema`, and whether a nested `$id` is above (or on) it."""
    stack: list[tuple[Any, bool]] = [(schema, False)]
    while stack:
        node, under_id = stack.pop()
        if isinstance(node, dict):
            nested = under_id or (node is not schema and any(isinstance(node.get(k), str) for k in _ID_KEYS))
            yield node, nested
            stack.extend((v, nested) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, under_id) for v in node)


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            p = _cut(str(p), 64)
            out += f".{p}" if out else p
    return out


def _cut(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "null" if value is None else type(value).__name__
