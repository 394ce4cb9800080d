"""Handlers that try to end their sandbox, or to silence it."""

from __future__ import annotations

import os
import sys

from clawsup.sandbox.api import hookimpl


def quit_sync(args: dict) -> str:
    sys.exit(int(args.get("code", 3)))


async def quit_async(args: dict) -> str:
    raise SystemExit(int(args.get("code", 3)))


def interrupt_sync(args: dict) -> str:
    raise KeyboardInterrupt


async def interrupt_async(args: dict) -> str:
    raise KeyboardInterrupt


def quit_hard(args: dict) -> str:
    os._exit(int(args.get("code", 7)))


def close_stderr(args: dict) -> str:
    """how: `fd` closes descriptor 2 under Python's feet; `object` closes sys.stderr."""
    if args.get("how", "fd") == "fd":
        os.close(2)
    else:
        sys.stderr.close()
    return "stderr closed"


def fail(args: dict) -> str:
    raise RuntimeError(args.get("message", "quitter failed on purpose"))


def whoami(args: dict) -> dict:
    return {"pid": os.getpid()}


@hookimpl
def clawsup_register(api) -> None:
    for fn in (quit_sync, quit_async, interrupt_sync, interrupt_async, quit_hard, close_stderr, fail, whoami):
        api.register_tool(name=fn.__name__, description=fn.__name__, handler=fn)
