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
import pwd
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
from loguru import logger

from sandbox import leftovers
from sandbox import warden as _warden_module
from sandbox.cgroup import Cgroup, CgroupRoot
from sandbox.launcher import Child, ChildUser, ExitStatus, LaunchSpec, MiB

# Address space beyond the memory limit: an idle grpc.aio child maps several hundred
# MiB it never touches (thread stacks, malloc arenas). The memory cgroup enforces the
# real limit on resident memory; RLIMIT_AS is the backstop where there is no cgroup.
ADDRESS_SPACE_HEADROOM = 1024 * MiB


class ProcessChild:
    """One child process. Held by pidfd: PIDs wrap quickly here (pid_max 32768), and a
    pidfd can never name a different process."""

    def __init__(
        self, popen: subprocess.Popen[bytes], pidfd: int, socket_path: str, cgroup: Cgroup | None, warden: Warden, run_as: ChildUser | None = None
    ) -> None:
        self._popen = popen
        self._run_as = run_as
        self._warden = warden
        self.pid = popen.pid
        self._pidfd = pidfd
        self.socket_path = socket_path
        self._cgroup = cgroup
        assert popen.stdout is not None and popen.stderr is not None
        self.stdout_fd = popen.stdout.fileno()
        self.stderr_fd = popen.stderr.fileno()
        self._exit: asyncio.Future[ExitStatus] | None = None

    def wait(self) -> asyncio.Future[ExitStatus]:
        if self._exit is None:
            loop = asyncio.get_running_loop()
            self._exit = loop.create_future()
            loop.add_reader(self._pidfd, self._on_exit)
        return self._exit

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED)
        # Popen must not try to reap a pid we already reaped (it could be reused).
        if info is None:
            status = ExitStatus()
            self._popen.returncode = -1
        elif info.si_code == os.CLD_EXITED:
            status = ExitStatus(code=info.si_status)
            self._popen.returncode = info.si_status
        else:
            status = ExitStatus(signal=info.si_status)
            self._popen.returncode = -info.si_status
        if self._exit is not None and not self._exit.done():
            self._exit.set_result(self._translate(status))

    def _translate(self, status: ExitStatus) -> ExitStatus:
        """For wrappers that report their child's end in their own exit code."""
        return status

    @property
    def exited(self) -> bool:
        return self._popen.returncode is not None

    def signal_group(self, sig: int) -> None:
        # The group id is the child's pid (it is a session leader). The number stays
        # ours while any member of the group lives, even after the leader is reaped.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill_all(self) -> None:
        if not self.exited:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        self.signal_group(signal.SIGKILL)
        if self._cgroup is not None:
            self._cgroup.kill_all()

    def diagnose(self) -> str:
        if self._cgroup is None:
            return ""
        if self._cgroup.memory_limit_hit():
            return "memory limit"
        if self._cgroup.pids_limit_hit():
            return "process limit reached"
        return ""

    def rss_bytes(self) -> int | None:
        if self.exited:
            return None
        try:
            return psutil.Process(self.pid).memory_info().rss
        except psutil.Error:
            return None

    def usage(self) -> dict[str, object] | None:
        return None

    def close(self) -> None:
        for f in (self._popen.stdout, self._popen.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        with contextlib.suppress(OSError):
            os.close(self._pidfd)
        if self._cgroup is not None:
            self._cgroup.kill_all()
            self._cgroup.remove()
        self._warden.forget(self.pid)
        if not self._private_scratch and leftovers.own_uid(self._run_as):
            assert self._run_as is not None
            leftovers.remove(self._run_as)

    _private_scratch = False
    """Whether the child had /tmp and /dev/shm of its own (bwrap); else what its own
    uid left in the host's is removed at close (sandbox/leftovers.py)."""


class Warden:
    """Our handle on the warden process (see sandbox/warden.py). Owned by the
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

    def _send(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
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
        with contextlib.suppress(OSError):
            self._pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)


def named_user(setting: str) -> ChildUser:
    """`sandbox.runAs` as a user name or uid. Raises KeyError when there is none."""
    pw = pwd.getpwuid(int(setting)) if setting.isdigit() else pwd.getpwnam(setting)
    return ChildUser(pw.pw_name, pw.pw_uid, pw.pw_gid)


def child_users_for(
    setting: str,
    sandbox_ids: list[str],
    plugin_dirs: list[Path],
    reach: list[Path] | None = None,
    *,
    own_uids: Callable[[list[str]], dict[str, ChildUser]] | None = None,
) -> tuple[dict[str, ChildUser], str]:
    """Decide who each sandbox's children run as, from `sandbox.runAs`.

    `supervisor`: as the supervisor. A user name or uid: all as that user, or an
    error. `auto` (the default): when the supervisor is root, each sandbox as its
    own unprivileged uid (from `own_uids`, the gateway's `sandbox.uids.SandboxUids`),
    provided such a uid can run the host runtime and read the plugins; else as the
    supervisor.

    Returns (sandbox id -> user; empty for "as the supervisor", and a sentence for
    the operator when it is not what was asked or hoped for; empty otherwise).
    """
    if setting == "supervisor":
        return {}, ""
    if os.geteuid() != 0:
        if setting == "auto":
            return {}, ""
        return {}, f"sandbox.runAs {setting!r} needs the supervisor to run as root"
    if setting == "auto":
        if own_uids is None:
            raise TypeError("child_users_for: a root supervisor's sandbox.runAs 'auto' needs own_uids")
        users = own_uids(sandbox_ids)
        who = "their own unprivileged uids"
    else:
        try:
            one = named_user(setting)
        except (KeyError, ValueError):
            return {}, f"sandbox.runAs: no user {setting!r} on this machine"
        users = {sid: one for sid in sandbox_ids}
        who = f"{one.name!r} (uid {one.uid})"
    if not users:
        return {}, ""
    problem = _probe_user(next(iter(users.values())), plugin_dirs, reach or [])
    if problem:
        return {}, f"children cannot run as {who}: {problem}"
    return users, ""


def _others_can_run(exe: Path) -> bool:
    """Whether a user who is neither owner nor in the group can reach and execute
    `exe`: o+x on every directory on the way, and on the file."""
    try:
        real = exe.resolve()
        for d in real.parents:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(real).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def _probe_user(user: ChildUser, plugin_dirs: list[Path], reach: list[Path]) -> str:
    """Run the host runtime's imports as `user`, list each plugin folder and reach
    (stat) each of `reach`: what a child will need. Empty when it works, else what
    failed. About 0.1 s, once per start."""
    # It drops privileges with the host's own code, as a host does, so that Popen can
    # vfork (see sandbox/host/__main__.py). It has to start as root to drop, so the
    # interpreter's reachability by other users is checked from the permission bits.
    if not _others_can_run(Path(sys.executable)):
        return f"Permission denied: {sys.executable}"
    code = (
        "import sys, os\n"
        "from sandbox.host.__main__ import _drop_privileges\n"
        f"_drop_privileges({user.uid}, {user.gid})\n"
        "import sandbox.host.server\n"
        "n = int(sys.argv[1])\n"
        "for p in sys.argv[2:2 + n]: os.listdir(p)\n"
        "for p in sys.argv[2 + n:]: os.stat(p)"
    )
    try:
        r = subprocess.run(
            [sys.executable, "-I", "-c", code, str(len(plugin_dirs)), *map(str, plugin_dirs), *map(str, reach)],
            cwd="/", env={"PATH": os.environ.get("PATH", "")},
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
    return ""


class ProcessLauncher:
    name = "process"

    def __init__(self, cgroups: CgroupRoot | None, warden: Warden | None = None) -> None:
        """`warden`: one shared by several launchers of a supervisor (its owner
        closes it); by default the launcher has its own."""
        self._cgroups = cgroups
        self._owns_warden = warden is None
        self._warden = warden or Warden()

    async def launch(self, spec: LaunchSpec) -> Child:
        socket_path = str(spec.run_dir / "host.sock")
        u = spec.run_as
        if u is not None:
            if not spec.operator_workspace:
                _give(spec.workspace, u)
            chown_dir(spec.run_dir, u.uid, u.gid)
        cgroup = None
        if self._cgroups is not None:
            cgroup = self._cgroups.child(
                spec.sandbox_id, max_processes=spec.limits.max_processes, memory_bytes=spec.limits.memory_bytes
            )
        gate_r, gate_w = os.pipe()
        argv = [
            # -I: the workspace is the cwd and is writable by the plugin; isolated
            # mode keeps it (and PYTHON* variables) off sys.path, so a plugin cannot
            # plant its own `sandbox` package for the next start.
            # -u: a plugin's print() reaches the log at once, and is not lost in a
            # buffer when the child crashes (-I ignores PYTHONUNBUFFERED).
            sys.executable, "-I", "-u", "-m", "sandbox.host",
            "--plugin-dir", str(spec.plugin_dir or ""),
            "--socket", socket_path,
            "--gate-fd", str(gate_r),
            "--parent-pid", str(self._host_parent_pid()),
        ]  # fmt: skip
        argv, cwd, env = self._wrap(spec, argv, cgroup)
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,
                pass_fds=(gate_r, *self._pass_fds),
                close_fds=True,
                # No user=/group= here: the child drops privileges itself (see
                # sandbox/host/__main__.py), so that Popen can vfork.
            )
        except BaseException:
            os.close(gate_w)
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            os.close(gate_r)
        # Not yet reaped, so the pid still names our child: pidfd_open is race-free.
        pidfd = os.pidfd_open(popen.pid)
        try:
            if cgroup is not None and self._attach_after_spawn:
                cgroup.attach(popen.pid)
            child_uid = spec.run_as.uid if spec.run_as is not None else os.geteuid()
            rlimits = _rlimits(spec, have_cgroup=cgroup is not None, child_uid=child_uid)
            _prlimit(popen.pid, rlimits, spec.sandbox_id)
            # Open the gate: only now may the child go on to load plugin code.
            run_as = (u.uid, u.gid) if u is not None else None
            os.write(gate_w, dataclasses.replace(spec.gate, rlimits=rlimits, run_as=run_as).encode())
        except BaseException:
            # Clean up without masking what went wrong.
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
            popen.returncode = -9
            os.close(pidfd)
            if cgroup is not None:
                cgroup.kill_all()
                cgroup.remove()
            said = popen.stderr.read(4096).decode(errors="replace").strip() if popen.stderr else ""
            for f in (popen.stdout, popen.stderr):
                if f is not None:
                    f.close()
            if said:
                raise OSError(f"the child died while starting: {said.splitlines()[-1]}")
            raise
        finally:
            os.close(gate_w)
        self._warden.watch(popen.pid, cgroup)
        child = self._child_class(popen, pidfd, socket_path, cgroup, self._warden, run_as=spec.run_as)
        os.set_blocking(child.stdout_fd, False)
        os.set_blocking(child.stderr_fd, False)
        return child

    # Hooks for backends that wrap the host command (sandbox/bwrap.py).
    _child_class: type[ProcessChild] = ProcessChild
    _attach_after_spawn = True
    _pass_fds: tuple[int, ...] = ()
    """Descriptors the wrapper needs besides the gate (bwrap: its mount sources)."""
    """Whether the cgroup is joined from outside once the child exists. Right for a
    lone child blocked on its gate; a wrapper that forks joins before it execs."""

    def _host_parent_pid(self) -> int:
        return os.getpid()

    def _wrap(self, spec: LaunchSpec, argv: list[str], cgroup: Cgroup | None) -> tuple[list[str], Path, dict[str, str]]:
        return argv, spec.workspace, spec.env

    def close(self) -> None:
        if self._owns_warden:
            self._warden.close()
        if self._cgroups is not None:
            self._cgroups.remove()


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
        _give_tree(top, "", frozenset({st.st_uid, os.geteuid(), user.uid}), user, kept, 0)
        os.fchown(top, user.uid, user.gid)
    finally:
        os.close(top)
    if kept:
        more = f"; and {len(kept) - 10} more" if len(kept) > 10 else ""
        logger.warning("{}: left to their owners, not given to uid {}: {}{}", workspace, user.uid, "; ".join(kept[:10]), more)


def _give_tree(dfd: int, rel: str, movable: frozenset[int], user: ChildUser, kept: list[str], depth: int) -> None:
    for name in os.listdir(dfd):
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
                    _give_tree(fd, path + "/", movable, user, kept, depth + 1)
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
