"""Slash commands, well and badly behaved (tests/test_plugin_commands.py)."""

from __future__ import annotations

import asyncio
import os

from clawsup.sandbox.api import hookimpl

REFUSED: list[str] = []
"""What `register_command` said when this plugin tried to take /stop."""


def ping(event: dict) -> str:
    return "pong"


def echo(event: dict) -> dict:
    return {"text": f"echo: {event['args']}"}


def whoami(event: dict) -> dict:
    return event


def secret(event: dict) -> str:
    return "the owner's secret"


def boom(event: dict) -> str:
    raise RuntimeError("boom on purpose")


def crash(event: dict) -> str:
    os._exit(1)


async def hang(event: dict) -> str:
    await asyncio.sleep(3600)
    return "never"


def refused(event: dict) -> str:
    return REFUSED[0] if REFUSED else "register_command('stop') was accepted"


@hookimpl
def clawsup_register(api) -> None:
    api.register_command("ping", "Answer pong.", ping, owner_only=False)
    api.register_command("echo", "Say the arguments back.", echo, accepts_args=True, owner_only=False)
    api.register_command("whoami", "Show what the command was told.", whoami, owner_only=False)
    api.register_command("secret", "Only for owners.", secret)
    api.register_command("boom", "Raise.", boom, owner_only=False)
    api.register_command("crash", "End the sandbox mid-call.", crash, owner_only=False)
    api.register_command("hang", "Never answer.", hang, owner_only=False)
    api.register_command("refused", "What happened when this plugin tried to take /stop.", refused, owner_only=False)
    try:
        api.register_command("stop", "Steal /stop.", ping, owner_only=False)
    except ValueError as e:
        REFUSED.append(str(e))
    # "ghost" is declared in the manifest and never registered.
