"""`clawsup exec run`: one command through the exec tool's own path (the screen, a
workspace sandbox host, the same runner) without a running supervisor.

The sandbox is supervised for the command's duration by a throwaway manager on a
temporary state directory, and runs as the invoking user (a root operator's command
keeps uid 0 under bwrap, without capabilities and inside its namespaces; the
gateway's workspace sandboxes get their own uid instead).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from sandbox.backends import backend_problem, make_launcher
from sandbox.cgroup import CgroupRoot
from sandbox.launcher import Launcher
from supervisor.config import ClawsupConfig
from supervisor.errors import ClawsupError, ConfigError
from supervisor.host_client import ExecResult
from supervisor.lifecycle import SandboxState
from supervisor.manager import SandboxManager
from supervisor.paths import StatePaths
from supervisor.registry import Registry
from supervisor.supervised import OutputSink, Timing
from supervisor.workspaces import Workspaces, settings_from_config

SANDBOX_ID = "exec-run"


@dataclass(frozen=True, kw_only=True)
class OnceResult:
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    blocked_by: str | None = None
    segment: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "duration_s": round(self.duration_s, 4),
            "blocked_by": self.blocked_by,
        }


async def run_once(
    command: str,
    *,
    cfg: ClawsupConfig,
    source: str,
    backend: str | None,
    workspace: Path | None,
    timeout: float | None,
    max_output: int | None,
    on_output: OutputSink,
) -> OnceResult:
    settings = settings_from_config(cfg, source=source)
    if backend is not None:
        if problem := backend_problem(backend):
            raise ConfigError("--backend", [problem])
        settings = replace(settings, backend=backend)
    e = settings.exec
    settings = replace(settings, exec=replace(e, max_output_bytes=max_output or e.max_output_bytes))
    verdict = settings.screen.check(command)
    if not verdict.allowed:
        return OnceResult(blocked_by=verdict.rule, segment=verdict.segment)
    if timeout is not None and timeout > e.max_timeout_s:
        raise ConfigError("--timeout", [f"at most tools.exec.maxTimeoutSeconds ({e.max_timeout_s:g} s), got {timeout:g}"])

    state = Path(tempfile.mkdtemp(prefix="clawsup-exec-"))
    cgroups = CgroupRoot.create()
    launcher: Launcher = make_launcher(settings.backend, cgroups=cgroups, state_dir=state)
    manager: SandboxManager | None = None
    try:
        paths = StatePaths(state)
        paths.ensure()
        manager = SandboxManager(
            registry=Registry(),
            launchers={settings.backend: launcher},
            paths=paths,
            timing=Timing(),
            env_allowlist=cfg.sandbox.env_allowlist,
        )
        workspaces = Workspaces(manager, settings)
        sb = manager.add(workspaces.plan_for(SANDBOX_ID), workspace=workspace.resolve() if workspace else None)
        ready, stop = asyncio.Event(), asyncio.Event()
        result: ExecResult | None = None
        failure: ClawsupError | None = None
        # Failures are kept and raised after the group, so that the caller gets the
        # error itself rather than an exception group.
        async with asyncio.TaskGroup() as tg:
            tg.create_task(manager.run(ready, stop, start_timeout=30.0, stop_timeout=10.0))
            try:
                await ready.wait()
                if sb.lc.state is not SandboxState.READY:
                    last = sb.lc.last_exit.reason if sb.lc.last_exit is not None else ""
                    tail = "; ".join(x for x in (last, *sb.log.stderr_tail) if x) or "no output"
                    raise ClawsupError(f"the sandbox did not start ({sb.lc.state.value}): {tail}")
                result = await sb.exec(
                    command,
                    workdir="",
                    timeout=timeout or e.timeout_s,
                    output_cap=settings.exec.max_output_bytes,
                    kill_grace=e.kill_grace_s,
                    on_output=on_output,
                )
            except ClawsupError as err:
                failure = err
            finally:
                stop.set()
        if failure is not None:
            raise failure
        assert result is not None
        if result.error:
            raise ClawsupError(result.error)
        return OnceResult(
            exit_code=result.exit_code,
            signal=result.signal,
            timed_out=result.timed_out,
            truncated=result.truncated,
            duration_s=result.duration_s,
        )
    finally:
        if manager is not None:
            manager.close()
        else:
            launcher.close()
        shutil.rmtree(state, ignore_errors=True)
