"""`clawsup exec run`: one command through the exec tool's own path (the screen, a
workspace sandbox host, the same runner) without a running supervisor.

The sandbox is supervised for the command's duration by a throwaway manager on a
temporary state directory. In a fresh folder of its own, a root operator's command on
bwrap or docker runs as an allocated uid of its own (sandbox/launch/uids.py), as the
gateway's workspace sandboxes do. In the operator's folder (`--workspace DIR`) it
runs as the invoking user, so that it can change DIR: under bwrap a root operator's
command keeps uid 0 without capabilities, inside its namespaces, and owns what it
writes; what it could leave for later is taken back after the run (a setuid or
setgid bit it set is removed, and said).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from clawsup.sandbox.launch.backends import backend_named, backend_problem, make_launcher
from clawsup.sandbox.launch.cgroup import CgroupRoot
from clawsup.sandbox.launch.launcher import Launcher
from clawsup.sandbox.launch.uids import SandboxUids, UidAllocator
from clawsup.sandbox.exec_result import ExecResult
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.errors import ClawsupError, ConfigError
from clawsup.supervisor.sandboxes.calls import OutputSink
from clawsup.supervisor.sandboxes.incarnation import Timing
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.sandboxes.manager import SandboxManager
from clawsup.supervisor.sandboxes.plans import workspace_plan
from clawsup.supervisor.paths import StatePaths
from clawsup.supervisor.sandboxes.registry import Registry
from clawsup.supervisor.tools.workspace_settings import settings_from_config

SANDBOX_ID = "exec-run"


@dataclass(frozen=True, kw_only=True)
class OnceResult:
    """What `clawsup exec run` reports: the command's result, or the screen's rule
    that refused it (then nothing ran, and `result` is empty)."""

    result: ExecResult = field(default_factory=ExecResult)
    blocked_by: str | None = None
    segment: str | None = None

    @property
    def exit_code(self) -> int | None:
        return self.result.exit_code

    @property
    def signal(self) -> int | None:
        return self.result.signal

    @property
    def timed_out(self) -> bool:
        return self.result.timed_out

    def to_json(self) -> dict[str, object]:
        return {**self.result.to_json(), "blocked_by": self.blocked_by}


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
        try:
            chosen = backend_named(backend)
        except ValueError as bad:
            raise ConfigError("--backend", [str(bad)]) from None
        # It may ask the docker engine: not on the loop.
        if problem := await asyncio.to_thread(backend_problem, chosen):
            raise ConfigError("--backend", [problem])
        settings = replace(settings, backend=chosen)
    e = settings.exec
    settings = replace(settings, exec=replace(e, max_output_bytes=max_output or e.max_output_bytes))
    verdict = settings.screen.check(command)
    if not verdict.allowed:
        return OnceResult(blocked_by=verdict.rule, segment=verdict.segment)
    if timeout is not None and timeout > e.max_timeout_s:
        raise ConfigError("--timeout", [f"at most tools.exec.maxTimeoutSeconds ({e.max_timeout_s:g} s), got {timeout:g}"])

    state = Path(tempfile.mkdtemp(prefix="clawsup-exec-"))
    uids: SandboxUids | None = None
    # Both block (cgroup writes and a sweep; the warden's spawn; docker asks the
    # engine), so they run in a worker thread.
    cgroups = await asyncio.to_thread(CgroupRoot.create)
    launcher: Launcher = await asyncio.to_thread(make_launcher, settings.backend, cgroups=cgroups, state_dir=state)
    manager: SandboxManager | None = None
    try:
        paths = StatePaths(state)
        paths.ensure()
        user_for = None
        if os.geteuid() == 0 and workspace is None and settings.backend in ("bwrap", "docker"):
            u = cfg.sandbox.uids
            uids = SandboxUids(UidAllocator(Path(u.registry), u.first, u.count), state)
            # Allocated now, in a thread (a locked file and maybe a scan of the
            # machine's processes); manager.add below then finds it remembered.
            await uids.auser(SANDBOX_ID)
            user_for = lambda plan: uids.user(plan.sandbox_id)  # noqa: E731
        manager = SandboxManager(
            registry=Registry(),
            launchers={settings.backend: launcher},
            paths=paths,
            timing=Timing(),
            env_allowlist=cfg.sandbox.env_allowlist,
            user_for=user_for,
        )
        setid_before = await asyncio.to_thread(setid_files, workspace) if workspace is not None and os.geteuid() == 0 else None
        sb = manager.add(workspace_plan(settings, SANDBOX_ID), workspace=workspace.resolve() if workspace else None)
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
        if setid_before is not None and workspace is not None:
            for path in await asyncio.to_thread(strip_new_setid, workspace, setid_before):
                await on_output(f"\nclawsup: removed the setuid/setgid bit the command set on {path}\n".encode())
        if failure is not None:
            raise failure
        assert result is not None
        if result.error:
            raise ClawsupError(result.error)
        return OnceResult(result=result)
    finally:
        if manager is not None:
            await manager.aclose()
        else:
            await launcher.aclose()
        await asyncio.to_thread(shutil.rmtree, state, ignore_errors=True)
        if uids is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(uids.release, SANDBOX_ID)


def setid_files(root: Path) -> set[tuple[int, int]]:
    """(device, inode) of every setuid or setgid file under `root`; no link followed."""
    found = set()
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    found.add((st.st_dev, st.st_ino))
    return found


def strip_new_setid(root: Path, before: set[tuple[int, int]]) -> list[str]:
    """A root command in the operator's folder owns what it writes: a setuid-root file
    it left there would serve any local user later. Such bits that were not there
    before the run are removed, through a descriptor opened without following."""
    stripped = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
                # Only a regular file is opened (a device or FIFO never is).
                if not (stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID)):
                    continue
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID) and (st.st_dev, st.st_ino) not in before:
                    os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                    stripped.append(path)
            finally:
                os.close(fd)
    return stripped
