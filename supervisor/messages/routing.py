"""Which agent handles an inbound message: OpenClaw's binding tiers, deterministic.

The tiers, most specific first (the label is the route's `matchedBy`):
  1. exact peer                      binding.peer
  2. parent peer (a thread's parent) binding.peer.parent
  3. guild with roles                binding.guild+roles
  4. guild                           binding.guild
  5. team                            binding.team
  6. account                         binding.account
  7. channel (`accountId: "*"`)      binding.channel
  8. the default agent               default
Within a tier the first matching binding in config order wins. Every constraint a
binding states must hold (a peer+guild binding is never a guild-wide fallback).
Channel names and account ids are trimmed and lower-cased; an omitted account is the
channel's default account, `"*"` any account; peer kind `dm` is `direct`.

Identity (channel, account, peer, guild, roles, team) comes from the channel
adapter that received the message, never from its text or from tool arguments.
Built once from config; immutable; safe to share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loguru import logger

from clawsup.supervisor.config import Binding, ClawsupConfig, PeerKind
from clawsup.supervisor.messages.session_key import SessionKeys

DEFAULT_ACCOUNT = "default"
ANY_ACCOUNT = "*"


def norm(s: str | None) -> str:
    return (s or "").strip().lower()


def norm_account(s: str | None) -> str:
    return norm(s) or DEFAULT_ACCOUNT


_KINDS: dict[str, PeerKind] = {"direct": "direct", "dm": "direct", "group": "group", "channel": "channel"}


def norm_kind(kind: str) -> PeerKind:
    """`dm` is `direct`; any case. Raises ValueError for what is not a peer kind
    (each channel and the config check theirs before they get here)."""
    try:
        return _KINDS[norm(kind)]
    except KeyError:
        raise ValueError(f"{kind!r} is not a peer kind (direct, group or channel)") from None


@dataclass(frozen=True)
class Peer:
    kind: PeerKind
    """`dm` is taken as `direct` (see `Peer.of`)."""
    id: str

    @classmethod
    def of(cls, kind: str, id: str) -> Peer:
        return cls(norm_kind(kind), id.strip())


@dataclass(frozen=True, kw_only=True)
class RouteInput:
    """Who sent a message and where, as the channel adapter saw it."""

    channel: str
    peer: Peer
    account_id: str | None = None
    parent_peer: Peer | None = None
    guild_id: str | None = None
    member_role_ids: tuple[str, ...] = ()
    team_id: str | None = None
    thread_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Route:
    agent_id: str
    matched_by: str
    session_key: str
    main_session_key: str
    account_id: str
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, str]:
        return {
            "agentId": self.agent_id,
            "matchedBy": self.matched_by,
            "sessionKey": self.session_key,
            "mainSessionKey": self.main_session_key,
            "accountId": self.account_id,
        }


@dataclass(frozen=True)
class _Rule:
    """One binding, normalised."""

    index: int
    agent_id: str
    channel: str
    account: str
    peer: Peer | None
    guild: str | None
    team: str | None
    roles: frozenset[str] | None

    @classmethod
    def of(cls, index: int, b: Binding) -> _Rule:
        m = b.match
        return cls(
            index=index,
            agent_id=norm(b.agent_id),
            channel=norm(m.channel),
            account=ANY_ACCOUNT if norm(m.account_id) == ANY_ACCOUNT else norm_account(m.account_id),
            peer=Peer.of(m.peer.kind, m.peer.id) if m.peer else None,
            guild=norm(m.guild_id) or None,
            team=norm(m.team_id) or None,
            roles=frozenset(norm(r) for r in m.roles) if m.roles else None,
        )

    def tier(self) -> str:
        """The tier a binding belongs to, by what it states (a peer binding also
        serves tier 2, for threads of that peer)."""
        if self.peer is not None:
            return "binding.peer"
        if self.guild is not None:
            return "binding.guild+roles" if self.roles else "binding.guild"
        if self.team is not None:
            return "binding.team"
        if self.account != ANY_ACCOUNT:
            return "binding.account"
        return "binding.channel"

    def holds(self, msg: RouteInput, peer: Peer | None) -> bool:
        """Every constraint this binding states holds for `msg`, with `peer` standing
        for the message's peer (or its parent, for tier 2)."""
        if self.channel != norm(msg.channel):
            return False
        if self.account != ANY_ACCOUNT and self.account != norm_account(msg.account_id):
            return False
        if self.peer is not None and (peer is None or self.peer.kind != peer.kind or norm(self.peer.id) != norm(peer.id)):
            return False
        if self.guild is not None and self.guild != norm(msg.guild_id):
            return False
        if self.roles is not None and not (self.roles & {norm(r) for r in msg.member_role_ids}):
            return False
        if self.team is not None and self.team != norm(msg.team_id):
            return False
        return True


TIERS = ("binding.peer", "binding.peer.parent", "binding.guild+roles", "binding.guild", "binding.team", "binding.account", "binding.channel")


class Router:
    def __init__(self, cfg: ClawsupConfig) -> None:
        self._rules = [_Rule.of(i, b) for i, b in enumerate(cfg.bindings)]
        self._agents = set(cfg.agents.ids())
        self.default_agent = cfg.agents.default_id()
        self.keys = SessionKeys(cfg.session.dm_scope, cfg.session.identity_links)

    def resolve(self, msg: RouteInput, *, agent_override: str | None = None) -> Route:
        """`agent_override`: the operator's own channel (the CLI) may name the agent."""
        warnings: list[str] = []
        agent, matched_by = self._match(msg)
        if agent_override is not None:
            agent, matched_by = norm(agent_override), "override"
        if agent not in self._agents:
            warnings.append(f"route {matched_by} names agent {agent!r}, which does not exist; using the default agent {self.default_agent!r}")
            logger.warning("{}", warnings[-1])
            agent = self.default_agent
        account = norm_account(msg.account_id)
        return Route(
            agent_id=agent,
            matched_by=matched_by,
            session_key=self.keys.for_message(agent, norm(msg.channel), account, msg.peer, msg.thread_id),
            main_session_key=self.keys.main(agent),
            account_id=account,
            warnings=tuple(warnings),
        )

    def _match(self, msg: RouteInput) -> tuple[str, str]:
        for tier in TIERS:
            for rule in self._rules:
                if tier == "binding.peer.parent":
                    if rule.peer is not None and msg.parent_peer is not None and rule.holds(msg, msg.parent_peer):
                        return rule.agent_id, tier
                elif rule.tier() == tier and rule.holds(msg, msg.peer):
                    return rule.agent_id, tier
        return self.default_agent, "default"
