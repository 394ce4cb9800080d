"""A second modifying plugin at priority 10 (tests/test_plugin_hooks.py): its gate
appends "+usher" to a call's text that says "chain", and it prepends its own context
to every turn. Named to sort after gatekeeper, so that order by name would differ
from order by priority."""

from __future__ import annotations

from clawsup.sandbox.api import hookimpl


def gate(event: dict) -> dict | None:
    text = event.get("params", {}).get("text")
    if isinstance(text, str) and "chain" in text:
        return {"params": {**event["params"], "text": text + "+usher"}}
    return None


def before_agent_start(event: dict) -> dict:
    return {"prependContext": "context from usher (priority 10)"}


@hookimpl
def clawsup_register(api) -> None:
    api.on("before_tool_call", gate, priority=10)
    api.on("before_agent_start", before_agent_start, priority=10)
