"""The core tools that act on a workspace (`exec`, `read`, `write`, `edit`,
`list_dir`, OpenClaw's names, so `group:fs` and `group:runtime` carry over) and the
workspace sandboxes they run in.

The supervisor owns these registrations (owner `core`): they stay registered while a
workspace sandbox restarts, and a call meanwhile gets `SandboxUnavailable`. Which
sandbox serves a call follows from who is calling (the agent, the session) and the
configured scope, never from the tool's arguments: the model cannot pick a workspace
or an identity. Arguments are checked here, at the edge, by pydantic; `exec`
commands are screened here (supervisor/exec_screen.py) before anything is sent.

Created by the gateway (and by `clawsup exec run`); lives as long as the manager.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import signal
from dataclasses import dataclass, field, replace
from typing import Any

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox.backends import backend_problem, first_isolating
from sandbox.launcher import Limits, MiB
from sandbox.manifest import format_validation_error
from supervisor.config import ClawsupConfig
from supervisor.errors import BadToolArguments, ConfigError, ExecBlocked
from supervisor.exec_screen import ExecScreen
from supervisor.plans import restart_policy
from supervisor.host_client import ExecResult
from supervisor.lifecycle import RestartPolicy, SandboxState
from supervisor.registry import CORE_OWNER, Kind, Registration, Registry
from supervisor.supervised import SETTLED, OutputSink, SandboxPlan, SupervisedSandbox, ToolResult

DEFAULT_AGENT = "main"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ExecArgs(_Args):
    command: str = Field(min_length=1, max_length=100_000, description="A shell command, run with /bin/sh -c in the workspace.")
    workdir: str | None = Field(default=None, description="A folder inside the workspace to run in (default: the workspace).")
    timeout: float | None = Field(default=None, gt=0, description="Seconds before the command is stopped (default 60).")


class ReadArgs(_Args):
    path: str = Field(min_length=1)
    offset: int | None = Field(default=None, ge=1)
    limit: int | None = Field(default=None, ge=1)


class WriteArgs(_Args):
    path: str = Field(min_length=1)
    content: str


class EditArgs(_Args):
    path: str = Field(min_length=1)
    old_string: str = Field(min_length=1)
    new_string: str


class ListDirArgs(_Args):
    path: str = "."


@dataclass(frozen=True)
class CoreTool:
    name: str
    description: str
    args: type[_Args]


CORE_TOOLS: dict[str, CoreTool] = {
    t.name: t
    for t in (
        CoreTool(
            "exec",
            "Run a shell command in your workspace sandbox. Returns its output (head and tail when long), exit code "
            "or signal, and whether it timed out. Dangerous commands are refused before they run.",
            ExecArgs,
        ),
        CoreTool("read", "Read a text file of the workspace. Long files: pass offset (first line, 1-based) and limit (lines).", ReadArgs),
        CoreTool("write", "Create or overwrite a file in the workspace; missing parent folders are created.", WriteArgs),
        CoreTool("edit", "Replace one exact, unique occurrence of old_string with new_string in a workspace file.", EditArgs),
        CoreTool("list_dir", "List a folder of the workspace: names, types, and sizes of files.", ListDirArgs),
    )
}


def register_core_tools(registry: Registry) -> None:
    for t in CORE_TOOLS.values():
        schema = t.args.model_json_schema()
        schema.pop("title", None)
        registry.register(
            Registration(kind=Kind.TOOL, name=t.name, owner=CORE_OWNER, sandbox_id=None, description=t.description, input_schema=schema)
        )


@dataclass(frozen=True, kw_only=True)
class ExecSettings:
    timeout_s: float = 60.0
    max_timeout_s: float = 600.0
    max_output_bytes: int = 64 * 1024
    kill_grace_s: float = 2.0
    shell: str = "/bin/sh"


@dataclass(frozen=True, kw_only=True)
class WorkspaceSettings:
    scope: str = "agent"
    backend: str = "process"
    network: bool = False
    limits: Limits = field(default_factory=lambda: Limits(memory_bytes=1024 * MiB, max_processes=256, cpu_seconds=3600, max_file_size_bytes=256 * MiB))
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    exec: ExecSettings = field(default_factory=ExecSettings)
    screen: ExecScreen = field(default_factory=ExecScreen)
    read_max_bytes: int = 256 * 1024
    idle_stop_s: float = 600.0
    protected_paths: tuple[str, ...] = ()
    unisolated: str = ""
    """Why the model's commands run on the process backend (the fallback was taken),
    said at start and in `clawsup status`; empty when they are isolated."""


def workspace_sandbox_id(scope: str, agent: str, session: str | None) -> str:
    if scope == "shared":
        return "workspace"
    if scope == "session" and session:
        digest = hashlib.sha256(f"{agent}\0{session}".encode()).hexdigest()[:12]
        return f"workspace-{_slug(agent)}-s{digest}"
    return f"workspace-{_slug(agent)}"


def _slug(s: str) -> str:
    """A name part for an id: one per input. A long one keeps a hash of the whole,
    so that two agents whose ids share 40 characters never share a workspace."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "_", s) or "_"
    if safe == s and len(s) <= 40:
        return s
    return f"{safe[:31]}-{hashlib.sha256(s.encode()).hexdigest()[:8]}"


class Workspaces:
    """Routes core tool calls to the right workspace sandbox, creating and starting
    it on first use (through the manager, which supervises it like any sandbox)."""

    def __init__(self, manager: Any, settings: WorkspaceSettings) -> None:
        self._manager = manager
        self.settings = settings
        self._starting: dict[str, asyncio.Task[SupervisedSandbox]] = {}
        self._last_used: dict[str, float] = {}

    def plan_for(self, sandbox_id: str) -> SandboxPlan:
        s = self.settings
        return SandboxPlan(
            sandbox_id=sandbox_id,
            plugin_id=sandbox_id,
            plugin_dir=None,
            plugin_version="core",
            entry="",
            declared_tools=frozenset(),
            plugin_config={},
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

    def sandbox_id(self, agent: str | None, session: str | None, pinned: str | None = None) -> str:
        return pinned or workspace_sandbox_id(self.settings.scope, agent or DEFAULT_AGENT, session)

    async def sandbox(self, agent: str | None, session: str | None, start_timeout: float = 30.0, *, pinned: str | None = None) -> SupervisedSandbox:
        """The workspace sandbox of this caller (or the one the supervisor `pinned`),
        started if need be."""
        sid = self.sandbox_id(agent, session, pinned)
        self._last_used[sid] = asyncio.get_running_loop().time()
        sb = self._manager.sandboxes.get(sid)
        if sb is None:
            sb = self._manager.add(self.plan_for(sid))
            self._manager.supervise_later(sb)
        if sb.lc.state is SandboxState.STOPPED:
            await sb.start(start_timeout)
        elif sb.lc.state is SandboxState.STARTING:
            await sb.wait_state(SETTLED, start_timeout)
        return sb

    async def call(
        self,
        name: str,
        args: dict[str, Any] | str,
        *,
        agent: str | None,
        session: str | None,
        timeout: float | None,
        on_output: OutputSink | None,
        sandbox_id: str | None = None,
    ) -> ToolResult:
        tool = CORE_TOOLS[name]
        parsed = _parse_args(tool, args)
        if isinstance(parsed, ExecArgs):
            return await self._exec(parsed, agent=agent, session=session, pinned=sandbox_id, on_output=on_output)
        sb = await self.sandbox(agent, session, pinned=sandbox_id)
        return await sb.invoke(name, parsed.model_dump_json(exclude_none=True), timeout)

    def screen(self, command: str, sandbox_id: str) -> None:
        verdict = self.settings.screen.check(command)
        if not verdict.allowed:
            assert verdict.rule is not None and verdict.segment is not None
            logger.info("exec refused by rule {!r}: {!r}", verdict.rule, verdict.segment)
            sb = self._manager.sandboxes.get(sandbox_id)
            if sb is not None:
                sb.log.event(f"exec {_short(command)}: refused by rule {verdict.rule!r} ({verdict.segment!r}); nothing ran")
            raise ExecBlocked(verdict.rule, verdict.segment, verdict.explain())

    async def _exec(self, a: ExecArgs, *, agent: str | None, session: str | None, pinned: str | None, on_output: OutputSink | None) -> ToolResult:
        e = self.settings.exec
        if a.timeout is not None and a.timeout > e.max_timeout_s:
            raise BadToolArguments("exec", f"timeout: at most {e.max_timeout_s:g} seconds, got {a.timeout:g}")
        self.screen(a.command, self.sandbox_id(agent, session, pinned))
        sb = await self.sandbox(agent, session, pinned=pinned)
        chunks: list[bytes] = []

        async def sink(data: bytes) -> None:
            chunks.append(data)
            if on_output is not None:
                await on_output(data)

        sb.log.event(f"exec {_short(a.command)}: started")
        r = await sb.exec(
            a.command,
            workdir=a.workdir or "",
            timeout=a.timeout or e.timeout_s,
            output_cap=e.max_output_bytes,
            kill_grace=e.kill_grace_s,
            on_output=sink,
        )
        sb.log.event(f"exec {_short(a.command)}: {_describe(r)}")
        if r.error:
            raise BadToolArguments("exec", r.error)
        out = {
            "output": b"".join(chunks).decode("utf-8", errors="replace"),
            "exit_code": r.exit_code,
            "signal": r.signal,
            "timed_out": r.timed_out,
            "truncated": r.truncated,
            "duration_s": round(r.duration_s, 4),
            "output_bytes": r.output_bytes,
        }
        return ToolResult(text=json.dumps(out), is_json=True)

    async def stop_idle(self) -> None:
        """Per-session sandboxes nobody called for `idle_stop_s` are stopped (their
        files stay; the next call starts them again)."""
        if self.settings.scope != "session":
            return
        now = asyncio.get_running_loop().time()
        for sid, t in list(self._last_used.items()):
            sb = self._manager.sandboxes.get(sid)
            if sb is not None and now - t > self.settings.idle_stop_s and sb.lc.state is SandboxState.READY:
                del self._last_used[sid]
                await sb.stop("idle", 10.0)


def _short(command: str) -> str:
    one = " ".join(command.split())
    return repr(one if len(one) <= 200 else one[:200] + "…")


def _describe(r: ExecResult) -> str:
    """For `clawsup logs <workspace sandbox>`: what became of a command."""
    if r.error:
        return f"not started: {r.error}"
    if r.signal is not None:
        try:
            how = f"killed by {signal.Signals(r.signal).name}"
        except ValueError:
            how = f"killed by signal {r.signal}"
    else:
        how = f"exit {r.exit_code}"
    extra = (", timed out" if r.timed_out else "") + (f", output cut ({r.output_bytes} bytes)" if r.truncated else "")
    return f"{how} after {r.duration_s:.3f} s{extra}"


def _parse_args(tool: CoreTool, args: dict[str, Any] | str) -> _Args:
    try:
        if isinstance(args, str):
            return tool.args.model_validate_json(args or "{}")
        return tool.args.model_validate(args)
    except ValidationError as e:
        raise BadToolArguments(tool.name, format_validation_error(e)) from None


def settings_from_config(cfg: ClawsupConfig, *, source: str) -> WorkspaceSettings:
    """Resolves `agents.defaults.sandbox` and `tools` into settings; `auto` becomes
    bwrap where bwrap works, else process (with a warning, since the process backend
    is no security boundary)."""
    a = cfg.agents.defaults.sandbox
    backend, unisolated = resolve_backend(a.backend, "agents.defaults.sandbox.backend", "exec and file tools", source=source, fallback=a.process_fallback)
    e = cfg.tools.exec
    d = cfg.sandbox.defaults
    return WorkspaceSettings(
        scope=a.scope,
        backend=backend,
        network=a.network,
        limits=Limits(
            memory_bytes=a.memory_mb * MiB,
            max_processes=a.max_processes,
            cpu_seconds=a.cpu_seconds,
            max_file_size_bytes=a.max_file_size_mb * MiB,
            max_open_files=max(d.max_open_files, 1024),
            workspace_bytes=a.max_workspace_mb * MiB,
            tmp_bytes=a.tmp_mb * MiB,
        ),
        restart=restart_policy(d.restart)[0],
        exec=ExecSettings(
            timeout_s=min(e.timeout_seconds, e.max_timeout_seconds),
            max_timeout_s=e.max_timeout_seconds,
            max_output_bytes=e.max_output_bytes,
            kill_grace_s=e.kill_grace_seconds,
            shell=e.shell,
        ),
        screen=screen_from_config(cfg),
        read_max_bytes=cfg.tools.fs.read_max_bytes,
        idle_stop_s=a.idle_stop_seconds,
        protected_paths=tuple(cfg.sandbox.protected_paths),
        unisolated=unisolated,
    )


def resolve_backend(backend: str, key: str, what: str, *, source: str, fallback: bool = False) -> tuple[str, str]:
    """The backend for sandboxes that run model-written commands, and, when it is
    `process`, why (said at start and in status). `auto` takes bwrap, else docker;
    the process backend only where `fallback` allows it, never silently. A named
    backend that cannot work here, or no isolating one without the fallback, is a
    config error that names the ways out."""
    if backend != "auto":
        if problem := backend_problem(backend):
            raise ConfigError(source, [f"{key}: {problem}"])
        return backend, ("configured" if backend == "process" else "")
    isolating, why = first_isolating()
    if isolating is not None:
        return isolating, ""
    if not fallback:
        raise ConfigError(source, [
            f"{key}: {what} need an isolating backend and none works here ({why}). Install bubblewrap "
            "(apt-get install bubblewrap) or start a Docker engine with the sandbox image (scripts/build-sandbox-image); "
            f"or accept unconfined commands with {key.rsplit('.', 1)[0]}.processFallback: true"
        ])  # fmt: skip
    logger.warning("{} run under the process backend, which is NOT a security boundary ({}); install bubblewrap to contain them", what, why)
    return "process", why


def screen_from_config(cfg: ClawsupConfig) -> ExecScreen:
    e = cfg.tools.exec
    return ExecScreen.build(use_defaults=e.deny_defaults, deny={k: p.pattern for k, p in e.deny.items()}, allow=[p.pattern for p in e.allow])
