"""The messaging side of the gateway, assembled from config: the bus, the router,
the session store, the dispatcher, and the channels that are enabled.

Created by the gateway; `run()` serves until the gateway's stop event, then cancels
the channels and the dispatcher (and with them every turn in flight).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from clawsup.supervisor.messages.bus import MessageBus
from clawsup.supervisor.messages.channels.cli import CliChannel
from clawsup.supervisor.messages.channels.http import HttpChannel
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.messages.lanes import Agent, Dispatcher, PlaceholderAgent
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.paths import StatePaths
from clawsup.supervisor.messages.routing import Router
from clawsup.supervisor.messages.session_store import SessionStore


class Messaging:
    def __init__(self, *, bus: MessageBus, dispatcher: Dispatcher, store: SessionStore, channels: dict[str, Any]) -> None:
        self.bus = bus
        self.dispatcher = dispatcher
        self.store = store
        self.channels = channels

    @property
    def cli(self) -> CliChannel | None:
        return self.channels.get("cli")

    @classmethod
    def from_config(
        cls, cfg: ClawsupConfig, paths: StatePaths, *, source: str, agent: Callable[[SessionStore], Agent] | None = None
    ) -> Messaging:
        """`agent` makes the agent that runs turns, given the session store (the
        gateway's is the agent loop); by default the placeholder."""
        bus = MessageBus(cfg.bus.inbound_capacity, cfg.bus.outbound_capacity)
        s = cfg.session_store
        store = SessionStore(paths.sessions, fsync=s.fsync, interval_s=s.fsync_interval_ms / 1000, max_open=s.max_open_files)
        os.chmod(paths.sessions, 0o700)
        channels: dict[str, Any] = {}
        if cfg.channels.cli.enabled:
            channels["cli"] = CliChannel(bus)
        h = cfg.channels.http
        if h.enabled:
            token = h.token or os.environ.get(h.token_env or "", "")
            if len(token) < 16:
                raise ConfigError(source, [f"channels.http.tokenEnv: ${h.token_env} is unset or shorter than 16 characters"])
            channels["http"] = HttpChannel(bus, host=h.host, port=h.port, token=token, account_id=h.account_id, port_file=paths.run / "http.port", max_connections=h.max_connections)
        dispatcher = Dispatcher(
            bus=bus, router=Router(cfg), store=store, agent=agent(store) if agent else PlaceholderAgent(), channels=channels, session_queue=cfg.bus.session_queue
        )
        return cls(bus=bus, dispatcher=dispatcher, store=store, channels=channels)

    async def run(self, stop: asyncio.Event, up: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self.dispatcher.run(), name="dispatcher")]
            tasks += [tg.create_task(c.serve(), name=f"channel {name}") for name, c in self.channels.items()]
            http = self.channels.get("http")
            if http is not None:
                await http.started.wait()
            up.set()
            await stop.wait()
            for t in tasks:
                t.cancel()

    async def aclose(self) -> None:
        await self.store.aclose()
