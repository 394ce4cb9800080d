"""A plugin's JSON Schema (a tool's input schema, a plugin's configSchema), checked
and compiled by the supervisor, and validated within bounds.

A schema is the plugin's data and is judged like any other: it must be a valid JSON
Schema (Draft 2020-12 unless its `$schema` names another draft clawsup knows), and a
`$ref` resolves inside it or not at all. The validator is built on an empty
reference registry, so nothing is ever fetched (jsonschema's default fetches remote
`$ref`s over HTTP, which would block the event loop and let a plugin make the
supervisor reach any address).

The plugin's schema decides what a validation costs, so every validation has a bound
(tests/test_arguments.py; tests/test_hostile_bounds.py with the hostile_schemas
plugin):
- it runs to a deadline, which every keyword function checks before it runs, so a
  schema whose cost grows with the instance (a `$ref` cycle under `allOf`, a huge
  `enum` against many items) is cut off with CheckTooCostly;
- what one keyword function does between two such checks is bounded too: `pattern`
  and `patternProperties` run on the `regex` package with a timeout (the stdlib's
  `re` cannot be interrupted and holds the GIL, so neither a deadline nor a thread
  bounds `^(a+)+$`), `uniqueItems` hashes instead of comparing every pair, and
  `enum` of a scalar is a set lookup;
- at compile time, a schema whose local `$ref`s expand past `MAX_EXPANDED_NODES`
  subschemas is refused (a `$ref` used twice at each of 16 steps is 65,536 walks for
  `{}`), as are patterns that `regex` would unroll past `MAX_PATTERN_WEIGHT` (it
  expands `(?:a{1000}){1000}` at compile time: 1.6 s and 270 MB), and anything that
  cannot be compiled is refused with a reason, whatever it raises.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import math
import re
import reprlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parser  # type: ignore[attr-defined]
from typing import Any, TypeVar

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
import regex
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

T = TypeVar("T")
DEFAULT_DIALECT: type[Validator] = jsonschema.Draft202012Validator
# What one problem may weigh in a message: jsonschema quotes the offending value,
# which may be a megabyte string the model wrote.
MAX_PROBLEM_CHARS = 300
# What one validation may cost in all, off the event loop.
CHECK_BUDGET_S = 1.0
# What checking one schema against its draft may cost (a 31 KB schema takes 0.3 s).
COMPILE_BUDGET_S = 2.0
# Subschemas one schema may expand to with its local `$ref`s followed.
MAX_EXPANDED_NODES = 10_000
# Atoms a schema's patterns may be unrolled to by `regex` (`[0-9a-f]{64}` is 64; each
# costs the compiled pattern some 250 bytes), and a plugin's patterns in all.
MAX_PATTERN_WEIGHT = 2048
MAX_PLUGIN_PATTERN_WEIGHT = 16 * 1024
# Compiled schemas kept by their text, so that a sandbox's restart compiles nothing.
CACHED_SCHEMA_BYTES = 1024 * 1024
_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
_ID_KEYS = ("$id", "id")

# Schema work off the event loop: compiling a plugin's schemas at its start, and the
# argument checks that pass their slice of the loop. Its own two threads, so that a
# hostile plugin's checks queue behind each other, not behind the supervisor's file
# walks and engine calls in asyncio's default pool. Lives as long as the process.
_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="clawsup-schemas")


async def in_schema_worker(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a schema worker thread."""
    return await asyncio.get_running_loop().run_in_executor(_WORKERS, functools.partial(fn, *args, **kwargs))


class SchemaRefused(ValueError):
    """A schema the supervisor will not use. Its text completes "its input schema ..."
    (`is not a valid JSON Schema: ...`), for the plugin's author; `Registry.register`
    turns it into RegistrationRefused."""


class CheckTooCostly(Exception):
    """A check ran past its time budget and was stopped. The schema is the cause: it is
    the plugin's, and its cost, not the arguments' size, is what has no bound."""


class _Budget(threading.local):
    """The running check's deadline and its schema's compiled patterns and enums, per
    thread: a check runs on the loop and others in the workers at the same time. The
    keyword functions read it; the defaults are those of no check (the draft's own
    metaschema, whose patterns are few and known)."""

    deadline: float = math.inf
    patterns: dict[str, Any] = {}  # noqa: RUF012 - read only; a check sets its own
    enums: dict[int, tuple[list[Any], frozenset[Any]]] = {}  # noqa: RUF012


_budget = _Budget()


@dataclass(frozen=True, eq=False)
class CompiledSchema:
    """A schema checked and compiled. Created by `compile_schema`; a tool's is held
    by its `Registration` and gone with it. Validators are immutable, so one serves
    every call, on the loop and in the workers."""

    validator: Validator
    patterns: dict[str, Any]
    """Every pattern of the schema, compiled by `regex`, by its text."""
    enums: dict[int, tuple[list[Any], frozenset[Any]]]
    """Every `enum` list of the schema (by id, with the list itself to be sure) and its
    members' `_key`s."""
    size: int
    """Its JSON text, in bytes."""
    pattern_weight: int
    any_object: bool = False
    """The schema takes any object (a tool registered without one gets
    `{"type": "object", "properties": {}}`): nothing to validate per call."""

    def errors(self, instance: Any, *, budget_s: float, limit: int) -> list[ValidationError]:
        """The first `limit` problems of `instance`; CheckTooCostly past `budget_s`."""
        b = _budget
        b.deadline, b.patterns, b.enums = time.monotonic() + budget_s, self.patterns, self.enums
        try:
            return list(itertools.islice(self.validator.iter_errors(instance), limit))
        finally:
            # Patterns and enums may stay: each is found by its text or its identity.
            b.deadline = math.inf


# -- compiling ----------------------------------------------------------------------


def compile_schema(schema: Any) -> CompiledSchema:
    """Check `schema` and compile it, or raise SchemaRefused saying why. Whatever the
    schema makes the checking raise (an OverflowError from `re`, say) refuses it; it
    never escapes. Bounded by the schema's size (the registry takes 32 KB, a
    manifest 256 KiB) and COMPILE_BUDGET_S; run it off the loop for a plugin's
    tools. A sandbox registers the same schemas at every restart: each is compiled
    once (`_compiled_from_text`)."""
    return _compiled_from_text(_schema_text(schema))


def compile_schemas(schemas: Iterable[Any], *, max_total_bytes: int) -> list[CompiledSchema | SchemaRefused]:
    """One plugin's schemas, in order, each compiled or refused. One that would take
    them past `max_total_bytes` of schema text is refused uncompiled (and one past
    MAX_PLUGIN_PATTERN_WEIGHT refused): what a plugin's start costs the supervisor
    has a bound, whatever it describes."""
    out: list[CompiledSchema | SchemaRefused] = []
    total_bytes = total_weight = 0
    for schema in schemas:
        try:
            text = _schema_text(schema)
            if total_bytes + len(text) > max_total_bytes:
                raise SchemaRefused(f"would take the plugin's input schemas past {max_total_bytes // 1024} KiB in all (this one is {len(text)} bytes)")
            total_bytes += len(text)
            compiled = _compiled_from_text(text)
            if total_weight + compiled.pattern_weight > MAX_PLUGIN_PATTERN_WEIGHT:
                raise SchemaRefused(f"has patterns that would take the plugin's past {MAX_PLUGIN_PATTERN_WEIGHT} repeated atoms in all")
            total_weight += compiled.pattern_weight
            out.append(compiled)
        except SchemaRefused as e:
            out.append(e)
    return out


async def compile_schemas_off_loop(schemas: list[Any], *, max_total_bytes: int) -> list[CompiledSchema | SchemaRefused]:
    """`compile_schemas` in a schema worker: a 31 KB schema costs 0.3 s to check
    against its draft, which the loop must not wait for."""
    return await in_schema_worker(compile_schemas, schemas, max_total_bytes=max_total_bytes)


def _schema_text(schema: Any) -> str:
    if not isinstance(schema, dict):
        raise SchemaRefused(f"must be a JSON object, not {type(schema).__name__}")
    try:
        return json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except RecursionError:
        raise SchemaRefused("is nested too deeply to check") from None
    except (TypeError, ValueError) as e:
        raise SchemaRefused(f"is not JSON ({e})") from None


_cache: OrderedDict[str, CompiledSchema | SchemaRefused] = OrderedDict()
_cache_bytes = 0
_cache_lock = threading.Lock()


def _compiled_from_text(text: str) -> CompiledSchema:
    """Least recently used first out, past CACHED_SCHEMA_BYTES of text: a plugin whose
    schemas are new at every start (a random `$comment`) gets no hit and pushes out
    no more than that."""
    global _cache_bytes
    with _cache_lock:
        outcome = _cache.get(text)
        if outcome is not None:
            _cache.move_to_end(text)
    if outcome is None:
        try:
            outcome = _compile(json.loads(text), len(text))
        except SchemaRefused as e:
            outcome = e
        with _cache_lock:
            if text not in _cache and len(text) <= CACHED_SCHEMA_BYTES // 4:
                _cache[text] = outcome
                _cache_bytes += len(text)
                while _cache_bytes > CACHED_SCHEMA_BYTES:
                    old, _ = _cache.popitem(last=False)
                    _cache_bytes -= len(old)
    if isinstance(outcome, SchemaRefused):
        raise SchemaRefused(str(outcome))
    return outcome


def _compile(schema: dict[str, Any], size: int) -> CompiledSchema:
    try:
        cls = _dialect(schema)
        outside = sorted(outside_refs(schema))
        if outside:
            raise SchemaRefused(f"refers outside itself ({', '.join(repr(r[:100]) for r in outside[:3])}); only local references such as '#/$defs/x' are followed")
        patterns, weight = _compile_patterns(schema)
        _check_against_draft(cls, schema)
        validator = _bounded(cls)(schema, registry=referencing.Registry())
        resolve = _local_resolver(validator, schema)
        _resolve_local_refs(resolve, schema)
        _check_expansion(resolve, schema)
        _check_combinations(schema)
        enums = {id(node["enum"]): (node["enum"], frozenset(_key(v) for v in node["enum"])) for node, _ in _nodes(schema) if isinstance(node.get("enum"), list)}
    except SchemaRefused:
        raise
    except RecursionError:
        raise SchemaRefused("is nested too deeply to check") from None
    except CheckTooCostly:
        raise SchemaRefused(f"takes more than {COMPILE_BUDGET_S:g} s to check against its JSON Schema draft; make it smaller") from None
    except Exception as e:  # noqa: BLE001 - the plugin's data made the checking fail: refuse it, say how
        raise SchemaRefused(f"could not be checked ({type(e).__name__}: {cut(str(e), 200)})") from None
    return CompiledSchema(validator, patterns, enums, size=size, pattern_weight=weight, any_object=_takes_any_object(schema))


def _dialect(schema: dict[str, Any]) -> type[Validator]:
    dialect = schema.get("$schema")
    if dialect is None:
        return DEFAULT_DIALECT
    known: type[Validator] | None = jsonschema.validators.validator_for(schema, default=None) if isinstance(dialect, str) else None
    if known is None:
        raise SchemaRefused(f"names {str(dialect)[:100]!r} in $schema, which is no JSON Schema draft clawsup knows; leave $schema out for Draft 2020-12")
    return known


def _check_against_draft(cls: type[Validator], schema: dict[str, Any]) -> None:
    """`cls.check_schema`, within COMPILE_BUDGET_S: the first problem refuses it."""
    meta = _meta_validator(cls)
    b = _budget
    b.deadline = time.monotonic() + COMPILE_BUDGET_S
    try:
        error = next(meta.iter_errors(schema), None)
    finally:
        b.deadline = math.inf
    if error is not None:
        raise SchemaRefused(f"is not a valid JSON Schema: {describe(error, root='(root)')}")


_meta_validators: dict[type[Validator], Validator] = {}
"""`_meta_validator`'s cache: one per draft. (A dict, not functools.cache: mypy takes
jsonschema's untyped classes for unhashable.)"""


def _meta_validator(cls: type[Validator]) -> Validator:
    if (done := _meta_validators.get(cls)) is None:
        meta_cls = jsonschema.validators.validator_for(cls.META_SCHEMA, default=cls)
        done = _meta_validators[cls] = _bounded(meta_cls)(cls.META_SCHEMA, format_checker=meta_cls.FORMAT_CHECKER)
    return done


def _takes_any_object(schema: dict[str, Any]) -> bool:
    """Whether every JSON object fits `schema`: only annotations, `type: object`, and
    no property described. (The caller has checked that the arguments are an object.)"""
    annotations = {"$schema", "$id", "title", "description", "$comment", "examples", "default"}
    return schema.get("type", "object") == "object" and not schema.get("properties") and set(schema) <= annotations | {"type", "properties"}


def _compile_patterns(schema: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Every `pattern` and `patternProperties` key, compiled by `regex`, and what they
    weigh in all. A pattern `re` rejects is left to the draft's check, which names it
    ("is not a 'regex'")."""
    found: set[str] = set()
    for node, _ in _nodes(schema):
        if isinstance(p := node.get("pattern"), str):
            found.add(p)
        if isinstance(pp := node.get("patternProperties"), dict):
            found.update(pp)
    compiled: dict[str, Any] = {}
    weight = 0
    for p in sorted(found):
        try:
            parsed = sre_parser.parse(p)
        except re.error:
            continue
        except Exception as e:  # noqa: BLE001 - OverflowError for a{4294967296}, RecursionError...
            raise SchemaRefused(f"has a pattern {cut(repr(p), 100)} that Python cannot compile ({type(e).__name__}: {e})") from None
        weight += _pattern_weight(parsed)
        if weight > MAX_PATTERN_WEIGHT:
            raise SchemaRefused(f"has patterns that repeat too much ({cut(repr(p), 100)} takes them past {MAX_PATTERN_WEIGHT} repeated atoms); bound lengths with minLength and maxLength")
        try:
            compiled[p] = regex.compile(p)
        except Exception as e:  # noqa: BLE001
            raise SchemaRefused(f"has a pattern {cut(repr(p), 100)} that cannot be compiled ({type(e).__name__}: {e})") from None
    return compiled, weight


_REPEATS = frozenset({sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT})


def _pattern_weight(parsed: Iterable[tuple[Any, Any]]) -> int:
    """What `regex` unrolls a parsed pattern to, in atoms: it expands each repeat's
    minimum count at compile time (a{50000} is 50,000 copies; a{0,50000} one)."""
    total = 0
    for op, av in parsed:
        if op in _REPEATS:
            low, _, sub = av
            total += max(low, 1) * max(_pattern_weight(sub), 1)
        elif op is sre_constants.SUBPATTERN:
            total += _pattern_weight(av[-1])
        elif op is sre_constants.BRANCH:
            total += sum(_pattern_weight(b) for b in av[1])
        elif op is sre_constants.ATOMIC_GROUP:
            total += _pattern_weight(av)
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            total += _pattern_weight(av[1])
        elif op is sre_constants.GROUPREF_EXISTS:
            total += _pattern_weight(av[1]) + (_pattern_weight(av[2]) if av[2] else 0)
        else:
            total += 1
        if total > MAX_PATTERN_WEIGHT:
            return total
    return total


def _local_resolver(validator: Validator, schema: dict[str, Any]) -> Callable[[str], Any]:
    """The subschema a local `$ref` names, or None."""
    resource = referencing.jsonschema.specification_with(
        validator.META_SCHEMA.get("$schema", DEFAULT_DIALECT.META_SCHEMA["$schema"]), default=referencing.jsonschema.DRAFT202012
    ).create_resource(schema)
    resolver = referencing.Registry().with_resource("", resource).resolver()
    found: dict[str, Any] = {}

    def resolve(ref: str) -> Any:
        if ref not in found:
            try:
                found[ref] = resolver.lookup(ref).contents
            except referencing.exceptions.Unresolvable:
                found[ref] = None
        return found[ref]

    return resolve


def _resolve_local_refs(resolve: Callable[[str], Any], schema: dict[str, Any]) -> None:
    """Refuse a `$ref: "#/$defs/x"` that points at nothing, now rather than at the
    first call that reaches it. Refs under a nested `$id` resolve against that id
    and are left to the call (which then fails as `invalid_schema`)."""
    for node, under_id in _nodes(schema):
        ref = node.get("$ref")
        if under_id or not isinstance(ref, str) or not ref.startswith("#"):
            continue
        if resolve(ref) is None:
            raise SchemaRefused(f"has a reference {ref[:100]!r} that points at nothing inside it")


def _check_expansion(resolve: Callable[[str], Any], schema: dict[str, Any]) -> None:
    """Refuse a schema whose subschemas, with every local `$ref` followed, pass
    MAX_EXPANDED_NODES: what one check may walk whatever the arguments. Counted once
    per subschema (a `$ref` used 2**16 times costs 17 counts, not 65,536 walks); a
    `$ref` back to a subschema being counted is a cycle, walked only as deep as the
    arguments go, which the check's deadline bounds."""
    counted: dict[int, int] = {}
    counting: set[int] = set()

    def size(node: Any) -> int:
        if isinstance(node, list):
            return sum(size(v) for v in node)
        if not isinstance(node, dict) or id(node) in counting:
            return 0
        if id(node) in counted:
            return counted[id(node)]
        counting.add(id(node))
        n = 1
        for k, v in node.items():
            n += size(v)
            if k in _REF_KEYS and isinstance(v, str) and v.startswith("#") and (target := resolve(v)) is not None:
                n += size(target)
            if n > MAX_EXPANDED_NODES:
                raise SchemaRefused(
                    f"expands to more than {MAX_EXPANDED_NODES:,} subschemas once its $refs are followed "
                    "(a $ref used twice at each step doubles the walk); follow fewer $refs per step"
                )
        counting.discard(id(node))
        counted[id(node)] = n
        return n

    size(schema)


def _check_combinations(schema: dict[str, Any]) -> None:
    """jsonschema's `unevaluatedProperties` matches `patternProperties` with the stdlib
    `re`, out of reach of any bound; the combination is refused."""
    nodes = [node for node, _ in _nodes(schema)]
    if any(isinstance(n.get("patternProperties"), dict) for n in nodes) and any("unevaluatedProperties" in n for n in nodes):
        raise SchemaRefused("uses patternProperties with unevaluatedProperties, which clawsup cannot check in bounded time; use additionalProperties instead")


# -- the bounded validator -----------------------------------------------------------


def _tick() -> None:
    if time.monotonic() > _budget.deadline:
        raise CheckTooCostly


def _deadlined(fn: Callable[..., Any]) -> Callable[..., Any]:
    def keyword(validator: Validator, value: Any, instance: Any, schema: Any, _now: Callable[[], float] = time.monotonic, _b: _Budget = _budget) -> Any:
        if _now() > _b.deadline:
            raise CheckTooCostly
        return fn(validator, value, instance, schema)

    return keyword


def _search(pattern: str, text: str) -> bool:
    compiled = _budget.patterns.get(pattern)
    if compiled is None:
        compiled = _trusted_pattern(pattern)
    left = _budget.deadline - time.monotonic()
    if left <= 0:
        raise CheckTooCostly
    try:
        return compiled.search(text, timeout=left if left < 3600 else None) is not None
    except TimeoutError:
        raise CheckTooCostly from None


@functools.lru_cache(maxsize=64)
def _trusted_pattern(pattern: str) -> Any:
    """A pattern of a draft's metaschema (a plugin's are compiled with its schema)."""
    if _pattern_weight(sre_parser.parse(pattern)) > MAX_PATTERN_WEIGHT:
        raise CheckTooCostly
    return regex.compile(pattern)


def _pattern(validator: Validator, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{_short(instance)} does not match {patrn!r}")


def _pattern_properties(validator: Validator, pattern_properties: dict[str, Any], instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for k, v in instance.items():
            if _search(pattern, k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional_properties(validator: Validator, ap: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """jsonschema's, with the patterns matched by `_search`."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = {k for k in instance if k not in properties and not any(_search(p, k) for p in patterns)}
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{', '.join(repr(e) for e in sorted(extras))} {verb} not match any of the regexes: {', '.join(repr(p) for p in sorted(patterns))}")
        else:
            listed = sorted(extras)
            yield ValidationError(f"Additional properties are not allowed ({', '.join(repr(e) for e in listed)} {'was' if len(listed) == 1 else 'were'} unexpected)")


def _unique_items(validator: Validator, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """By hashing each item's `_key`: jsonschema compares every pair of items that do
    not sort (2-3 s for 1,200 small objects)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: dict[Any, int] = {}
    for i, item in enumerate(instance):
        first = seen.setdefault(_key(item), i)
        if first != i:
            yield ValidationError(f"{_short(instance)} has non-unique elements ([{first}] and [{i}] are equal)")
            return


def _enum_of(original: Callable[..., Any]) -> Callable[..., Any]:
    def enum(validator: Validator, enums: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        """A scalar is looked up in the enum's `_key`s, compiled with the schema; an
        object or array is compared member by member, as jsonschema does (each
        comparison stops at the first difference, so this is bounded by the enum)."""
        known = _budget.enums.get(id(enums))
        if known is None or known[0] is not enums or isinstance(instance, (dict, list)):
            yield from original(validator, enums, instance, schema)
        elif _key(instance) not in known[1]:
            yield ValidationError(f"{_short(instance)} is not one of {_short(enums)}")

    return enum


_bounded_classes: dict[type[Validator], type[Validator]] = {}
"""`_bounded`'s cache: one per draft (see `_meta_validators`)."""


def _bounded(cls: type[Validator]) -> type[Validator]:
    """`cls` with every keyword function behind the running check's deadline, and the
    ones whose own cost has no bound in jsonschema replaced."""
    if (done := _bounded_classes.get(cls)) is not None:
        return done
    own: dict[str, Callable[..., Any]] = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "uniqueItems": _unique_items,
    }
    keywords = {k: _deadlined(own.get(k, fn)) for k, fn in cls.VALIDATORS.items()}
    if "enum" in cls.VALIDATORS:
        keywords["enum"] = _deadlined(_enum_of(cls.VALIDATORS["enum"]))
    bounded: type[Validator] = jsonschema.validators.extend(cls, keywords)
    _bounded_classes[cls] = bounded
    return bounded


def _key(value: Any) -> Any:
    """A hashable stand-in for a JSON value, equal where JSON Schema says the values are
    equal: 1 and 1.0 alike, true and 1 not, objects whatever their key order."""
    if isinstance(value, dict):
        _tick()
        return ("o", tuple(sorted((k, _key(v)) for k, v in value.items())))
    if isinstance(value, list):
        _tick()
        return ("a", tuple(_key(v) for v in value))
    if isinstance(value, bool):
        return ("b", value)
    return value


# -- words ---------------------------------------------------------------------------


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
    return f"{path_text(path) or root}: {cut(message)}"


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


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 120
_repr.maxlist = _repr.maxdict = 8


def _short(value: Any) -> str:
    """repr, cut without writing the whole value first."""
    return _repr.repr(value)


def path_text(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            p = cut(str(p), 64)
            out += f".{p}" if out else p
    return out


def cut(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
