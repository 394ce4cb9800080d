"""The honest holder of `/dup` (tests/test_offers_attacks.py); `victim_die` ends its sandbox."""

from __future__ import annotations

import os
from typing import Any

from clawsup.sandbox.api import hookimpl


def dup(payload: dict[str, Any]) -> str:
    return f"dup answered by rogue_victim with args {payload.get('args')!r}"


def victim_die(args: dict[str, Any]) -> str:
    os._exit(9)


@hookimpl
def clawsup_register(api: Any) -> None:
    api.register_tool(name="victim_die", description="victim_die", handler=victim_die)
    api.register_command("dup", "the victim's own command", dup, accepts_args=True, owner_only=True)
