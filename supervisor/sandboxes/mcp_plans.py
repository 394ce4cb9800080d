"""The `SandboxPlan` of each MCP server (`mcpServers.<id>`): one sandbox per enabled
entry, role `mcp`, whose host is the server's MCP client (sandbox/host/mcp_bridge.py).

Trust, backend, limits and the restart policy follow a plugin's rules exactly
(supervisor/sandboxes/plans.py: `mcpServers.<id>.sandbox` over `sandbox.defaults`;
untrusted code only on bwrap or docker). What is the server's own: `${VAR}` in `env`
and `headers` expanded from the supervisor's environment for this entry alone (the
values go into the plan's McpServerSpec, for that sandbox's start gate, and are never
logged or shown); the network (granted by default to a remote server, which cannot
work without it); the tool prefix; and, for a command, where it is installed and what
of it the sandbox must see (supervisor/sandboxes/mcp_install.py).

Every problem is a ConfigError line naming the key path; the gateway adds the
config file's name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from loguru import logger

from clawsup.sandbox.launch.backends import backend_problem
from clawsup.sandbox.launch.launcher import Backend
from clawsup.sandbox.manifest import TOOL_NAME_PATTERN, RestartRequest
from clawsup.sandbox.mcp_spec import McpServerSpec
from clawsup.supervisor.config import ClawsupConfig, McpServerEntry
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.names import MCP_OWNER_PREFIX
from clawsup.supervisor.sandboxes.mcp_install import Host, resolve_install
from clawsup.supervisor.sandboxes.plans import (
    LIMIT_FIELDS, SandboxPlan, choose_backend, granted_limits, operator_grant, restart_policy, untrusted_refusal,
)  # fmt: skip

SANDBOX_PREFIX = "mcp-"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
"""`${VAR}`, `${VAR:-default}` (the default also when VAR is set but empty, as in a
shell). Anything else, a lone `$` included, stays as written."""
HOST_START_ALLOWANCE_S = 3.0
"""What the sandbox host needs of the handshake timeout besides the server's
initialize: its own start before the server's (Python and the `mcp` SDK's imports
take about 1.4 s on a two-core machine under moderate load, twice that when busy),
and after its deadline the kill of the server and the load-error line."""


def build_mcp_plans(
    cfg: ClawsupConfig,
    *,
    config_dir: Path,
    state_dir: Path | None = None,
    problem_of: Callable[[Backend], str] = backend_problem,
    environ: Mapping[str, str] = os.environ,
    home: Path | None = None,
) -> list[SandboxPlan]:
    """One plan per enabled entry. `environ`: where `${VAR}` comes from (the
    supervisor's). `state_dir`, `home`: never made visible to a sandbox. Blocking
    (it looks at the filesystem, and may ask pyenv): the gateway runs it in a thread."""
    host = Host(config_dir=config_dir, home=home or Path.home(), state_dir=state_dir, environ=environ)
    problems: list[str] = []
    plans: list[SandboxPlan] = []
    sandboxes: dict[str, str] = {}
    for sid, entry in cfg.mcp_servers.items():
        if not entry.on:
            continue
        sandbox_id = SANDBOX_PREFIX + sid.lower()
        if (other := sandboxes.setdefault(sandbox_id, sid)) != sid:
            problems.append(f"mcpServers.{sid}: the same id as mcpServers.{other} once lower-cased (both would be sandbox {sandbox_id!r}); rename one")
            continue
        try:
            plans.append(_plan(cfg, sid, entry, host, problem_of))
        except ConfigError as e:
            problems += e.problems
    problems += _overlapping_prefixes(plans)
    if problems:
        raise ConfigError("", problems)
    return plans


def _overlapping_prefixes(plans: list[SandboxPlan]) -> list[str]:
    """Servers whose prefixes overlap could each serve a name of the other's (`acme_`
    listing `docs_lookup` is `acme_docs_lookup`, which `acme_docs_` serves as
    `lookup`), and which one holds it would depend on who starts first: a server in
    backoff would find its name taken (tests/test_mcp_attacks.py). Plugins are kept
    apart by their declared names; servers, which declare none, by prefixes that
    never begin one another."""
    out = []
    specs = sorted((p.mcp for p in plans if p.mcp is not None), key=lambda m: m.server_id)
    for i, a in enumerate(specs):
        for b in specs[i + 1 :]:
            short, long = (a, b) if len(a.prefix) <= len(b.prefix) else (b, a)
            if long.prefix.startswith(short.prefix):
                out.append(
                    f"mcpServers.{long.server_id}: its tool prefix {long.prefix!r} begins with that of mcpServers.{short.server_id} "
                    f"({short.prefix!r}), so either server could register a name the other serves; set a toolPrefix on one "
                    "so that neither begins the other"
                )
    return out


def initialize_timeout(handshake_timeout_s: float) -> float:
    """The host's deadline for the server's initialize and first tools/list. It must
    pass before the supervisor's handshake timeout, so that a hung initialize is
    reported by the host as such ("did not finish initialize within N s; killed it",
    a retried load error) rather than as a silent "no handshake". At least half the
    handshake timeout, so that a short one still leaves the server some time."""
    return round(max(handshake_timeout_s - HOST_START_ALLOWANCE_S, handshake_timeout_s / 2), 2)


def expand(value: str, key: str, environ: Mapping[str, str]) -> str:
    """`value` with its `${VAR}`s from `environ`; ConfigError naming `key` for each
    VAR that is unset and has no default. Never puts a value in a message."""
    missing: list[str] = []

    def one(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        got = environ.get(name)
        if default is not None:
            return got or default
        if got is None:
            missing.append(name)
            return ""
        return got

    out = _VAR.sub(one, value)
    if missing:
        raise ConfigError("", [
            f"{key}: ${{{name}}} is not set in the supervisor's environment (set it where `clawsup start` runs, "
            f"or give a default: ${{{name}:-value}})"
            for name in dict.fromkeys(missing)
        ])  # fmt: skip
    return out


def _expand_all(values: dict[str, str], key: str, environ: Mapping[str, str], problems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in values.items():
        try:
            out[name] = expand(value, f"{key}.{name}", environ)
        except ConfigError as e:
            problems += e.problems
    return out


def _plan(cfg: ClawsupConfig, sid: str, entry: McpServerEntry, host: Host, problem_of: Callable[[Backend], str]) -> SandboxPlan:
    key = f"mcpServers.{sid}"
    problems: list[str] = []
    op, asked_backend = operator_grant(cfg, entry.sandbox)
    trusted = entry.trust == "trusted"
    backend, why_not = choose_backend(asked_backend, trusted=trusted, problem_of=problem_of)
    if backend is None:
        if trusted:
            problems.append(f"{key}.sandbox.backend: MCP server {sid!r} cannot start: {why_not}")
        else:
            problems.append(untrusted_refusal(key, f"MCP server {sid!r}", entry.sandbox, why_not))

    granted_network, network_key = (entry.network, f"{key}.network") if entry.network is not None else (entry.sandbox.network, f"{key}.sandbox.network")
    if entry.transport == "http":
        if granted_network is False:
            problems.append(f"{network_key}: false, but {sid!r} is a remote server (`url`), which cannot work without the network")
        network = True
    else:
        network = cfg.sandbox.defaults.network if granted_network is None else granted_network

    prefix = f"{sid}_" if entry.tool_prefix is None else entry.tool_prefix
    if not re.fullmatch(TOOL_NAME_PATTERN, prefix + "x"):
        where = f"{key}.toolPrefix" if entry.tool_prefix is not None else key
        problems.append(f"{where}: the tool prefix {prefix!r} would make tool names that are not valid ({TOOL_NAME_PATTERN}); set {key}.toolPrefix")

    env = _expand_all(entry.env, f"{key}.env", host.environ, problems)
    headers = _expand_all(entry.headers, f"{key}.headers", host.environ, problems)
    for name, value in headers.items():
        # An HTTP client's refusal of a bad value quotes it: caught here, named by key.
        if not re.fullmatch(r"[\x20-\x7e\t]*", value) or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
            problems.append(f"{key}.headers.{name}: not a valid HTTP header (printable ASCII only, no line breaks; its value is not shown)")
    if entry.transport == "http" and not re.match(r"^https?://", entry.url or "", re.IGNORECASE):
        problems.append(f"{key}.url: must be an http:// or https:// address (the server's streamable HTTP endpoint)")
    command, args = "", list(entry.args)
    visible: tuple[str, ...] = ()
    if entry.command is not None and backend is not None and not problems:
        try:
            install = resolve_install(entry.command, server_id=sid, env=env, backend=backend, host=host)
        except ConfigError as e:
            problems += e.problems
        else:
            command, args, visible = install.command, [*install.args_before, *entry.args], install.visible_paths
            for note in install.notes:
                logger.warning("MCP server {!r}: {}", sid, note)
    if problems or backend is None:
        raise ConfigError("", problems)

    restart, raised = restart_policy(op.restart or RestartRequest())
    if raised:
        logger.warning("MCP server {!r}: {}", sid, raised)
    limits = {name: getattr(op, name) for name, _ in LIMIT_FIELDS}
    if entry.call_timeout_seconds is not None:
        limits["call_timeout_seconds"] = entry.call_timeout_seconds
    spec = McpServerSpec(
        server_id=sid,
        transport=entry.transport,
        command=command,
        args=args,
        env=env,
        url=entry.url or "",
        headers=headers,
        prefix=prefix,
        allow=list(entry.tools.allow),
        deny=list(entry.tools.deny),
        initialize_timeout_s=initialize_timeout(cfg.sandbox.handshake_timeout_seconds),
    )
    return SandboxPlan(
        sandbox_id=SANDBOX_PREFIX + sid.lower(),
        plugin_id=MCP_OWNER_PREFIX + sid,
        plugin_dir=None,
        plugin_version="mcp",
        entry="",
        declared_tools=frozenset(),
        plugin_config={},
        limits=granted_limits(limits),
        restart=restart,
        backend=backend,
        role="mcp",
        network=network,
        trusted=trusted,
        protected_paths=tuple(cfg.sandbox.protected_paths),
        mcp=spec,
        visible_paths=visible,
    )
