"""A tool's arguments, checked against its input schema in the supervisor before any
dispatch: the handler of a call whose arguments do not fit is never called.

The schema is compiled once, when the tool registers (supervisor/tools/schemas.py; a
plugin's schemas all at once and off the event loop), and the compiled check travels
on the `Registration`; a call pays one validation, never a compile
(tests/test_arguments.py). `ToolDispatcher.invoke` (supervisor/tools/dispatch.py),
the one path every tool call takes, calls `check_arguments_async` (or
`check_arguments`).

The plugin's schema decides what a check costs (supervisor/tools/schemas.py bounds it): a
check on the event loop stops after `LOOP_BUDGET_S`; `check_arguments_async` then
does it again in a schema worker, within `CHECK_BUDGET_S`, and past that the call
fails naming the schema as the cause (tests/test_hostile_bounds.py).
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

import referencing.exceptions
from jsonschema.exceptions import ValidationError, best_match

from clawsup.supervisor.errors import BadToolArguments, ToolFailed
from clawsup.supervisor.tools.schemas import CHECK_BUDGET_S, CheckTooCostly, cut, describe, in_schema_worker, path_text

if TYPE_CHECKING:
    from clawsup.supervisor.sandboxes.registry import Registration

# Problems past the first are counted this far ("and 3 more problems"): a huge array
# of wrong items must not cost a validation of all of it to say so.
COUNTED_PROBLEMS = 50
# What one check may hold the event loop. A normal check takes 10-30 µs; 2,000 rows
# of five typed properties take about 100 ms, and go on in a worker.
LOOP_BUDGET_S = 0.02
# An integer past this many bits (some 4,200 digits) cannot be written as JSON text
# by Python (sys.get_int_max_str_digits) and would fail the call further on.
MAX_INT_BITS = 14_000


def check_arguments(reg: Registration, args: dict[str, Any] | str, *, budget_s: float = LOOP_BUDGET_S) -> None:
    """Raise BadToolArguments unless `args` fit `reg`'s input schema; a ToolFailed
    naming the schema if checking them takes more than `budget_s` (the default is
    what the event loop may be held). `args` as text (JSON) is parsed to be checked;
    the caller sends it on as it came."""
    parsed = _parsed(reg, args)
    try:
        _check(reg, parsed, budget_s)
    except CheckTooCostly:
        raise _too_costly(reg, budget_s) from None


async def check_arguments_async(reg: Registration, args: dict[str, Any] | str) -> None:
    """`check_arguments`, on the loop for LOOP_BUDGET_S (every normal check ends well
    within it, without a thread hop), then again from the start in a schema worker,
    within CHECK_BUDGET_S: arguments that are big but fit still pass, and the loop is
    never held longer than LOOP_BUDGET_S."""
    parsed = _parsed(reg, args)
    try:
        _check(reg, parsed, LOOP_BUDGET_S)
        return
    except CheckTooCostly:
        pass
    await in_schema_worker(check_arguments, reg, parsed, budget_s=CHECK_BUDGET_S)


def _parsed(reg: Registration, args: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except json.JSONDecodeError as e:
            raise BadToolArguments(reg.name, f"arguments are not valid JSON: {e.msg} at position {e.pos}", owner=reg.owner) from None
        except ValueError as e:
            # Python's int-from-text limit: 5,000 digits of a number.
            raise BadToolArguments(reg.name, f"arguments hold a number that cannot be read ({cut(str(e), 120)})", owner=reg.owner) from None
        except RecursionError:
            raise BadToolArguments(reg.name, "arguments are nested too deeply", owner=reg.owner) from None
    if not isinstance(args, dict):
        raise BadToolArguments(reg.name, f"arguments must be a JSON object, not {_json_type(args)}", owner=reg.owner)
    return args


def _check(reg: Registration, args: dict[str, Any], budget_s: float) -> None:
    deadline = time.monotonic() + budget_s
    odd = _unrepresentable(args, deadline)
    if odd is not None:
        raise BadToolArguments(reg.name, odd, owner=reg.owner)
    check = reg.arguments
    if check is None or check.any_object:
        # None: only a Registration built by hand and never registered has none.
        return
    try:
        errors = check.errors(args, budget_s=deadline - time.monotonic(), limit=COUNTED_PROBLEMS + 1)
    except CheckTooCostly:
        raise
    except RecursionError:
        raise BadToolArguments(reg.name, "arguments are nested too deeply to check", owner=reg.owner) from None
    except referencing.exceptions.Unresolvable as e:
        raise ToolFailed(reg.name, reg.owner, "invalid_schema", f"its input schema has a reference that does not resolve inside it ({e}); tell the plugin's author") from None
    except Exception as e:  # noqa: BLE001 - whatever the schema makes jsonschema raise is the schema's fault
        raise ToolFailed(reg.name, reg.owner, "invalid_schema", f"its input schema could not be checked against these arguments ({type(e).__name__}: {cut(str(e), 200)}); tell the plugin's author") from None
    if errors:
        raise BadToolArguments(reg.name, _problems(errors), owner=reg.owner)


def _problems(errors: list[ValidationError]) -> str:
    """The most relevant problem, named by its path and rule, and how many more."""
    best = best_match(errors)
    assert best is not None
    text = describe(best)
    more = len(errors) - 1
    if more > COUNTED_PROBLEMS - 1:
        text += f" (and at least {COUNTED_PROBLEMS} more problems)"
    elif more:
        text += f" (and {more} more problem{'s' if more != 1 else ''})"
    return text


def _unrepresentable(args: dict[str, Any], deadline: float) -> str | None:
    """The first number in `args` that JSON cannot carry, named by its path: NaN and
    the infinities (Python's json reads and writes them; NaN passes `minimum` and
    `maximum`, for it compares false with both), and integers too long to write."""
    stack: list[Any] = [args]
    walked = 0
    while stack:
        node = stack.pop()
        for v in node.values() if isinstance(node, dict) else node:
            walked += 1
            if walked & 4095 == 0 and time.monotonic() > deadline:
                raise CheckTooCostly
            if isinstance(v, str):
                continue
            if isinstance(v, float):
                if not math.isfinite(v):
                    return f"{path_text(_path_to(args, v))}: {v} is not a number JSON allows"
            elif isinstance(v, int):
                if v.bit_length() > MAX_INT_BITS:
                    return f"{path_text(_path_to(args, v))}: an integer of more than {MAX_INT_BITS * 3 // 10:,} digits is too long to pass on"
            elif isinstance(v, (dict, list)):
                stack.append(v)
    return None


def _path_to(args: dict[str, Any], found: Any) -> list[Any]:
    """Where `found` (that very object) is in `args`, in the order `_unrepresentable`
    walks: kept apart so that a walk that finds nothing builds no paths."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(args, ())]
    while stack:
        node, path = stack.pop()
        for k, v in node.items() if isinstance(node, dict) else enumerate(node):
            if v is found:
                return [*path, k]
            if isinstance(v, (dict, list)):
                stack.append((v, (*path, k)))
    return []


def _too_costly(reg: Registration, budget_s: float) -> ToolFailed:
    return ToolFailed(
        reg.name, reg.owner, "schema_too_costly",
        f"checking these arguments against its input schema took more than {budget_s:g} s and was stopped; "
        "the schema is too costly to check (tell the plugin's author)",
    )  # fmt: skip


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
