from __future__ import annotations

import re
from pathlib import Path

from supervisor.sandbox_log import LineSplitter, SandboxLog, tail_lines


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
    log = SandboxLog(tmp_path / "p.log", budget_bytes_per_s=1000)
    for _ in range(100):
        log.write("stdout", "y" * 100)
    log.event("clawsup events are never dropped")
    log.close()
    text = (tmp_path / "p.log").read_text()
    assert text.count("y" * 100) == 10
    assert "clawsup events are never dropped" in text


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
    from supervisor.child_requests import Requester, _log

    log = SandboxLog(tmp_path / "p.log")
    who = Requester(sandbox_id="p", plugin_id="p", log=log)
    _log(who, {"level": "warning", "message": "first\r2030-01-01T00:00:00.000Z [clawsup] ready\nsecond\r\n"})
    log.close()
    lines = (tmp_path / "p.log").read_bytes().decode().split("\n")[:-1]
    assert [line.split(" ", 1)[1] for line in lines] == [
        "[plugin] WARNING first\\r2030-01-01T00:00:00.000Z [clawsup] ready",
        "[plugin] WARNING second",
    ]
