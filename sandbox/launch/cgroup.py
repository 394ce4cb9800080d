"""Per-sandbox cgroups: the kernel limit that holds for root too.

RLIMIT_NPROC does not bind root, and a killpg misses a grandchild that called
setsid(); a cgroup catches both. This machine mounts cgroup v1 with writable `pids`
and `memory` controllers; elsewhere it is v2. Both are supported:

    v1: <mount>/<controller>/<our cgroup>/clawsup-<supervisor pid>/<sandbox id>
    v2: <mount>/<our cgroup>/clawsup-<supervisor pid>/<sandbox id>

When neither is writable, `CgroupRoot.create` returns None, the supervisor logs a
warning once, and sandboxes fall back to rlimits alone.

A cgroup folder can be removed only once no process is in it, and a killed process
stays in it until the kernel has torn it down (its memory first: a sandbox that held
hundreds of MiB takes a while). An rmdir straight after the kill failed with EBUSY,
and the empty folder stayed (about 4 stops in 30). So `remove` kills, then waits for
the cgroup to empty, event-driven and bounded: on v2 on `cgroup.events` (the kernel
wakes a poller when `populated` changes), on v1, which has no such file, on a pidfd
of each process still listed (readable once that process has exited). Only then is
the folder removed. tests/test_launchers.py::test_stops_leave_no_cgroup_folder.

Everything here blocks (file writes, waits): supervisor code calls it through
`asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

MOUNT = Path("/sys/fs/cgroup")
KILL_ROUNDS = 50
EMPTY_WAIT_S = 5.0
"""The most `remove` waits for a killed cgroup's processes to be gone. Beyond it (a
process stuck in the kernel) the folder stays, said in the log; the next launch of
the same sandbox, or the next supervisor's stale sweep, takes it."""


def _own_paths() -> dict[str, str]:
    """controller name (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def _writable_dir(p: Path) -> bool:
    return p.is_dir() and os.access(p, os.W_OK)


@dataclass(frozen=True)
class Cgroup:
    """One sandbox's cgroup (one directory per v1 controller, one for v2)."""

    version: int
    dirs: tuple[Path, ...]

    @property
    def _memory_dir(self) -> Path | None:
        for d in self.dirs:
            if self.version == 2 or "memory" in d.parts:
                return d
        return None

    def attach(self, pid: int) -> None:
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except OSError as e:
                # A cgroup being removed meanwhile reads as gone (ENOENT) or, on v1,
                # as no device (ENODEV): either way it holds no process.
                if e.errno not in (errno.ENOENT, errno.ENODEV):
                    raise
        return sorted(out)

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup, including any that fork meanwhile.
        Does not wait for them to be gone (`wait_empty`, `remove`)."""
        if self.version == 2:
            kill = self.dirs[0] / "cgroup.kill"
            if kill.exists():
                with contextlib.suppress(OSError):
                    kill.write_text("1")
                    return
        # v1 has no cgroup.kill: kill what is there until nothing is. pids.max bounds
        # how many a fork bomb can make between two rounds, so this converges.
        for _ in range(KILL_ROUNDS):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def wait_empty(self, timeout: float = EMPTY_WAIT_S) -> bool:
        """Wait until no process is left in the cgroup (event-driven, at most
        `timeout` seconds). True when it is empty."""
        deadline = time.monotonic() + timeout
        if self.version == 2:
            return _wait_unpopulated(self.dirs[0] / "cgroup.events", deadline)
        return self._wait_members_gone(deadline)

    def _wait_members_gone(self, deadline: float) -> bool:
        while pids := self.pids():
            fds: dict[int, int] = {}
            try:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        fds[pid] = os.pidfd_open(pid)
                # A pid read above may have exited and been reused by a process
                # outside the cgroup before pidfd_open: only those still listed now
                # are waited for (anyone new is caught by the next round).
                still = set(self.pids())
                poll = select.poll()
                waiting = set()
                for pid, fd in fds.items():
                    if pid in still:
                        poll.register(fd, select.POLLIN)
                        waiting.add(fd)
                while waiting:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    for fd, _ in poll.poll(left * 1000):
                        poll.unregister(fd)
                        waiting.discard(fd)
            finally:
                for fd in fds.values():
                    os.close(fd)
            if time.monotonic() >= deadline:
                return not self.pids()
        return True

    def remove(self, timeout: float = EMPTY_WAIT_S) -> bool:
        """Kill what is left, wait for the cgroup to empty (bounded), then remove its
        folders. True when they are gone; else the reason is logged."""
        deadline = time.monotonic() + timeout
        for _ in range(KILL_ROUNDS):
            if not any(d.exists() for d in self.dirs):
                return True
            self.kill_all()
            emptied = self.wait_empty(max(0.0, deadline - time.monotonic()))
            busy = []
            for d in self.dirs:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        logger.warning("cannot remove the cgroup {}: {}", d, e.strerror)
                        return False
                    busy.append(d)
            if not busy:
                return True
            if not emptied or time.monotonic() >= deadline:
                logger.warning(
                    "cgroup {} still holds processes {:g} s after they were killed ({}); its folder stays until the sandbox's next start or the next supervisor's sweep",
                    busy[0], timeout, " ".join(map(str, self.pids())) or "none listed",
                )
                return False
            # Emptied, yet busy: a process joined between the wait and the rmdir.
        return False

    def memory_limit_hit(self) -> bool:
        d = self._memory_dir
        if d is None:
            return False
        try:
            if self.version == 2:
                for line in (d / "memory.events").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
                return False
            for line in (d / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
            return False
        except (OSError, ValueError):
            return False

    def pids_limit_hit(self) -> bool:
        for d in self.dirs:
            events = d / "pids.events"
            with contextlib.suppress(OSError, ValueError):
                for line in events.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "max" and int(value) > 0:
                        return True
        return False



def _wait_unpopulated(events: Path, deadline: float) -> bool:
    """v2: wait for `populated 0` in `cgroup.events`; the kernel wakes a poller of the
    file (POLLPRI) whenever it changes."""
    try:
        fd = os.open(events, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        poll = select.poll()
        poll.register(fd, select.POLLPRI)
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            for line in os.read(fd, 4096).decode().splitlines():
                key, _, value = line.partition(" ")
                if key == "populated" and value.strip() == "0":
                    return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poll.poll(left * 1000)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class CgroupRoot:
    """The `clawsup-<pid>` parent(s) for this supervisor's sandboxes."""

    version: int
    bases: dict[str, Path]
    """controller ("pids", "memory"; "" for v2) -> our parent directory."""

    @classmethod
    def create(cls) -> CgroupRoot | None:
        try:
            own = _own_paths()
        except OSError:
            return None
        name = f"clawsup-{os.getpid()}"
        v1: dict[str, Path] = {c: MOUNT / c / own[c].lstrip("/") for c in ("pids", "memory") if c in own}
        if len(v1) == 2 and all(_writable_dir(p) for p in v1.values()):
            bases = {c: p / name for c, p in v1.items()}
            for p in bases.values():
                p.mkdir(exist_ok=True)
            root = cls(1, bases)
            root.sweep_stale()
            return root
        if "" in own:
            return cls._create_v2(own[""], name)
        return None

    @classmethod
    def _create_v2(cls, own: str, name: str) -> CgroupRoot | None:
        for mount in (MOUNT, MOUNT / "unified"):
            parent = mount / own.lstrip("/")
            controllers = parent / "cgroup.controllers"
            if not controllers.exists():
                continue
            if not {"pids", "memory"} <= set(controllers.read_text().split()):
                continue
            base = parent / name
            try:
                base.mkdir(exist_ok=True)
                (base / "cgroup.subtree_control").write_text("+pids +memory")
            except OSError as e:
                logger.debug("cgroup v2 at {} not usable: {}", base, e)
                with contextlib.suppress(OSError):
                    base.rmdir()
                continue
            root = cls(2, {"": base})
            root.sweep_stale()
            return root
        return None

    def child(self, sandbox_id: str, *, max_processes: int, memory_bytes: int) -> Cgroup:
        dirs = []
        for controller, base in self.bases.items():
            d = base / sandbox_id
            if d.exists():
                # Left by an incarnation whose folder could not be removed: emptied
                # and removed now, or, if a process of it is stuck, taken again
                # with its limits written afresh below (it is ours).
                Cgroup(self.version, (d,)).remove()
            d.mkdir(exist_ok=True)
            dirs.append(d)
            if self.version == 2:
                (d / "pids.max").write_text(str(max_processes))
                (d / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
            elif controller == "pids":
                (d / "pids.max").write_text(str(max_processes))
            elif controller == "memory":
                (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (d / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        return Cgroup(self.version, tuple(dirs))

    def sweep_stale(self) -> None:
        """Kill and remove the cgroups of supervisors that died without cleaning up
        (SIGKILL, power loss): their sandboxes' descendants end here at the latest."""
        for base in self.bases.values():
            for sibling in base.parent.glob("clawsup-*"):
                try:
                    pid = int(sibling.name.split("-", 1)[1])
                except ValueError:
                    continue
                if pid == os.getpid() or _alive(pid):
                    continue
                for d in sibling.iterdir():
                    if d.is_dir():
                        Cgroup(self.version, (d,)).remove()
                with contextlib.suppress(OSError):
                    sibling.rmdir()
                logger.info("removed stale cgroup {} of a supervisor that is gone", sibling)

    def remove(self) -> None:
        """Remove our parent folders, and first any empty sandbox folder left in them.
        A sandbox whose processes still run is not touched (launchers sharing this
        root close one after the other): then the parent stays too."""
        for base in self.bases.values():
            with contextlib.suppress(OSError):
                for d in base.iterdir():
                    if d.is_dir() and not Cgroup(self.version, (d,)).pids():
                        with contextlib.suppress(OSError):
                            d.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
