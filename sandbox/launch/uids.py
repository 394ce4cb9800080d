"""Per-sandbox uids for a root supervisor: allocated from one record shared by every
clawsup supervisor on the machine, never derived from the sandbox's id.

A uid derived from the id (a hash) let a plugin pick an id whose uid was another
sandbox's, and gave the same id in two supervisors the same uid. Here a key, (state
directory, sandbox id), holds its uid in a JSON file under an exclusive flock:

* the same key gets the same uid at every start, so its workspace keeps its owner;
* no two keys hold one uid, whichever supervisor asked;
* a uid goes to a new key only when no process runs as it (real, effective or saved
  uid or gid), no user or group of the machine has it, and no /etc/subuid or
  /etc/subgid range covers it;
* new uids are handed out round the range from a cursor, so a freed uid comes back
  only after the whole range has been used once (leftover files of a dead key stay
  out of a new key's reach as long as possible).

A key is dropped by `release` (ephemeral sandboxes: subagent runs) or, by whoever
next allocates, once its state directory is gone, none of its processes lives, and
the process that last asked for it (its supervisor) is gone too.

The record's folder (default /var/lib/clawsup, 0700) and file (0600) must be ours
and not symlinks; anything else is refused with the reason. The file is replaced,
never written in place, so a crash leaves the old record or the new one, and readers
never see half of one. Supervisor-side code; tests/test_uids.py proves each promise.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import grp
import json
import os
import pwd
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from clawsup.sandbox.launch.launcher import ChildUser
from clawsup.supervisor.errors import ClawsupError

DEFAULT_REGISTRY = Path("/var/lib/clawsup/uids.json")
# Above systemd's container range (up to 1879048191) and below 2**31, which some
# tools mishandle.
DEFAULT_FIRST = 1_900_000_000
DEFAULT_COUNT = 1_000_000
FORMAT = 1
_LAST_VALID_UID = 2**32 - 2  # (uid_t)-1 means "no change" to setresuid


class UidRegistryError(ClawsupError):
    """The uid record cannot be used, or the range is full. For the operator."""

    code = "uid_registry"


@dataclass
class _Record:
    """The file's content while the lock is held."""

    holders: dict[tuple[str, str], int] = field(default_factory=dict)
    """(state directory, sandbox id) -> uid."""
    askers: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    """Who last asked for each key: a process (pid, start time), most likely its
    supervisor."""
    cursor: int | None = None
    """Where the search for the next new uid starts."""
    changed: bool = False


@dataclass(frozen=True)
class UidAllocator:
    """Hands out sandbox uids in [first, first + count) from the record at `registry`.

    Created by the gateway from `sandbox.uids` (one per supervisor; it holds no state
    of its own, the file is the state). Every call is one locked read of the record
    and, when something changed, one write."""

    registry: Path = DEFAULT_REGISTRY
    first: int = DEFAULT_FIRST
    count: int = DEFAULT_COUNT

    def __post_init__(self) -> None:
        object.__setattr__(self, "registry", Path(self.registry))
        if not self.registry.is_absolute():
            raise UidRegistryError(f"sandbox.uids.registry: {str(self.registry)!r} must be an absolute path")
        if self.first < 1 or self.count < 1 or self.first + self.count - 1 > _LAST_VALID_UID:
            raise UidRegistryError(
                f"sandbox.uids: first {self.first}, count {self.count} is not a range of uids: "
                f"first must be at least 1, count at least 1, and first + count - 1 at most {_LAST_VALID_UID}"
            )

    def allocate(self, state_dir: Path | str, sandbox_id: str) -> ChildUser:
        return self.allocate_many(state_dir, [sandbox_id])[sandbox_id]

    def allocate_many(self, state_dir: Path | str, sandbox_ids: Iterable[str]) -> dict[str, ChildUser]:
        """Each sandbox's uid (and a group of the same number): the one its key holds,
        else a new one. Raises UidRegistryError when the record cannot be used or no
        uid of the range is free."""
        state = _state_key(state_dir)
        ids = list(dict.fromkeys(sandbox_ids))
        me = _me()
        out: dict[str, int] = {}
        with self._locked() as rec:
            missing = []
            for sid in ids:
                uid = rec.holders.get((state, sid))
                if uid is not None and self._in_range(uid):
                    out[sid] = uid
                    if rec.askers.get((state, sid)) != me:
                        rec.askers[(state, sid)] = me
                        rec.changed = True
                else:
                    missing.append(sid)
            if missing:
                # Only now is the machine scanned: a restart with every key known
                # reads the record and nothing else.
                live = _live_ids()
                self._reclaim(rec, live)
                for sid in missing:
                    # A key left outside the range by a change of sandbox.uids moves
                    # into it; its workspace is handed to the new uid at launch.
                    rec.holders.pop((state, sid), None)
                    rec.askers.pop((state, sid), None)
                held = set(rec.holders.values())
                system = _SystemIds.read()
                for sid in missing:
                    uid = self._pick(rec, lambda u: u not in held and u not in live and not system.has(u))
                    held.add(uid)
                    rec.holders[(state, sid)] = uid
                    rec.askers[(state, sid)] = me
                    out[sid] = uid
                rec.changed = True
        return {sid: ChildUser(f"uid {uid}", uid, uid) for sid, uid in out.items()}

    def release(self, state_dir: Path | str, sandbox_id: str) -> None:
        """Forget a key (a discarded ephemeral sandbox). Its uid goes to a new key
        only once no process of it lives, and only after the cursor has come round."""
        state = _state_key(state_dir)
        with self._locked() as rec:
            if rec.holders.pop((state, sandbox_id), None) is not None:
                rec.askers.pop((state, sandbox_id), None)
                rec.changed = True

    def holders(self) -> dict[tuple[str, str], int]:
        """The whole record: (state directory, sandbox id) -> uid."""
        with self._locked() as rec:
            return dict(rec.holders)

    def _in_range(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count

    def _reclaim(self, rec: _Record, live: set[int]) -> None:
        # The state directory may only be out of our sight (a supervisor under
        # systemd's ProtectHome or PrivateTmp), so a key also stays while the process
        # that last asked for it lives: that supervisor still uses the uid.
        for key, uid in list(rec.holders.items()):
            if uid not in live and not os.path.isdir(key[0]) and not _alive(rec.askers.get(key)):
                del rec.holders[key]
                rec.askers.pop(key, None)

    def _pick(self, rec: _Record, free: Callable[[int], bool]) -> int:
        start = rec.cursor if rec.cursor is not None and self._in_range(rec.cursor) else self.first
        for i in range(self.count):
            uid = self.first + (start - self.first + i) % self.count
            if free(uid):
                rec.cursor = self.first + (uid - self.first + 1) % self.count
                return uid
        raise UidRegistryError(
            f"no free uid left in {self.first}..{self.first + self.count - 1}: {len(rec.holders)} are held "
            f"(recorded in {self.registry}), the rest belong to users, groups or live processes. "
            "Raise sandbox.uids.count, or remove state directories no longer used (their uids are reclaimed then)"
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[_Record]:
        folder = _open_folder(self.registry.parent)
        try:
            # The lock is on the folder, not the file: the file is replaced on every
            # write, and a lock on a replaced inode would guard nothing.
            fcntl.flock(folder, fcntl.LOCK_EX)
            rec = _read(folder, self.registry)
            yield rec
            if rec.changed:
                _write(folder, self.registry, rec)
        finally:
            os.close(folder)  # also lets go of the lock



class SandboxUids:
    """One supervisor's sandboxes' uids: a `UidAllocator` keyed by its state
    directory, each answer remembered (a key's uid does not change while it holds
    it). Created by the gateway when it starts, dies with it; `release` when an
    ephemeral sandbox is discarded."""

    def __init__(self, allocator: UidAllocator, state_dir: Path) -> None:
        self.allocator = allocator
        self.state_dir = state_dir
        self._known: dict[str, ChildUser] = {}

    def users(self, sandbox_ids: Iterable[str]) -> dict[str, ChildUser]:
        """In one visit to the record for those not yet known."""
        ids = list(dict.fromkeys(sandbox_ids))
        if missing := [sid for sid in ids if sid not in self._known]:
            self._known.update(self.allocator.allocate_many(self.state_dir, missing))
        return {sid: self._known[sid] for sid in ids}

    def user(self, sandbox_id: str) -> ChildUser:
        return self.users([sandbox_id])[sandbox_id]

    async def auser(self, sandbox_id: str) -> ChildUser:
        """`user` from the event loop: a first answer for a key takes the record's
        lock and may scan every process of the machine, so it runs in a worker
        thread; a remembered one is returned at once."""
        if (known := self._known.get(sandbox_id)) is not None:
            return known
        return await asyncio.to_thread(self.user, sandbox_id)

    async def arelease(self, sandbox_id: str) -> None:
        """`release` from the event loop (it takes the record's lock)."""
        await asyncio.to_thread(self.release, sandbox_id)

    def release(self, sandbox_id: str) -> None:
        self._known.pop(sandbox_id, None)
        self.allocator.release(self.state_dir, sandbox_id)


def _state_key(state_dir: Path | str) -> str:
    return str(Path(state_dir).resolve())


def _me() -> tuple[int, float]:
    return os.getpid(), round(psutil.Process().create_time(), 2)


def _alive(asker: tuple[int, float] | None) -> bool:
    if asker is None:
        return False
    try:
        return round(psutil.Process(asker[0]).create_time(), 2) == asker[1]
    except psutil.Error:
        return False


def _live_ids() -> set[int]:
    """Every uid and gid a process of the machine runs with (real, effective, saved)."""
    out: set[int] = set()
    for p in psutil.process_iter(["uids", "gids"]):
        for ids in (p.info["uids"], p.info["gids"]):
            if ids:
                out.update(ids)
    return out


@dataclass(frozen=True)
class _SystemIds:
    """Ids the machine already gives someone: users, groups, and the subordinate
    ranges of user namespaces (rootless containers run as those on the host)."""

    ids: frozenset[int]
    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def read(cls) -> _SystemIds:
        ids = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
        ranges = []
        for path in ("/etc/subuid", "/etc/subgid"):
            with contextlib.suppress(OSError):
                for line in Path(path).read_text().splitlines():
                    parts = line.strip().split(":")
                    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                        ranges.append((int(parts[1]), int(parts[1]) + int(parts[2])))
        return cls(frozenset(ids), tuple(ranges))

    def has(self, uid: int) -> bool:
        return uid in self.ids or any(lo <= uid < hi for lo, hi in self.ranges)


def _check_ours(st: os.stat_result, what: str, path: Path, fix: str) -> None:
    me = os.geteuid()
    if st.st_uid != me:
        raise UidRegistryError(f"the uid registry's {what} {path} belongs to uid {st.st_uid}, not to us (uid {me}); {fix}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise UidRegistryError(
            f"the uid registry's {what} {path} has mode {stat.S_IMODE(st.st_mode):o}: others could change who holds which uid; {fix}"
        )


def _open_folder(folder: Path) -> int:
    fix = "remove it, or point sandbox.uids.registry at a file in a folder of ours with mode 0700"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(folder.parent, 0o755, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UidRegistryError(f"the uid registry's folder {folder} is a symlink or not a directory; {fix}") from None
        raise UidRegistryError(f"cannot open the uid registry's folder {folder}: {e.strerror}") from None
    try:
        _check_ours(os.fstat(fd), "folder", folder, fix)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(folder: int, path: Path) -> _Record:
    fix = "move it aside (sandboxes then get new uids, and their workspaces are handed to them)"
    try:
        # Non-blocking: a FIFO planted here must not hang the supervisor.
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError:
        return _Record()
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UidRegistryError(f"the uid registry {path} is a symlink; {fix}") from None
        raise UidRegistryError(f"cannot open the uid registry {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UidRegistryError(f"the uid registry {path} is not a regular file; {fix}")
        _check_ours(st, "file", path, fix)
        raw = f.read()
    if not raw:
        return _Record()
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
        rec = _Record(cursor=doc["cursor"])
        if rec.cursor is not None and type(rec.cursor) is not int:
            raise ValueError("the cursor is not a number")
        for entry in doc["holders"]:
            key, uid, asker = (entry["state"], entry["id"]), entry["uid"], entry.get("asker")
            if not (isinstance(key[0], str) and isinstance(key[1], str) and type(uid) is int):
                raise ValueError(f"entry {entry!r} is not a state directory, a sandbox id and a uid")
            if key in rec.holders:
                raise ValueError(f"sandbox {key[1]!r} of {key[0]} is recorded twice")
            rec.holders[key] = uid
            if isinstance(asker, list) and len(asker) == 2 and type(asker[0]) is int and isinstance(asker[1], (int, float)):
                rec.askers[key] = (asker[0], float(asker[1]))
        if len(set(rec.holders.values())) != len(rec.holders):
            raise ValueError("a uid is recorded for two sandboxes")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UidRegistryError(f"the uid registry {path} is not one clawsup wrote ({e}); {fix}") from None
    return rec


def _write(folder: int, path: Path, rec: _Record) -> None:
    # One holder a line: the file stays readable (and diffable) by an operator.
    holders = "".join(
        f"\n  {json.dumps({'state': k[0], 'id': k[1], 'uid': u, 'asker': rec.askers.get(k)})}," for k, u in sorted(rec.holders.items())
    )
    text = f'{{"format": {FORMAT}, "cursor": {json.dumps(rec.cursor)}, "holders": [{holders.rstrip(",")}\n]}}\n'
    tmp = path.name + ".tmp"
    # Left by a writer that died mid-way; we hold the lock, so it is nobody's now.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=folder)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode())
        f.flush()
        os.fsync(fd)
    os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
