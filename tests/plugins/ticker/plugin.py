"""Background services for tests/test_plugin_services.py, with files in the plugin's
workspace (its cwd, which the test reads from the host) as their trace:

- `ticker`, async: writes its beat count to `beat` every 50 ms, and logs its first
  beat through the supervisor. It raises when `break-once` exists (and removes it,
  so that the next incarnation runs on) or when `break-always` exists (kept: it
  raises in every incarnation). Its stop writes `stopped`.
- `sleepy`, sync (a worker thread): waits until its stop tells it to end. With the
  plugin config `hangStop`, its stop never returns in time, and so neither does
  its start.

Beside them, one offer of each other kind (a hook, a command, a channel, two HTTP
routes) and one outside the manifest's contracts, for `clawsup plugins show`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from clawsup.sandbox.api import hookimpl

BEAT_S = 0.05
HANG_S = 3600


@hookimpl
def clawsup_register(api) -> None:
    here = Path.cwd()
    beats = 0

    async def tick() -> None:
        nonlocal beats
        while True:
            if (here / "break-once").exists():
                (here / "break-once").unlink()
                raise RuntimeError(f"ticker broke on purpose after {beats} beats")
            if (here / "break-always").exists():
                raise RuntimeError("ticker breaks every time")
            beats += 1
            (here / "beat").write_text(str(beats))
            if beats == 1:
                api.log("ticker: first beat")
            await asyncio.sleep(BEAT_S)

    async def tick_stop() -> None:
        (here / "stopped").write_text(f"stopped after {beats} beats\n")

    ended = threading.Event()

    def doze() -> None:
        while not ended.wait(BEAT_S):
            pass

    def doze_stop() -> None:
        if api.config.get("hangStop"):
            time.sleep(HANG_S)
        ended.set()

    api.register_service("ticker", tick, tick_stop)
    api.register_service("sleepy", doze, doze_stop)

    def break_ticker(args: dict) -> str:
        name = "break-always" if args.get("always") else "break-once"
        (here / name).write_text("")
        return f"{name} written"

    api.register_tool(name="ticker_break", description="Make the ticker service raise.", handler=break_ticker,
                      input_schema={"type": "object", "properties": {"always": {"type": "boolean"}}})
    api.register_tool(name="ticker_beats", description="The ticker's beats so far.", handler=lambda args: beats)

    api.on("after_tool_call", lambda event: None, priority=7)
    api.on("gateway_start", lambda event: None, priority=-3)
    api.register_command("beats", "How many beats the ticker has made.", lambda event: f"{beats} beats", accepts_args=True, owner_only=False)
    api.register_command("undeclared", "Outside the contracts: refused.", lambda event: "never")
    api.register_channel("tickertape", lambda message: {"delivered": True})
    api.register_http_route("beats", lambda request: {"status": 200, "body": str(beats)})
    api.register_http_route("hook/in", lambda request: "ok", auth="plugin")
