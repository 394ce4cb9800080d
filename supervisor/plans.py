"""From the operator's config and the plugins' manifests to one `SandboxPlan` per
plugin. Manifests are read as JSON; no plugin code is imported. Every problem comes
back as a `ConfigError` naming the key path or the plugin folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema

from sandbox.launcher import Limits, MiB
from sandbox.manifest import Manifest, ManifestError, RestartRequest, SandboxRequest, load_manifest
from supervisor.config import ClawsupConfig, resolve_plugin_path
from supervisor.errors import ConfigError
from supervisor.lifecycle import RestartPolicy
from supervisor.supervised import SandboxPlan

AVAILABLE_BACKENDS = frozenset({"process", "bwrap", "docker"})


def build_plans(cfg: ClawsupConfig, *, config_source: str, config_dir: Path, extra_plugins: list[Path]) -> list[SandboxPlan]:
    problems: list[str] = []
    folders: list[tuple[str, Path]] = [
        (f"plugins.load.paths[{i}]", resolve_plugin_path(p, config_dir)) for i, p in enumerate(cfg.plugins.load.paths)
    ]
    folders += [(f"--plugin {p}", p.resolve()) for p in extra_plugins]
    plans: list[SandboxPlan] = []
    seen: dict[str, str] = {}
    for where, folder in folders:
        try:
            manifest = load_manifest(folder)
        except ManifestError as e:
            problems.append(f"{where}: {e}")
            continue
        if manifest.id in seen:
            if folder != seen[manifest.id]:
                problems.append(f"{where}: plugin id {manifest.id!r} is also loaded from {seen[manifest.id]}")
            continue
        seen[manifest.id] = str(folder)
        entry = cfg.plugins.entries.get(manifest.id)
        if entry is not None and not entry.enabled:
            continue
        plugin_config = dict(entry.config) if entry else {}
        if manifest.config_schema is not None:
            problems += _check_plugin_config(manifest, plugin_config)
        request = _merge(_merge(_defaults_as_request(cfg), manifest.sandbox), entry.sandbox if entry else SandboxRequest())
        backend = request.backend or "process"
        if backend not in AVAILABLE_BACKENDS:
            problems.append(
                f"plugins.entries.{manifest.id}.sandbox.backend: backend {backend!r} is not available in this clawsup "
                f"(available: {', '.join(sorted(AVAILABLE_BACKENDS))})"
            )
            continue
        plans.append(_plan(manifest, folder, plugin_config, request, backend))
    for pid in cfg.plugins.entries:
        if pid not in seen:
            problems.append(f"plugins.entries.{pid}: no plugin with this id is loaded (check plugins.load.paths)")
    if problems:
        raise ConfigError(config_source, problems)
    return plans


def _check_plugin_config(manifest: Manifest, config: dict[str, Any]) -> list[str]:
    validator_cls = jsonschema.validators.validator_for(manifest.config_schema)
    try:
        validator_cls.check_schema(manifest.config_schema)
    except jsonschema.SchemaError as e:
        return [f"plugin {manifest.id!r}: its configSchema is not a valid JSON Schema: {e.message}"]
    out = []
    for err in validator_cls(manifest.config_schema).iter_errors(config):
        path = ".".join(str(p) for p in err.absolute_path)
        out.append(f"plugins.entries.{manifest.id}.config{'.' + path if path else ''}: {err.message}")
    return out


def _defaults_as_request(cfg: ClawsupConfig) -> SandboxRequest:
    d = cfg.sandbox.defaults
    return SandboxRequest(
        backend=d.backend,
        call_timeout_seconds=d.call_timeout_seconds,
        memory_mb=d.memory_mb,
        cpu_seconds=d.cpu_seconds,
        max_processes=d.max_processes,
        max_open_files=d.max_open_files,
        max_file_size_mb=d.max_file_size_mb,
        cpus=d.cpus,
        restart=d.restart,
    )


def _merge(base: SandboxRequest, over: SandboxRequest) -> SandboxRequest:
    """Fields set in `over` win; `restart` merges field by field."""
    fields = {k: v for k, v in over.model_dump(exclude_none=True).items() if k != "restart"}
    restart = base.restart or RestartRequest()
    if over.restart is not None:
        restart = restart.model_copy(update=over.restart.model_dump(exclude_none=True))
    return base.model_copy(update={**fields, "restart": restart})


def _plan(manifest: Manifest, folder: Path, plugin_config: dict[str, Any], r: SandboxRequest, backend: str) -> SandboxPlan:
    assert r.call_timeout_seconds and r.memory_mb and r.cpu_seconds and r.max_processes and r.max_open_files and r.max_file_size_mb
    rr = r.restart or RestartRequest()
    return SandboxPlan(
        sandbox_id=manifest.id,
        plugin_id=manifest.id,
        plugin_dir=folder,
        plugin_version=manifest.version,
        entry=manifest.entry,
        declared_tools=frozenset(manifest.contracts.tools),
        plugin_config=plugin_config,
        limits=Limits(
            call_timeout_s=r.call_timeout_seconds,
            memory_bytes=r.memory_mb * MiB,
            cpu_seconds=r.cpu_seconds,
            max_processes=r.max_processes,
            max_open_files=r.max_open_files,
            max_file_size_bytes=r.max_file_size_mb * MiB,
            cpus=r.cpus or 1.0,
        ),
        restart=RestartPolicy(
            max_restarts=rr.max_restarts if rr.max_restarts is not None else 5,
            period_s=rr.period_seconds or 60.0,
            backoff_initial_s=rr.backoff_initial_seconds if rr.backoff_initial_seconds is not None else 0.5,
            backoff_max_s=rr.backoff_max_seconds if rr.backoff_max_seconds is not None else 30.0,
        ),
        backend=backend,
        network=bool(r.network) if r.network is not None else False,
    )
