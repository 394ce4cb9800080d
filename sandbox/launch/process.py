"""The `process` backend: a plain child process with rlimits, its own session and
process group, a death signal, a scrubbed environment, the workspace as cwd, and a
cgroup when one is writable.

This is NOT a security boundary. The child runs as the supervisor's user and sees
its files; limits contain accidents (loops, floods, memory and fork bombs), not an
attacker. Run code you did not write under the bwrap or docker backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import ClassVar
from pathlib import Path

import psutil
from loguru import logger

from clawsup.sandbox.launch import leftovers
from clawsup.sandbox.launch import warden as _warden_module
from clawsup.sandbox.launch.cgroup import Cgroup, CgroupRoot
from clawsup.sandbox.launch.launcher import Backend, Child, ChildUser, ExitStatus, LaunchSpec, MiB, Pacer, cleanup_in_thread, in_thread, outlast
from clawsup.sandbox.protected import Mounts

# Address space beyond the memory limit: an idle grpc.aio child maps several hundred
# MiB it never touches (thread stacks, malloc arenas). The memory cgroup enforces the
# real limit on resident memory; RLIMIT_AS is the backstop where there is no cgroup.
ADDRESS_SPACE_HEADROOM = 1024 * MiB


KILL_WAIT_S = 2.0
"""How long `kill_all` waits for the cgroup's processes to be gone, so that a death
is reported once nothing of the child runs (its folder goes at `aclose`)."""
CLOSE_WAIT_S = 5.0
"""How long `aclose` waits for a child that is still alive after its kill."""
MAX_TREE = 256
"""The most processes `rss_bytes` and bwrap's signal look at in a child's tree."""


class ProcessChild:
    """One child process. Held by pidfd: PIDs wrap quickly here (pid_max 32768), and a
    pidfd can never name a different process. Created by `ProcessLauncher.launch`,
    owned by the supervisor's incarnation, released by `aclose()`."""

    def __init__(
        self, popen: subprocess.Popen[bytes], pidfd: int, socket_path: str, cgroup: Cgroup | None, warden: Warden, run_as: ChildUser | None = None
    ) -> None:
        self._popen = popen
        self._run_as = run_as
        self._warden = warden
        self.pid = popen.pid
        self._pidfd = pidfd
        self._held: list[int] = []
        """pidfds of descendants, taken before a signal where no cgroup holds them."""
        self.socket_path = socket_path
        self._cgroup = cgroup
        assert popen.stdout is not None and popen.stderr is not None
        self.stdout_fd = popen.stdout.fileno()
        self.stderr_fd = popen.stderr.fileno()
        self._exit: asyncio.Future[ExitStatus] | None = None
        self._watching: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def wait(self) -> asyncio.Future[ExitStatus]:
        if self._exit is None:
            loop = asyncio.get_running_loop()
            self._exit = loop.create_future()
            if self.exited:
                self._exit.set_result(self._translate(_status_of(self._popen.returncode)))
            else:
                loop.add_reader(self._pidfd, self._on_exit)
                self._watching = loop
        return self._exit

    def _on_exit(self) -> None:
        self._unwatch()
        status = self._reap()
        if self._exit is not None and not self._exit.done():
            self._exit.set_result(self._translate(status))

    def _unwatch(self) -> None:
        if self._watching is not None:
            self._watching.remove_reader(self._pidfd)
            self._watching = None

    def _reap(self) -> ExitStatus:
        """The pidfd is readable: the child has exited; reaping it cannot block."""
        try:
            info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED)
        except ChildProcessError:
            info = None
        # Popen must not try to reap a pid we already reaped (it could be reused).
        if info is None:
            self._popen.returncode = -1
            return ExitStatus()
        if info.si_code == os.CLD_EXITED:
            self._popen.returncode = info.si_status
            return ExitStatus(code=info.si_status)
        self._popen.returncode = -info.si_status
        return ExitStatus(signal=info.si_status)

    def _translate(self, status: ExitStatus) -> ExitStatus:
        """For wrappers that report their child's end in their own exit code."""
        return status

    @property
    def exited(self) -> bool:
        return self._popen.returncode is not None

    async def signal_group(self, sig: int) -> None:
        self._hold_descendants()
        self._signal_group(sig)

    def _hold_descendants(self) -> None:
        """Without a cgroup, what left the child's group (setsid) is found only as the
        child's descendants (the host is a subreaper then: its orphans stay below
        it), and only while the child lives. So before it is signalled each one is
        held by a pidfd, which names it whoever its parent becomes, and killed with
        the rest (`_send_kills`)."""
        if self._cgroup is not None or self.exited or self._closed:
            return
        tree = descendants(self.pid)
        family = {self.pid, *tree}
        for pid in tree:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            # Still the process listed (not a new one that took a freed number): its
            # parent is in the tree.
            if _parent(pid) in family and len(self._held) < MAX_TREE:
                self._held.append(fd)
            else:
                os.close(fd)

    def _signal_group(self, sig: int) -> None:
        # The group id is the child's pid (it is a session leader). The number stays
        # ours while any member of the group lives, even after the leader is reaped.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _send_kills(self) -> None:
        """No wait: the child by its pidfd, then its group, then (without a cgroup)
        the descendants held by pidfd."""
        self._hold_descendants()
        if not self.exited and not self._closed:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        self._signal_group(signal.SIGKILL)
        held, self._held = self._held, []
        for fd in held:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)

    async def kill_all(self) -> None:
        self._send_kills()
        if self._cgroup is not None:
            cgroup = self._cgroup

            def sweep() -> None:
                cgroup.kill_all()
                cgroup.wait_empty(KILL_WAIT_S)

            await in_thread(sweep)

    def kill_all_now(self) -> None:
        """Sync, for a `finally` that cannot await (see clawsup.sandbox.launch.launcher.Child): the
        same kills as `kill_all`, without waiting for the cgroup to empty."""
        self._send_kills()
        if self._cgroup is not None:
            self._cgroup.kill_all()

    async def diagnose(self) -> str:
        cgroup = self._cgroup
        if cgroup is None:
            return ""

        def read() -> str:
            if cgroup.memory_limit_hit():
                return "memory limit"
            if cgroup.pids_limit_hit():
                return "process limit reached"
            return ""

        return await in_thread(read)

    def rss_bytes(self) -> int | None:
        if self.exited:
            return None
        try:
            return psutil.Process(self.pid).memory_info().rss
        except psutil.Error:
            return None

    async def usage(self) -> dict[str, object] | None:
        return None

    async def aclose(self) -> None:
        if self._closed:
            return
        if not self.exited:
            # Meant for a dead child; a live one is killed first, not left unowned.
            await self.kill_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await asyncio.shield(self.wait())
        self._closed = True
        self._unwatch()
        for fd in self._held:  # what was held and not killed yet goes with the child
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        self._held = []
        if self._exit is not None and not self._exit.done():
            self._exit.set_result(ExitStatus(reason="still running when closed"))
        for f in (self._popen.stdout, self._popen.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        with contextlib.suppress(OSError):
            os.close(self._pidfd)
        try:
            await cleanup_in_thread(self._release)
        finally:
            self._warden.forget(self.pid)

    def _release(self) -> None:
        """The blocking part of `aclose`: the cgroup folder, once its last process is
        gone (sandbox/launch/cgroup.py), and what the child's own uid left in the host's
        scratch folders."""
        if self._cgroup is not None:
            self._cgroup.remove()
        if not self._private_scratch and leftovers.own_uid(self._run_as):
            assert self._run_as is not None
            leftovers.remove(self._run_as)

    _private_scratch = False
    """Whether the child had /tmp and /dev/shm of its own (bwrap); else what its own
    uid left in the host's is removed at close (sandbox/launch/leftovers.py)."""


def _status_of(returncode: int | None) -> ExitStatus:
    if returncode is None:
        return ExitStatus()
    return ExitStatus(code=returncode) if returncode >= 0 else ExitStatus(signal=-returncode)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int, limit: int = MAX_TREE) -> list[int]:
    """`pid`'s descendants, from /proc/<pid>/task/<tid>/children: a few reads per
    process of the tree, never a scan of the whole process table."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < limit:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out[:limit]


class Warden:
    """Our handle on the warden process (see sandbox/launch/warden.py). Owned by the
    launcher; closing it tells the warden we left cleanly."""

    def __init__(self) -> None:
        self._popen = subprocess.Popen(
            [sys.executable, "-I", "-S", _warden_module.__file__],
            # Never our environment: the warden runs as our user and is readable by
            # its other processes, and ours holds the API keys (tests/test_nonroot.py).
            env={k: v for k, v in os.environ.items() if k in ("PATH", "DOCKER_HOST")},
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        assert self._popen.stdin is not None
        self._pipe = self._popen.stdin
        # Lines come from the loop and from launch and cleanup threads; each goes
        # whole. (A few dozen bytes into a pipe the warden drains: never a wait.)
        self._lock = threading.Lock()

    def _send(self, line: str) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._pipe.write(line.encode() + b"\n")
            self._pipe.flush()

    def watch(self, pgid: int, cgroup: Cgroup | None) -> None:
        dirs = " ".join(str(d) for d in cgroup.dirs) if cgroup is not None else ""
        self._send(f"add {pgid} {dirs}")

    def forget(self, pgid: int) -> None:
        self._send(f"del {pgid}")

    def watch_container(self, name: str) -> None:
        """Before the container is created, so that no moment leaves it unlisted."""
        self._send(f"add-container {name}")

    def forget_container(self, name: str) -> None:
        self._send(f"del-container {name}")

    def close(self) -> None:
        """Sync: it waits up to 5 s for the warden to exit. From the loop, `aclose`."""
        with self._lock, contextlib.suppress(OSError):
            self._pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)

    async def aclose(self) -> None:
        await cleanup_in_thread(self.close)


class ProcessLauncher:
    """Starts process-backend children. Created by the gateway (or `clawsup exec
    run`), one per backend; `aclose()` once its children are closed."""

    name: ClassVar[Backend] = "process"

    def __init__(self, cgroups: CgroupRoot | None, warden: Warden | None = None) -> None:
        """`warden`: one shared by several launchers of a supervisor (its owner
        closes it); by default the launcher has its own."""
        self._cgroups = cgroups
        self._owns_warden = warden is None
        self._warden = warden or Warden()
        self.checkpoint: Callable[[str], Awaitable[None]] | None = None
        """Awaited between the steps of a launch with the next step's name
        ("prepare", "spawn", "gate", "return"): where tests/test_launchers.py
        cancels a launch midway. None in service."""

    async def launch(self, spec: LaunchSpec) -> Child:
        # Each step runs in a worker thread (a chown walk, a cgroup's writes, a scan of
        # the process table, Popen); `_Start` records what each one made, so that a
        # failure or a cancellation anywhere undoes exactly that.
        start = _Start(self, spec)
        try:
            await self._at("prepare")
            await in_thread(start.prepare)
            await self._at("spawn")
            await in_thread(start.spawn)
            await self._at("gate")
            await in_thread(start.open_gate)
            await self._at("return")
            return start.child()
        except BaseException as e:
            said, cancelled = await _undo(start)
            if cancelled and not isinstance(e, asyncio.CancelledError):
                # Cancelled while undoing a failure: the cancellation is what the
                # caller must see, or its task group would wait for it in vain.
                raise asyncio.CancelledError() from e
            if said and isinstance(e, Exception):
                raise OSError(f"the child died while starting: {said.splitlines()[-1]}") from e
            raise

    async def _at(self, step: str) -> None:
        if self.checkpoint is not None:
            await self.checkpoint(step)

    # Hooks for backends that wrap the host command (sandbox/launch/bwrap.py).
    _child_class: type[ProcessChild] = ProcessChild
    _attach_after_spawn = True
    """Whether the cgroup is joined from outside once the child exists. Right for a
    lone child blocked on its gate; a wrapper that forks joins before it execs."""

    def _host_parent_pid(self) -> int:
        return os.getpid()

    def _mounts(self, spec: LaunchSpec) -> Mounts:
        """Descriptors the wrapper needs besides the gate (bwrap: its mount sources),
        opened in the launch's prepare step; closed once the child has its copies."""
        return Mounts([])

    def _wrap(self, spec: LaunchSpec, argv: list[str], cgroup: Cgroup | None, mounts: Mounts) -> tuple[list[str], Path, dict[str, str]]:
        return argv, spec.workspace, spec.env

    async def aclose(self) -> None:
        await cleanup_in_thread(self._close)

    def _close(self) -> None:
        if self._owns_warden:
            self._warden.close()
        if self._cgroups is not None:
            self._cgroups.remove()


class _Start:
    """One launch in progress: what it has made so far. Each step is a method run in a
    worker thread; `undo` (also in a thread) removes whatever exists, whichever step
    failed or was cancelled."""

    def __init__(self, launcher: ProcessLauncher, spec: LaunchSpec) -> None:
        self.launcher = launcher
        self.spec = spec
        self.socket_path = str(spec.run_dir / "host.sock")
        self.cgroup: Cgroup | None = None
        self.mounts: Mounts | None = None
        self.rlimits: dict[str, int] = {}
        self.gate_r: int | None = None
        self.gate_w: int | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self.pidfd: int | None = None
        self.watched = False

    def prepare(self) -> None:
        spec, u = self.spec, self.spec.run_as
        if u is not None:
            if not spec.operator_workspace:
                _give(spec.workspace, u)
            chown_dir(spec.run_dir, u.uid, u.gid)
        cgroups = self.launcher._cgroups
        if cgroups is not None:
            self.cgroup = cgroups.child(spec.sandbox_id, max_processes=spec.limits.max_processes, memory_bytes=spec.limits.memory_bytes)
        child_uid = u.uid if u is not None else os.geteuid()
        self.rlimits = _rlimits(spec, have_cgroup=self.cgroup is not None, child_uid=child_uid)
        self.mounts = self.launcher._mounts(spec)
        self.gate_r, self.gate_w = os.pipe()

    def spawn(self) -> None:
        assert self.gate_r is not None and self.mounts is not None
        argv = [
            # -I: the workspace is the cwd and is writable by the plugin; isolated
            # mode keeps it (and PYTHON* variables) off sys.path, so a plugin cannot
            # plant its own `sandbox` package for the next start.
            # -u: a plugin's print() reaches the log at once, and is not lost in a
            # buffer when the child crashes (-I ignores PYTHONUNBUFFERED).
            sys.executable, "-I", "-u", "-m", "clawsup.sandbox.host",
            "--plugin-dir", str(self.spec.plugin_dir or ""),
            "--socket", self.socket_path,
            "--gate-fd", str(self.gate_r),
            "--parent-pid", str(self.launcher._host_parent_pid()),
        ]  # fmt: skip
        argv, cwd, env = self.launcher._wrap(self.spec, argv, self.cgroup, self.mounts)
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            pass_fds=(self.gate_r, *(m.fd for m in self.mounts.items)),
            close_fds=True,
            # No user=/group= here: the child drops privileges itself (see
            # sandbox/host/__main__.py), so that Popen can vfork.
        )
        # Not yet reaped, so the pid still names our child: pidfd_open is race-free.
        self.pidfd = os.pidfd_open(self.popen.pid)
        # The child has its copies of these.
        os.close(self.gate_r)
        self.gate_r = None
        self.mounts.close()

    def open_gate(self) -> None:
        assert self.popen is not None and self.gate_w is not None
        pid = self.popen.pid
        if self.cgroup is not None and self.launcher._attach_after_spawn:
            self.cgroup.attach(pid)
        _prlimit(pid, self.rlimits, self.spec.sandbox_id)
        self.launcher._warden.watch(pid, self.cgroup)
        self.watched = True
        # Open the gate: only now may the child go on to load plugin code.
        u = self.spec.run_as
        run_as = (u.uid, u.gid) if u is not None else None
        # Without a cgroup, the host keeps what it orphans below itself (a subreaper)
        # so that its shutdown, or our kill, can still find it (sandbox/host/server.py).
        payload = dataclasses.replace(self.spec.gate, rlimits=self.rlimits, run_as=run_as, subreaper=self.cgroup is None).encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(self.gate_w, view) :]
        os.close(self.gate_w)
        self.gate_w = None
        assert self.popen.stdout is not None and self.popen.stderr is not None
        os.set_blocking(self.popen.stdout.fileno(), False)
        os.set_blocking(self.popen.stderr.fileno(), False)

    def child(self) -> ProcessChild:
        assert self.popen is not None and self.pidfd is not None
        return self.launcher._child_class(self.popen, self.pidfd, self.socket_path, self.cgroup, self.launcher._warden, run_as=self.spec.run_as)

    def undo(self) -> str:
        """Kill and remove what this launch made; returns the child's last words on
        stderr, if it said any. Bounded: a SIGKILLed child exits, and the cgroup
        wait is (sandbox/launch/cgroup.py)."""
        # A child still blocked on its gate reads EOF there and exits.
        for fd in (self.gate_w, self.gate_r):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.gate_r = self.gate_w = None
        if self.mounts is not None:
            self.mounts.close()
        said = ""
        popen = self.popen
        if popen is not None:
            if self.pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:  # pidfd_open failed: the pid is still unreaped, so still ours
                popen.kill()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
            if self.cgroup is not None:
                self.cgroup.kill_all()
            if self.pidfd is not None:
                with contextlib.suppress(ChildProcessError):
                    os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED)
                popen.returncode = -signal.SIGKILL
                os.close(self.pidfd)
                self.pidfd = None
            else:
                popen.wait()
            if popen.stderr is not None:
                # Never blocks: a descendant may still hold the pipe's other end.
                os.set_blocking(popen.stderr.fileno(), False)
                with contextlib.suppress(OSError, TypeError):
                    said = (popen.stderr.read(4096) or b"").decode(errors="replace").strip()
            for f in (popen.stdout, popen.stderr):
                if f is not None:
                    f.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.watched and popen is not None:
            self.launcher._warden.forget(popen.pid)
        return said


async def _undo(start: _Start) -> tuple[str, bool]:
    """Run `start.undo` to its end whatever cancellation arrives meanwhile: (what the
    child said, whether the caller was cancelled meanwhile). The launch re-raises
    what stopped it, or that cancellation."""
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(None, start.undo)
    cancelled = await outlast(fut)
    if fut.cancelled() or fut.exception() is not None:
        logger.opt(exception=None if fut.cancelled() else fut.exception()).error(
            "{}: cleaning up after a failed launch failed; its cgroup or processes may be left", start.spec.sandbox_id
        )
        return "", cancelled
    return fut.result(), cancelled


# How deep `_give` descends. Only a child builds a deeper tree; below this its
# entries keep their owner rather than cost one open descriptor per level.
GIVE_MAX_DEPTH = 64
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def chown_dir(path: Path, uid: int, gid: int) -> None:
    """Make a folder the child's (its socket folder), by fd, so that a symlink put in
    its place is refused rather than followed. Every backend's launch uses it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def _give(workspace: Path, user: ChildUser) -> None:
    """Make the workspace the child's own. Its contents are chowned only when the
    owner changed (a first run, or a new uid): with recorded uids that is rare.

    This runs as root over a folder a child wrote, so it must be useless as a weapon
    (tests/test_hostile_paths.py): the walk goes from directory descriptor to
    directory descriptor and follows no symlink; each entry is chowned through a
    descriptor of the very inode that was checked, never by a name the child could
    swap meanwhile; only an inode of the workspace's previous owner (or ours, or
    already the new owner's) moves, never a symlink, and never a file with other hard
    links (one linked in from elsewhere, so that root would give it away)."""
    top = os.open(workspace, _OPEN_DIR)
    kept: list[str] = []
    try:
        st = os.fstat(top)
        if (st.st_uid, st.st_gid) == (user.uid, user.gid):
            return
        _give_tree(top, "", frozenset({st.st_uid, os.geteuid(), user.uid}), user, kept, 0, Pacer())
        os.fchown(top, user.uid, user.gid)
    finally:
        os.close(top)
    if kept:
        more = f"; and {len(kept) - 10} more" if len(kept) > 10 else ""
        logger.warning("{}: left to their owners, not given to uid {}: {}{}", workspace, user.uid, "; ".join(kept[:10]), more)


def _give_tree(dfd: int, rel: str, movable: frozenset[int], user: ChildUser, kept: list[str], depth: int, pacer: Pacer) -> None:
    for name in os.listdir(dfd):
        pacer.tick()
        path = rel + name
        try:
            # A directory opens as one; anything else (a FIFO, a device) is not opened
            # at all, and a symlink is taken as itself.
            fd = os.open(name, _OPEN_DIR, dir_fd=dfd)
        except OSError:
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError:
                continue  # gone meanwhile
        try:
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_uid not in movable:
                kept.append(f"{path} (uid {st.st_uid})")
            elif stat.S_ISDIR(st.st_mode):
                if depth < GIVE_MAX_DEPTH:
                    _give_tree(fd, path + "/", movable, user, kept, depth + 1, pacer)
                else:
                    kept.append(f"what is below {path}/ (deeper than {GIVE_MAX_DEPTH} levels)")
                os.fchown(fd, user.uid, user.gid)
            elif (st.st_uid, st.st_gid) == (user.uid, user.gid):
                pass
            elif st.st_nlink > 1:
                kept.append(f"{path} ({st.st_nlink} hard links)")
            else:
                # chown through the descriptor's magic link: the inode fstat saw.
                os.chown(f"/proc/self/fd/{fd}", user.uid, user.gid)
        finally:
            os.close(fd)


def _rlimits(spec: LaunchSpec, *, have_cgroup: bool, child_uid: int) -> dict[str, int]:
    lim = spec.limits
    out = {
        "RLIMIT_AS": lim.memory_bytes + ADDRESS_SPACE_HEADROOM,
        "RLIMIT_CPU": lim.cpu_seconds,
        "RLIMIT_NOFILE": lim.max_open_files,
        "RLIMIT_FSIZE": lim.max_file_size_bytes,
        "RLIMIT_CORE": 0,
    }
    if not have_cgroup and child_uid != 0:
        # RLIMIT_NPROC counts every task of the uid (other sandboxes', and the
        # supervisor's own when it is that uid), so a bare max_processes would forbid
        # the child even its gRPC threads. It does not bind root at all.
        out["RLIMIT_NPROC"] = _tasks_of_uid(child_uid) + lim.max_processes
    return out


def _prlimit(pid: int, rlimits: dict[str, int], sandbox_id: str) -> None:
    """Set the limits from outside, before the gate opens, so they hold even if the
    child's own setrlimit were skipped. (The child is still our uid here: it drops
    privileges after the gate. Were it not, this would need CAP_SYS_RESOURCE, which
    containers often drop; then the child's own call is what holds.)"""
    for name, value in rlimits.items():
        which = getattr(resource, name)
        try:
            resource.prlimit(pid, which, (value, value))
        except ValueError:
            # Asking for more than our own hard limit: take the hard limit.
            _, hard = resource.getrlimit(which)
            resource.prlimit(pid, which, (hard, hard))
        except PermissionError:
            logger.debug("{}: prlimit {} not permitted here; the child sets it on itself", sandbox_id, name)
            return


def _tasks_of_uid(uid: int) -> int:
    n = 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if p.info["uids"].real == uid:
                n += p.info["num_threads"]
    return n
