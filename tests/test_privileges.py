"""When the supervisor runs as root, each sandbox's children run as an unprivileged
uid of their own (sandbox.runAs auto), and what that buys is checked from the
attacker's side: from inside a child.

This machine keeps Python under /root (0700), where `nobody` cannot start it, so
these tests run the supervisor in a private mount namespace in which the way to the
interpreter and the code is open (tests/helpers/open_paths.py). Elsewhere the
supervisor itself would do exactly the same.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from clawsup.sandbox.launch.uids import SandboxUids, UidAllocator
from tests.conftest import IN_CI, PLUGINS, ROOT, make_config

OPEN_PATHS = Path(__file__).resolve().parent / "helpers" / "open_paths.py"


@pytest.fixture
def as_root_wrap() -> list[str]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        if IN_CI:
            pytest.fail("CI runs as root with util-linux: the privilege-drop tests must run there")
        pytest.skip("needs root and unshare(1)")
    return ["unshare", "--mount", "--propagation", "private", sys.executable, str(OPEN_PATHS), sys.executable, str(ROOT), "--"]


def chaos_cfg(uid_registry: Path) -> dict:
    cfg = make_config(sandbox__uids={"registry": str(uid_registry)})
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    return cfg


def test_children_drop_root_and_keep_out_of_the_supervisor_and_each_other(gateway_factory, as_root_wrap, tmp_path) -> None:
    gw = gateway_factory(chaos_cfg(tmp_path / "uids" / "uids.json"), wrap=as_root_wrap)
    found = re.search(r"chaos as uid (\d+)", "".join(gw.output))
    assert found, "".join(gw.output)
    chaos_uid = int(found.group(1))
    basics_pid = gw.status("basics")["pid"]
    st = gw.state
    attempt = [
        ["connect", str(st / "run" / "control.sock")],  # the control API: would let it stop us
        ["read", str(st / "logs" / "supervisor.log")],
        ["read", str(st / "logs" / "basics.log")],
        ["write", str(st / "sandboxes" / "basics" / "workspace" / "planted")],  # another sandbox's files
        ["connect", str(st / "hosts" / "basics" / "host.sock")],  # another sandbox's socket
        ["write", str(PLUGINS / "chaos" / "planted.py")],  # its own code
        ["write", "/etc/planted"],
        ["kill", str(basics_pid)],  # another sandbox's process
        ["kill", str(gw.proc.pid)],  # the supervisor
        ["write", "workspace-file"],  # its own workspace: allowed
        ["write", str(st / "sandboxes" / "chaos" / "workspace" / ".tmp" / "t")],
    ]
    p = gw.call("chaos_probe", {"attempt": attempt})["data"]["result"]
    assert p["uid"] == chaos_uid and p["uid"] != 0
    assert p["attempts"][:9] == ["PermissionError: Permission denied"] * 7 + ["PermissionError: Operation not permitted"] * 2, p["attempts"]
    assert p["attempts"][9:] == ["ok", "ok"]
    assert not (PLUGINS / "chaos" / "planted.py").exists()
    assert gw.call("echo", {"text": "unharmed"})["data"]["result"] == "unharmed"
    # The limits hold even where prlimit from outside is not permitted.
    assert p["limits"]["RLIMIT_CORE"] == 0 and p["limits"]["RLIMIT_NOFILE"] == 256
    # The supervisor still manages it: kill, reclaim, restart, same uid again.
    resp = gw.call("chaos_crash", {"how": "segfault"})
    assert resp["error"]["code"] == "sandbox_died" and "SIGSEGV" in resp["error"]["message"]
    assert gw.wait("chaos", "ready") == "ready"
    assert gw.call("chaos_probe")["data"]["result"]["uid"] == chaos_uid


def _need_root() -> None:
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("CI runs as root: the privilege-drop tests must run there")
        pytest.skip("needs root")


def test_explicit_run_as_that_cannot_work_refuses_to_start(gateway_factory) -> None:
    _need_root()
    cfg = make_config(sandbox__runAs="no-such-user")
    with pytest.raises(AssertionError, match="exited with 2"):
        gateway_factory(cfg)

