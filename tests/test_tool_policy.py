"""OpenClaw's layered tool policy, table-driven: each layer narrows, deny beats allow,
groups and globs expand, alsoAllow adds, provider rules apply to their provider only,
owner-only tools need an owner."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from clawsup.supervisor.agents.tool_policy import Caller, decide

AVAILABLE = {
    "exec": "core", "read": "core", "write": "core", "edit": "core", "list_dir": "core",
    "echo": "basics", "now": "basics", "calc": "basics",
    "chaos_ok": "chaos", "chaos_crash": "chaos",
}  # fmt: skip
ALL = sorted(AVAILABLE)

CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, dict[str, Any], list[str], dict[str, str]]] = [
    # (case, tools config, agent tools, caller extras, tools left, some removals expected)
    ("no policy: everything", {}, None, {}, ALL, {}),
    ("profile coding", {"profile": "coding"}, None, {}, ["edit", "exec", "list_dir", "read", "write"], {"echo": "profile"}),
    ("profile full restricts nothing", {"profile": "full"}, None, {}, ALL, {}),
    ("profile minimal", {"profile": "minimal"}, None, {}, [], {"exec": "profile"}),
    ("alsoAllow adds to the profile", {"profile": "coding", "alsoAllow": ["group:plugin:basics"]}, None, {}, ["calc", "echo", "edit", "exec", "list_dir", "now", "read", "write"], {}),
    ("agent profile wins over the global one", {"profile": "minimal"}, {"profile": "coding"}, {}, ["edit", "exec", "list_dir", "read", "write"], {}),
    ("provider profile", {"byProvider": {"anthropic": {"profile": "coding"}}}, None, {"provider": "anthropic/claude-x"}, ["edit", "exec", "list_dir", "read", "write"], {"echo": "provider profile"}),
    ("provider profile, other provider", {"byProvider": {"anthropic": {"profile": "coding"}}}, None, {"provider": "openai/gpt"}, ALL, {}),
    ("global allow with a group", {"allow": ["group:fs"]}, None, {}, ["edit", "list_dir", "read", "write"], {"exec": "global"}),
    ("empty allow is no restriction", {"allow": [], "deny": ["exec"]}, None, {}, [t for t in ALL if t != "exec"], {"exec": "global"}),
    ("deny beats allow", {"allow": ["group:fs", "exec"], "deny": ["exec"]}, None, {}, ["edit", "list_dir", "read", "write"], {"exec": "global"}),
    ("bash is exec", {"deny": ["Bash "]}, None, {}, [t for t in ALL if t != "exec"], {"exec": "global"}),
    ("globs", {"deny": ["chaos_*"]}, None, {}, [t for t in ALL if not t.startswith("chaos")], {"chaos_ok": "global"}),
    ("group:plugins", {"allow": ["group:plugins"]}, None, {}, ["calc", "chaos_crash", "chaos_ok", "echo", "now"], {"read": "global"}),
    ("global by provider", {"byProvider": {"openai": {"deny": ["group:runtime"]}}}, None, {"provider": "openai/gpt-4o"}, [t for t in ALL if t != "exec"], {"exec": "global by provider"}),
    ("agent narrows, cannot widen", {"allow": ["read", "echo"]}, {"allow": ["read", "exec"]}, {}, ["read"], {"echo": "agent", "exec": "global"}),
    ("agent by provider", {}, {"byProvider": {"anthropic": {"deny": ["write"]}}}, {"provider": "anthropic/claude"}, [t for t in ALL if t != "write"], {"write": "agent by provider"}),
    ("channel", {"byChannel": {"http": {"deny": ["group:fs"]}}}, None, {"channel": "http"}, ["calc", "chaos_crash", "chaos_ok", "echo", "exec", "now"], {"read": "channel"}),
    ("group within a channel", {"byChannel": {"discord": {"groups": {"G1": {"allow": ["echo"]}}}}}, None, {"channel": "discord", "group_id": "g1"}, ["echo"], {"read": "group"}),
    ("sender", {"bySender": {"http:eve": {"deny": ["exec"]}}}, None, {"channel": "http", "sender": "eve"}, [t for t in ALL if t != "exec"], {"exec": "sender"}),
    ("sandbox layer", {"sandbox": {"tools": {"deny": ["edit"]}}}, None, {}, [t for t in ALL if t != "edit"], {"edit": "sandbox"}),
    ("subagent layer, subagent turn", {"subagents": {"tools": {"allow": ["read"]}}}, None, {"subagent": True}, ["read"], {"exec": "subagent"}),
    ("subagent layer, main turn", {"subagents": {"tools": {"allow": ["read"]}}}, None, {}, ALL, {}),
    ("owner-only, not an owner", {"ownerOnly": ["exec"]}, None, {"owner": False}, [t for t in ALL if t != "exec"], {"exec": "owner only"}),
    ("owner-only, an owner", {"ownerOnly": ["exec"]}, None, {"owner": True}, ALL, {}),
]


@pytest.mark.parametrize(("case", "tools", "agent", "caller", "left", "removed"), CASES, ids=[c[0] for c in CASES])
def test_policy(case: str, tools: dict[str, Any], agent: dict[str, Any] | None, caller: dict[str, Any], left: list[str], removed: dict[str, str]) -> None:
    d = decide(tools, agent, Caller(agent="main", **{"owner": True, **caller}), AVAILABLE)
    assert list(d.tools) == left
    for tool, layer in removed.items():
        assert d.removed[tool] == layer


def test_unknown_allow_entries_are_reported() -> None:
    d = decide({"allow": ["read", "raed", "group:nope", "zz_*"]}, None, Caller(agent="main", owner=True), AVAILABLE)
    assert d.tools == ("read",)
    text = " ".join(d.warnings)
    assert "'raed' names no known tool" in text and "unknown group 'group:nope'" in text and "'zz_*' matches no known tool" in text


def test_tools_explain_without_a_gateway(tmp_path) -> None:
    cfg = tmp_path / "clawsup.json"
    cfg.write_text(json.dumps({
        "plugins": {"load": {"paths": ["bundled:basics"]}},
        "agents": {"list": [{"id": "main", "default": True}, {"id": "ops", "tools": {"deny": ["exec"]}}]},
        "tools": {"profile": "coding", "alsoAllow": ["echo"], "ownerOnly": ["write"]},
    }))  # fmt: skip
    run = lambda *a: subprocess.run([sys.executable, "-m", "clawsup.supervisor.control.cli", "tools", "explain", "--config", str(cfg), *a], capture_output=True, text=True, timeout=60)  # noqa: E731
    r = run("--agent", "ops", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # The coding profile's group:sessions brings the spawn tools.
    assert out["tools"] == ["echo", "edit", "list_dir", "read", "sessions_spawn", "subagents"]
    assert out["removed"] == {"calc": "profile", "now": "profile", "exec": "agent", "write": "owner only"}
    r = run("--agent", "ops", "--owner", "--json")
    assert "write" in json.loads(r.stdout)["tools"]
    sub = json.loads(run("--agent", "ops", "--subagent", "--json").stdout)
    assert sub["tools"] == ["echo", "edit", "list_dir", "read"] and sub["removed"]["sessions_spawn"] == "withheld from subagent runs"


# MCP servers' tools are owned by `mcp:<id>` (supervisor/sandboxes/mcp_plans.py).
AVAILABLE_MCP = {**AVAILABLE, "time_now": "mcp:time", "time_convert": "mcp:time", "Docs_search": "mcp:Docs"}
ALL_MCP = sorted(n.lower() for n in AVAILABLE_MCP)

MCP_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("group:plugins covers MCP tools", {"allow": ["group:plugins"]}, ["calc", "chaos_crash", "chaos_ok", "docs_search", "echo", "now", "time_convert", "time_now"]),
    ("group:mcp is every MCP server's", {"allow": ["group:mcp"]}, ["docs_search", "time_convert", "time_now"]),
    ("group:mcp:<id> is one server's", {"allow": ["group:mcp:time"]}, ["time_convert", "time_now"]),
    ("a server's id in any case", {"allow": ["group:mcp:docs", "group:MCP:Docs"]}, ["docs_search"]),
    ("deny one server", {"deny": ["group:mcp:time"]}, [t for t in ALL_MCP if not t.startswith("time_")]),
    ("deny every MCP tool", {"deny": ["group:mcp"]}, ALL),
    ("the coding profile leaves MCP tools out", {"profile": "coding", "alsoAllow": ["group:mcp:time"]}, ["edit", "exec", "list_dir", "read", "time_convert", "time_now", "write"]),
]


@pytest.mark.parametrize(("case", "tools", "left"), MCP_CASES, ids=[c[0] for c in MCP_CASES])
def test_mcp_groups(case: str, tools: dict[str, Any], left: list[str]) -> None:
    d = decide(tools, None, Caller(agent="main", owner=True), AVAILABLE_MCP)
    assert list(d.tools) == left
    assert not d.warnings, d.warnings


def test_group_mcp_is_known_with_no_server() -> None:
    """No MCP server (none configured, or all down): `group:mcp` names nothing, and is
    no unknown group; a server's own group is, until its tools are registered."""
    d = decide({"allow": ["read", "group:mcp", "group:mcp:time"]}, None, Caller(agent="main", owner=True), AVAILABLE)
    assert d.tools == ("read",)
    assert d.warnings == ("global allow: unknown group 'group:mcp:time'",)


def test_a_cron_run_is_denied_the_automation_tools_even_as_an_owner() -> None:
    """A job's run may not add jobs (they would multiply): the policy's `cron run`
    layer, so that `clawsup tools explain --channel cron` says so too."""
    available = {"cron": "core", "exec": "core"}
    d = decide({}, None, Caller(agent="main", channel="cron", owner=True), available)
    assert d.tools == ("exec",) and d.removed == {"cron": "cron run"}
    other = decide({}, None, Caller(agent="main", channel="cli", owner=True), available)
    assert other.tools == ("cron", "exec")
