"""The sandbox is the wall: destructive commands that the blocklist lets through
(interpreters, variables, encodings, links, moving things out) run for real in a
bwrap workspace sandbox, through the exec tool, and change nothing outside it.

Each command is first shown to pass the screen, so that what stops it is the
sandbox. Then: a sentinel outside the workspace survives (one the sandbox can see
read-only, one in the supervisor's state directory, one in the host's /tmp), a
secret in the supervisor's environment is not visible, neither is the supervisor's
process, the network is unreachable, and the gateway goes on answering."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.supervisor.tools.exec_screen import ExecScreen
from tests.conftest import Gateway, require_backend, require_bwrap, workspace_config

SECRET = f"s3cr3t-{uuid.uuid4().hex}"
PY = "python3"  # on PATH in every sandbox (bwrap binds the interpreter; the image has its own)


@pytest.fixture(scope="module")
def sentinels() -> Iterator[dict[str, Path]]:
    visible = Path("/usr/local/share") / f"clawsup-sentinel-{uuid.uuid4().hex[:8]}"
    visible.mkdir(parents=True)
    (visible / "keep.txt").write_text("keep\n")
    hosttmp = Path(tempfile.mkdtemp(prefix="clawsup-hosttmp-"))
    (hosttmp / "keep.txt").write_text("keep\n")
    yield {"visible": visible, "hosttmp": hosttmp}
    shutil.rmtree(visible, ignore_errors=True)
    shutil.rmtree(hosttmp, ignore_errors=True)


@pytest.fixture(params=["bwrap", "docker"])
def gw(request: pytest.FixtureRequest, module_gateways: Any) -> Gateway:
    require_backend(request.param)
    cfg = workspace_config(request.param, plugins={"load": {"paths": [str(Path(__file__).parent.parent / "plugins" / "basics")]}})
    g: Gateway = module_gateways(request.param, cfg, env={"CLAWSUP_TEST_SECRET": SECRET})
    g.backend = request.param  # type: ignore[attr-defined]
    g.wait("workspace-main", "ready")
    if not (g.state / "sentinel.txt").exists():
        (g.state / "sentinel.txt").write_text("keep\n")
    return g


def slips_through(command: str) -> str:
    v = ExecScreen.build().check(command)
    assert v.allowed, f"the screen refused {command!r} ({v}); this test needs one that slips past it"
    return command


def attacks(s: dict[str, Path], state: Path) -> list[str]:
    vis, tmp = s["visible"], s["hosttmp"]
    targets = f"{vis} {tmp} {state}"
    encoded = base64.b64encode(f"rm -rf {targets}; echo pwned > {vis}/keep.txt".encode()).decode()
    return [
        f"$(echo rm) -rf {targets}",
        f"X=rm; $X -r -f {targets}",
        f"{PY} -c 'import shutil,sys; [shutil.rmtree(p, ignore_errors=True) for p in sys.argv[1:]]' {targets}",
        f"{PY} -c 'open(\"{vis}/keep.txt\", \"w\").write(\"pwned\")'",
        f"echo {encoded} | base64 -d | sh",
        "printf '%s' 'cm0gLXJmIC0tbm8tcHJlc2VydmUtcm9vdCAv' | base64 -d | sh",  # rm -rf --no-preserve-root /
        f"ln -s {vis} link; rm -rf link/ link/*; ln -s {vis}/keep.txt kl; echo pwned > kl",
        f"cd / && cd .. && mv {vis} /workspace/stolen; mv {vis}/keep.txt /workspace/",
        f"cp /etc/hostname {vis}/ 2>&1; touch {vis}/new; chmod 777 {vis}",
        "f=find; $f / -xdev -mindepth 1 -delete 2>/dev/null; true",
        "d=dd; $d if=/dev/zero of=/dev/sda bs=1k count=1; ls /dev",
    ]


def test_destructive_commands_that_pass_the_screen_are_contained(gw: Gateway, sentinels: dict[str, Path]) -> None:
    for command in attacks(sentinels, gw.state):
        r = gw.exec(slips_through(command), timeout=60)
        assert not r["timed_out"], (command, r)
    assert (sentinels["visible"] / "keep.txt").read_text() == "keep\n"
    assert sorted(os.listdir(sentinels["visible"])) == ["keep.txt"]
    assert (sentinels["hosttmp"] / "keep.txt").read_text() == "keep\n"
    assert (gw.state / "sentinel.txt").read_text() == "keep\n"
    assert (gw.state / "clawsup.json").exists()
    # The gateway answers, and the workspace sandbox is still serving.
    assert gw.call("echo", {"text": "still here"})["data"]["result"] == "still here"
    assert gw.exec("echo alive")["output"] == "alive\n"


def test_killing_everything_it_can_costs_only_the_sandbox(gw: Gateway) -> None:
    resp = gw.call("exec", {"command": slips_through("k=kill; $k -9 -1")})
    # The command took its own host with it: the caller is told, the gateway lives,
    # and the sandbox comes back.
    assert not resp["ok"] and resp["error"]["code"] == "sandbox_died", resp
    assert gw.call("echo", {"text": "x"})["ok"]
    gw.wait("workspace-main", "ready")
    assert gw.exec("echo back")["output"] == "back\n"
    assert "killed by SIGKILL" in gw.log("workspace-main")


def test_supervisor_secret_and_process_are_invisible(gw: Gateway) -> None:
    assert SECRET in (Path(f"/proc/{gw.proc.pid}/environ").read_bytes().decode(errors="replace"))
    r = gw.exec(
        f"env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rs {SECRET[:10]} /proc/*/environ /workspace /tmp; "
        f"cat /proc/{gw.proc.pid}/environ 2>&1; echo; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '; echo; ps -eo pid,user,args"
    )
    out = r["output"]
    assert SECRET not in out and SECRET[:10] not in out.replace(f"grep -rs {SECRET[:10]}", "")
    assert "clawsup.supervisor.control.cli" not in out and "warden" not in out
    pids = [int(p) for p in gw.exec("ls /proc | grep -E '^[0-9]+$'")["output"].split()]
    # Its own few processes only (the numbers grow with each command, so count them).
    assert len(pids) < 10, f"the sandbox sees more than its own few processes: {pids}"


def test_no_privileges_inside(gw: Gateway) -> None:
    out = gw.exec("id -u; grep -E 'CapEff|CapPrm|NoNewPrivs' /proc/self/status")["output"]
    if gw.backend == "docker":  # type: ignore[attr-defined]
        # The engine's own socket is not there to be reached.
        r = gw.exec("ls -l /var/run/docker.sock /run/docker.sock 2>&1; python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('/var/run/docker.sock')\" 2>&1 | tail -1")
        assert "No such file" in r["output"], r
        r = gw.exec("touch /usr/x /etc/x 2>&1; true")
        assert r["output"].count("Read-only file system") == 2, r
    uid, *caps = out.splitlines()
    if os.geteuid() == 0:
        assert int(uid) != 0, "a root supervisor's sandbox must not run as root"
    assert "CapEff:\t0000000000000000" in caps and "CapPrm:\t0000000000000000" in caps
    assert "NoNewPrivs:\t1" in caps
    control = gw.state / "run" / "control.sock"
    r = gw.exec(f"test -e {control} && echo visible || echo hidden; ls {gw.state} 2>&1 | head -3")
    assert r["output"].startswith("hidden"), r


def test_network_is_unreachable(gw: Gateway) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        probe = (
            f"{PY} -c \"import socket\n"
            f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
            f"  try:\n    socket.create_connection(addr, timeout=3); print('CONNECTED', addr)\n"
            f"  except OSError as e:\n    print('refused', addr, e)\"; cat /proc/net/dev"
        )
        out = gw.exec(probe, timeout=30)["output"]
        assert "CONNECTED" not in out, out
        with pytest.raises(BlockingIOError):
            listener.accept()
    interfaces = [line.split(":")[0].strip() for line in out.splitlines() if ":" in line and "|" not in line and "refused" not in line]
    assert interfaces == ["lo"], out


def test_network_comes_back_only_when_asked_for(module_gateways: Any) -> None:
    require_bwrap()
    host_ifaces = {line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]}
    cfg = workspace_config("bwrap")
    cfg["agents"]["defaults"]["sandbox"]["network"] = True
    g: Gateway = module_gateways("bwrap-net", cfg)
    g.wait("workspace-main", "ready")
    out = g.exec("cat /proc/net/dev")["output"]
    inside = {line.split(":")[0].strip() for line in out.splitlines()[2:]}
    assert inside == host_ifaces, (inside, host_ifaces)
