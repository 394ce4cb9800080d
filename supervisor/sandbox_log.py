"""One sandbox's log: the child's stdout and stderr and its lifecycle events, a line
at a time with a timestamp, in `<state>/logs/<sandbox-id>.log`, rotated by size.

Created by the manager with the sandbox; lives as long as the supervisor (the log
outlives each incarnation of the child, which is the point). Memory stays bounded
however the child writes: lines are cut at `max_line` bytes, and lines past the
sandbox's byte budget are counted and dropped rather than queued.

Every line is written through `printable` (supervisor/printable.py): what the child
wrote can neither start a line of its own nor reach the terminal of whoever reads the
log. Escaping makes a cut line at most six times `max_line` characters.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from supervisor.printable import printable

MAX_LINE = 16 * 1024
ROTATE_BYTES = 5 * 1024 * 1024
KEEP_ROTATED = 3
# Disk budget per sandbox. A flood beyond it is dropped with a note, so that one child
# cannot make the supervisor spend its loop writing its output.
BUDGET_BYTES_PER_S = 2 * 1024 * 1024
TAIL_LINES = 20
SUBSCRIBER_QUEUE = 1000


class LineSplitter:
    """Turns a byte stream into lines of at most `max_line` bytes. A longer run
    without a newline comes out in pieces, the first ones marked as cut."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buf = bytearray()
        self._max = max_line

    def feed(self, data: bytes) -> Iterator[tuple[str, bool]]:
        """Yields (line, cut) pairs; `cut` means the line continues in the next one."""
        self._buf += data
        while True:
            nl = self._buf.find(b"\n", 0, self._max + 1)
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                yield line.decode("utf-8", "replace").rstrip("\r"), False
            elif len(self._buf) >= self._max:
                line = bytes(self._buf[: self._max])
                del self._buf[: self._max]
                yield line.decode("utf-8", "replace"), True
            else:
                return

    def flush(self) -> Iterator[tuple[str, bool]]:
        if self._buf:
            line = bytes(self._buf)
            self._buf.clear()
            yield line.decode("utf-8", "replace"), False


def timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class SandboxLog:
    def __init__(self, path: Path, *, rotate_bytes: int = ROTATE_BYTES, budget_bytes_per_s: int = BUDGET_BYTES_PER_S) -> None:
        self.path = path
        self._rotate_bytes = rotate_bytes
        self._budget = budget_bytes_per_s
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8", buffering=64 * 1024)
        self._size = self._f.tell()
        self._window_start = time.monotonic()
        self._window_bytes = 0
        self._dropped = 0
        self._stderr_tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._subscribers: set[asyncio.Queue[str]] = set()

    def write(self, stream: str, text: str, *, cut: bool = False) -> None:
        """Append one line. `stream` is stdout, stderr or clawsup (our own events,
        which are never dropped). `text` is escaped here, whoever wrote it: our own
        events quote the child too (tool names, refusal reasons)."""
        if stream == "stderr":
            self._stderr_tail.append(text)
        # Lines past the budget are dropped before they are escaped: in a flood that
        # is nearly all of them (tests/test_faults.py::test_output_flood...). The
        # raw length decides; what escaping adds is charged after.
        if stream != "clawsup" and not self._within_budget(len(text)):
            return
        shown = printable(text)
        if stream != "clawsup":
            self._window_bytes += len(shown) - len(text)
        self._emit(f"{timestamp()} [{stream}] {shown}{' ⏎…' if cut else ''}\n")

    @property
    def stderr_tail(self) -> list[str]:
        """The child's last stderr lines, escaped."""
        return [printable(line) for line in self._stderr_tail]

    def event(self, text: str) -> None:
        """Our own line about this sandbox: never dropped, on disk at once."""
        self.write("clawsup", text)
        self.flush()

    def _within_budget(self, n: int) -> bool:
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            if self._dropped:
                dropped, self._dropped = self._dropped, 0
                self._emit(f"{timestamp()} [clawsup] dropped {dropped} line(s): output over {self._budget // 1024} KiB/s\n")
            self._window_start = now
            self._window_bytes = 0
        if self._window_bytes + n > self._budget:
            self._dropped += 1
            return False
        self._window_bytes += n
        return True

    def _emit(self, line: str) -> None:
        self._f.write(line)
        self._size += len(line)
        for q in tuple(self._subscribers):
            try:
                q.put_nowait(line)
            except asyncio.QueueFull:
                pass  # a slow follower misses lines; it never slows the child or us
        if self._size >= self._rotate_bytes:
            self._rotate()

    def flush(self) -> None:
        self._f.flush()

    def _rotate(self) -> None:
        self._f.close()
        for i in range(KEEP_ROTATED - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._f = open(self.path, "a", encoding="utf-8", buffering=64 * 1024)
        self._size = 0

    def subscribe(self) -> asyncio.Queue[str]:
        q: asyncio.Queue[str] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[str]) -> None:
        self._subscribers.discard(q)

    def close(self) -> None:
        self._f.close()


def tail_lines(path: Path, n: int) -> list[str]:
    """The last `n` lines of a log file, reading from the end (logs can be large)."""
    if n <= 0 or not path.exists():
        return []
    with open(path, "rb") as f:
        f.seek(0, 2)
        end = f.tell()
        block = 64 * 1024
        data = b""
        pos = end
        while pos > 0 and data.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    # On "\n" alone, as the log was written: splitlines() would also break on the
    # separators a child may have left in a file written before escaping.
    lines = data.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[-n:]
