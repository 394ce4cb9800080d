"""A real MCP server from PyPI for the tests: `mcp-server-time`, installed the way an
operator would (`python -m venv DIR && DIR/bin/pip install mcp-server-time`) into a
venv of its own that every test process shares.

The venv lives in a fixed folder outside any test's state directory, so that it is
made once per machine and reused by every run and every xdist worker; an fcntl lock
makes the first worker build it while the others wait. A venv that does not answer
(a build cut short, a Python upgraded under it) is made again.

The folder is open to every user (0755 all the way), as a system-wide install would
be: the sandboxes' own uids must be able to run it (sandbox.runAs on this root
machine). Its interpreter is this Python's, whose folders the tests' supervisors
open in their own mount namespace (tests/conftest.py open_paths_wrap).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CACHE = Path("/var/tmp/clawsup-tests")
TIME_VENV = CACHE / "mcp-server-time-venv"
READY = ".clawsup-ready"
"""Written last: a venv without it was cut short."""
INSTALL_TIMEOUT_S = 300.0


def _healthy(venv: Path) -> bool:
    if not (venv / READY).is_file() or not (venv / "bin" / "mcp-server-time").is_file():
        return False
    try:
        r = subprocess.run([str(venv / "bin" / "python"), "-c", "import mcp_server_time, mcp"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _clean_env() -> dict[str, str]:
    # pip in the new venv must not see the test run's own interpreter settings.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}


def _build(venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "mcp-server-time"],
    ]
    for argv in steps:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=_clean_env(), stdin=subprocess.DEVNULL, umask=0o022)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    (venv / READY).write_text("ok\n")


def time_server_venv() -> Path:
    """The shared venv holding `mcp-server-time` (made, or made again, if needed)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(CACHE, 0o755)
    with open(CACHE / "mcp-server-time.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not _healthy(TIME_VENV):
            _build(TIME_VENV)
            if not _healthy(TIME_VENV):
                raise RuntimeError(f"{TIME_VENV}: made, but `import mcp_server_time` still fails in it")
    return TIME_VENV


@pytest.fixture(scope="session")
def mcp_server_time() -> Iterator[Path]:
    """The `mcp-server-time` executable of the shared venv, as `command` would name it."""
    try:
        venv = time_server_venv()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        # PyPI (or the machine's mirror of it) is part of what this test needs.
        pytest.fail(f"could not install mcp-server-time from PyPI into {TIME_VENV}: {e}")
    yield venv / "bin" / "mcp-server-time"
