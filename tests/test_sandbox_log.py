from __future__ import annotations

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
