"""A child's stdout and stderr, read line by line into its sandbox log, and the
handshake line picked out of stdout.

One `ChildOutput` per incarnation, created when the child is launched and closed
when it has been reaped. Reading is driven by the event loop's readers (no task, no
polling) and bounded twice per wake-up: one 64 KiB chunk, and at most
`LINES_PER_WAKE` lines made. A 64 KiB read of empty lines is 65,536 lines, and
making them all in one callback held the loop for half a second
(tests/test_hostile_bounds.py); past the bound, the rest of the chunk waits in the
splitter, the pipe is left unread (the child's writes wait, as they would for any
slow reader), and the next slice runs on the loop's next turn.
"""

from __future__ import annotations

import asyncio
import os

from clawsup.sandbox.handshake import LOAD_ERROR_MAGIC, MAGIC, Handshake, HandshakeError, LoadError, parse_handshake, parse_load_error
from clawsup.supervisor.sandboxes.log import LineSplitter, SandboxLog, Stream, timestamp

READ_CHUNK = 64 * 1024
# After the exit, at most this many chunks per pipe are read to save the last words.
DRAIN_CHUNKS = 64
# The last stderr lines of a flood kept for a crash report, though not logged.
TAIL_KEPT = 5
# Lines made per wake-up: about 5 ms of the loop each (a line is escaped, written,
# and offered to every follower). Far above the budget's rate over a second.
LINES_PER_WAKE = 1024


class ChildOutput:
    def __init__(self, stdout_fd: int, stderr_fd: int, log: SandboxLog) -> None:
        self._log = log
        self._pipes: dict[int, tuple[Stream, LineSplitter]] = {
            stdout_fd: ("stdout", LineSplitter()),
            stderr_fd: ("stderr", LineSplitter()),
        }
        self.handshake: asyncio.Future[Handshake] = asyncio.get_running_loop().create_future()
        self.load_error: LoadError | None = None
        """What the host said, before any handshake, when the plugin could not load
        (sandbox/handshake.py): believed only together with its exit code."""

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in self._pipes:
            loop.add_reader(fd, self._read, fd, 1)

    def drain(self) -> None:
        """After the exit: take what is still in the pipes (the traceback, the last
        words), bounded, so that the log says why."""
        for fd in tuple(self._pipes):
            self._read(fd, DRAIN_CHUNKS, lines=None)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in tuple(self._pipes):
            loop.remove_reader(fd)
        self._pipes.clear()
        self._log.flush()

    def _read(self, fd: int, chunks: int, lines: int | None = LINES_PER_WAKE) -> None:
        """Up to `chunks` reads of `fd`, making at most `lines` lines (None: no
        bound, for the drain after the exit, which the budget bounds)."""
        stream, splitter = self._pipes[fd]
        made = 0
        # Lines read together arrived together: one stamp for all of them.
        stamp = timestamp()
        data = b""  # first, what the last wake-up left in the splitter
        for turn in range(chunks + 1):
            for line, cut in splitter.feed(data):
                self._line(stream, line, cut, stamp)
                made += 1
                if lines is not None and made >= lines:
                    break
            if lines is not None and made >= lines and splitter.has_line():
                self._pause(fd)
                break
            if turn == chunks:
                break
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                asyncio.get_running_loop().remove_reader(fd)
                del self._pipes[fd]
                for line, cut in splitter.flush():
                    self._line(stream, line, cut, stamp)
                break
            if (stream == "stderr" or self.handshake.done()) and self._log.spent():
                # This second's budget is spent: the lines of a flood are counted,
                # not made one by one (a flood once cost the supervisor a
                # millisecond and more of the loop per 64 KiB read). The splitter
                # holds no whole line here: those were made above.
                self._log.drop(stream, *splitter.skip(data, TAIL_KEPT if stream == "stderr" else 0))
                data = b""
        self._log.flush()

    def _pause(self, fd: int) -> None:
        """Lines are left over: stop reading until they are made, on the loop's next
        turn, so other callbacks run in between."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(fd)
        loop.call_soon(self._resume, fd)

    def _resume(self, fd: int) -> None:
        if fd not in self._pipes:
            return  # closed meanwhile
        asyncio.get_running_loop().add_reader(fd, self._read, fd, 1)
        self._read(fd, 0)

    def _line(self, stream: Stream, line: str, cut: bool, stamp: str) -> None:
        if stream == "stdout" and not self.handshake.done():
            if self.load_error is None and LOAD_ERROR_MAGIC in line and (err := parse_load_error(line[line.find(LOAD_ERROR_MAGIC):])) is not None:
                self.load_error = err
                self._log.write("clawsup", f"{'could not start' if err.retry else 'the plugin could not load'}: {err.message}{f' (at {err.where})' if err.where else ''}")
                return
            # A plugin may print without a newline before the host's handshake, which
            # then lands mid-line: look for it anywhere in the line.
            at = line.find(MAGIC + "|")
            if at >= 0:
                if at > 0:
                    self._log.write(stream, line[:at])
                # A host that says it serves has loaded: an earlier load-error line
                # was the plugin's own words (tests/test_hostile_bounds.py).
                self.load_error = None
                try:
                    self.handshake.set_result(parse_handshake(line[at:]))
                except HandshakeError as e:
                    self.handshake.set_exception(e)
                self._log.write("clawsup", f"handshake: {line[at:]}")
                return
        self._log.write(stream, line, cut=cut, at=stamp)
