"""Routing and session keys, table-driven: OpenClaw's binding tiers and key scopes."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.messages.routing import Peer, RouteInput, Router

AGENTS = {"list": [{"id": "main", "default": True}, {"id": "work"}, {"id": "ops"}, {"id": "fam"}, {"id": "mods"}, {"id": "team"}, {"id": "biz"}, {"id": "tg"}, {"id": "thread"}]}

BINDINGS: list[dict[str, Any]] = [
    # tier 1: exact peer (two of them for the same peer: the first in config order wins)
    {"agentId": "work", "match": {"channel": "whatsapp", "peer": {"kind": "direct", "id": "+15550001"}}},
    {"agentId": "ops", "match": {"channel": "whatsapp", "peer": {"kind": "direct", "id": "+15550001"}}},
    # a peer binding that also states a guild: never a guild-wide fallback
    {"agentId": "fam", "match": {"channel": "discord", "guildId": "G1", "peer": {"kind": "channel", "id": "C-family"}}},
    # tier 2: a thread under this channel inherits it; the exact thread beats it
    {"agentId": "thread", "match": {"channel": "discord", "guildId": "G1", "peer": {"kind": "channel", "id": "C-threads"}}},
    {"agentId": "work", "match": {"channel": "discord", "peer": {"kind": "channel", "id": "T-special"}}},
    # tier 3 and 4
    {"agentId": "mods", "match": {"channel": "discord", "guildId": "G1", "roles": ["R-mod", "R-admin"]}},
    {"agentId": "ops", "match": {"channel": "discord", "guildId": "G1"}},
    # tier 5
    {"agentId": "team", "match": {"channel": "slack", "teamId": "T1"}},
    # tier 6: a named account, and an omitted account (the default one)
    {"agentId": "biz", "match": {"channel": "whatsapp", "accountId": " Biz "}},
    {"agentId": "tg", "match": {"channel": "Telegram"}},
    # tier 7: any account
    {"agentId": "ops", "match": {"channel": "signal", "accountId": "*"}},
    {"agentId": "ghost", "match": {"channel": "matrix", "accountId": "*"}},
]

ROUTES = [
    # (case, message fields, agent, matchedBy)
    ("exact peer", dict(channel="whatsapp", peer=("direct", "+15550001")), "work", "binding.peer"),
    ("exact peer, dm alias", dict(channel="whatsapp", peer=("dm", "+15550001")), "work", "binding.peer"),
    ("exact peer on a named account", dict(channel="whatsapp", account_id="biz", peer=("direct", "+15550001")), "biz", "binding.account"),
    ("peer+guild holds", dict(channel="discord", guild_id="G1", peer=("channel", "C-family")), "fam", "binding.peer"),
    ("peer+guild, other guild: no fallback to it", dict(channel="discord", guild_id="G2", peer=("channel", "C-family")), "main", "default"),
    ("thread inherits its parent", dict(channel="discord", guild_id="G1", peer=("channel", "T-9"), parent_peer=("channel", "C-threads")), "thread", "binding.peer.parent"),
    ("exact peer beats the parent", dict(channel="discord", guild_id="G1", peer=("channel", "T-special"), parent_peer=("channel", "C-threads")), "work", "binding.peer"),
    ("guild with a matching role", dict(channel="discord", guild_id="g1", peer=("channel", "C-x"), member_role_ids=("R-admin",)), "mods", "binding.guild+roles"),
    ("guild, role mismatch", dict(channel="discord", guild_id="G1", peer=("channel", "C-x"), member_role_ids=("R-guest",)), "ops", "binding.guild"),
    ("guild, no roles", dict(channel="discord", guild_id="G1", peer=("channel", "C-x")), "ops", "binding.guild"),
    ("other guild", dict(channel="discord", guild_id="G9", peer=("channel", "C-x")), "main", "default"),
    ("team", dict(channel="slack", team_id="T1", peer=("channel", "C1")), "team", "binding.team"),
    ("other team", dict(channel="slack", team_id="T2", peer=("channel", "C1")), "main", "default"),
    ("account, normalised", dict(channel=" WhatsApp ", account_id="BIZ", peer=("direct", "+1999")), "biz", "binding.account"),
    ("omitted account is the default one", dict(channel="telegram", peer=("direct", "42")), "tg", "binding.account"),
    ("explicit default account", dict(channel="telegram", account_id="default", peer=("direct", "42")), "tg", "binding.account"),
    ("another account is not the default", dict(channel="telegram", account_id="second", peer=("direct", "42")), "main", "default"),
    ("any account", dict(channel="signal", account_id="whatever", peer=("direct", "7")), "ops", "binding.channel"),
    ("missing agent falls back to default", dict(channel="matrix", peer=("direct", "x")), "main", "binding.channel"),
    ("no binding", dict(channel="irc", peer=("direct", "nick")), "main", "default"),
]


def make_input(fields: dict[str, Any]) -> RouteInput:
    f = dict(fields)
    f["peer"] = Peer.of(*f["peer"])
    if "parent_peer" in f:
        f["parent_peer"] = Peer.of(*f["parent_peer"])
    return RouteInput(**f)


def router(**session: Any) -> Router:
    return Router(ClawsupConfig.model_validate({"agents": AGENTS, "bindings": BINDINGS, "session": session}))


@pytest.mark.parametrize(("case", "fields", "agent", "matched_by"), ROUTES, ids=[r[0] for r in ROUTES])
def test_routing_tiers(case: str, fields: dict[str, Any], agent: str, matched_by: str) -> None:
    route = router().resolve(make_input(fields))
    assert (route.agent_id, route.matched_by) == (agent, matched_by)


def test_missing_agent_is_warned_about() -> None:
    route = router().resolve(make_input(dict(channel="matrix", peer=("direct", "x"))))
    assert route.warnings and "'ghost', which does not exist" in route.warnings[0]


def test_default_agent_without_a_list_is_main() -> None:
    r = Router(ClawsupConfig()).resolve(make_input(dict(channel="cli", peer=("direct", "me"))))
    assert (r.agent_id, r.matched_by, r.session_key) == ("main", "default", "agent:main:main")


KEYS = [
    # (dmScope, identityLinks, message fields, session key)
    ("main", {}, dict(channel="telegram", peer=("direct", "42")), "agent:tg:main"),
    ("per-peer", {}, dict(channel="telegram", peer=("direct", "42")), "agent:tg:direct:42"),
    ("per-channel-peer", {}, dict(channel="Telegram", peer=("direct", "42")), "agent:tg:telegram:direct:42"),
    ("per-account-channel-peer", {}, dict(channel="telegram", peer=("direct", "42")), "agent:tg:telegram:default:direct:42"),
    ("per-account-channel-peer", {}, dict(channel="whatsapp", account_id="Biz", peer=("direct", "+1A")), "agent:biz:whatsapp:biz:direct:+1a"),
    ("per-peer", {"alice": ["telegram:42", "whatsapp:+1555"]}, dict(channel="telegram", peer=("direct", "42")), "agent:tg:direct:alice"),
    ("per-channel-peer", {"Alice": ["telegram:42"]}, dict(channel="telegram", peer=("direct", "42")), "agent:tg:telegram:direct:alice"),
    ("main", {"alice": ["telegram:42"]}, dict(channel="telegram", peer=("direct", "42")), "agent:tg:main"),
    ("main", {}, dict(channel="discord", guild_id="G9", peer=("group", "GRP-1")), "agent:main:discord:group:grp-1"),
    ("main", {}, dict(channel="discord", guild_id="G9", peer=("channel", "C-7")), "agent:main:discord:channel:c-7"),
    ("main", {}, dict(channel="discord", guild_id="G9", peer=("channel", "C-7"), thread_id="TH1"), "agent:main:discord:channel:c-7:thread:th1"),
    ("main", {}, dict(channel="telegram", peer=("direct", "42"), thread_id="9"), "agent:tg:main:thread:9"),
    ("per-peer", {}, dict(channel="telegram", peer=("dm", "42"), thread_id="9"), "agent:tg:direct:42:thread:9"),
]


@pytest.mark.parametrize(("scope", "links", "fields", "key"), KEYS)
def test_session_keys(scope: str, links: dict[str, list[str]], fields: dict[str, Any], key: str) -> None:
    route = router(dmScope=scope, identityLinks=links).resolve(make_input(fields))
    assert route.session_key == key
    assert route.main_session_key == f"agent:{route.agent_id}:main"


def test_route_explain_without_a_gateway(tmp_path) -> None:
    cfg = tmp_path / "openclaw.json"
    cfg.write_text(
        "// an OpenClaw config, unchanged\n"
        + json.dumps({"agents": AGENTS, "bindings": BINDINGS, "session": {"dmScope": "per-channel-peer"}, "gateway": {"port": 18789}})
    )
    run = lambda *a: subprocess.run([sys.executable, "-m", "clawsup.supervisor.control.cli", "route", "explain", "--config", str(cfg), *a], capture_output=True, text=True, timeout=60)  # noqa: E731
    r = run("--channel", "discord", "--peer-kind", "channel", "--peer-id", "T-9", "--parent-kind", "channel", "--parent-id", "C-threads", "--guild", "G1", "--thread", "T-9", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "agentId": "thread",
        "matchedBy": "binding.peer.parent",
        "sessionKey": "agent:thread:discord:channel:t-9:thread:t-9",
        "mainSessionKey": "agent:thread:main",
        "accountId": "default",
    }
    r = run("--channel", "discord", "--guild", "G1", "--roles", "R-guest,R-mod", "--peer-kind", "channel", "--peer-id", "C-1", "--json")
    assert json.loads(r.stdout)["matchedBy"] == "binding.guild+roles"
    r = run("--channel", "telegram", "--account", "Default", "--peer-kind", "dm", "--peer-id", "42", "--json")
    assert json.loads(r.stdout) == {"agentId": "tg", "matchedBy": "binding.account", "sessionKey": "agent:tg:telegram:direct:42", "mainSessionKey": "agent:tg:main", "accountId": "default"}
    r = run("--channel", "telegram", "--peer-kind", "robot", "--peer-id", "42")
    assert r.returncode == 2 and "--peer-kind" in r.stderr
