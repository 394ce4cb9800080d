"""The docker backend with plugins: the faults an operator meets (a crash, a hang, a
memory bomb, a fork bomb, an output flood), containment from the attacker's side, and
no container left behind after the supervisor is killed."""

from __future__ import annotations

from typing import Any

import docker
import pytest

from clawsup.sandbox.launch.container import STATE_LABEL
from tests.conftest import PLUGINS, Gateway, make_config, require_docker, require_kernel_limits


@pytest.fixture(autouse=True)
def _engine() -> None:
    require_docker()


def docker_config(chaos: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    cfg = make_config(sandbox__defaults__backend="docker", **overrides)
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    cfg["plugins"]["entries"]["chaos"] = chaos or {"sandbox": {"restart": {"backoffInitialSeconds": 30, "backoffMaxSeconds": 30}}}
    return cfg


def containers(gw: Gateway) -> list[Any]:
    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": f"{STATE_LABEL}={gw.state}"})
    finally:
        client.close()


def assert_after_death(gw: Gateway, error: dict[str, Any], *, why: str) -> None:
    assert gw.call("echo", {"text": "still here"})["data"]["result"] == "still here"
    assert gw.wait("chaos", "backoff") == "backoff"
    assert not [t for t in gw.tools() if t.startswith("chaos_")]
    assert error["code"] in ("sandbox_died", "tool_timeout"), error
    assert why in gw.log("chaos")


def test_crash(gateway_factory: Any) -> None:
    gw = gateway_factory(docker_config())
    resp = gw.call("chaos_crash", {"how": "segfault"}, timeout=30)
    assert "SIGSEGV" in resp["error"]["message"]
    assert_after_death(gw, resp["error"], why="was killed by SIGSEGV")


def test_hang(gateway_factory: Any) -> None:
    gw = gateway_factory(docker_config())
    resp = gw.call("chaos_hang", timeout=1)
    assert_after_death(gw, resp["error"], why="killing pid")


def test_memory_bomb_is_oom_killed_with_the_reason(gateway_factory: Any) -> None:
    gw = gateway_factory(docker_config({"sandbox": {"memoryMb": 128, "restart": {"backoffInitialSeconds": 30}}}))
    resp = gw.call("chaos_alloc", timeout=60)
    assert "memory limit" in resp["error"]["message"]
    assert_after_death(gw, resp["error"], why="was killed by SIGKILL (memory limit)")


def test_fork_bomb_is_held_by_the_pids_limit(gateway_factory: Any) -> None:
    require_kernel_limits("a fork bomb")
    gw = gateway_factory(docker_config({"sandbox": {"maxProcesses": 32, "cpus": 0.5, "restart": {"backoffInitialSeconds": 30}}}))
    [chaos] = [c for c in containers(gw) if c.labels["clawsup.sandbox"] == "chaos"]
    assert chaos.attrs["HostConfig"]["PidsLimit"] == 32 and chaos.attrs["HostConfig"]["NanoCpus"] == 500_000_000
    resp = gw.call("chaos_forkbomb", timeout=3)
    assert not resp["ok"]
    assert_after_death(gw, resp["error"], why="killing pid")
    # The bomb went with its container: nothing of it is left on the machine.
    assert [c.labels["clawsup.sandbox"] for c in containers(gw)] == ["basics"]


def test_output_flood(gateway_factory: Any) -> None:
    gw = gateway_factory(docker_config())
    resp = gw.call("chaos_flood", {"mb": 8, "stream": "both"}, timeout=60)
    assert resp["ok"], resp
    assert gw.call("echo", {"text": "x"})["ok"]
    log = gw.state / "logs" / "chaos.log"
    assert "flood flood" in log.read_text() and log.stat().st_size < 12 * 1024 * 1024


def test_the_container_is_locked_down(gateway_factory: Any) -> None:
    gw = gateway_factory(docker_config())
    probe = gw.call("chaos_probe", {"attempt": [["write", "/etc/pwned"], ["connect", "/var/run/docker.sock"], ["read", str(gw.state / "run" / "control.sock")]]})
    assert probe["ok"], probe
    r = probe["data"]["result"]
    assert r["uid"] != 0
    assert not [a for a in r["attempts"] if a.startswith("ok")], r["attempts"]
    [c] = [c for c in containers(gw) if c.labels["clawsup.sandbox"] == "chaos"]
    hc = c.attrs["HostConfig"]
    assert hc["ReadonlyRootfs"] is True and hc["CapDrop"] == ["ALL"] and "no-new-privileges" in hc["SecurityOpt"]
    assert hc["NetworkMode"] == "none"
