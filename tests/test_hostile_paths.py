"""The supervisor's own surfaces, attacked through the paths it creates or touches in
folders a child can write (a sandbox's socket folder and workspace) or that others
share (/tmp, the place of the state directory), on every backend.

The attackers: the hostile plugin tests/plugins/sockswap (it swaps its own host.sock,
before the handshake or while running), exec commands in a workspace sandbox, and
names planted from outside while the supervisor is down. The victims, checked from
the host: a listener where a planted symlink points (whoever dials it would hand it
the sandbox's tokens), and a folder and a file outside every sandbox (owner, mode,
contents)."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.sandbox.socket_paths import SUN_PATH_MAX
from tests.conftest import CLAWSUP, TEST_PLUGINS, Gateway, make_config, require_backend

SOCKSWAP = TEST_PLUGINS / "sockswap"
WS = "workspace-main"
BACKENDS = ["process", "bwrap", "docker"]
KINDS = ["symlink", "fifo", "file"]
# What the supervisor's log says for each kind found at a socket's name.
SAID = {"symlink": "is a symbolic link, not a socket", "fifo": "is a FIFO, not a socket", "file": "is a regular file, not a socket"}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    require_backend(request.param)
    return str(request.param)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside every sandbox and state directory, for the victims."""
    d = Path(tempfile.mkdtemp(prefix="cs-out-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def config(backend: str, *, sockswap: dict[str, Any] | None = None, workspace: bool = False, basics: bool = False) -> dict[str, Any]:
    """sockswap (and the workspace sandbox, and basics, if asked) on `backend`."""
    cfg = make_config(agents__defaults__sandbox={"scope": "agent", "backend": backend} if workspace else {"scope": "session"})
    cfg["plugins"]["load"]["paths"] = [str(SOCKSWAP)] + ([cfg["plugins"]["load"]["paths"][0]] if basics else [])
    cfg["plugins"]["entries"]["sockswap"] = {"config": sockswap or {}, "sandbox": {"backend": backend}}
    if basics:
        cfg["plugins"]["entries"]["basics"] = {"trust": "trusted", "sandbox": {"backend": backend}}
    if backend == "process":
        cfg["plugins"]["entries"]["sockswap"]["trust"] = "trusted"
    return cfg


class Trap:
    """A unix socket outside every sandbox, where a planted symlink points. It never
    answers; a connection only queues, and `connections()` takes what queued."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "trap.sock"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o777)  # so that a sandbox's uid could connect, were it led here
        self._sock.listen(64)
        self._sock.setblocking(False)

    def connections(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def trap(outside: Path) -> Iterator[Trap]:
    t = Trap(outside)
    yield t
    t.close()


class Victim:
    """A folder and a file of root's outside every sandbox, and what they looked like."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder / "victim-dir"
        self.dir.mkdir(mode=0o755)
        os.chmod(self.dir, 0o755)
        self.file = folder / "victim-file"
        self.file.write_text("precious\n")
        os.chmod(self.file, 0o644)
        self._before = self._look()

    def _look(self) -> dict[str, Any]:
        return {
            p: (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), sorted(os.listdir(p)) if p == self.dir else p.read_text())
            for p in (self.dir, self.file)
            for st in [os.lstat(p)]
        }

    def assert_untouched(self) -> None:
        assert self._look() == self._before


def ok_result(resp: dict[str, Any]) -> Any:
    assert resp["ok"], resp
    return resp["data"]["result"]


def socket_dir(state: Path, sandbox: str) -> Path:
    [d] = [p for p in (state / "run" / "hosts" / sandbox, state / "hosts" / sandbox) if p.is_dir()]
    return d


def plant(path: Path, kind: str, target: Path) -> None:
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("planted\n")


# -- host.sock ------------------------------------------------------------------------


def test_host_sock_swapped_while_running_is_not_followed(backend: str, gateway_factory: Any, trap: Trap) -> None:
    """The plugin swaps its live host.sock for a symlink to the trap (then a FIFO, then
    a file) and cuts the supervisor's connections: the supervisor dials again, and
    must reach the same socket it checked, not whatever the name now holds."""
    gw = gateway_factory(config(backend))
    assert gw.status("sockswap")["state"] == "ready"
    for kind in KINDS:
        ok_result(gw.call("sockswap_plant", {"kind": kind, "target": str(trap.path)}))
        # It cuts the connection its own answer travels on: that call fails (which
        # shows the cut happened), the next one must not.
        assert not gw.call("sockswap_drop", timeout=5)["ok"]
        assert ok_result(gw.call("sockswap_ping", timeout=10)) == "pong", kind
        assert gw.status("sockswap")["state"] == "ready"
    assert trap.connections() == 0
    # The next incarnation finds what was planted last (a file) at its name, and
    # comes up.
    resp = gw.request(op="restart", sandbox="sockswap", timeout=60)
    assert resp["ok"] and resp["data"]["state"] == "ready", resp
    assert ok_result(gw.call("sockswap_ping")) == "pong"
    assert trap.connections() == 0


def test_host_sock_replaced_before_handshake_is_refused(backend: str, gateway_factory: Any, trap: Trap) -> None:
    """The plugin replaces host.sock with a symlink to the trap just before its
    handshake line goes out, at every start (the attack that once got the tokens).
    The supervisor opens the name without following, refuses what it finds and dials
    nothing; the plugin's sandbox fails (its restart budget spent), a bystander is
    unharmed."""
    cfg = config(backend, sockswap={"plantAtStart": "symlink", "target": str(trap.path)}, basics=True)
    gw = gateway_factory(cfg)
    assert gw.wait("sockswap", "failed", timeout=55) == "failed"
    log = gw.log("sockswap")
    assert "refusing to dial the child's socket" in log and SAID["symlink"] in log, log[-3000:]
    assert trap.connections() == 0
    assert gw.status("basics")["state"] == "ready", (gw.status("basics"), gw.log("basics")[-2000:])
    assert ok_result(gw.call("echo", {"text": "hi"})) is not None


@pytest.mark.parametrize("kind", ["fifo", "file"])
def test_host_sock_fifo_or_file_before_handshake_does_not_block(kind: str, gateway_factory: Any) -> None:
    """A FIFO (or a file) at the name is refused at once: the supervisor never opens
    it for reading, so nothing waits on a writer that never comes. The dial is
    the same code on every backend, so the process backend stands for all three."""
    gw = gateway_factory(config("process", sockswap={"plantAtStart": kind}))
    gw.wait_log("sockswap", SAID[kind], timeout=30)
    assert gw.stop(timeout=30) == 0


def test_names_planted_while_the_supervisor_is_down(backend: str, gateway_factory: Any, trap: Trap, outside: Path) -> None:
    """While no supervisor runs, someone plants into the folders the children own: a
    symlink to the trap, a FIFO and a file at three sandboxes' host.sock; a symlink
    at the workspace's .tmp; and in the workspace, which changes owner, a hard link to
    a file of root's, a symlink to a folder of root's and a FIFO. The next start
    brings every sandbox up without following, blocking on or giving away any of it."""
    victim = Victim(outside)
    cfg = config(backend, workspace=True, basics=True)
    gw = gateway_factory(cfg)
    for sid in ("sockswap", "basics", WS):
        assert gw.status(sid)["state"] == "ready", gw.status(sid)
    assert gw.stop() == 0

    state = gw.state
    plant(socket_dir(state, "sockswap") / "host.sock", "symlink", trap.path)
    plant(socket_dir(state, WS) / "host.sock", "fifo", trap.path)
    plant(socket_dir(state, "basics") / "host.sock", "file", trap.path)
    ws = gw.workspace()
    plant(ws / ".tmp", "symlink", victim.dir)
    os.link(victim.file, ws / "hardlink")
    (ws / "dirlink").symlink_to(victim.dir)
    os.mkfifo(ws / "fifo")
    (ws / "plain").write_text("the workspace's own\n")
    os.chown(ws / "plain", 0, 0)
    os.chown(ws, 0, 0)  # a new owner is due: the whole workspace is given again

    gw = gateway_factory(cfg)
    for sid in ("sockswap", "basics", WS):
        assert gw.status(sid)["state"] == "ready", (sid, gw.status(sid), gw.log(sid)[-2000:])
    assert ok_result(gw.call("sockswap_ping")) == "pong"
    assert gw.exec("echo alive")["exit_code"] == 0
    assert trap.connections() == 0
    victim.assert_untouched()
    assert os.lstat(victim.file).st_nlink == 2  # the hard link is still there, still root's
    owner = os.stat(ws).st_uid
    if owner != 0:  # the workspace was given to the sandbox's uid: so was its own file
        assert os.lstat(ws / "plain").st_uid == owner
        assert os.lstat(ws / "fifo").st_uid == owner
    tmp = os.lstat(ws / ".tmp")
    assert stat.S_ISDIR(tmp.st_mode), "the planted .tmp symlink was not replaced by a directory"
    assert "not followed" in gw.log(WS)


# -- the workspace's .tmp -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_workspace_tmp_planted_by_a_command(kind: str, backend: str, gateway_factory: Any, outside: Path) -> None:
    """A command puts a symlink (to a folder of root's), a FIFO or a regular file at
    the workspace's .tmp; the workspace sandbox is restarted and comes up, with .tmp
    a directory again, the planted thing removed or (a file) moved aside and said so
    in its log, and the victim untouched."""
    victim = Victim(outside)
    gw = gateway_factory(config(backend, workspace=True))
    make = {"symlink": f"ln -s {victim.dir} .tmp", "fifo": "mkfifo .tmp", "file": "echo mine > .tmp"}[kind]
    assert gw.exec(f"rm -rf .tmp && {make}")["exit_code"] == 0
    resp = gw.request(op="restart", sandbox=WS, timeout=60)
    assert resp["ok"] and resp["data"]["state"] == "ready", (resp, gw.log(WS)[-2000:])
    # A directory again, and the child's: it can write there.
    assert gw.exec("test -d .tmp && test ! -L .tmp && touch .tmp/mine")["exit_code"] == 0
    log = gw.log(WS)
    if kind == "file":
        assert "moved it aside" in log
        [aside] = [p for p in gw.workspace().iterdir() if p.name.startswith(".tmp.moved-")]
        assert aside.read_text() == "mine\n"
    else:
        assert "removed it (not followed)" in log
    victim.assert_untouched()


# -- where the supervisor keeps its state ---------------------------------------------------


def test_long_state_dir_needs_no_tmp_folder(backend: str, state_dir: Path, outside: Path) -> None:
    """A state directory so deep that its sockets' paths pass sun_path's 107 bytes.
    Before, the socket folder fell back to a predictable name in /tmp, reused and
    chowned through a symlink planted there. Now nothing goes to /tmp: the sockets
    stay in the state directory and are reached through a folder's descriptor."""
    os.chmod(state_dir, 0o711)  # children of their own uid reach their workspace by name
    root = state_dir / ("deep-" + "d" * 90)
    root.mkdir(mode=0o700)
    assert len(str(root / "run" / "hosts" / WS / "host.sock")) > SUN_PATH_MAX
    assert len(str(root / "run" / "control.sock")) > SUN_PATH_MAX
    victim = Victim(outside)
    uid = os.getuid()
    old_name = Path(tempfile.gettempdir()) / f"clawsup-{uid}-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    before = set(Path(tempfile.gettempdir()).glob(f"clawsup-{uid}-*"))
    old_name.symlink_to(victim.dir)
    try:
        gw = Gateway(root, config(backend, workspace=True), [])
        try:
            assert gw.status("sockswap")["state"] == "ready"
            assert ok_result(gw.call("sockswap_ping")) == "pong"
            assert gw.exec("echo deep")["exit_code"] == 0
            status = gw.cli("status")
            assert status.returncode == 0, status.stderr
            assert WS in status.stdout
        finally:
            assert gw.stop() == 0
    finally:
        old_name.unlink()
    victim.assert_untouched()
    assert set(Path(tempfile.gettempdir()).glob(f"clawsup-{uid}-*")) == before


def _start_refused(state: Path, outside: Path) -> subprocess.CompletedProcess[str]:
    cfg = outside / "clawsup.json"
    cfg.write_text('{"plugins": {"load": {"paths": []}}}')
    return subprocess.run([*CLAWSUP, "start", "--state-dir", str(state), "--config", str(cfg)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", ["symlink", "other-uid", "world-writable", "group-writable", "open-parent"])
def test_unsafe_state_dir_is_refused(kind: str, outside: Path) -> None:
    """`clawsup start` refuses a state directory someone else could have planted or
    could change, with a sentence that names it, says why and what to do, and
    leaves nothing in it."""
    real = outside / "real"
    real.mkdir(mode=0o700)
    state = real
    if kind == "symlink":
        state = outside / "link"
        state.symlink_to(real)
        why = "it is a symbolic link, not a directory"
    elif kind == "other-uid":
        os.chown(real, 4242, 4242)
        why = "it belongs to uid 4242"
    elif kind == "world-writable":
        os.chmod(real, 0o777)
        why = "it is writable by others (mode 777)"
    elif kind == "group-writable":
        os.chmod(real, 0o770)
        why = "it is writable by its group (mode 770)"
    else:
        os.chmod(outside, 0o777)  # not sticky: anyone could rename `real` away
        state = real / "state"
        why = "above it is writable by others (mode 777)"
    r = _start_refused(state, outside)
    assert r.returncode == 2, (r.stdout, r.stderr)
    said = " ".join(r.stderr.split())
    assert f"refusing to use {state}" in said and why in said, said
    assert list(real.iterdir()) == []
