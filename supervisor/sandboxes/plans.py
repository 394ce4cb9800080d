"""Every `SandboxPlan`, the one description of what a sandbox runs and within which
limits, is built here: one per plugin from the operator's config and the plugin's
manifest (`build_plans`), and one per workspace or subagent run from the workspace
settings (`workspace_plan`, `subagent_plan`). Manifests are read as JSON; no plugin
code is imported. Every problem comes back as a `ConfigError` naming the key path or
the plugin folder.

The operator grants, the plugin only asks (DESIGN §5a): each limit is the stricter
of the operator's value and the manifest's; backend, trust, network and the restart
policy are the operator's alone. What a manifest asked and was refused loads with
the operator's value and a warning naming the key (tests/test_trust.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from clawsup.sandbox.launch.backends import backend_problem, first_isolating
from clawsup.sandbox.handshake import SandboxRole
from clawsup.sandbox.launch.launcher import Backend, BackendChoice, Limits, MiB
from clawsup.sandbox.mcp_spec import McpServerSpec
from clawsup.sandbox.offers import OFFER_KINDS
from clawsup.sandbox.manifest import MANIFEST_NAME, Manifest, ManifestError, RestartRequest, SandboxRequest, load_manifest
from clawsup.supervisor.config import ClawsupConfig, PluginEntry, SandboxGrant, resolve_plugin_path
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.sandboxes.offers import OfferGrant
from clawsup.supervisor.sandboxes.restarts import RestartPolicy
from clawsup.supervisor.names import reserved_reason
from clawsup.supervisor.tools.schemas import CHECK_BUDGET_S, CheckTooCostly, SchemaRefused, compile_schema, outside_refs

if TYPE_CHECKING:
    from clawsup.supervisor.tools.workspace_settings import WorkspaceSettings

Role = SandboxRole
"""What a sandbox hosts: one plugin; the core exec and file tools of a workspace,
whose registrations the supervisor holds (supervisor/tools/core.py); or one
subagent run's agent loop (supervisor/agents/subagents.py). The same word is on the
child's start gate (sandbox/handshake.py)."""

AVAILABLE_BACKENDS = frozenset({"process", "bwrap", "docker"})
# The limits a manifest may ask for: (field, manifest key). Each is granted as the
# stricter (smaller) of the ask and the operator's value.
LIMIT_FIELDS = (
    ("call_timeout_seconds", "callTimeoutSeconds"), ("memory_mb", "memoryMb"), ("cpu_seconds", "cpuSeconds"),
    ("max_processes", "maxProcesses"), ("max_open_files", "maxOpenFiles"), ("max_file_size_mb", "maxFileSizeMb"),
    ("cpus", "cpus"), ("max_workspace_mb", "maxWorkspaceMb"), ("tmp_mb", "tmpMb"),
)  # fmt: skip
# What one crash of a child that dies at start-up may take, start to death, when the
# floor on the restart period is computed (see `restart_policy`).
CRASH_ALLOWANCE_S = 2.0
MIN_PERIOD_S = 10.0
# Problems of one plugin's config named, at most.
MAX_CONFIG_PROBLEMS = 20


@dataclass(frozen=True, kw_only=True)
class SandboxPlan:
    """Everything needed to run one plugin's sandbox, resolved from the operator's
    config and the plugin's manifest."""

    sandbox_id: str
    plugin_id: str
    plugin_dir: Path | None
    """None for a workspace sandbox, which loads no plugin."""
    plugin_version: str
    entry: str
    declared_tools: frozenset[str]
    plugin_config: dict[str, Any]
    limits: Limits
    restart: RestartPolicy
    backend: Backend
    role: Role = "plugin"
    network: bool = True
    workspace_tools: dict[str, Any] = field(default_factory=dict)
    """For `workspace`: handed to the host on its gate (shell, kill grace, read cap)."""
    trusted: bool = False
    """The operator's `trust` for this plugin; workspace and subagent sandboxes run
    model-written commands and are never trusted."""
    protected_paths: tuple[str, ...] = ()
    """Workspace-relative paths read-only to the child (see LaunchSpec)."""
    requested: dict[str, Any] = field(default_factory=dict)
    """What the manifest asked for (`sandbox`), for `clawsup plugins show`."""
    refused: tuple[str, ...] = ()
    """Each part of the manifest's ask the operator's config did not grant, as a
    sentence (also logged at start)."""
    mcp: McpServerSpec | None = None
    """For `mcp`: the server its host is the client of (supervisor/sandboxes/mcp_plans.py).
    `declared_tools` is then empty: the server lists its tools at run time, and the
    supervisor registers those the spec's prefix and allow/deny rule pick."""
    visible_paths: tuple[str, ...] = ()
    """Host paths the child sees read-only at their own paths (LaunchSpec.visible_paths)."""
    offers: OfferGrant = field(default_factory=OfferGrant)
    """What it may offer beyond tools (supervisor/sandboxes/offers.py)."""


def build_plans(
    cfg: ClawsupConfig,
    *,
    config_source: str,
    config_dir: Path,
    extra_plugins: list[Path],
    problem_of: Callable[[Backend], str] = backend_problem,
) -> list[SandboxPlan]:
    """`problem_of(backend)`: empty when that backend works here, else why not."""
    problems: list[str] = []
    folders: list[tuple[str, Path]] = [
        (f"plugins.load.paths[{i}]", resolve_plugin_path(p, config_dir)) for i, p in enumerate(cfg.plugins.load.paths)
    ]
    folders += [(f"--plugin {p}", p.resolve()) for p in extra_plugins]
    plans: list[SandboxPlan] = []
    seen: dict[str, Path] = {}
    for where, folder in folders:
        try:
            manifest = load_manifest(folder)
        except ManifestError as e:
            problems.append(f"{where}: {e}")
            continue
        if why := reserved_reason(manifest.id):
            problems.append(f"{where}: plugin id {manifest.id!r} cannot be used: {why}; the plugin's author must choose another id")
            continue
        if manifest.id in seen:
            if folder != seen[manifest.id]:
                problems.append(f"{where}: plugin id {manifest.id!r} is also loaded from {seen[manifest.id]}")
            continue
        seen[manifest.id] = folder
        entry = cfg.plugins.entries.get(manifest.id) or PluginEntry()
        if not entry.enabled:
            continue
        plugin_config = dict(entry.config)
        if manifest.config_schema is not None:
            problems += _check_plugin_config(manifest, plugin_config)
        try:
            plans.append(_plan(cfg, manifest, folder, entry, plugin_config, problem_of))
        except ConfigError as e:
            problems += e.problems
    for pid in cfg.plugins.entries:
        if pid not in seen:
            problems.append(f"plugins.entries.{pid}: no plugin with this id is loaded (check plugins.load.paths)")
    if problems:
        raise ConfigError(config_source, problems)
    return plans


def _check_plugin_config(manifest: Manifest, config: dict[str, Any]) -> list[str]:
    """The operator's config against the manifest's configSchema. The schema is data
    from the plugin: a `$ref` resolves inside it or not at all, never over the
    network or from a file (a remote `$ref` once made the gateway hang at start);
    and it is compiled and checked with the bounds of a tool's input schema
    (supervisor/tools/schemas.py), so that it cannot stop or stall the gateway's start
    (a pattern `re` cannot compile, `$ref`s that double at each step)."""
    schema = manifest.config_schema
    assert schema is not None
    outside = sorted(outside_refs(schema))
    if outside:
        return [f"plugin {manifest.id!r}: its configSchema refers outside the manifest ({', '.join(repr(r[:100]) for r in outside[:3])}); only local references such as '#/$defs/x' are followed"]
    try:
        check = compile_schema(schema)
    except SchemaRefused as e:
        return [f"plugin {manifest.id!r}: its configSchema {e}"]
    try:
        errors = check.errors(config, budget_s=CHECK_BUDGET_S, limit=MAX_CONFIG_PROBLEMS)
    except CheckTooCostly:
        return [f"plugin {manifest.id!r}: its configSchema took more than {CHECK_BUDGET_S:g} s to check the config and was stopped; the schema is too costly to check (tell the plugin's author)"]
    except RecursionError:
        return [f"plugins.entries.{manifest.id}.config: nested too deeply to check"]
    except Exception as e:  # noqa: BLE001 - whatever the plugin's schema makes jsonschema raise is the schema's fault
        return [f"plugin {manifest.id!r}: its configSchema could not be checked ({type(e).__name__}: {str(e)[:200]})"]
    out = []
    for err in errors:
        path = ".".join(str(p) for p in err.absolute_path)
        out.append(f"plugins.entries.{manifest.id}.config{'.' + path if path else ''}: {err.message[:300]}")
    return out


def operator_grant(cfg: ClawsupConfig, over: SandboxGrant) -> tuple[SandboxRequest, BackendChoice]:
    """`sandbox.defaults` overridden by one sandbox's grant (`plugins.entries.<id>.sandbox`,
    `mcpServers.<id>.sandbox`), and the backend asked for."""
    d = cfg.sandbox.defaults
    base = SandboxRequest(
        call_timeout_seconds=d.call_timeout_seconds, memory_mb=d.memory_mb, cpu_seconds=d.cpu_seconds,
        max_processes=d.max_processes, max_open_files=d.max_open_files, max_file_size_mb=d.max_file_size_mb,
        cpus=d.cpus, max_workspace_mb=d.max_workspace_mb, tmp_mb=d.tmp_mb, network=d.network, restart=d.restart,
    )  # fmt: skip
    fields = {k: v for k, v in over.model_dump(exclude_none=True).items() if k not in ("restart", "backend")}
    restart = base.restart or RestartRequest()
    if over.restart is not None:
        restart = restart.model_copy(update=over.restart.model_dump(exclude_none=True))
    return base.model_copy(update={**fields, "restart": restart}), over.backend or d.backend


def _grant(pid: str, ask: SandboxRequest, op: SandboxRequest) -> tuple[dict[str, Any], bool, list[str]]:
    """The granted limits, network, and a sentence per refused ask."""
    refused: list[str] = []
    granted: dict[str, Any] = {}
    for name, key in LIMIT_FIELDS:
        mine, theirs = getattr(op, name), getattr(ask, name)
        granted[name] = mine
        if theirs is None:
            continue
        if theirs <= mine:
            granted[name] = theirs
        else:
            refused.append(f"sandbox.{key}: asked {theirs:g}, granted {mine:g} (raise it in plugins.entries.{pid}.sandbox.{key})")
    network = bool(ask.network) and bool(op.network)
    if ask.network and not op.network:
        refused.append(f"sandbox.network: asked for the network, granted none (grant it with plugins.entries.{pid}.sandbox.network: true)")
    return granted, network, refused


def choose_backend(asked: BackendChoice, *, trusted: bool, problem_of: Callable[[Backend], str]) -> tuple[Backend | None, str]:
    """(backend, why not). `auto` takes the first isolating backend that works here;
    only trusted code may end on `process`. Never a silent step down: an untrusted
    plugin with no isolating backend gets None and the reasons."""
    if asked == "auto":
        backend, reasons = first_isolating(problem_of)
        if backend is not None:
            return backend, ""
        return ("process", "") if trusted else (None, reasons)
    if asked == "process" and not trusted:
        return None, "the process backend does not isolate it"
    if problem := problem_of(asked):
        return None, f"{asked}: {problem}"
    return asked, ""


def untrusted_refusal(entry_key: str, what: str, grant: SandboxGrant, why_not: str) -> str:
    """Why an untrusted sandbox cannot start on the backend it was given, and the two
    ways out. `entry_key`: the entry's key path (`plugins.entries.x`, `mcpServers.x`)."""
    key = f"{entry_key}.sandbox.backend" if grant.backend else "sandbox.defaults.backend"
    return (
        f"{key}: {what} is untrusted and cannot start: {why_not}. Either make an isolating backend work here "
        "(apt-get install bubblewrap; or a Docker engine and scripts/build-sandbox-image), or, if you trust its author, "
        f"set {entry_key}.trust: \"trusted\" to let it run on the process backend"
    )


def _plan(
    cfg: ClawsupConfig, manifest: Manifest, folder: Path, entry: PluginEntry, plugin_config: dict[str, Any], problem_of: Callable[[Backend], str]
) -> SandboxPlan:
    pid = manifest.id
    ask = manifest.sandbox
    op, asked_backend = operator_grant(cfg, entry.sandbox)
    trusted = entry.trust == "trusted"
    granted, network, refused = _grant(pid, ask, op)
    backend, why_not = choose_backend(asked_backend, trusted=trusted, problem_of=problem_of)
    if backend is None:
        raise ConfigError("", [untrusted_refusal(f"plugins.entries.{pid}", f"plugin {pid!r}", entry.sandbox, why_not)])
    if ask.backend is not None and ask.backend != backend:
        refused.append(f"sandbox.backend: asked {ask.backend!r}; the backend is the operator's choice ({backend!r})")
    restart, raised = restart_policy(op.restart or RestartRequest())
    if ask.restart is not None:
        theirs = ask.restart.model_dump(exclude_none=True)
        mine = {
            "max_restarts": restart.max_restarts, "period_seconds": restart.period_s,
            "backoff_initial_seconds": restart.backoff_initial_s, "backoff_max_seconds": restart.backoff_max_s,
        }  # fmt: skip
        if any(mine[k] != v for k, v in theirs.items()):
            refused.append(f"sandbox.restart: asked {_camel(theirs)}; the restart policy is the operator's ({_camel(mine)})")
    if raised:
        logger.warning("plugin {!r}: {}", pid, raised)
    for line in refused:
        logger.warning("plugin {!r} asked for more than it is granted: {}", pid, line)
    protected = [*cfg.sandbox.protected_paths, MANIFEST_NAME, manifest.entry if manifest.entry.endswith(".py") else manifest.entry.replace(".", "/") + ".py"]
    return SandboxPlan(
        sandbox_id=pid,
        plugin_id=pid,
        plugin_dir=folder,
        plugin_version=manifest.version,
        entry=manifest.entry,
        declared_tools=frozenset(manifest.contracts.tools),
        plugin_config=plugin_config,
        limits=granted_limits(granted),
        restart=restart,
        backend=backend,
        network=network,
        trusted=trusted,
        protected_paths=tuple(dict.fromkeys(protected)),
        requested=ask.model_dump(by_alias=True, exclude_none=True),
        refused=tuple(refused),
        offers=OfferGrant(
            declared={kind: manifest.contracts.declared(kind) for kind in OFFER_KINDS},
            hooks_allow=frozenset(entry.hooks.allow),
            fail_open=entry.hooks.fail_open,
            hook_timeout_s=entry.hooks.timeout_seconds,
            command_timeout_s=entry.command_timeout_seconds,
            http_plugin_auth=entry.http.allow_plugin_auth,
            http_timeout_s=entry.http.timeout_seconds,
            channels_enabled=frozenset(k for k, c in cfg.channels.plugin_channels().items() if c.enabled and k in manifest.contracts.channels),
        ),
    )


def granted_limits(granted: dict[str, Any]) -> Limits:
    """`granted`: a value for each of LIMIT_FIELDS, in the config's units."""
    return Limits(
        call_timeout_s=granted["call_timeout_seconds"],
        memory_bytes=granted["memory_mb"] * MiB,
        cpu_seconds=granted["cpu_seconds"],
        max_processes=granted["max_processes"],
        max_open_files=granted["max_open_files"],
        max_file_size_bytes=granted["max_file_size_mb"] * MiB,
        cpus=granted["cpus"] or 1.0,
        workspace_bytes=granted["max_workspace_mb"] * MiB,
        tmp_bytes=granted["tmp_mb"] * MiB,
    )


def workspace_plan(settings: WorkspaceSettings, sandbox_id: str) -> SandboxPlan:
    """A workspace sandbox: the host of the core exec and file tools, which run
    model-written commands and so are never trusted."""
    s = settings
    return SandboxPlan(
        **_no_plugin(sandbox_id),
        limits=replace(s.limits, call_timeout_s=max(s.limits.call_timeout_s, 30.0)),
        restart=s.restart,
        backend=s.backend,
        role="workspace",
        network=s.network,
        trusted=False,
        protected_paths=s.protected_paths,
        workspace_tools={
            "shell": s.exec.shell, "kill_grace_s": s.exec.kill_grace_s, "read_max_bytes": s.read_max_bytes,
            "protected_paths": list(s.protected_paths),
        },  # fmt: skip
    )


def subagent_plan(settings: WorkspaceSettings, sandbox_id: str, backend: Backend) -> SandboxPlan:
    """A subagent run's sandbox. Its loop only talks to the supervisor: small
    limits, no network, and a crash fails the run (no second try)."""
    s = settings
    return SandboxPlan(
        **_no_plugin(sandbox_id),
        limits=replace(s.limits, memory_bytes=min(s.limits.memory_bytes, 512 * MiB), max_processes=min(s.limits.max_processes, 64)),
        restart=RestartPolicy(max_restarts=0),
        backend=backend,
        role="subagent",
        network=False,
    )


def _no_plugin(sandbox_id: str) -> dict[str, Any]:
    return {
        "sandbox_id": sandbox_id, "plugin_id": sandbox_id, "plugin_dir": None, "plugin_version": "core", "entry": "",
        "declared_tools": frozenset(), "plugin_config": {},
    }  # fmt: skip


def restart_policy(r: RestartRequest) -> tuple[RestartPolicy, str]:
    """The policy, with its period raised where it is too short for a crash loop to
    spend the budget (deaths spaced by the backoff would each fall outside the
    window, and the loop would never reach `failed`); and a sentence saying so."""
    d = RestartPolicy()  # the defaults' one source
    policy = RestartPolicy(
        max_restarts=d.max_restarts if r.max_restarts is None else r.max_restarts,
        period_s=d.period_s if r.period_seconds is None else r.period_seconds,
        backoff_initial_s=d.backoff_initial_s if r.backoff_initial_seconds is None else r.backoff_initial_seconds,
        backoff_max_s=d.backoff_max_s if r.backoff_max_seconds is None else r.backoff_max_seconds,
    )
    floor = max(MIN_PERIOD_S, period_floor(policy))
    if policy.period_s >= floor:
        return policy, ""
    raised = RestartPolicy(max_restarts=policy.max_restarts, period_s=floor, backoff_initial_s=policy.backoff_initial_s, backoff_max_s=policy.backoff_max_s)
    return raised, f"restart.periodSeconds {policy.period_s:g} is too short for {policy.max_restarts} restarts to end a crash loop; using {floor:g}"


def period_floor(p: RestartPolicy) -> float:
    """How long `max_restarts` fast crashes take with their backoffs."""
    backoffs = sum(p.backoff(n) for n in range(1, p.max_restarts + 1))
    return backoffs + p.max_restarts * CRASH_ALLOWANCE_S


def _camel(d: dict[str, Any]) -> dict[str, Any]:
    return {RestartRequest.model_fields[k].alias or k: v for k, v in d.items()}
