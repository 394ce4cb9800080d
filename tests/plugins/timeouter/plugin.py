"""Handlers whose upstream timed out: each raises TimeoutError at once, well within
its call's deadline (tests/test_handler_timeouts.py)."""

from __future__ import annotations

import os
import time

from clawsup.sandbox.api import hookimpl


def upstream_sync(args: dict) -> str:
    raise TimeoutError("upstream timed out")


async def upstream_async(args: dict) -> str:
    raise TimeoutError("upstream timed out")


def upstream_command(event: dict) -> str:
    raise TimeoutError("upstream timed out")


def stall_command(event: dict) -> str:
    """A real overrun, for contrast: a sync handler cannot be interrupted."""
    time.sleep(600)
    return "never"


def whoami(args: dict) -> dict:
    return {"pid": os.getpid()}


@hookimpl
def clawsup_register(api) -> None:
    for name, handler in (("upstream_sync", upstream_sync), ("upstream_async", upstream_async), ("whoami", whoami)):
        api.register_tool(name=name, description=f"{name}, for tests", input_schema={"type": "object"}, handler=handler)
    api.register_command("upstream", "Raise the upstream's TimeoutError.", upstream_command, owner_only=False)
    api.register_command("stall", "Overrun the deadline on a thread.", stall_command, owner_only=False)
