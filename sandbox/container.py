"""The `docker` backend: the sandbox host in a hardened container, through the
`docker` SDK (so `DOCKER_HOST` can point at another engine).

Each child is one container of the image scripts/build-sandbox-image built for this
very runtime (the tag carries its hash; a missing image is an error that says how to
build it). Defaults: no network unless the manifest asks; a read-only root with a
tmpfs /tmp; every capability dropped and no-new-privileges; a non-root user (the
sandbox's own uid when the supervisor is root); memory, pids and CPU limits; the
workspace bound read-write at /workspace and the socket folder at its own path, so
gRPC travels over the same unix socket as with the other backends; labels that say
whose it is. The start gate arrives as a file in the socket folder (no fd crosses
into a container), which the host removes once read.

Death is noticed by the engine's wait (a thread blocked on it, no polling); the
container's output is streamed into pipes, so the supervisor reads it as it does any
child's. Supervisor-side code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors
from loguru import logger

from sandbox.image import image_tag
from sandbox.launcher import Child, ExitStatus, LaunchSpec

LABEL = "clawsup.sandbox"
STATE_LABEL = "clawsup.state-dir"
WORKSPACE = "/workspace"
PLUGIN = "/plugin"
NANO = 1_000_000_000


def docker_problem() -> str:
    """Empty when an engine answers and the image for this runtime exists."""
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as e:  # the SDK raises several kinds for "no engine"
        return f"no docker engine answers ({type(e).__name__}: {e})"
    try:
        client.images.get(image_tag())
    except docker.errors.ImageNotFound:
        return f"the sandbox image {image_tag()} is not built; run scripts/build-sandbox-image"
    finally:
        client.close()
    return ""


class ContainerChild:
    """One container. `pid` is the host pid of its init, for display only."""

    def __init__(self, client: docker.DockerClient, container: Any, socket_path: str) -> None:
        self._client = client
        self.container = container
        self.socket_path = socket_path
        container.reload()
        self.pid = int(container.attrs["State"].get("Pid") or 0)
        self.container_id = container.id[:12]
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.stdout_fd, self.stderr_fd = out_r, err_r
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        self._exit: asyncio.Future[ExitStatus] | None = None
        self._status: ExitStatus | None = None
        self._oom = False
        self._done = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        threading.Thread(target=self._pump_output, args=(out_w, err_w), daemon=True, name=f"logs {self.container_id}").start()
        threading.Thread(target=self._wait, daemon=True, name=f"wait {self.container_id}").start()

    def _pump_output(self, out_w: int, err_w: int) -> None:
        try:
            for out, err in self.container.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True):
                for fd, data in ((out_w, out), (err_w, err)):
                    if data:
                        with contextlib.suppress(OSError):
                            os.write(fd, data)
        except Exception as e:
            logger.debug("{}: output stream ended: {}", self.container_id, e)
        finally:
            os.close(out_w)
            os.close(err_w)

    def _wait(self) -> None:
        try:
            res = self.container.wait()
            code = int(res.get("StatusCode", -1))
        except Exception as e:
            logger.warning("{}: wait failed: {}", self.container_id, e)
            code = -1
        oom = False
        with contextlib.suppress(Exception):
            self.container.reload()
            oom = bool(self.container.attrs["State"].get("OOMKilled"))
        self._oom = oom
        if oom:
            status = ExitStatus(signal=9)
        elif code > 128:
            status = ExitStatus(signal=code - 128)
        else:
            status = ExitStatus(code=code)
        self._status = status
        self._done.set()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if self._exit is not None and not self._exit.done() and self._status is not None:
            self._exit.set_result(self._status)

    def _pids_limit_hit(self) -> bool:
        """The engine does not say; the container's pids cgroup does (cgroupfs
        driver, v1 or v2 layouts), where this host can read it."""
        cid = self.container.id
        for path in (f"/sys/fs/cgroup/pids/docker/{cid}/pids.events", f"/sys/fs/cgroup/docker/{cid}/pids.events", f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/pids.events"):
            with contextlib.suppress(OSError, ValueError):
                with open(path) as f:
                    for line in f:
                        key, _, value = line.partition(" ")
                        if key == "max" and int(value) > 0:
                            return True
        return False

    def wait(self) -> asyncio.Future[ExitStatus]:
        if self._exit is None:
            self._loop = asyncio.get_running_loop()
            self._exit = self._loop.create_future()
            if self._done.is_set():
                self._resolve()
        return self._exit

    @property
    def exited(self) -> bool:
        return self._done.is_set()

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(docker.errors.APIError):
            self.container.kill(signal=int(sig))

    def kill_all(self) -> None:
        with contextlib.suppress(docker.errors.APIError):
            self.container.kill()

    def diagnose(self) -> str:
        if self._oom:
            return "memory limit"
        return "process limit reached" if self._pids_limit_hit() else ""

    def rss_bytes(self) -> int | None:
        if self.exited:
            return None
        try:
            stats = self.container.stats(stream=False, one_shot=True)
            return int(stats["memory_stats"]["usage"])
        except Exception:
            return None

    def usage(self) -> dict[str, Any]:
        """For `clawsup status`: the container, its memory and its CPU time."""
        out: dict[str, Any] = {"container": self.container_id}
        with contextlib.suppress(Exception):
            st = self.container.stats(stream=False, one_shot=True)
            out["cpu_seconds"] = round(st["cpu_stats"]["cpu_usage"]["total_usage"] / NANO, 3)
            out["memory_bytes"] = int(st["memory_stats"]["usage"])
        return out

    def close(self) -> None:
        for fd in (self.stdout_fd, self.stderr_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(docker.errors.APIError):
            self.container.remove(force=True)


class DockerLauncher:
    name = "docker"

    def __init__(self, state_dir: Path) -> None:
        self._client = docker.from_env(timeout=60)
        self._image = image_tag()
        self._state = str(state_dir)
        self.remove_stale()

    def remove_stale(self) -> None:
        """Containers left by an earlier supervisor of this state directory that died
        (one supervisor per state directory holds the pidfile lock, so any found now
        are leftovers)."""
        for c in self._client.containers.list(all=True, filters={"label": f"{STATE_LABEL}={self._state}"}):
            logger.info("removing container {} ({}) left by a supervisor that is gone", c.id[:12], c.labels.get(LABEL))
            with contextlib.suppress(docker.errors.APIError):
                c.remove(force=True)

    async def launch(self, spec: LaunchSpec) -> Child:
        return await asyncio.to_thread(self._launch, spec)

    def _launch(self, spec: LaunchSpec) -> Child:
        socket_path = str(spec.run_dir / "host.sock")
        u = spec.run_as
        if u is None and os.geteuid() == 0:
            # Never root in a container: the sandbox's own uid, as for a root gateway.
            from sandbox.process import sandbox_uids

            u = sandbox_uids([spec.sandbox_id])[spec.sandbox_id]
        uid, gid = (u.uid, u.gid) if u is not None else (os.getuid(), os.getgid())
        if u is not None:
            from sandbox.process import _give

            _give(spec.workspace, u)
            os.chown(spec.run_dir, u.uid, u.gid)
        gate = spec.run_dir / "gate"
        tmp = spec.run_dir / ".gate.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(dataclasses.replace(spec.gate, run_as=None, rlimits={"RLIMIT_CORE": 0, "RLIMIT_CPU": spec.limits.cpu_seconds, "RLIMIT_NOFILE": spec.limits.max_open_files, "RLIMIT_FSIZE": spec.limits.max_file_size_bytes}).encode())
        os.chown(tmp, uid, gid)
        os.replace(tmp, gate)
        volumes = {str(spec.workspace): {"bind": WORKSPACE, "mode": "rw"}, str(spec.run_dir): {"bind": str(spec.run_dir), "mode": "rw"}}
        if spec.plugin_dir is not None:
            volumes[str(spec.plugin_dir)] = {"bind": PLUGIN, "mode": "ro"}
        env = {**spec.env, "HOME": WORKSPACE, "TMPDIR": "/tmp", "PATH": "/usr/local/bin:/usr/bin:/bin"}
        command = [
            "--plugin-dir", PLUGIN if spec.plugin_dir is not None else "",
            "--socket", socket_path,
            "--gate-file", str(gate),
            "--parent-pid", "1",
            "--workdir", WORKSPACE,
        ]  # fmt: skip
        try:
            container = self._client.containers.run(
                self._image,
                command=command,
                detach=True,
                init=True,
                user=f"{uid}:{gid}",
                network_mode="bridge" if spec.network else "none",
                read_only=True,
                tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"},
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit=spec.limits.memory_bytes,
                memswap_limit=spec.limits.memory_bytes,
                pids_limit=spec.limits.max_processes,
                nano_cpus=int(spec.limits.cpus * NANO),
                volumes=volumes,
                environment=env,
                labels={LABEL: spec.sandbox_id, STATE_LABEL: self._state},
                name=f"clawsup-{spec.sandbox_id}-{os.urandom(3).hex()}",
            )
        except docker.errors.DockerException:
            with contextlib.suppress(OSError):
                gate.unlink()
            raise
        return ContainerChild(self._client, container, socket_path)

    def close(self) -> None:
        self._client.close()
