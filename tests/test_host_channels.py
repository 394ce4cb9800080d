"""A host's channel never inherits a dead host's connection (supervisor/sandboxes/host_client.py).

Hosts are dialled by descriptor, as `unix:/proc/self/fd/N`, and the supervisor reuses
descriptor numbers: after a crash the next incarnation's socket often gets the number
of the last one's. With gRPC's global subchannel pool, a channel whose host died and
whose descriptor was closed left a subchannel failing with ENOENT behind, and the next
channel to the same text was handed it: every bring-up after the crash failed, until
the supervisor restarted (a CI run: the forger's crash test, under load)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from clawsup.sandbox.socket_paths import dial_address, open_child_socket
from clawsup.supervisor.sandboxes.host_client import HostClient, HostUnreachable

SERVER = r"""
import asyncio, sys, grpc
from grpc_health.v1 import health, health_pb2_grpc
async def main(path):
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port("unix:" + path)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
asyncio.run(main(sys.argv[1]))
"""


def serve(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def test_a_new_host_on_a_reused_descriptor_number_is_reached(tmp_path: Path) -> None:
    first = serve(tmp_path / "first.sock")
    fd = open_child_socket(tmp_path / "first.sock")
    old = HostClient(dial_address(fd), "supervisor-token", "host-token")
    second: subprocess.Popen[str] | None = None
    try:
        assert await old.health(timeout=5)
        # The host dies; its descriptor is closed while its channel is still open,
        # and the channel is asked once more (a heartbeat in the window before the
        # exit is seen): gRPC makes a subchannel that now fails.
        first.kill()
        first.wait()
        os.close(fd)
        try:
            await old.health(timeout=1)
        except HostUnreachable:
            pass
        # Its reconnect attempts now fail with ENOENT: the descriptor is gone (the
        # pause is the scenario, a window the attempts fall in, not a wait for an event).
        await asyncio.sleep(0.3)
        # The next incarnation's socket, on the same descriptor number.
        second = serve(tmp_path / "second.sock")
        fd2 = open_child_socket(tmp_path / "second.sock")
        if fd2 != fd:
            os.dup2(fd2, fd)
            os.close(fd2)
        new = HostClient(dial_address(fd), "supervisor-token", "host-token")
        try:
            assert await new.health(timeout=5), "the new host answered, but not SERVING"
        finally:
            await new.close()
    finally:
        await old.close()
        os.close(fd) if _open(fd) else None
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
