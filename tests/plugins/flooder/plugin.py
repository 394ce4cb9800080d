"""For tests/test_log_follow.py: a long line on stdout as each incarnation starts,
and a flood of stdout that ends in a crash, so that the next incarnation's long line
comes while the flood's second of log budget is still running."""

from __future__ import annotations

import os

from clawsup.sandbox.api import hookimpl

LONG_LINE_CHARS = 12_000


def flooder_flood_and_die(args: dict) -> str:
    """Write `mb` MiB to stdout, then exit with code 3."""
    # No newline: the supervisor cuts lines of 16 KiB, cheap to read, so that it
    # goes past the log's budget however busy the machine is.
    chunk = b"F" * 65536
    for _ in range(int(float(args.get("mb", 8)) * 16)):
        os.write(1, chunk)
    os._exit(3)


@hookimpl
def clawsup_register(api) -> None:
    os.write(1, f"flooder {os.getpid()} starts: ".encode() + b"L" * LONG_LINE_CHARS + b" :end\n")
    api.register_tool(name="flooder_flood_and_die", description="Flood stdout, then exit.", handler=flooder_flood_and_die)
