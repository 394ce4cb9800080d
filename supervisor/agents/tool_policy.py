"""Which tools a turn may see and call: OpenClaw's layered tool policy.

Layers, in order; each can only narrow the set left by the ones before:
   1. profile              tools.profile (or the agent's tools.profile), plus alsoAllow
   2. provider profile     tools.byProvider.<provider>.profile
   3. global               tools.allow / tools.deny
   4. global by provider   tools.byProvider.<provider>.allow / deny
   5. agent                agents.list[].tools.allow / deny
   6. agent by provider    agents.list[].tools.byProvider.<provider>.allow / deny
   7. group/channel        tools.byChannel.<channel> (and its groups.<groupId>)
   8. sender               tools.bySender."<channel>:<senderId>"
   9. sandbox              tools.sandbox.tools.allow / deny
  10. subagent             tools.subagents.tools.allow / deny (subagent turns only)
  11. cron run             group:automation denied to turns from the `cron` channel
                           (a job's run may not add jobs: they would multiply)
In each: deny beats allow; an empty allow means no restriction; `alsoAllow` adds to
that layer's allow list; `*` globs work; `group:*` names expand first (the core
groups; `group:plugins`, every tool not core's, MCP servers' included;
`group:plugin:<id>`; `group:mcp`, every MCP server's tool; `group:mcp:<id>`). Names are
trimmed and lower-cased, `bash` means `exec` and `apply-patch` means `apply_patch`.
An allow entry that names no known tool or group is reported, not silently ignored.
Owner-only tools (`tools.ownerOnly`) are removed for anyone who is not an owner.

What the model is shown and what it may call are one set (`Decision.tools`).
Pure functions of config and the registered tool names; no I/O.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clawsup.supervisor.names import MCP_OWNER_PREFIX
from clawsup.supervisor.sandboxes.registry import CORE_OWNER

ALIASES = {"bash": "exec", "apply-patch": "apply_patch"}
CORE_GROUPS: dict[str, tuple[str, ...]] = {
    "group:fs": ("read", "write", "edit", "apply_patch", "list_dir"),
    "group:runtime": ("exec", "process"),
    "group:sessions": ("sessions_list", "sessions_history", "sessions_send", "sessions_spawn", "subagents", "session_status"),
    "group:messaging": ("message",),
    "group:automation": ("cron", "gateway"),
}
CRON_CHANNEL = "cron"
"""The channel a cron job's turn comes from (supervisor/automation/cron_run.py)."""
PROFILES: dict[str, tuple[str, ...] | None] = {
    "minimal": ("session_status",),
    "coding": ("group:fs", "group:runtime", "group:sessions"),
    "messaging": ("group:messaging", "sessions_list", "sessions_history", "sessions_send", "session_status"),
    "full": None,
}


def norm_tool(name: str) -> str:
    n = name.strip().lower()
    return ALIASES.get(n, n)


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who the turn is for: the routing and the channel's identity."""

    agent: str
    provider: str = ""
    channel: str = ""
    group_id: str | None = None
    sender: str | None = None
    owner: bool = False
    subagent: bool = False


@dataclass(frozen=True)
class Decision:
    tools: tuple[str, ...]
    """Shown to the model this turn, and the only ones it may call."""
    removed: dict[str, str]
    """Tool -> the layer that removed it."""
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"tools": list(self.tools), "removed": self.removed}


@dataclass
class _Layer:
    name: str
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    also: list[str] = field(default_factory=list)
    restrict: bool = False
    """A profile restricts even when its list is empty (`minimal` with nothing known)."""


def decide(config_tools: Mapping[str, Any], agent_tools: Mapping[str, Any] | None, caller: Caller, available: Mapping[str, str]) -> Decision:
    """`available`: tool name -> owner (`core` or a plugin id), from the registry."""
    names = {norm_tool(n): owner for n, owner in available.items()}
    groups = dict(CORE_GROUPS)
    plugins = sorted({o for o in names.values() if o != CORE_OWNER})
    groups["group:plugins"] = tuple(n for n, o in names.items() if o != CORE_OWNER)
    groups["group:mcp"] = tuple(n for n, o in names.items() if o.startswith(MCP_OWNER_PREFIX))
    for pid in plugins:
        # Keys as norm_tool leaves an entry: an MCP server's id may have capitals.
        groups[f"group:plugin:{pid}".lower()] = tuple(n for n, o in names.items() if o == pid)
        if pid.startswith(MCP_OWNER_PREFIX):
            groups[f"group:{pid}".lower()] = groups[f"group:plugin:{pid}".lower()]
    warnings: list[str] = []

    def expand(entries: Iterable[str], where: str, *, check: bool) -> set[str]:
        out: set[str] = set()
        for raw in entries:
            e = norm_tool(raw)
            if e in groups:
                out |= {t for t in groups[e] if t in names}
            elif any(c in e for c in "*?["):
                hits = {t for t in names if fnmatch.fnmatchcase(t, e)}
                out |= hits
                if check and not hits and e != "*":
                    warnings.append(f"{where}: {raw!r} matches no known tool")
            elif e in names:
                out.add(e)
            elif check and not e.startswith("group:") and e not in {t for g in CORE_GROUPS.values() for t in g}:
                warnings.append(f"{where}: {raw!r} names no known tool or group")
            elif check and e.startswith("group:"):
                warnings.append(f"{where}: unknown group {raw!r}")
        return out

    cfg = config_tools or {}
    agent = agent_tools or {}
    prov = caller.provider.split("/", 1)[0].lower() if caller.provider else ""
    by_prov = _get(cfg, "byProvider", prov, default={}) if prov else {}
    agent_by_prov = _get(agent, "byProvider", prov, default={}) if prov else {}

    layers: list[_Layer] = []
    profile = agent.get("profile") or cfg.get("profile")
    if profile:
        if profile not in PROFILES:
            warnings.append(f"tools.profile: unknown profile {profile!r} (known: {', '.join(PROFILES)})")
        elif PROFILES[profile] is not None:
            layers.append(_Layer("profile", list(PROFILES[profile] or ()), also=list(cfg.get("alsoAllow", [])) + list(agent.get("alsoAllow", [])), restrict=True))
    if by_prov.get("profile") and PROFILES.get(by_prov["profile"]) is not None:
        layers.append(_Layer("provider profile", list(PROFILES[by_prov["profile"]] or ()), also=list(by_prov.get("alsoAllow", [])), restrict=True))
    layers.append(_Layer("global", list(cfg.get("allow", [])), list(cfg.get("deny", [])), [] if profile else list(cfg.get("alsoAllow", []))))
    layers.append(_Layer("global by provider", list(by_prov.get("allow", [])), list(by_prov.get("deny", []))))
    layers.append(_Layer("agent", list(agent.get("allow", [])), list(agent.get("deny", []))))
    layers.append(_Layer("agent by provider", list(agent_by_prov.get("allow", [])), list(agent_by_prov.get("deny", []))))
    if caller.channel:
        ch = _get(cfg, "byChannel", caller.channel.lower(), default={})
        layers.append(_Layer("channel", list(ch.get("allow", [])), list(ch.get("deny", []))))
        if caller.group_id:
            g = _get(ch, "groups", caller.group_id.lower(), default={})
            layers.append(_Layer("group", list(g.get("allow", [])), list(g.get("deny", []))))
        if caller.sender:
            s = _get(cfg, "bySender", f"{caller.channel}:{caller.sender}".lower(), default={})
            layers.append(_Layer("sender", list(s.get("allow", [])), list(s.get("deny", []))))
    sb = _get(cfg, "sandbox", "tools", default={})
    layers.append(_Layer("sandbox", list(sb.get("allow", [])), list(sb.get("deny", []))))
    if caller.subagent:
        sa = _get(cfg, "subagents", "tools", default={})
        layers.append(_Layer("subagent", list(sa.get("allow", [])), list(sa.get("deny", []))))
    if caller.channel == CRON_CHANNEL:
        layers.append(_Layer("cron run", deny=["group:automation"]))

    current = set(names)
    removed: dict[str, str] = {}
    for layer in layers:
        allow_entries = layer.allow + layer.also if (layer.allow or layer.restrict) else []
        if allow_entries or layer.restrict:
            keep = expand(allow_entries, f"{layer.name} allow", check=True)
            for t in sorted(current - keep):
                removed.setdefault(t, layer.name)
            current &= keep
        if layer.deny:
            gone = expand(layer.deny, f"{layer.name} deny", check=False) & current
            for t in sorted(gone):
                removed.setdefault(t, layer.name)
            current -= gone
    if not caller.owner:
        owner_only = expand(cfg.get("ownerOnly", []), "tools.ownerOnly", check=False) & current
        for t in sorted(owner_only):
            removed.setdefault(t, "owner only")
        current -= owner_only
    return Decision(tuple(sorted(current)), removed, tuple(dict.fromkeys(warnings)))


def _get(d: Mapping[str, Any], *keys: str, default: Any) -> Any:
    """`d[k1][k2]...`, keys matched without case; `default` where the path ends."""
    cur: object = d
    for k in keys:
        if not isinstance(cur, Mapping):
            return default
        cur = {str(kk).lower(): v for kk, v in cur.items()}.get(k.lower(), None)
        if cur is None:
            return default
    return cur
