"""Harmless everyday tools, and the plugin the benchmarks call."""

from __future__ import annotations

import ast
import operator
from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from clawsup.sandbox.api import hookimpl

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT = 1000


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"only numbers and + - * / // % ** are allowed, found {type(node).__name__}")


def calc(args: dict) -> str:
    expr = args.get("expression")
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError("'expression' must be a non-empty string such as '2 * (3 + 4)'")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"cannot parse {expr!r}: {e.msg}") from None
    return str(_eval(tree))


@hookimpl
def clawsup_register(api) -> None:
    default_tz = api.config.get("defaultTimezone", "UTC")

    def now(args: dict) -> dict:
        name = args.get("timezone") or default_tz
        try:
            tz = timezone.utc if name == "UTC" else ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {name!r}; use an IANA name such as 'Europe/Paris'") from None
        return {"timezone": name, "iso": datetime.now(tz).isoformat(timespec="seconds")}

    async def echo(args: dict) -> str:
        return str(args.get("text", ""))

    api.register_tool(
        name="echo",
        description="Repeat the given text back unchanged.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        handler=echo,
    )
    api.register_tool(
        name="now",
        description="The current date and time, in UTC or the given IANA timezone.",
        input_schema={"type": "object", "properties": {"timezone": {"type": "string"}}},
        handler=now,
    )
    api.register_tool(
        name="calc",
        description="Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        input_schema={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        handler=calc,
    )
