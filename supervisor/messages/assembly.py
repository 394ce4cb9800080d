"""The messaging side of the gateway, assembled from config: the bus, the session
store and the enabled channels (`message_bus`, `session_store`, `channels_from_config`:
the built-in ones, each enabled plugin channel, and the plugins' HTTP routes on the
http channel's server), then `Messaging`, which adds the router and the session lanes
around the agent that runs turns. A plugin's sandbox gets `plugin_services` (its
channels' inbound messages) when it is added.

The gateway builds them in dependency order: bus, store and channels first, then
the agent loop and the subagent runs (which need the store and the bus), then
`Messaging` with that agent. `Messaging.from_config` does it all at once with the
placeholder agent (the in-process benchmark). `run()` serves until the gateway's stop
event, then cancels the channels and the lanes (and with them every turn in flight).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.messages.bus import MessageBus
from clawsup.supervisor.messages.channels import Channel
from clawsup.supervisor.messages.channels.cli import CliChannel
from clawsup.supervisor.messages.channels.http import HttpChannel
from clawsup.supervisor.messages.channels.plugin import PluginChannel, PluginSandboxes, inbound_services
from clawsup.supervisor.messages.http_routes import PluginRoutes
from clawsup.supervisor.messages.commands import Commands
from clawsup.supervisor.messages.lanes import Agent, MessageHooks, PlaceholderAgent, SessionLanes
from clawsup.supervisor.messages.routing import Router
from clawsup.supervisor.messages.session_store import SessionStore
from clawsup.supervisor.paths import StatePaths
from clawsup.supervisor.sandboxes.child_requests import Service
from clawsup.supervisor.sandboxes.plans import SandboxPlan


def message_bus(cfg: ClawsupConfig) -> MessageBus:
    return MessageBus(cfg.bus.inbound_capacity, cfg.bus.outbound_capacity)


def session_store(cfg: ClawsupConfig, paths: StatePaths) -> SessionStore:
    s = cfg.session_store
    store = SessionStore(paths.sessions, fsync=s.fsync, interval_s=s.fsync_interval_ms / 1000, max_open=s.max_open_files)
    os.chmod(paths.sessions, 0o700)
    return store


def plugin_services(bus: MessageBus, sandboxes: PluginSandboxes, plan: SandboxPlan) -> dict[str, Service]:
    """What a sandbox may ask of the messaging side over its stream
    (`SandboxManager.add(plan, services=...)`): a plugin, its channels' inbound
    messages; anything else, nothing."""
    return inbound_services(bus, sandboxes, plan)


def channels_from_config(cfg: ClawsupConfig, bus: MessageBus, paths: StatePaths, *, source: str, sandboxes: PluginSandboxes | None = None) -> dict[str, Channel]:
    """The enabled channels, by name. ConfigError when the http channel's token is
    missing or short. With `sandboxes` (the gateway's manager), the enabled plugin
    channels too, and the plugins' HTTP routes on the http channel."""
    channels: dict[str, Channel] = {}
    if cfg.channels.cli.enabled:
        channels["cli"] = CliChannel(bus)
    h = cfg.channels.http
    if h.enabled:
        token = h.token or os.environ.get(h.token_env or "", "")
        if len(token) < 16:
            raise ConfigError(source, [f"channels.http.tokenEnv: ${h.token_env} is unset or shorter than 16 characters"])
        channels["http"] = HttpChannel(
            bus,
            host=h.host,
            port=h.port,
            token=token,
            account_id=h.account_id,
            port_file=paths.run / "http.port",
            max_connections=h.max_connections,
            routes=PluginRoutes(sandboxes) if sandboxes is not None else None,
        )
    if sandboxes is not None:
        for cid, c in cfg.channels.plugin_channels().items():
            if c.enabled:
                channels[cid] = PluginChannel(cid, sandboxes)
    return channels


class Messaging:
    """The channels, the bus, the session store and the lanes that run turns, served
    together. Created by the gateway (or `from_config`); `run()` serves them, and
    `aclose()` closes the store once it has returned."""

    def __init__(
        self,
        cfg: ClawsupConfig,
        *,
        bus: MessageBus,
        store: SessionStore,
        channels: Mapping[str, Channel],
        agent: Agent,
        commands: Commands | None = None,
        hooks: MessageHooks | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.channels = channels
        self.lanes = SessionLanes(
            bus=bus, router=Router(cfg), store=store, agent=agent, channels=channels, session_queue=cfg.bus.session_queue, commands=commands, hooks=hooks
        )

    @classmethod
    def from_config(cls, cfg: ClawsupConfig, paths: StatePaths, *, source: str, agent: Agent | None = None) -> Messaging:
        """All of it from config, with `agent` running turns (by default the
        placeholder)."""
        bus = message_bus(cfg)
        store = session_store(cfg, paths)
        channels = channels_from_config(cfg, bus, paths, source=source)
        return cls(cfg, bus=bus, store=store, channels=channels, agent=agent or PlaceholderAgent())

    @property
    def cli(self) -> CliChannel | None:
        cli = self.channels.get("cli")
        return cli if isinstance(cli, CliChannel) else None

    async def run(self, stop: asyncio.Event, up: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self.lanes.run(), name="session lanes")]
            tasks += [tg.create_task(c.serve(), name=f"channel {name}") for name, c in self.channels.items()]
            http = self.channels.get("http")
            if isinstance(http, HttpChannel):
                await http.started.wait()
            up.set()
            await stop.wait()
            for t in tasks:
                t.cancel()

    async def aclose(self) -> None:
        await self.store.aclose()
