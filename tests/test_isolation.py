"""What a child can see and do, checked from inside the child. The process backend
is not a security boundary (see the README); these tests prove the limits it does
promise, and that the supervisor's secrets do not leak into children."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clawsup.v1 import host_pb2, host_pb2_grpc
from clawsup.sandbox.launch.cgroup import CgroupRoot
from clawsup.sandbox.handshake import GatePayload
from clawsup.sandbox.launch.launcher import Limits, LaunchSpec, MiB
from clawsup.sandbox.launch.process import ADDRESS_SPACE_HEADROOM, ProcessLauncher
from clawsup.supervisor.sandboxes.host_client import HostAuthError, HostClient
from tests.conftest import PLUGINS, make_config, cgroups_available


def chaos_gateway(gateway_factory, env=None):
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    cfg["plugins"]["entries"]["chaos"] = {"sandbox": {"memoryMb": 200, "cpuSeconds": 77, "maxOpenFiles": 99, "maxFileSizeMb": 3}}
    return gateway_factory(cfg, env=env)


def test_child_sees_a_scrubbed_environment(gateway_factory) -> None:
    gw = chaos_gateway(gateway_factory, env={"ANTHROPIC_API_KEY": "sk-ant-secret", "CLAWSUP_SECRET_X": "s3cret", "LANG": "C.UTF-8"})
    probe = gw.call("chaos_probe")["data"]["result"]
    env = probe["env"]
    assert "ANTHROPIC_API_KEY" not in env and "CLAWSUP_SECRET_X" not in env
    assert not any("s3cret" in v or "sk-ant" in v for v in env.values())
    assert env["LANG"] == "C.UTF-8"  # on the allowlist
    workspace = str(gw.state / "sandboxes" / "chaos" / "workspace")
    assert env["HOME"] == workspace and probe["cwd"] == workspace


def test_child_limits_session_and_stdin(gateway_factory) -> None:
    gw = chaos_gateway(gateway_factory)
    p = gw.call("chaos_probe")["data"]["result"]
    assert p["sid"] == p["pid"] and p["pgid"] == p["pid"]  # its own session and group
    assert p["ppid"] == gw.proc.pid
    assert p["stdin"] == "/dev/null"
    lim = p["limits"]
    assert lim["RLIMIT_CPU"] == 77 and lim["RLIMIT_NOFILE"] == 99 and lim["RLIMIT_FSIZE"] == 3 * MiB
    assert lim["RLIMIT_CORE"] == 0 and lim["RLIMIT_AS"] == 200 * MiB + ADDRESS_SPACE_HEADROOM
    if cgroups_available():
        assert f"clawsup-{gw.proc.pid}/chaos" in p["cgroup"]


def test_file_size_limit_holds(gateway_factory) -> None:
    gw = chaos_gateway(gateway_factory)
    resp = gw.call("chaos_write", {"name": "big.bin", "mb": 10})
    assert resp["error"]["code"] == "tool_failed" and "File too large" in resp["error"]["message"]
    assert (gw.state / "sandboxes" / "chaos" / "workspace" / "big.bin").stat().st_size <= 3 * MiB
    assert gw.call("chaos_ok")["ok"]


def test_host_refuses_calls_without_the_token(gateway_factory) -> None:
    gw = chaos_gateway(gateway_factory)
    # As its own uid, the child's socket folder sits in the enter-only <state>/hosts.
    sock = gw.state / ("hosts" if gw.status("chaos")["uid"] is not None else "run/hosts") / "chaos" / "host.sock"
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        stub = host_pb2_grpc.HostStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.InvokeTool(host_pb2.InvokeToolRequest(name="chaos_probe", args_json="{}"), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            stub.InvokeTool(host_pb2.InvokeToolRequest(name="chaos_probe"), timeout=5, metadata=(("x-clawsup-token", "guess"),))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert gw.call("chaos_ok")["ok"]


def test_supervisor_refuses_a_host_without_the_host_token() -> None:
    """Both sides check: whatever answers on the socket must prove it is our child."""

    async def scenario() -> None:
        root = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
        (root / "ws").mkdir()
        (root / "run").mkdir(mode=0o700)
        launcher = await asyncio.to_thread(ProcessLauncher, await asyncio.to_thread(CgroupRoot.create))
        gate = GatePayload(sandbox_id="t", supervisor_token="sup-token", host_token="host-token", plugin_id="basics", plugin_version="1", entry="plugin.py", plugin_config={})
        spec = LaunchSpec(sandbox_id="t", plugin_dir=PLUGINS / "basics", workspace=root / "ws", run_dir=root / "run", limits=Limits(), env={"PATH": os.environ["PATH"]}, gate=gate)
        child = await launcher.launch(spec)
        try:
            loop = asyncio.get_running_loop()
            line: asyncio.Future[bytes] = loop.create_future()
            loop.add_reader(child.stdout_fd, lambda: line.done() or line.set_result(os.read(child.stdout_fd, 4096)))
            assert (await asyncio.wait_for(line, 30)).startswith(b"CLAWSUP|1|unix|")
            loop.remove_reader(child.stdout_fd)
            good = HostClient(child.socket_path, "sup-token", "host-token")
            assert (await good.describe(5)).plugin_id == "basics"
            impostor_check = HostClient(child.socket_path, "sup-token", "another-host-token")
            with pytest.raises(HostAuthError):
                await impostor_check.describe(5)
            await good.close()
            await impostor_check.close()
        finally:
            await child.kill_all()
            await child.wait()
            await child.aclose()
            await launcher.aclose()

    asyncio.run(scenario())


def test_plugin_cannot_shadow_the_host_runtime_from_its_workspace(gateway_factory) -> None:
    """Attacker's side: the workspace is the child's cwd and writable by the plugin.
    A planted `sandbox` package there must not run at the next start."""
    gw = chaos_gateway(gateway_factory)
    ws = gw.state / "sandboxes" / "chaos" / "workspace"
    marker = gw.state / "pwned"
    (ws / "sandbox" / "host").mkdir(parents=True)
    (ws / "sandbox" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (ws / "sandbox" / "host" / "__init__.py").write_text("")
    (ws / "sandbox" / "host" / "__main__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    resp = gw.request(op="restart", sandbox="chaos", timeout=30)
    assert resp["data"]["state"] == "ready"
    assert not marker.exists()
    assert gw.call("chaos_ok")["ok"]
