"""The docker backend attacked from the sandbox's side: names planted in the folder a
container can write (the old start gate's), a flood of the engine's container log,
and containers meant to outlive a SIGKILLed supervisor.

The attackers are the hostile plugin tests/plugins/squatter (it plants at every
start) and exec commands in a docker workspace sandbox; the victims are files outside
every sandbox, checked from the host for content, owner and mode."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from clawsup.sandbox.launch.container import GATE, GATE_NAME, LABEL, STATE_LABEL
from tests.conftest import PLUGINS, TEST_PLUGINS, Gateway, make_config, require_docker, wait_gone

SQUATTER = TEST_PLUGINS / "squatter"
OLD_GATE_NAMES = (".gate.tmp", "gate")
MARK = "6.6.6-squatter-was-here"  # the squatter's version: it travels in the gate
WS = "workspace-main"


@pytest.fixture(autouse=True)
def _engine() -> None:
    require_docker()


def config(squatter: dict[str, Any] | None = None, *, plugins: list[Path] | None = None) -> dict[str, Any]:
    """The default agent's workspace sandbox and every plugin on docker."""
    cfg = make_config(sandbox__defaults__backend="docker", agents__defaults__sandbox={"scope": "agent", "backend": "docker"})
    cfg["plugins"]["load"]["paths"] = [str(p) for p in (plugins or [SQUATTER])]
    cfg["plugins"]["entries"]["squatter"] = {"config": squatter or {}}
    return cfg


def engine() -> docker.DockerClient:
    return docker.from_env(timeout=30)


def containers(state: Path) -> list[Any]:
    client = engine()
    try:
        return client.containers.list(all=True, filters={"label": f"{STATE_LABEL}={state}"})
    finally:
        client.close()


def container_of(gw: Gateway, sandbox: str) -> Any:
    [c] = [c for c in containers(gw.state) if c.labels[LABEL] == sandbox and c.status == "running"]
    return c


def socket_dir(gw: Gateway, sandbox: str) -> Path:
    """The sandbox's socket folder, as its container was told it (`--socket`)."""
    args = container_of(gw, sandbox).attrs["Args"]
    return Path(args[args.index("--socket") + 1]).parent


def launcher_paths(gw: Gateway, sandbox: str) -> list[Path]:
    """Every child-writable place the docker launcher could once be made to touch:
    the old gate names in the socket folder."""
    return [socket_dir(gw, sandbox) / n for n in OLD_GATE_NAMES]


class Victims:
    """Files outside every sandbox that a planted name points at: one that exists
    (root's, 0644) and one that does not (a create would show)."""

    def __init__(self, root: Path) -> None:
        root.mkdir(mode=0o755)
        self.present = root / "precious"
        self.present.write_text("precious operator data\n")
        os.chmod(self.present, 0o644)
        self.absent = root / "absent"
        self.root = root
        self._before = self._seen()

    def _seen(self) -> tuple[bytes, int, int, int]:
        st = os.stat(self.present, follow_symlinks=False)
        return self.present.read_bytes(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)

    def targets(self) -> list[Path]:
        return [self.present, self.absent]

    def assert_untouched(self) -> None:
        assert self._seen() == self._before
        assert not self.absent.exists() and not self.absent.is_symlink()
        assert sorted(p.name for p in self.root.iterdir()) == ["precious"]
        assert MARK not in self.present.read_text()


def plant(kind: str, paths: list[Path], victims: Victims) -> None:
    for path, target in zip(paths, victims.targets() * len(paths)):
        if path.is_symlink() or path.exists():
            path.unlink()
        if kind == "symlink":
            path.symlink_to(target)
        else:
            os.mkfifo(path, 0o666)


def plant_command(kind: str, paths: list[Path], victims: Victims) -> str:
    """The same, as an exec command run inside the workspace container."""
    steps = []
    for path, target in zip(paths, victims.targets() * len(paths)):
        steps.append(f"rm -f {path}")
        steps.append(f"ln -s {target} {path}" if kind == "symlink" else f"mkfifo {path}")
    return " && ".join(steps) + " && ls -l " + " ".join(str(p) for p in paths)


def squatter_config(kind: str, victims: Victims) -> dict[str, Any]:
    if kind == "symlink":
        return {"symlinks": dict(zip(OLD_GATE_NAMES, [str(t) for t in victims.targets()], strict=True))}
    return {"fifos": list(OLD_GATE_NAMES)}


def assert_gate_is_private(gw: Gateway, sandbox: str) -> None:
    """The gate lives in the supervisor-only folder, the child's alone to read, and
    reaches the container read-only; nothing of it is in the socket folder."""
    c = container_of(gw, sandbox)
    [mount] = [m for m in c.attrs["Mounts"] if m["Destination"] == GATE]
    assert mount["RW"] is False
    private = gw.state / "sandboxes" / sandbox / "private"
    assert Path(mount["Source"]) == private / GATE_NAME
    st = os.stat(private / GATE_NAME, follow_symlinks=False)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o400
    assert f"{st.st_uid}:{st.st_gid}" == c.attrs["Config"]["User"]
    pst = os.stat(private)
    assert pst.st_uid == os.geteuid() and not pst.st_mode & 0o022


def stop_bounded(gw: Gateway) -> None:
    """`clawsup stop`, and the supervisor process itself gone soon after (a FIFO once
    kept it alive after `stopped`)."""
    r = gw.cli("stop", timeout=60)
    assert r.returncode == 0, r.stderr
    gw.proc.wait(30)
    assert containers(gw.state) == []


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_names_planted_ahead_of_time_are_never_followed_nor_block(kind: str, gateway_factory: Any, state_dir: Path, tmp_path: Path) -> None:
    """As an earlier incarnation could have left them, while no supervisor ran."""
    victims = Victims(tmp_path / "victims")
    gw = gateway_factory(config())
    gw.wait(WS, "ready")
    paths = launcher_paths(gw, WS) + launcher_paths(gw, "squatter")
    stop_bounded(gw)
    for d in {p.parent for p in paths}:
        d.mkdir(parents=True, exist_ok=True)
    plant(kind, paths, victims)

    gw = gateway_factory(config())
    assert gw.wait(WS, "ready") == "ready" and gw.wait("squatter", "ready") == "ready"
    assert gw.exec("echo alive")["output"] == "alive\n"
    victims.assert_untouched()
    for sandbox in (WS, "squatter"):
        assert_gate_is_private(gw, sandbox)
    stop_bounded(gw)
    victims.assert_untouched()
    # The supervisor cleans its own folder: no gate outlives the child.
    for sandbox in (WS, "squatter"):
        assert not (state_dir / "sandboxes" / sandbox / "private" / GATE_NAME).exists()


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_names_planted_while_running_are_never_followed_nor_block(kind: str, gateway_factory: Any, tmp_path: Path) -> None:
    """By an exec command in the workspace container, and by the plugin at every start
    of its own; each then relaunched, where the old gate once fired."""
    victims = Victims(tmp_path / "victims")
    gw = gateway_factory(config(squatter_config(kind, victims)))
    gw.wait(WS, "ready")
    assert len(gw.call("squatter_planted")["data"]["result"]) == 2
    paths = launcher_paths(gw, WS)
    r = gw.exec(plant_command(kind, paths, victims))
    assert r["exit_code"] == 0, r

    for sandbox in (WS, "squatter"):
        before = gw.status(sandbox)["pid"]
        resp = gw.request(op="restart", sandbox=sandbox, timeout=60)
        assert resp["ok"] and resp["data"]["state"] == "ready", resp
        assert gw.status(sandbox)["pid"] != before
        victims.assert_untouched()
        assert_gate_is_private(gw, sandbox)
    # From inside, the gate can be read but not changed.
    r = gw.exec(f"echo x > {GATE} || rm -f {GATE} || echo refused; cat {GATE} >/dev/null && echo readable")
    assert "refused" in r["output"] and "readable" in r["output"], r
    victims.assert_untouched()
    stop_bounded(gw)
    victims.assert_untouched()


def log_size(c: Any) -> int:
    c.reload()
    return os.stat(c.attrs["LogPath"]).st_size


def test_a_stdout_flood_does_not_fill_the_hosts_disk(gateway_factory: Any) -> None:
    cfg = config()
    cfg["plugins"]["entries"]["squatter"]["sandbox"] = {"callTimeoutSeconds": 300}
    # A supervisor busy reading 400 MiB on a loaded machine may answer heartbeats
    # late; a restart would take the flooded container (and its log) away unseen.
    cfg["sandbox"].update(heartbeatTimeoutSeconds=5, heartbeatMisses=10)
    gw = gateway_factory(cfg)
    gw.wait(WS, "ready")
    plugin, ws = container_of(gw, "squatter"), container_of(gw, WS)
    pids = {sb: gw.status(sb)["pid"] for sb in ("squatter", WS)}

    # The plugin's own stdout, 200 MiB.
    r = gw.call("squatter_flood", {"mb": 200}, timeout=300)
    assert r["ok"] and r["data"]["result"] == f"wrote {200 * 1024 * 1024} bytes", r
    # An exec command past the exec output cap: straight into the host's stdout.
    r = gw.exec("head -c 209715200 /dev/zero | tr '\\0' y > /proc/$PPID/fd/1; echo wrote", timeout=300)
    assert r["exit_code"] == 0 and r["output"] == "wrote\n", r

    assert gw.proc.poll() is None
    assert {sb: gw.status(sb)["pid"] for sb in ("squatter", WS)} == pids, gw.supervisor_log()[-3000:]
    for c in (plugin, ws):
        assert log_size(c) < 2 * 1024 * 1024
        assert c.attrs["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": {"max-file": "1", "max-size": "1m"}}
    assert gw.call("squatter_planted")["ok"]
    assert gw.exec("echo alive")["output"] == "alive\n"
    # What the supervisor keeps is bounded on its side (tests/test_docker.py).
    assert (gw.state / "logs" / "squatter.log").stat().st_size < 32 * 1024 * 1024


def test_containers_die_with_a_sigkilled_supervisor(gateway_factory: Any) -> None:
    gw = gateway_factory(config(plugins=[SQUATTER, PLUGINS / "basics"]))
    gw.wait(WS, "ready")
    assert {c.labels[LABEL] for c in containers(gw.state)} == {WS, "squatter", "basics"}
    [warden] = gw.warden_pids()

    gw.proc.kill()
    gw.proc.wait(10)
    # The warden removes them and leaves: its exit is the event to wait on (bounded
    # by its own deadline on the engine, 15 s).
    assert wait_gone([warden], timeout=40) == []
    assert containers(gw.state) == []


def test_containers_of_a_supervisor_and_warden_both_killed_go_at_the_next_start(gateway_factory: Any, state_dir: Path) -> None:
    """Where even the warden could not act, the next start on that state directory
    sweeps them up (DockerLauncher.remove_stale)."""
    gw = gateway_factory(config())
    gw.wait(WS, "ready")
    old = {c.id for c in containers(state_dir)}
    assert len(old) == 2
    [warden] = gw.warden_pids()
    # The warden first, so that it never sees its pipe close.
    os.kill(warden, signal.SIGKILL)
    assert wait_gone([warden]) == []
    gw.proc.kill()
    gw.proc.wait(10)
    assert {c.id for c in containers(state_dir)} == old

    gw2 = gateway_factory(config())
    gw2.wait(WS, "ready")
    now = containers(state_dir)
    assert len(now) == 2 and not old & {c.id for c in now}
    assert "left by a supervisor that is gone" in gw2.supervisor_log()


def test_the_warden_is_bounded_when_the_engine_does_not_answer(tmp_path: Path) -> None:
    """An engine that accepts and never answers must not keep the warden alive."""
    import socket

    from clawsup.sandbox.launch import warden

    path = tmp_path / "mute.sock"
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(path))
    mute.listen(16)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", warden.__file__],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"DOCKER_HOST": f"unix://{path}"},
        )
        assert proc.stdin is not None
        proc.stdin.write(b"add-container clawsup-x-000000\nadd-container ../../etc\n")
        proc.stdin.close()
        proc.wait(warden.CONTAINER_DEADLINE_S + 10)
        conn, _ = mute.accept()
        # Only the well-formed name was asked for.
        assert conn.recv(4096).startswith(b"DELETE /containers/clawsup-x-000000?force=1")
        conn.close()
        with pytest.raises(BlockingIOError):
            mute.setblocking(False)
            mute.accept()
    finally:
        mute.close()
