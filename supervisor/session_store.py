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
from pathlib import Path
from typing import Any

from loguru import logger

TAIL_SCAN = 1024 * 1024
"""How far from the end a torn line is looked for (a record is far smaller)."""


def file_name(key: str) -> str:
    """Readable and safe: the key percent-encoded; long keys end in a hash."""
    name = urllib.parse.quote(key, safe="")
    if len(name) > 150:
        name = name[:120] + "~" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return name + ".jsonl"


class SessionStore:
    def __init__(self, root: Path, *, fsync: str = "always", interval_s: float = 0.2) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.interval_s = interval_s
        self._fds: dict[str, int] = {}
        self._dirty: set[int] = set()

    def path(self, key: str) -> Path:
        return self.root / file_name(key)

    def _fd(self, key: str) -> int:
        fd = self._fds.get(key)
        if fd is None:
            path = self.path(key)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            _cut_torn_tail(fd, path)
            self._fds[key] = fd
        return fd

    async def append(self, key: str, record: dict[str, Any]) -> None:
        """Returns once the record is as durable as the policy asks."""
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        fd = self._fd(key)
        _write_all(fd, line)
        if self.fsync == "always":
            # Off the loop: a disk flush takes milliseconds, other sessions go on.
            await asyncio.to_thread(os.fsync, fd)
        elif self.fsync == "interval":
            self._dirty.add(fd)

    async def flush_periodically(self) -> None:
        """For `interval`: runs until cancelled (owned by the dispatcher's task group)."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Force what was written since the last flush to disk."""
        dirty, self._dirty = self._dirty, set()
        for fd in dirty:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(os.fsync, fd)

    def read(self, key: str) -> list[dict[str, Any]]:
        return read_session(self.path(key))

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.fsync(fd)
            os.close(fd)
        self._fds.clear()


def read_session(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            logger.warning("{}: line {} is not a whole record (a torn write?); skipped", path, n)
            continue
        out.append(rec)
    return out


def _cut_torn_tail(fd: int, path: Path) -> None:
    size = os.fstat(fd).st_size
    if size == 0:
        return
    start = max(0, size - TAIL_SCAN)
    tail = os.pread(fd, size - start, start)
    if tail.endswith(b"\n"):
        return
    cut = tail.rfind(b"\n")
    keep = start + cut + 1 if cut >= 0 else 0
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
