"""`clawsup exec run`: one command through the exec tool's screen and sandbox path,
without a running supervisor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CLAWSUP, require_bwrap
from tests.test_privileges import as_root_wrap  # noqa: F401  (a fixture)


@pytest.fixture(params=["process", "bwrap"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "bwrap":
        require_bwrap()
    return request.param


def run(backend: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLAWSUP, "exec", "run", "--backend", backend, *args], capture_output=True, text=True, timeout=timeout)


def verdict(stdout: str) -> dict:
    return json.loads(stdout.rstrip("\n").rsplit("\n", 1)[-1])


def test_output_then_the_result(backend: str) -> None:
    r = run(backend, "--json", "--", "echo hi; echo err >&2; exit 3")
    assert r.returncode == 3, r.stderr
    assert r.stdout.startswith("hi\nerr\n")
    v = verdict(r.stdout)
    assert v["exit_code"] == 3 and v["signal"] is None and v["blocked_by"] is None
    assert v["timed_out"] is False and v["truncated"] is False and v["duration_s"] > 0
    # The same fields as the exec tool's result (clawsup.sandbox.exec_result.ExecResult.to_json).
    assert v["output_bytes"] == len("hi\nerr\n")


def test_blocked_command_exits_nonzero_without_running(backend: str, tmp_path: Path) -> None:
    r = run(backend, "--workspace", str(tmp_path), "--json", "--", "touch ran; sudo reboot")
    assert r.returncode == 126
    assert verdict(r.stdout)["blocked_by"] == "power-off"
    assert "refused by rule 'power-off'" in r.stderr
    assert not (tmp_path / "ran").exists()


def test_timeout_signal_and_cap(backend: str, tmp_path: Path) -> None:
    r = run(backend, "--timeout", "0.5", "--json", "--", "sleep 30")
    assert r.returncode == 124 and verdict(r.stdout)["timed_out"] is True
    r = run(backend, "--", "kill -KILL $$")
    assert r.returncode == 128 + 9
    r = run(backend, "--max-output", "2000", "--json", "--", "seq 1 100000")
    v = verdict(r.stdout)
    assert v["truncated"] is True and r.returncode == 0
    assert r.stdout.startswith("1\n2\n") and "100000\n" in r.stdout and len(r.stdout) < 2300


def test_workspace_is_the_operators_folder(backend: str, tmp_path: Path) -> None:
    (tmp_path / "input.txt").write_text("data\n")
    r = run(backend, "--workspace", str(tmp_path), "--", "cat input.txt > output.txt; pwd")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "output.txt").read_text() == "data\n"
    # Used as is: not chmodded, nothing of ours left in it.
    assert sorted(os.listdir(tmp_path)) == ["input.txt", "output.txt"]


def test_output_streams_before_the_command_ends(backend: str) -> None:
    proc = subprocess.Popen([*CLAWSUP, "exec", "run", "--backend", backend, "--", "echo first; sleep 1.5; echo second"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    t_first = time.monotonic()
    rest = proc.stdout.read()
    t_end = time.monotonic()
    assert proc.wait(30) == 0
    assert first == "first\n" and rest == "second\n"
    assert t_end - t_first > 1.0


def test_bad_usage() -> None:
    r = subprocess.run([*CLAWSUP, "exec", "run", "--backend", "vm", "--", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--backend" in r.stderr


def test_bwrap_as_an_ordinary_user_takes_a_user_namespace(tmp_path: Path, as_root_wrap: list[str]) -> None:
    """The workstation case: clawsup run by a user, not root. (Here, root plays that
    user with setpriv, in a mount namespace where the interpreter is reachable.)"""
    require_bwrap()
    tmp_path.chmod(0o777)
    cmd = [
        *as_root_wrap,
        "setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
        "env", f"HOME={tmp_path}", f"PATH={os.path.dirname(sys.executable)}:/usr/bin:/bin",
        *CLAWSUP, "exec", "run", "--backend", "bwrap", "--",
        "id -u; grep CapEff /proc/self/status; readlink /proc/self/ns/user; ls /proc | grep -cE '^[0-9]+$'",
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    uid, caps, userns, nprocs = r.stdout.split("\n")[:4]
    assert uid == "65534" and caps == "CapEff:\t0000000000000000"
    assert userns != os.readlink("/proc/self/ns/user"), "no user namespace of its own"
    assert int(nprocs) < 10
