"""Durable sessions: one append-only JSONL file per session key.

Every record is written (one `write` of one whole line, `O_APPEND`) before the message
is acknowledged, so a killed supervisor loses nothing it acknowledged: the bytes are
in the kernel. The `fsync` policy decides what survives a power cut as well:
`always` forces each record to disk before the acknowledgement, `interval` forces
every `fsyncIntervalMs`, `never` leaves it to the kernel.

A crash can tear the last line of a file (a write cut short). That tail is found when
the file is next opened for writing: it is logged, kept beside the file as
`<name>.torn-<time>`, and cut off, so the next record starts on a line of its own.
Readers skip any line that is not a whole JSON object, with a warning; neither is
ever fatal.

Open files are bounded: at most `sessionStore.maxOpenFiles` are kept open, and the
least recently used is closed (forced to disk first if it has unforced writes) when
another must open; a file with a write under way is never closed under it. Opening
(and the torn-tail check) runs in a worker thread, never on the event loop.

Created by the gateway; one writer (the event loop) per store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
import urllib.parse
from collections import OrderedDict
from pathlib import Path
from typing import Any

from loguru import logger

from clawsup.sandbox.launch.launcher import cleanup_in_thread, outlast
from clawsup.supervisor.config import FsyncMode

TAIL_SCAN = 1024 * 1024
"""How far from the end a torn line is looked for (a record is far smaller)."""
MAX_OPEN_FILES = 64
"""The default of `sessionStore.maxOpenFiles`."""


def file_name(key: str) -> str:
    """Readable and safe: the key percent-encoded; long keys end in a hash."""
    name = urllib.parse.quote(key, safe="")
    if len(name) > 150:
        name = name[:120] + "~" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return name + ".jsonl"


class SessionStore:
    def __init__(self, root: Path, *, fsync: FsyncMode = "always", interval_s: float = 0.2, max_open: int = MAX_OPEN_FILES) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.interval_s = interval_s
        self.max_open = max_open
        self._fds: OrderedDict[str, int] = OrderedDict()
        """Open files by session key, least recently used first."""
        self._opening: dict[str, asyncio.Future[int]] = {}
        """Opens under way (in a thread): a second writer of the key waits for it."""
        self._pins: dict[str, int] = {}
        """Keys with a write or a flush under way: their file is not closed."""
        self._dirty: set[str] = set()
        """Keys written since their last fsync (`interval`)."""

    def path(self, key: str) -> Path:
        return self.root / file_name(key)

    def open_files(self) -> int:
        return len(self._fds)

    async def append(self, key: str, record: dict[str, Any]) -> None:
        """Returns once the record is as durable as the policy asks."""
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        fd = await self._acquire(key)
        try:
            _write_all(fd, line)
            if self.fsync == "always":
                # Off the loop: a disk flush takes milliseconds, other sessions go on.
                await _fsync(fd)
            elif self.fsync == "interval":
                self._dirty.add(key)
        finally:
            self._unpin(key)
        if len(self._fds) > self.max_open:
            await self._close_least_used()

    async def _acquire(self, key: str) -> int:
        """The key's open file, pinned (the caller unpins it)."""
        self._pins[key] = self._pins.get(key, 0) + 1
        try:
            fd = self._fds.get(key)
            if fd is not None:
                self._fds.move_to_end(key)
                return fd
            opening = self._opening.get(key)
            if opening is None:
                opening = self._opening[key] = asyncio.ensure_future(asyncio.to_thread(_open_for_append, self.path(key)))
                # Registered in a callback, not after the await: a writer cancelled
                # while the thread runs must not lose (leak) the descriptor.
                opening.add_done_callback(lambda f: self._opened(key, f))
            # Shielded: cancelling one waiting writer must not cancel the open.
            return await asyncio.shield(opening)
        except BaseException:
            self._unpin(key)
            raise

    def _opened(self, key: str, f: asyncio.Future[int]) -> None:
        del self._opening[key]
        if not f.cancelled() and f.exception() is None:
            self._fds[key] = f.result()

    def _unpin(self, key: str) -> None:
        n = self._pins[key] - 1
        if n:
            self._pins[key] = n
        else:
            del self._pins[key]

    async def _close_least_used(self) -> None:
        """Close files from the least recently used end until the cap holds again,
        skipping any with a write under way."""
        while len(self._fds) > self.max_open:
            # Chosen afresh each time: the awaits below let other writers in.
            key = next((k for k in self._fds if k not in self._pins), None)
            if key is None:
                return  # every open file is being written; the next append tries again
            fd = self._fds.pop(key)
            if key in self._dirty:
                self._dirty.discard(key)
                await asyncio.to_thread(_fsync_close, fd)
            else:
                os.close(fd)

    async def flush_periodically(self) -> None:
        """For `interval`: runs until cancelled (owned by the session lanes' task group)."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Force what was written since the last flush to disk."""
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            fd = self._fds.get(key)
            if fd is None:
                continue  # closed since, and forced to disk then
            self._pins[key] = self._pins.get(key, 0) + 1
            try:
                with contextlib.suppress(OSError):
                    await _fsync(fd)
            finally:
                self._unpin(key)

    def read(self, key: str) -> list[dict[str, Any]]:
        """The whole session (blocking: call it from a worker thread)."""
        return read_session(self.path(key))

    def read_tail(self, key: str, max_bytes: int) -> list[dict[str, Any]]:
        """The session's whole records within its last `max_bytes` (blocking: call it
        from a worker thread)."""
        return read_session(self.path(key), max_bytes)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.fsync(fd)
            os.close(fd)
        self._fds.clear()
        self._dirty.clear()

    async def aclose(self) -> None:
        """`close`, in a thread: at shutdown it forces up to `max_open` files to disk."""
        await cleanup_in_thread(self.close)


async def _fsync(fd: int) -> None:
    """`os.fsync` in a thread, waited for to its end even if the caller is cancelled
    (a /stop during the write): the caller's pin on the file must outlive the thread
    using its descriptor, or the file could be closed, and its number reused, under
    it. The cancellation is raised afterwards."""
    fut = asyncio.get_running_loop().run_in_executor(None, os.fsync, fd)
    if await outlast(fut):
        raise asyncio.CancelledError()
    fut.result()


def read_session(path: Path, max_bytes: int | None = None) -> list[dict[str, Any]]:
    """Every whole record of the file, or of its last `max_bytes`. A line that is not a
    whole JSON object (a torn write) is skipped with a warning."""
    try:
        with open(path, "rb") as f:
            start = 0
            if max_bytes is not None:
                start = max(0, os.fstat(f.fileno()).st_size - max_bytes)
                # From the byte before: a start on a record's first byte keeps it.
                f.seek(max(0, start - 1))
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the record the start cut into (or nothing)
    out = []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            where = f"line {n}" if start == 0 else f"a line near the end (byte {start}+)"
            logger.warning("{}: {} is not a whole record (a torn write?); skipped", path, where)
            continue
        out.append(rec)
    return out


def _open_for_append(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        _cut_torn_tail(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fsync_close(fd: int) -> None:
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _cut_torn_tail(fd: int, path: Path) -> None:
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    # Back from the end a piece at a time until the last whole line's newline: a
    # torn record may be longer than one piece (a tool result of megabytes), and
    # the whole records before it are the session's history.
    keep = 0
    end = size
    while end > 0:
        start = max(0, end - TAIL_SCAN)
        cut = os.pread(fd, end - start, start).rfind(b"\n")
        if cut >= 0:
            keep = start + cut + 1
            break
        end = start
    torn = os.pread(fd, size - keep, keep)
    aside = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%dT%H%M%S')}")
    aside.write_bytes(torn)
    os.ftruncate(fd, keep)
    os.fsync(fd)
    logger.warning("{}: its last line was torn ({} bytes, a crash mid-write?); kept in {} and cut off", path, len(torn), aside.name)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
