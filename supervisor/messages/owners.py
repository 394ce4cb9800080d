"""Who owns this gateway, as each channel tells it: the one rule that the tool policy
(`owner` on a turn's caller) and the plugins' owner-only slash commands both use.

- the operator's own channel (`cli`) is always an owner;
- `tools.owners` lists `channel:peerId` pairs, for any channel (compared trimmed and
  lower-cased, as routing compares ids);
- a plugin channel's `channels.<id>.owners` lists sender ids (the peer's id where the
  channel reports no sender), compared exactly as the channel reports them: a
  platform whose ids differ by case must not hand one user's rights to another.

The owner flag is never a channel's word: a plugin channel reports who wrote, the
operator's config says whether that is an owner. Built once from config; immutable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.messages.bus import InboundMessage

OWNER_CHANNELS = frozenset({"cli"})
"""The operator's own channels: whoever uses them is an owner."""


@dataclass(frozen=True)
class Owners:
    pairs: frozenset[str] = frozenset()
    """`tools.owners`: `channel:peerId`, lower-cased."""
    by_channel: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Plugin channel id -> its owners' sender ids (`channels.<id>.owners`)."""

    @classmethod
    def from_config(cls, cfg: ClawsupConfig) -> Owners:
        return cls(
            pairs=frozenset(o.strip().lower() for o in cfg.tools.owners),
            by_channel={cid: frozenset(o.strip() for o in c.owners) for cid, c in cfg.channels.plugin_channels().items()},
        )

    def is_owner(self, msg: InboundMessage) -> bool:
        if msg.owner is not None:  # the gateway's own message says (a cron run's)
            return msg.owner
        channel = msg.reply_to.channel
        if channel in OWNER_CHANNELS:
            return True
        peer = msg.source.peer.id
        if f"{channel}:{peer}".lower() in self.pairs:
            return True
        owners = self.by_channel.get(channel)
        who = (msg.sender_id if msg.sender_id is not None else peer).strip()
        return owners is not None and who != "" and who in owners
