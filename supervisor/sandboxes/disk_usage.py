"""How much a sandbox's workspace holds, measured by the supervisor against its
limit (`maxWorkspaceMb`, `Limits.workspace_bytes`).

No backend bounds a bind-mounted folder by itself, so the supervisor measures: at
each heartbeat and after each tool or exec call (supervisor/sandboxes/watches.py), in a
worker thread, never on the event loop. Past the limit the sandbox is killed
(`disk limit: workspace over N MiB`), reported as a memory kill is.

What counts: each entry's allocated blocks (st_blocks, so a sparse file costs what
it really holds), each inode once however many names it has, and at least one
4 KiB block per entry, so that a million empty files (which exhaust inodes and make
each walk slow) are not free. Nothing is followed: no symlink, no other filesystem
mounted inside. The walk stops as soon as the count passes the limit, so a full
workspace costs no more to measure than one at its limit.

How far a fast writer gets past the limit: what it writes between two measurements,
about one heartbeat interval (2 s by default) plus the walk itself. RLIMIT_FSIZE
caps each single file, so one write cannot take the disk; a host's disk is
protected on the scale of seconds, not bytes, which is what the limit is for: a
runaway or hostile sandbox is stopped long before the disk is full.
tests/test_sandbox_walls.py fills a workspace past its limit on each backend.
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from clawsup.sandbox.launch.launcher import MiB

BLOCK = 4096
MAX_DEPTH = 128
"""Deeper than this counts as over the limit: no honest workspace nests that far, and
walking it would hold a descriptor per level."""
DUTY = 10.0
"""A walk that took t seconds is followed by the next no sooner than DUTY * t later,
so that measuring a huge workspace takes at most a tenth of a core."""


MIN_GAP_S = 0.25
"""And never sooner than this: a walk after every one of a thousand quick calls a
second would cost each call a thread hop (scripts/bench.py figure a)."""


class TooDeep(Exception):
    pass


class Unreadable(TooDeep):
    """A folder the supervisor may not read. Counted as over the limit: else a child
    could hide any amount behind a `chmod 000` (the supervisor is not always root)."""


class Aborted(Exception):
    """The walk's caller went away (its sandbox ended)."""


def measure(root: Path | str, stop_above: int, abort: threading.Event | None = None) -> int:
    """Bytes `root` holds, counted as the module says; once the count passes
    `stop_above` it returns at once (the value is then a lower bound). Raises TooDeep
    past MAX_DEPTH, OSError when `root` itself cannot be opened, Aborted soon after
    `abort` is set."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    dev = os.fstat(top).st_dev
    seen: set[int] = set()
    total = count = 0
    # The folders on the current path, each with its open listing: memory and
    # descriptors grow with the depth, never with the size of a folder.
    stack: list[tuple[int, Iterator[os.DirEntry[str]]]] = []
    try:
        stack.append((top, os.scandir(top)))
        top = -1
        while stack:
            fd, it = stack[-1]
            count += 1
            if abort is not None and count % 1024 == 0 and abort.is_set():
                raise Aborted
            entry = next(it, None)
            if entry is None:
                _close(stack.pop())
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            used = st.st_blocks * 512
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                if st.st_ino in seen:
                    used = 0
                seen.add(st.st_ino)
            total += max(used, BLOCK)
            if total > stop_above:
                return total
            if stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                if len(stack) >= MAX_DEPTH:
                    raise TooDeep(f"folders nested more than {MAX_DEPTH} levels deep")
                try:
                    sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except PermissionError:
                    raise Unreadable(f"folder {entry.name!r} cannot be read") from None
                except OSError:
                    continue  # replaced by a link or a file meanwhile: counted above
                try:
                    stack.append((sub, os.scandir(sub)))
                except PermissionError:
                    os.close(sub)
                    raise Unreadable(f"folder {entry.name!r} cannot be read") from None
                except OSError:
                    os.close(sub)
        return total
    finally:
        if top >= 0:
            os.close(top)
        for level in stack:
            _close(level)


def _close(level: tuple[int, Iterator[os.DirEntry[str]]]) -> None:
    fd, it = level
    it.close()  # type: ignore[attr-defined]
    os.close(fd)


class WorkspaceDisk:
    """The disk limit of one sandbox's workspace. Created with its DiskWatch
    and owned by it for the supervisor's life. One walk at a time; a check that
    arrives while one runs, or too soon after the last (DUTY), is skipped.

    `grow_only`: the workspace is an operator's own folder (`clawsup exec run
    --workspace`), which may already hold more than a sandbox's limit; then the limit
    is on what it holds beyond its size at the first measurement."""

    def __init__(self, path: Path, limit_bytes: int, *, grow_only: bool = False) -> None:
        self.path = path
        self.limit = limit_bytes
        self._grow_only = grow_only
        self._baseline: int | None = None if grow_only else 0
        self._busy = False
        self._not_before = 0.0

    def _walk(self, abort: threading.Event) -> str | None:
        start = time.monotonic()
        try:
            if self._baseline is None:
                self._baseline = measure(self.path, 1 << 62, abort)
                return None
            used = measure(self.path, self._baseline + self.limit, abort)
        except Unreadable as e:
            return f"disk limit: workspace {e}, so it cannot be measured"
        except TooDeep as e:
            return f"disk limit: workspace {e}, too deep to measure"
        except (OSError, Aborted):
            return None  # not there (yet), or no longer wanted
        finally:
            self._not_before = time.monotonic() + max(MIN_GAP_S, DUTY * (time.monotonic() - start))
        if used - self._baseline > self.limit:
            beyond = " beyond its size at start" if self._grow_only else ""
            return f"disk limit: workspace over {self.limit // MiB} MiB{beyond}"
        return None

    async def over(self) -> str | None:
        """The kill reason when the workspace holds more than its limit, else None."""
        if self._busy or time.monotonic() < self._not_before:
            return None
        self._busy = True
        abort = threading.Event()
        try:
            return await asyncio.to_thread(self._walk, abort)
        except asyncio.CancelledError:
            # The thread cannot be cancelled; told to stop, it does within 1024
            # entries, so that it holds nobody up (asyncio.run waits for it at exit).
            abort.set()
            raise
        finally:
            self._busy = False
