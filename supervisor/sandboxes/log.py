"""One sandbox's log: the child's stdout and stderr and its lifecycle events, a line
at a time with a timestamp, in `<state>/logs/<sandbox-id>.log`, rotated by size.

Created by the manager with the sandbox; lives as long as the supervisor (the log
outlives each incarnation of the child, which is the point). Memory stays bounded
however the child writes: lines are cut at `max_line` bytes, and lines past the
sandbox's byte budget are counted and dropped rather than queued. The count is
written when the budget's second is over, by a timer, even if the child never writes
again; each incarnation starts with a fresh budget.

Followers (`clawsup logs -f`) get every line as it is written, each through its own
bounded `Follower`: the log never waits for one. A follower that falls behind gets,
in place of the lines it missed, one `Skipped` count (tests/test_log_follow.py).

Every line is written through `printable` (supervisor/printable.py): what the child
wrote can neither start a line of its own nor reach the terminal of whoever reads the
log. Escaping makes a cut line at most six times `max_line` characters.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Literal

from loguru import logger

from clawsup.supervisor.printable import printable

Stream = Literal["stdout", "stderr", "clawsup", "plugin"]
"""Who wrote a line: the child's stdout or stderr, the supervisor (`clawsup`), or the
plugin through its `log` request (supervisor/sandboxes/child_requests.py)."""
MAX_LINE = 16 * 1024
LINE_COST = 36
"""What a line costs beyond its text: its timestamp, stream tag and newline. Charged
to the budget, so that a flood of empty lines is held to it too."""
ROTATE_BYTES = 5 * 1024 * 1024
KEEP_ROTATED = 3
# Disk budget per sandbox. A flood beyond it is dropped with a note, so that one child
# cannot make the supervisor spend its loop writing its output.
BUDGET_BYTES_PER_S = 2 * 1024 * 1024
TAIL_LINES = 20
# What one follower may have waiting, in characters: about half a second of output at
# the full budget. One read of the child's pipe (64 KiB) is a thousand short lines, so
# a bound in lines that small was overrun before the follower ever ran.
FOLLOWER_CHARS = 1024 * 1024


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

    def has_line(self) -> bool:
        """Whether `feed(b"")` would make a line now."""
        return self._buf.find(b"\n", 0, self._max + 1) >= 0 or len(self._buf) >= self._max

    def skip(self, data: bytes, keep_last: int = 0) -> tuple[int, list[str]]:
        """Consume `data` as `feed` would, without making its lines: (how many lines
        it ended, the last `keep_last` of them). For a flood past the budget."""
        last_nl = data.rfind(b"\n")
        n = 0
        kept: list[str] = []
        if last_nl >= 0:
            n = data.count(b"\n")
            if keep_last:
                kept = [x.decode("utf-8", "replace").rstrip("\r")[: self._max] for x in data[:last_nl].rsplit(b"\n", keep_last)[-keep_last:]]
            self._buf = bytearray(data[last_nl + 1 :])
        else:
            self._buf += data
        while len(self._buf) >= self._max:  # a run with no newline comes in pieces
            del self._buf[: self._max]
            n += 1
        return n, kept

    def flush(self) -> Iterator[tuple[str, bool]]:
        if self._buf:
            line = bytes(self._buf)
            self._buf.clear()
            yield line.decode("utf-8", "replace"), False


def timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Skipped:
    """Stands, in a follower's stream, for `count` lines it did not get because it
    fell behind. They are in the log file."""

    count: int


class Follower:
    """One reader of a log as it is written: the lines it has not taken yet, at most
    `max_chars` of them. Made by `SandboxLog.follow()` for a `logs -f` request, which
    owns it and ends it with `unfollow`.

    The log hands it each line and never waits (`offer`): a line that does not fit
    is counted instead. The count goes into the stream where those lines were, as
    one `Skipped`, once a line fits again or the reader has taken all before it. So
    every line written while it follows reaches the reader, or is counted in the
    `Skipped` that stands where it was."""

    def __init__(self, max_chars: int = FOLLOWER_CHARS) -> None:
        self._items: deque[str | Skipped] = deque()
        self._chars = 0
        self._skipped = 0
        self._max = max_chars
        self._ready = asyncio.Event()
        self.ended = False
        """The log was closed (its sandbox discarded): nothing more will come."""

    def offer(self, line: str) -> None:
        self._ready.set()
        if self._chars + len(line) > self._max:
            self._skipped += 1
            return
        if self._skipped:
            self._items.append(Skipped(self._skipped))
            self._skipped = 0
        self._items.append(line)
        self._chars += len(line)

    def end(self) -> None:
        self.ended = True
        self._ready.set()

    async def take(self, max_chars: int) -> list[str | Skipped]:
        """What is waiting, oldest first, about `max_chars` of it; waits for a line.
        Empty only once the log has ended and everything was taken."""
        while not self._items and not self._skipped:
            if self.ended:
                return []
            self._ready.clear()
            await self._ready.wait()
        batch: list[str | Skipped] = []
        taken = 0
        while self._items and taken < max_chars:
            item = self._items.popleft()
            if isinstance(item, str):
                self._chars -= len(item)
                taken += len(item)
            batch.append(item)
        if not self._items and self._skipped:
            batch.append(Skipped(self._skipped))
            self._skipped = 0
        return batch


class SandboxLog:
    def __init__(self, path: Path, *, rotate_bytes: int = ROTATE_BYTES, budget_bytes_per_s: int = BUDGET_BYTES_PER_S) -> None:
        self.path = path
        self._rotate_bytes = rotate_bytes
        self._budget = budget_bytes_per_s
        path.parent.mkdir(parents=True, exist_ok=True)
        # Bytes, not text: `_size` must be the file's length, which a follower's
        # snapshot (`open_written`) relies on.
        self._f = open(path, "ab", buffering=64 * 1024)
        self._size = self._f.tell()
        self._window_start = time.monotonic()
        self._window_bytes = 0
        self._dropped = 0
        self._window_timer: asyncio.TimerHandle | None = None
        self._stderr_tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._followers: set[Follower] = set()

    def write(self, stream: Stream, text: str, *, cut: bool = False, at: str | None = None) -> None:
        """Append one line. `stream` is stdout, stderr or clawsup (our own events,
        which are never dropped). `text` is escaped here, whoever wrote it: our own
        events quote the child too (tool names, refusal reasons). `at` is the
        line's `timestamp()`, when the caller stamps many lines at once."""
        if stream == "stderr":
            self._stderr_tail.append(text)
        # Lines past the budget are dropped before they are escaped: in a flood that
        # is nearly all of them (tests/test_faults.py::test_output_flood...). The
        # raw length decides; what escaping adds is charged after.
        if stream != "clawsup" and not self._within_budget(len(text) + LINE_COST):
            return
        shown = printable(text)
        if stream != "clawsup":
            self._window_bytes += len(shown) - len(text)
        self._emit(f"{at or timestamp()} [{stream}] {shown}{' ⏎…' if cut else ''}\n")

    @property
    def stderr_tail(self) -> list[str]:
        """The child's last stderr lines, escaped."""
        return [printable(line) for line in self._stderr_tail]

    def event(self, text: str) -> None:
        """Our own line about this sandbox: never dropped, on disk at once."""
        self.write("clawsup", text)
        self.flush()

    def new_incarnation(self) -> None:
        """A new child starts: it gets the whole budget. What the last one flooded
        must not cost it its first lines (a long line right after a flood and a
        restart was dropped whole). Called as each incarnation starts
        (SupervisedSandbox._run_incarnation)."""
        self._end_window(time.monotonic())
        self.flush()

    def spent(self) -> bool:
        """Whether this second's budget is used up (a flood): the next lines would
        be dropped anyway."""
        return self._window_bytes >= self._budget and time.monotonic() - self._window_start < 1.0

    def drop(self, stream: Stream, lines: int, last: list[str]) -> None:
        """`lines` lines of `stream` dropped unread past the budget (see `spent`);
        `last`, the last of them, still go to the stderr tail for a crash report."""
        if stream == "stderr":
            self._stderr_tail.extend(last)
        if lines and not self._dropped:
            self._arm_window_timer(time.monotonic())
        self._dropped += lines

    def _within_budget(self, n: int) -> bool:
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            self._end_window(now)
        if self._window_bytes + n > self._budget:
            if not self._dropped:
                self._arm_window_timer(now)
            self._dropped += 1
            self._window_bytes = self._budget  # spent: the rest of this second is dropped
            return False
        self._window_bytes += n
        return True

    def _arm_window_timer(self, now: float) -> None:
        """The first line dropped in a window sets a timer for the window's end,
        which writes the count: a flood that stops has its count written within a
        second, with no further line to carry it, and an idle log has no timer."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a unit test): the count comes with the next line, or at close
        self._window_timer = loop.call_later(self._window_start + 1.0 - now, self._window_over)

    def _window_over(self) -> None:
        self._window_timer = None
        self._end_window(time.monotonic())
        self.flush()

    def _end_window(self, now: float) -> None:
        if self._window_timer is not None:
            self._window_timer.cancel()
            self._window_timer = None
        if self._dropped:
            dropped, self._dropped = self._dropped, 0
            self._emit(f"{timestamp()} [clawsup] dropped {dropped} line(s): output over {self._budget // 1024} KiB/s\n")
        self._window_start = now
        self._window_bytes = 0

    def _emit(self, line: str) -> None:
        if self._f.closed:
            # A discarded sandbox's log, written by the last of its clean-up: the
            # line goes to the supervisor's own log instead of failing that clean-up.
            logger.info("{}: {}", self.path.stem, line.rstrip("\n"))
            return
        data = line.encode()
        self._f.write(data)
        self._size += len(data)
        for follower in self._followers:
            follower.offer(line)
        if self._size >= self._rotate_bytes:
            self._rotate()

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def _rotate(self) -> None:
        self._f.close()
        for i in range(KEEP_ROTATED - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._f = open(self.path, "ab", buffering=64 * 1024)
        self._size = 0

    def open_written(self) -> tuple[BinaryIO, int]:
        """The file as written so far: a handle of our own on it and its length.
        Read in another thread, it stays what it was now: a rotation renames the
        file (the handle follows it), and lines written later lie past the length.
        Taken in the same step as `follow()`, the two meet without a gap or a line
        twice."""
        self.flush()
        # Through our own descriptor: the very file we write, even if its name was
        # moved or removed under us.
        return open(f"/proc/self/fd/{self._f.fileno()}", "rb"), self._size

    def follow(self, max_chars: int = FOLLOWER_CHARS) -> Follower:
        follower = Follower(max_chars)
        self._followers.add(follower)
        return follower

    def unfollow(self, follower: Follower) -> None:
        self._followers.discard(follower)

    def close(self) -> None:
        """The count of a flood still in its second is written, not lost."""
        self._end_window(time.monotonic())
        self._f.close()
        # A `logs -f` of a discarded sandbox ends, rather than wait on a log that will
        # never be written again.
        for follower in self._followers:
            follower.end()
        self._followers.clear()


def tail_lines(path: Path, n: int) -> list[str]:
    """The last `n` lines of a log file, reading from the end (logs can be large)."""
    if n <= 0 or not path.exists():
        return []
    with open(path, "rb") as f:
        return read_tail(f, n, f.seek(0, 2))


def read_tail(f: BinaryIO, n: int, end: int) -> list[str]:
    """The last `n` lines of what an open log holds before offset `end`. Blocking:
    the supervisor calls it through asyncio.to_thread."""
    if n <= 0:
        return []
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
