from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from clawsup.supervisor.sandboxes.child_output import ChildOutput
from clawsup.supervisor.sandboxes.log import LINE_COST, LineSplitter, SandboxLog, Skipped, read_tail, tail_lines


def test_splitter_cuts_long_lines_and_keeps_memory_bounded() -> None:
    sp = LineSplitter(max_line=10)
    out = list(sp.feed(b"x" * 25))
    assert out == [("x" * 10, True), ("x" * 10, True)]
    assert list(sp.feed(b"yy\nz")) == [("xxxxxyy", False)]
    assert list(sp.flush()) == [("z", False)]


def test_splitter_handles_split_utf8_and_crlf() -> None:
    sp = LineSplitter()
    data = "héllo\r\n".encode()
    assert list(sp.feed(data[:2])) == []
    assert list(sp.feed(data[2:])) == [("héllo", False)]


def test_log_rotates_by_size(tmp_path: Path) -> None:
    log = SandboxLog(tmp_path / "p.log", rotate_bytes=1000, budget_bytes_per_s=10**9)
    for i in range(200):
        log.write("stdout", f"line {i:04d} " + "." * 40)
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["p.log", "p.log.1", "p.log.2", "p.log.3"]
    assert all(p.stat().st_size < 1100 for p in tmp_path.iterdir())
    assert "line 0199" in (tmp_path / "p.log").read_text()


def test_flood_over_budget_is_dropped_and_counted(tmp_path: Path) -> None:
    # A line costs its text and what the log adds to it (LINE_COST).
    log = SandboxLog(tmp_path / "p.log", budget_bytes_per_s=10 * (100 + LINE_COST))
    for _ in range(100):
        log.write("stdout", "y" * 100)
    log.event("clawsup events are never dropped")
    log.close()
    text = (tmp_path / "p.log").read_text()
    assert text.count("y" * 100) == 10
    assert "clawsup events are never dropped" in text
    # With no loop for a timer, the count is written at close at the latest.
    assert text.rstrip("\n").endswith("[clawsup] dropped 90 line(s): output over 1 KiB/s")


def test_a_flood_of_empty_lines_is_held_to_the_budget(tmp_path: Path) -> None:
    """An empty line has no text, but its timestamp and tag are written all the same:
    it is charged for them, or a flood of newlines would pass any budget."""
    log = SandboxLog(tmp_path / "p.log", budget_bytes_per_s=10 * LINE_COST)
    for _ in range(10_000):
        log.write("stdout", "")
    log.close()
    lines = (tmp_path / "p.log").read_text().splitlines()
    assert len(lines) == 11 and lines[-1].endswith("dropped 9990 line(s): output over 0 KiB/s")


def test_a_flood_past_the_budget_is_counted_without_being_split(tmp_path: Path) -> None:
    """Once a second's budget is spent, a read's lines are counted in bulk (no line
    made one by one), the same count the line-by-line path gives, and the stderr
    tail still holds the last lines for a crash report."""
    log = SandboxLog(tmp_path / "p.log", budget_bytes_per_s=10 * (5 + LINE_COST))
    splitter = LineSplitter()
    for line, cut in splitter.feed(b"".join(b"line%d\n" % i for i in range(10))):
        log.write("stderr", line, cut=cut)
    assert log.spent()
    log.drop("stderr", *splitter.skip(b"".join(b"more%04d\n" % i for i in range(5000)) + b"partial", 5))
    assert log.stderr_tail[-5:] == ["more4995", "more4996", "more4997", "more4998", "more4999"]
    for line, cut in splitter.flush():
        assert line == "partial"
    log.close()
    assert (tmp_path / "p.log").read_text().rstrip("\n").endswith("dropped 5000 line(s): output over 0 KiB/s")


def test_stderr_tail_keeps_last_lines(tmp_path: Path) -> None:
    log = SandboxLog(tmp_path / "p.log")
    for i in range(50):
        log.write("stderr", f"e{i}")
    assert list(log.stderr_tail)[-1] == "e49" and len(log.stderr_tail) == 20


def test_tail_lines_reads_from_the_end(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_text("".join(f"{i}\n" for i in range(100_000)))
    assert tail_lines(p, 3) == ["99997", "99998", "99999"]
    assert tail_lines(tmp_path / "missing.log", 3) == []


def test_every_line_is_written_escaped_and_starts_with_a_timestamp(tmp_path: Path) -> None:
    log = SandboxLog(tmp_path / "p.log")
    log.write("stdout", "a\rb\x1b[2J\u2028c\td")
    log.write("stderr", "lone \ud800 surrogate")
    log.event("tool 'x\x1b]0;t\x07' refused")
    log.close()
    raw = (tmp_path / "p.log").read_bytes().decode()
    lines = raw.split("\n")[:-1]
    assert len(lines) == 3 and all(re.match(r"\d{4}-\d\d-\d\dT[\d:.]{12}Z \[", line) for line in lines)
    assert lines[0].endswith("[stdout] a\\rb\\x1b[2J\\u2028c\td")
    assert lines[1].endswith("[stderr] lone \\ud800 surrogate")
    assert lines[2].endswith("[clawsup] tool 'x\\x1b]0;t\\x07' refused")
    # What goes on into errors and the supervisor's log is the escaped text too.
    assert list(log.stderr_tail) == ["lone \\ud800 surrogate"]


def test_an_escaped_cut_line_stays_bounded(tmp_path: Path) -> None:
    log = SandboxLog(tmp_path / "p.log", budget_bytes_per_s=10**9)
    splitter = LineSplitter(max_line=1000)
    for line, cut in splitter.feed(b"\x1b" * 5000):
        log.write("stdout", line, cut=cut)
    log.close()
    lines = (tmp_path / "p.log").read_bytes().decode().split("\n")[:-1]
    assert len(lines) == 5 and all(len(line) < 60 + 4 * 1000 for line in lines)


def test_tail_lines_splits_on_newlines_only(tmp_path: Path) -> None:
    # A log written before escaping may hold separators that splitlines() breaks on.
    p = tmp_path / "old.log"
    p.write_bytes("one\rforged\u2028x\x0cy\n two\n".encode())
    assert tail_lines(p, 5) == ["one\rforged\u2028x\x0cy", " two"]


def test_a_plugin_log_message_keeps_its_lines_tagged_and_the_rest_escaped(tmp_path: Path) -> None:
    from clawsup.supervisor.sandboxes.child_requests import Requester, _log

    log = SandboxLog(tmp_path / "p.log")
    who = Requester(sandbox_id="p", plugin_id="p", log=log)
    _log(who, {"level": "warning", "message": "first\r2030-01-01T00:00:00.000Z [clawsup] ready\nsecond\r\n"})
    log.close()
    lines = (tmp_path / "p.log").read_bytes().decode().split("\n")[:-1]
    assert [line.split(" ", 1)[1] for line in lines] == [
        "[plugin] WARNING first\\r2030-01-01T00:00:00.000Z [clawsup] ready",
        "[plugin] WARNING second",
    ]


async def test_a_follower_that_falls_behind_gets_each_line_or_a_count_in_its_place(tmp_path: Path) -> None:
    log = SandboxLog(tmp_path / "p.log", budget_bytes_per_s=10**9)
    follower = log.follow(max_chars=20_000)
    got: list[str | Skipped] = []
    async with asyncio.timeout(10):
        for i in range(20_000):
            log.write("stdout", f"line {i:05d}")
            if i % 2000 == 1999:  # the reader takes a little now and then, never enough
                got += await follower.take(5_000)
        while sum(1 if isinstance(item, str) else item.count for item in got) < 20_000:
            got += await follower.take(5_000)
        log.write("stdout", "and one more")
        got += await follower.take(5_000)
    log.close()
    written = (tmp_path / "p.log").read_text().splitlines(keepends=True)
    assert len(written) == 20_001
    # Walk the file with what the follower got: each line is there in its place, or
    # counted by the Skipped that stands where it was.
    at = 0
    for item in got:
        if isinstance(item, str):
            assert item == written[at]
            at += 1
        else:
            assert item.count > 0
            at += item.count
    assert at == len(written)
    skips = [item for item in got if isinstance(item, Skipped)]
    assert len(skips) >= 5, "it fell behind, several times"
    assert got[-1].endswith(" [stdout] and one more\n"), "having caught up, it gets the live lines"


async def test_a_floods_count_is_written_when_its_second_is_over_with_no_line_after_it(tmp_path: Path) -> None:
    log = SandboxLog(tmp_path / "p.log", budget_bytes_per_s=10 * (100 + LINE_COST))
    for _ in range(100):
        log.write("stdout", "y" * 100)
    flood_end = time.time()
    follower = log.follow()
    async with asyncio.timeout(3):
        [note] = await follower.take(10**6)
    log.close()
    assert note.endswith(" [clawsup] dropped 90 line(s): output over 1 KiB/s\n")
    assert datetime.fromisoformat(note.split(" ")[0].replace("Z", "+00:00")).timestamp() - flood_end < 1.2
    # On disk once written: a reader of the file need not wait for the next line.
    assert (tmp_path / "p.log").read_text().endswith(note)


async def test_a_new_incarnation_gets_the_whole_budget(tmp_path: Path) -> None:
    """Two real children, one after the other, through the same log as the
    supervisor reads them and starts them (SupervisedSandbox._run_incarnation calls
    new_incarnation): the first floods past the budget and exits, the second prints
    one long line at once, still inside the first one's second."""
    log = SandboxLog(tmp_path / "p.log", budget_bytes_per_s=256 * 1024)
    started = time.monotonic()
    for code in ("import os\nfor _ in range(64): os.write(1, (b'f' * 99 + b'\\n') * 160)", "print('long ' + 'L' * 12000 + ' end')"):
        log.new_incarnation()
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert child.stdout is not None and child.stderr is not None
        for f in (child.stdout, child.stderr):
            os.set_blocking(f.fileno(), False)
        output = ChildOutput(child.stdout.fileno(), child.stderr.fileno(), log)
        output.start()
        await asyncio.to_thread(child.wait)
        output.drain()
        output.close()
        child.stdout.close()
        child.stderr.close()
    assert time.monotonic() - started < 1.0, "both children ran within one second of budget, or this proves nothing"
    log.close()
    text = (tmp_path / "p.log").read_text()
    assert "dropped" in text, "the first child went past the budget"
    assert re.search(r"\[stdout\] long L{12000} end\n$", text), text[-300:]


def test_what_was_written_is_read_as_of_then_across_a_rotation(tmp_path: Path) -> None:
    log = SandboxLog(tmp_path / "p.log", rotate_bytes=4000, budget_bytes_per_s=10**9)
    for i in range(20):
        log.write("stdout", f"before {i}")
    written, end = log.open_written()
    for i in range(200):  # rotates the file away several times
        log.write("stdout", f"after {i} " + "." * 40)
    log.close()
    assert not (tmp_path / "p.log").read_text().count("before")
    with written:
        tail = read_tail(written, 3, end)
    assert [line.split(" ", 2)[2] for line in tail] == ["before 17", "before 18", "before 19"]


async def test_closing_a_log_ends_its_followers_after_what_they_had(tmp_path: Path) -> None:
    """A discarded sandbox's log closes: a `logs -f` of it gets what was written, then
    an end, instead of waiting for lines that will never come."""
    log = SandboxLog(tmp_path / "s.log")
    follower = log.follow()
    log.event("last words")
    log.close()
    first = await asyncio.wait_for(follower.take(1 << 20), 1)
    assert len(first) == 1 and isinstance(first[0], str) and "last words" in first[0]
    assert await asyncio.wait_for(follower.take(1 << 20), 1) == []


async def test_a_burst_of_short_lines_is_made_a_slice_at_a_time(tmp_path: Path) -> None:
    """A real child writes 20,000 short lines at once (more than the pipe holds).
    A 64 KiB read of them is some 12,000 lines; made in one callback, a read of empty
    lines held the loop for half a second. Each turn of the loop makes at most
    LINES_PER_WAKE of them, other callbacks run between the slices, and every line
    reaches the log, in order."""
    from clawsup.supervisor.sandboxes.child_output import LINES_PER_WAKE

    loop = asyncio.get_running_loop()
    turn = 0
    per_turn: dict[int, int] = {}
    written: list[str] = []
    n = 20_000
    all_in = asyncio.Event()

    class CountingLog(SandboxLog):
        def write(self, stream: Any, text: str, *, cut: bool = False, at: str | None = None) -> None:
            if stream == "stderr":
                per_turn[turn] = per_turn.get(turn, 0) + 1
                written.append(text)
                if len(written) == n:
                    all_in.set()
            super().write(stream, text, cut=cut, at=at)

    def tick() -> None:
        nonlocal turn
        turn += 1
        if not all_in.is_set():
            loop.call_soon(tick)

    log = CountingLog(tmp_path / "p.log", budget_bytes_per_s=10**9)
    code = f"import os\nos.write(2, ''.join(f'{{i}}\\n' for i in range({n})).encode())"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    for f in (child.stdout, child.stderr):
        os.set_blocking(f.fileno(), False)
    output = ChildOutput(child.stdout.fileno(), child.stderr.fileno(), log)
    tick()
    output.start()
    try:
        await asyncio.wait_for(all_in.wait(), 30)
    finally:
        await asyncio.to_thread(child.wait)
        output.close()
        child.stdout.close()
        child.stderr.close()
        log.close()
    assert written == [str(i) for i in range(n)]
    assert max(per_turn.values()) <= LINES_PER_WAKE, max(per_turn.values())
    assert len(per_turn) >= n // LINES_PER_WAKE
