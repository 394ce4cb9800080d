"""The `bwrap` backend: the process backend's child, started inside bubblewrap.

What the child gets: pid, ipc, uts and cgroup namespaces, and a network namespace
unless it asked for the network; a root of its own in which the system directories
(/usr and its links) and the Python runtime are read-only, the workspace is bound
read-write at /workspace, /tmp is private, /proc is fresh (it shows the sandbox's own
processes only) and /dev is minimal; a cleared environment plus the allowlist;
`--new-session` (no TIOCSTI into our terminal) and `--die-with-parent`.

Who it runs as. As an ordinary user, bwrap also takes a user namespace and the child
runs as that user, without capabilities. As root, a user namespace would map the
child back onto root, so instead bwrap keeps only CAP_SETUID/CAP_SETGID and the
child drops to its own unprivileged uid (sandbox/host/__main__.py) before it loads
anything, which leaves it no capability at all and a uid that owns nothing outside
its workspace. (Unlike the process backend, this works when the interpreter lives
under a 0700 home: inside, the interpreter is bound at its path with open parents.)

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
from pathlib import Path

import psutil

from sandbox.cgroup import Cgroup, CgroupRoot
from sandbox.launcher import ExitStatus, LaunchSpec
from sandbox.process import ProcessChild, ProcessLauncher, Warden

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

    def signal_group(self, sig: int) -> None:
        # A polite signal must reach the host, as under the process backend: sent
        # to bwrap, it would kill the sandbox outright. SIGKILL may take bwrap, and
        # with it (--die-with-parent) everything inside.
        host = None if sig == signal.SIGKILL else self._host_pid()
        if host is None:
            super().signal_group(sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(host), sig)

    def _host_pid(self) -> int | None:
        try:
            for p in psutil.Process(self.pid).children(recursive=True):
                if "sandbox.host" in p.cmdline():
                    return p.pid
        except psutil.Error:
            pass
        return None

    def _translate(self, status: ExitStatus) -> ExitStatus:
        # bwrap reports a child killed by signal N as exit code 128 + N.
        if status.code is not None and 128 < status.code < 128 + 65:
            return ExitStatus(signal=status.code - 128, reason=status.reason)
        return status

    def rss_bytes(self) -> int | None:
        if self.exited:
            return None
        try:
            top = psutil.Process(self.pid)
            return sum(p.memory_info().rss for p in [top, *top.children(recursive=True)])
        except psutil.Error:
            return None


class BwrapLauncher(ProcessLauncher):
    name = "bwrap"
    _child_class = BwrapChild
    _attach_after_spawn = False

    def __init__(self, cgroups: CgroupRoot | None, warden: Warden | None = None) -> None:
        exe = bwrap_path()
        if exe is None:
            raise RuntimeError(bwrap_problem())
        self._bwrap = exe
        super().__init__(cgroups, warden)

    def _host_parent_pid(self) -> int:
        # Inside the new pid namespace our parent is bwrap's init, pid 1.
        return 1

    def _wrap(self, spec: LaunchSpec, argv: list[str], cgroup: Cgroup | None) -> tuple[list[str], Path, dict[str, str]]:
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
        # the private /tmp, not be hidden by it.
        b += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        binds = [("--ro-bind", d) for d in runtime_dirs()]
        if spec.plugin_dir is not None and not _inside(str(spec.plugin_dir), [*SYSTEM_DIRS, *runtime_dirs()]):
            # (A plugin under /usr or in the clawsup tree is already there, read-only.)
            binds.append(("--ro-bind", str(spec.plugin_dir)))
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
        b += [
            "--bind", str(spec.workspace), WORKSPACE,
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


def _inside(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


@functools.cache
def runtime_dirs() -> tuple[str, ...]:
    """Where the host runtime's code lives outside /usr: the interpreter's prefixes
    and the clawsup source tree (an editable install). Bound read-only at the same
    paths, so that the host starts exactly as under the process backend."""
    import sandbox

    candidates = {sys.base_prefix, sys.prefix, sys.exec_prefix, str(Path(sandbox.__file__).resolve().parent.parent)}
    try:
        import clawsup.v1

        candidates.add(str(Path(clawsup.v1.__file__).resolve().parent.parent.parent))
    except ImportError:
        pass
    out: list[str] = []
    for c in sorted(candidates, key=len):
        real = os.path.realpath(c)
        if not os.path.isdir(real) or _inside(real, ["/usr", *out]):
            continue
        out.append(real)
    return tuple(out)
