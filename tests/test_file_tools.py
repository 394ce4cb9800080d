"""The file tools (read, write, edit, list_dir) through a running supervisor, on both
workspace backends. Escapes (symlinks, `..`, a new file under a symlinked parent, a
dangling link) are refused and nothing outside the workspace changes.

The outside target is a folder under /usr/local/share: under bwrap the sandbox sees
it read-only, under the process backend (which runs as root on these machines) a
confinement bug would really write there, so the checks below would catch it."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gateway, require_backend, workspace_config

READ_MAX = 4096


@pytest.fixture(params=["process", "bwrap", "docker"])
def gw(request: pytest.FixtureRequest, module_gateways: Any) -> Gateway:
    require_backend(request.param)
    g: Gateway = module_gateways(request.param, workspace_config(request.param, tools={"fs": {"readMaxBytes": READ_MAX}}))
    g.wait("workspace-main", "ready")
    g.backend = request.param  # type: ignore[attr-defined]
    return g


@pytest.fixture
def outside() -> Iterator[Path]:
    d = Path("/usr/local/share") / f"clawsup-outside-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    (d / "keep.txt").write_text("original\n")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def ok(gw: Gateway, name: str, **args: Any) -> Any:
    resp = gw.call(name, args)
    assert resp["ok"], resp
    return resp["data"]["result"]


def refused(gw: Gateway, name: str, **args: Any) -> str:
    resp = gw.call(name, args)
    assert not resp["ok"], f"{name} {args} was not refused: {resp}"
    return resp["error"]["message"]


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(d.rglob("*"))}


def plant(gw: Gateway, name: str, target: str) -> None:
    """A symlink in the workspace, made from outside (the sandbox could make it too)."""
    link = gw.workspace() / name
    if link.is_symlink():
        link.unlink()
    os.symlink(target, link)


def test_symlink_escapes_are_refused_and_nothing_outside_changes(gw: Gateway, outside: Path) -> None:
    before = snapshot(outside)
    plant(gw, "leak", str(outside / "keep.txt"))
    plant(gw, "outdir", str(outside))
    plant(gw, "dangling", str(outside / "created-through-link.txt"))
    # Under docker the target is not even in the container's view: the links dangle
    # there, and are refused as such.
    escape = ("outside the workspace",)
    if gw.backend == "docker":  # type: ignore[attr-defined]
        escape += ("does not exist", "dangling symlink", "missing file")
    assert any(w in refused(gw, "read", path="leak") for w in escape)
    assert any(w in refused(gw, "write", path="leak", content="pwned\n") for w in escape)
    assert any(w in refused(gw, "edit", path="leak", old_string="original", new_string="pwned") for w in escape)
    assert any(w in refused(gw, "list_dir", path="outdir") for w in escape)
    assert any(w in refused(gw, "read", path="outdir/keep.txt") for w in escape)
    # New files under a symlinked parent, with and without missing folders.
    assert any(w in refused(gw, "write", path="outdir/new.txt", content="x") for w in escape)
    assert any(w in refused(gw, "write", path="outdir/a/b/new.txt", content="x") for w in escape)
    assert "missing file" in refused(gw, "write", path="dangling", content="x")
    assert "outside the workspace" in refused(gw, "read", path=str(outside / "keep.txt"))
    assert snapshot(outside) == before
    # A symlink that stays inside is fine.
    ok(gw, "write", path="real.txt", content="inside\n")
    plant(gw, "inner", "real.txt")
    assert ok(gw, "read", path="inner") == "inside\n"


def test_dotdot_is_refused_and_nothing_is_created_outside(gw: Gateway) -> None:
    parent = gw.workspace().parent
    before = sorted(os.listdir(parent))
    for path in ("../escape.txt", "../../escape.txt", "a/../../escape.txt", "/etc/passwd", "./../workspace/../x"):
        assert "outside the workspace" in refused(gw, "write", path=path, content="x")
    assert "outside the workspace" in refused(gw, "read", path="../../clawsup.json")
    assert "outside the workspace" in refused(gw, "list_dir", path="..")
    assert sorted(os.listdir(parent)) == before
    # `..` that stays inside is only a path.
    ok(gw, "write", path="d/../inside.txt", content="y")
    assert ok(gw, "read", path="inside.txt") == "y"


def test_write_creates_folders_and_list_dir_shows_them(gw: Gateway) -> None:
    assert ok(gw, "write", path="deep/er/file.txt", content="hello\n").startswith("created")
    assert ok(gw, "write", path="deep/er/file.txt", content="hi\n").startswith("wrote")
    assert (gw.workspace() / "deep/er/file.txt").read_text() == "hi\n"
    entries = ok(gw, "list_dir", path="deep/er")
    assert entries == [{"name": "file.txt", "type": "file", "size": 3}]
    assert {"name": "deep", "type": "dir"} in ok(gw, "list_dir")
    assert "is a directory" in refused(gw, "write", path="deep", content="x")
    assert "does not exist" in refused(gw, "read", path="nope.txt")


def test_read_offset_limit_and_size_cap(gw: Gateway) -> None:
    ok(gw, "write", path="lines.txt", content="".join(f"line {i}\n" for i in range(1, 101)))
    text = ok(gw, "read", path="lines.txt", offset=10, limit=3)
    assert text == "line 10\nline 11\nline 12\n[more lines follow; continue with offset=13]"
    assert ok(gw, "read", path="lines.txt", offset=99) == "line 99\nline 100\n"
    ok(gw, "write", path="big.txt", content="".join(f"{i:07d}\n" for i in range(2000)))
    text = ok(gw, "read", path="big.txt")
    assert len(text.encode()) < READ_MAX + 100
    assert "output cap of 4096 bytes reached; continue with offset=513" in text
    ok(gw, "write", path="oneline.txt", content="x" * 10_000)
    assert "line 1 cut at 4096 bytes" in ok(gw, "read", path="oneline.txt")


def test_edit_replaces_one_exact_unique_occurrence(gw: Gateway) -> None:
    ok(gw, "write", path="e.txt", content="alpha beta\nbeta gamma\ndelta\n")
    assert ok(gw, "edit", path="e.txt", old_string="delta", new_string="DELTA").startswith("edited")
    msg = refused(gw, "edit", path="e.txt", old_string="beta", new_string="B")
    assert "occurs 2 times" in msg
    assert "not found" in refused(gw, "edit", path="e.txt", old_string="omega", new_string="x")
    assert (gw.workspace() / "e.txt").read_text() == "alpha beta\nbeta gamma\nDELTA\n"


def test_bad_arguments_name_the_field(gw: Gateway) -> None:
    resp = gw.call("read", {"path": 5})
    assert resp["error"]["code"] == "bad_arguments" and "path" in resp["error"]["message"]
    resp = gw.call("edit", {"path": "x", "old_string": "", "new_string": "y"})
    assert resp["error"]["code"] == "bad_arguments" and "old_string" in resp["error"]["message"]
    resp = gw.call("write", {"path": "x", "content": "y", "mode": "0777"})
    assert resp["error"]["code"] == "bad_arguments" and "mode" in resp["error"]["message"]


def test_read_of_one_enormous_line_stays_bounded(gw: Gateway) -> None:
    big = gw.workspace() / "huge.txt"
    with open(big, "wb") as f:
        f.write(b"a" * (READ_MAX - 1) + b"\n")  # exactly at the cap, with its newline
        f.write(b"y" * 50_000_000 + b"\n")
        f.write(b"last\n")
    before = gw.status("workspace-main")["rss_bytes"]
    assert ok(gw, "read", path="huge.txt", offset=3) == "last\n"
    text = ok(gw, "read", path="huge.txt", offset=2)
    assert text.startswith("yyyy") and text.endswith("[line 2 cut at 4096 bytes]")
    assert ok(gw, "read", path="huge.txt", limit=1) == "a" * (READ_MAX - 1) + "\n[more lines follow; continue with offset=2]"
    assert gw.status("workspace-main")["rss_bytes"] - before < 16 * 1024 * 1024
    big.unlink()
