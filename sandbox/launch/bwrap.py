"""The `bwrap` backend: the process backend's child, started inside bubblewrap.

What the child gets: pid, ipc, uts and cgroup namespaces, and a network namespace
unless it asked for the network; a root of its own in which the system directories
(/usr and its links) and the host runtime are read-only, the workspace is bound
read-write at /workspace with its protected paths read-only over it, /proc is fresh
(it shows the sandbox's own processes only) and /dev is minimal; a cleared
environment plus the allowlist; `--new-session` (no TIOCSTI into our terminal) and
`--die-with-parent`. bwrap itself sets no_new_privs, so no setuid binary works
inside.

The host runtime is exactly what `python -I -m clawsup.sandbox.host` imports, read-only at
its own paths (`runtime_paths`): the interpreter (its bin folder, libpython, a
venv's pyvenv.cfg), the standard library and site-packages, and of clawsup only the
two packages the host imports, `sandbox` and `clawsup` (the wire protocol). For an
editable install those two live in the project checkout; only they are bound, never
the checkout, the operator's home or the state directory (whose sandbox folders,
the workspace and the socket folder, are the only parts bound).
tests/test_sandbox_walls.py puts sentinels in the checkout and the home. An MCP
server's install (LaunchSpec.visible_paths: its venv, interpreter, node_modules) is
bound the same way, read-only at its own paths.

/tmp and /dev/shm are the sandbox's own: size-limited tmpfs (`Limits.tmp_bytes`
each; see `_tmpfs_takes_size` for an older bwrap), mode 1777 so that the child's own
uid can write them, gone when the sandbox ends.

Who it runs as. As an ordinary user, bwrap also takes a user namespace and the child
runs as that user, without capabilities. As root, a user namespace would map the
child back onto root, so instead bwrap keeps only CAP_SETUID/CAP_SETGID and the
child drops to its own unprivileged uid (sandbox/host/__main__.py) before it loads
anything, which leaves it no capability at all and a uid that owns nothing outside
its workspace. (Unlike the process backend, this works when the interpreter lives
under a 0700 home: inside, the runtime is bound at its paths with open parents.)

Protected paths (sandbox/protected.py) are mounted from descriptors (`--ro-bind-fd`)
that were opened without following any symlink, so no name the child planted can
redirect a mount.

Everything else (start gate, cgroup, rlimits, warden, pidfd, death diagnosis) is the
process backend's. bwrap forks, so the cgroup is joined by a shell that then execs
bwrap, rather than from outside after the fact.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import ClassVar

import psutil

from clawsup.sandbox.launch.cgroup import Cgroup, CgroupRoot
from clawsup.sandbox import protected
from clawsup.sandbox.launch.launcher import Backend, ExitStatus, LaunchSpec
from clawsup.sandbox.launch.process import ProcessChild, ProcessLauncher, Warden, descendants

WORKSPACE = "/workspace"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs in the sandbox need from /etc: the dynamic linker's cache, the
# alternatives links that /usr/bin points into, user and group names, time zone,
# and (for a sandbox that has the network) name resolution and CA certificates.
ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
    "localtime", "hosts", "resolv.conf", "host.conf", "gai.conf", "ssl", "ca-certificates", "mime.types",
)  # fmt: skip


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def bwrap_problem() -> str:
    """Empty when bwrap can build a sandbox here, else why not (not installed, or
    namespaces refused, as in some containers)."""
    exe = bwrap_path()
    if exe is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    args = [exe, "--unshare-pid", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    if os.geteuid() != 0:
        args.insert(1, "--unshare-user")
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap cannot run: {e}"
    if r.returncode != 0:
        return f"bwrap cannot create namespaces here: {(r.stderr.strip().splitlines() or ['exit code %d' % r.returncode])[-1]}"
    return ""


class BwrapChild(ProcessChild):
    """The pid we hold is bwrap's; the host is its grandchild, in its own session
    inside the sandbox (--new-session)."""

    _private_scratch = True

    async def signal_group(self, sig: int) -> None:
        # A polite signal must reach the host, as under the process backend: sent
        # to bwrap, it would kill the sandbox outright. SIGKILL may take bwrap, and
        # with it (--die-with-parent) everything inside.
        host = None if sig == signal.SIGKILL else self._host_pid()
        if host is None:
            self._signal_group(sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(host), sig)

    def _host_pid(self) -> int | None:
        """The host among bwrap's descendants (a few /proc reads, not a scan)."""
        if self.exited:
            return None
        for pid in descendants(self.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"clawsup.sandbox.host" in f.read().split(b"\0"):
                        return pid
            except OSError:
                continue
        return None

    def _translate(self, status: ExitStatus) -> ExitStatus:
        # bwrap reports a child killed by signal N as exit code 128 + N.
        if status.code is not None and 128 < status.code < 128 + 65:
            return ExitStatus(signal=status.code - 128, reason=status.reason)
        return status

    def rss_bytes(self) -> int | None:
        if self.exited:
            return None
        total = 0
        for pid in [self.pid, *descendants(self.pid)]:
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
        return total or None


class BwrapLauncher(ProcessLauncher):
    name: ClassVar[Backend] = "bwrap"
    _child_class = BwrapChild
    _attach_after_spawn = False

    def __init__(self, cgroups: CgroupRoot | None, warden: Warden | None = None) -> None:
        exe = bwrap_path()
        if exe is None:
            raise RuntimeError(bwrap_problem())
        self._bwrap = exe
        super().__init__(cgroups, warden)

    def _mounts(self, spec: LaunchSpec) -> protected.Mounts:
        # The protected paths are walked in the launch's prepare step, while no child
        # of this sandbox runs, and their descriptors handed to this launch's bwrap.
        return protected.resolve(spec.workspace, spec.protected_paths)

    def _host_parent_pid(self) -> int:
        # Inside the new pid namespace our parent is bwrap's init, pid 1.
        return 1

    def _wrap(self, spec: LaunchSpec, argv: list[str], cgroup: Cgroup | None, mounts: protected.Mounts) -> tuple[list[str], Path, dict[str, str]]:
        b = [self._bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not spec.network:
            b.append("--unshare-net")
        if os.geteuid() == 0:
            # See the module docstring: no user namespace as root; the child drops to
            # its own uid with these two and then has no capability left.
            b += ["--cap-drop", "ALL"]
            if spec.run_as is not None:
                b += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            b.append("--unshare-user")
        b += ["--hostname", "clawsup-sandbox"]
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                b += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                b += ["--ro-bind", d, d]
        for name in ETC_FILES:
            b += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        # /tmp first: a bind below it (a state directory under /tmp) must land on
        # the private /tmp, not be hidden by it. 1777: the child drops to its own uid
        # after bwrap made them (as root), and must still write there.
        b += ["--proc", "/proc", "--dev", "/dev", *_scratch("/tmp", spec.limits.tmp_bytes), *_scratch("/dev/shm", spec.limits.tmp_bytes)]
        binds = [("--ro-bind", d) for d in runtime_paths()]
        if spec.plugin_dir is not None and not _inside(str(spec.plugin_dir), [*SYSTEM_DIRS, *runtime_paths()]):
            # (A plugin under /usr or in site-packages is already there, read-only.)
            binds.append(("--ro-bind", str(spec.plugin_dir)))
        binds += [("--ro-bind", path) for path in visible_binds(spec, [*SYSTEM_DIRS, *runtime_paths()], own=["/proc", "/dev", WORKSPACE])]
        binds.append(("--bind", str(spec.run_dir)))
        # bwrap would copy the modes of the outside parents (a 0700 home, a 0700
        # state directory); inside, the parents only lead the way, so open them.
        made: set[str] = set()
        for _, path in binds:
            for parent in reversed(Path(path).parents[:-1]):
                if str(parent) not in made and str(parent) not in SYSTEM_DIRS:
                    made.add(str(parent))
                    b += ["--perms", "0755", "--dir", str(parent)]
        for flag, path in binds:
            b += [flag, path, path]
        b += ["--bind", str(spec.workspace), WORKSPACE]
        # Over it, the protected paths read-only and their folders pinned (see
        # sandbox/protected.py), from the descriptors `_mounts` opened; bwrap closes
        # them before the child runs.
        for m in mounts.items:
            b += ["--bind-fd" if m.writable else "--ro-bind-fd", str(m.fd), f"{WORKSPACE}/{m.rel}"]
        b += [
            # Not --chdir: as root, bwrap has no capability left to enter the
            # workspace, which is the child's own (0700); the child enters it.
            "--chdir", "/",
            "--clearenv",
        ]  # fmt: skip
        env = {**spec.env, "HOME": WORKSPACE, "TMPDIR": "/tmp"}
        for k, v in env.items():
            b += ["--setenv", k, v]
        b += ["--", *argv, "--workdir", WORKSPACE]
        if cgroup is not None:
            # Join the cgroup, then become bwrap: everything bwrap forks is inside.
            procs = [str(d / "cgroup.procs") for d in cgroup.dirs]
            b = ["/bin/sh", "-c", 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 71; shift; done; shift; exec "$@"', "sh", *procs, "--", *b]
        return b, Path("/"), {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _scratch(path: str, size: int) -> list[str]:
    """A private tmpfs at `path`, mode 1777, of `size` bytes where this bwrap can say so."""
    if _tmpfs_takes_size():
        return ["--perms", "01777", "--size", str(size), "--tmpfs", path]
    return ["--tmpfs", path, "--chmod", "01777", path]


@functools.cache
def _tmpfs_takes_size() -> bool:
    """bubblewrap 0.7 added `--size` (and `--perms` for a tmpfs). An older one (Ubuntu
    22.04 ships 0.6) gets an unsized tmpfs, which the sandbox's memory limit still
    bounds: tmpfs pages count as the writer's memory in its cgroup."""
    exe = bwrap_path()
    try:
        return exe is not None and "--size" in subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False


def visible_binds(spec: LaunchSpec, shown: list[str], *, own: list[str]) -> list[str]:
    """The spec's `visible_paths` (an MCP server's install) to bind read-only at their
    own paths: not those the sandbox shows already (`shown`: the system folders, the
    host runtime), not those on or under the launcher's own mounts (`own`), and never
    one that holds the workspace or the socket folder (the plan never asks for one:
    supervisor/sandboxes/mcp_install.py keeps the state directory out)."""
    mine = [str(spec.workspace), str(spec.run_dir)]
    out = []
    for path in spec.visible_paths:
        if not os.path.isabs(path) or _inside(path, [*shown, *own]) or any(_inside(m, [path]) for m in mine):
            continue
        out.append(path)
    return out


def _inside(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


@functools.cache
def runtime_paths() -> tuple[str, ...]:
    """What `python -I -m clawsup.sandbox.host` needs outside /usr, as real paths: the folder
    of the interpreter, libpython (a shared build), a venv's pyvenv.cfg, the standard
    library and site-packages, and the `sandbox` and `clawsup` packages wherever
    they are installed (a project checkout, for an editable install: those two
    folders only). Each is bound read-only at its own path, so that the host starts
    exactly as under the process backend. clawsup.sandbox.host imports nothing else of
    clawsup: tests/test_boundaries.py and tests/test_sandbox_walls.py check it."""
    import clawsup
    import clawsup.sandbox as sandbox

    exe = Path(sys.executable)
    candidates = [exe.parent, exe.resolve().parent, Path(sys.prefix, "pyvenv.cfg")]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        candidates.append(Path(str(sysconfig.get_config_var("LIBDIR")), str(sysconfig.get_config_var("INSTSONAME"))))
    for scheme_path in ("stdlib", "platstdlib", "purelib", "platlib"):
        candidates.append(Path(sysconfig.get_paths()[scheme_path]))
    candidates += [Path(sandbox.__file__).parent, Path(clawsup.__file__).parent]
    out: list[str] = []
    for real in sorted({os.path.realpath(c) for c in candidates}, key=len):
        if os.path.exists(real) and not _inside(real, ["/usr", *out]):
            out.append(real)
    return tuple(out)
