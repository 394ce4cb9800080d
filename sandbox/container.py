"""The `docker` backend: the sandbox host in a hardened container, through the
`docker` SDK (so `DOCKER_HOST` can point at another engine).

Each child is one container of the image scripts/build-sandbox-image built for this
very runtime (the tag carries its hash; a missing image is an error that says how to
build it). Defaults: no network unless the manifest asks; a read-only root with a
tmpfs /tmp; every capability dropped and no-new-privileges; a non-root user (the
sandbox's own uid when the supervisor is root); memory, pids and CPU limits; the
workspace bound read-write at /workspace and the socket folder at its own path, so
gRPC travels over the same unix socket as with the other backends; labels that say
whose it is; a small cap on the engine's own log of the container (LOG_CONFIG).

The start gate arrives as a file (no fd crosses into a container). The socket folder
is the child's to write, so every name in it is hostile (a symlink, a FIFO): the
gate lives instead in the sandbox's private folder, which only the supervisor writes
(LaunchSpec.private_dir). It is created there without following or blocking, given
to the child's uid by fd, 0400, bind-mounted read-only at GATE, and removed by the
supervisor when the child is closed and before the next launch.
tests/test_docker_hostile.py.

Death is noticed by the engine's wait (a thread blocked on it, no polling); the
container's output is streamed into pipes through an attach made before the
container starts, so the supervisor reads all of it (the handshake first) whatever
the engine's log keeps. The supervisor's warden (sandbox/warden.py) is told each
container's name before it is created, and removes those still listed if the
supervisor dies, even by SIGKILL. Supervisor-side code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import stat
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
from loguru import logger

from sandbox.image import image_tag
from sandbox.launcher import Child, ChildUser, ExitStatus, LaunchSpec
from sandbox.protected import docker_volumes
from sandbox.process import Warden, _give, chown_dir

LABEL = "clawsup.sandbox"
STATE_LABEL = "clawsup.state-dir"
WORKSPACE = "/workspace"
PLUGIN = "/plugin"
NANO = 1_000_000_000
GATE = "/run/clawsup/gate"
"""Where the start gate appears in the container, read-only."""
GATE_NAME = "gate"
"""Its name in the private folder."""
# What the engine itself keeps of a container's output, on the host's disk. The
# supervisor does not read it (it attaches before the start), so it can be tiny: one
# file of 1 MiB, truncated when full. A flood of 200 MiB once left a 224 MB file.
LOG_CONFIG = docker.types.LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"})


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

    def __init__(self, client: docker.DockerClient, container: Any, socket_path: str, output: Any, gate: _Gate, warden: Warden) -> None:
        """`output`: the attach stream, made before the container started. Owned by
        the launch until close() removes the container, the gate and the warden's
        entry."""
        self._client = client
        self.container = container
        self.socket_path = socket_path
        self._gate = gate
        self._warden = warden
        self._name = container.name
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
        threading.Thread(target=self._pump_output, args=(output, out_w, err_w), daemon=True, name=f"logs {self.container_id}").start()
        threading.Thread(target=self._wait, daemon=True, name=f"wait {self.container_id}").start()

    def _pump_output(self, output: Any, out_w: int, err_w: int) -> None:
        try:
            for out, err in output:
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
        self._gate.remove()
        self._warden.forget_container(self._name)


class _Gate:
    """The start gate of one launch, in the sandbox's private folder. Created by
    DockerLauncher, removed by the ContainerChild's close() (or the failed launch)."""

    def __init__(self, private_dir: Path) -> None:
        self.dir = private_dir
        self.path = private_dir / GATE_NAME
        self._ident: tuple[int, int] | None = None

    def _open_dir(self) -> int:
        """The private folder, refused unless only we can write it: the gate must never
        be created where the child (or anyone else) could have planted a name."""
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            os.close(fd)
            raise PermissionError(
                f"{self.dir} holds the docker start gate and must be a directory that only the supervisor's "
                f"user writes (it is owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it and start again"
            )
        return fd

    def write(self, payload: bytes, uid: int, gid: int) -> None:
        dfd = self._open_dir()
        try:
            _unlink_at(dfd, GATE_NAME)
            # Never follows, never blocks (a FIFO), never reuses: only a fresh file.
            fd = os.open(GATE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o400, dir_fd=dfd)
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o400)
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view) :]
                st = os.fstat(fd)
                self._ident = (st.st_dev, st.st_ino)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)

    def remove(self) -> None:
        """Only the file this launch created: a later launch's gate is not ours."""
        if self._ident is None:
            return
        with contextlib.suppress(OSError):
            dfd = self._open_dir()
            try:
                st = os.stat(GATE_NAME, dir_fd=dfd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == self._ident:
                    os.unlink(GATE_NAME, dir_fd=dfd)
            finally:
                os.close(dfd)
        self._ident = None


def _unlink_at(dfd: int, name: str) -> None:
    """Remove a leftover (a gate from an incarnation whose close never ran); unlink
    takes the name itself, whatever it is, and follows nothing."""
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        os.rmdir(name, dir_fd=dfd)


class DockerLauncher:
    name = "docker"

    def __init__(self, state_dir: Path, warden: Warden | None = None) -> None:
        """`warden`: the supervisor's, shared with its other launchers (its owner closes
        it); by default the launcher has its own."""
        self._client = docker.from_env(timeout=60)
        self._image = image_tag()
        self._state = str(state_dir)
        self._owns_warden = warden is None
        self._warden = warden or Warden()
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
        if spec.private_dir is None:
            raise ValueError(f"{spec.sandbox_id}: the docker backend needs the sandbox's private folder for its start gate (LaunchSpec.private_dir)")
        socket_path = str(spec.run_dir / "host.sock")
        u = spec.run_as
        if spec.operator_workspace and os.geteuid() == 0:
            # The operator's own folder is never handed to another uid (the whole tree
            # once went to nobody): the container runs as the folder's owner, and never
            # as root.
            st = os.stat(spec.workspace)
            if st.st_uid == 0:
                raise OSError(
                    f"{spec.workspace} belongs to root, and a container never runs as root: run this as the folder's "
                    "owner, or use the bwrap backend"
                )
            u = ChildUser(f"uid {st.st_uid}", st.st_uid, st.st_gid)
        if u is None and os.geteuid() == 0:
            # Never root in a container. A root gateway always names the sandbox's own
            # uid (sandbox/uids.py); a caller that does not (scripts/bench.py) gets nobody.
            u = ChildUser("nobody", 65534, 65534)
        uid, gid = (u.uid, u.gid) if u is not None else (os.getuid(), os.getgid())
        if u is not None:
            if not spec.operator_workspace:
                _give(spec.workspace, u)
            chown_dir(spec.run_dir, u.uid, u.gid)
        gate = _Gate(spec.private_dir)
        rlimits = {"RLIMIT_CORE": 0, "RLIMIT_CPU": spec.limits.cpu_seconds, "RLIMIT_NOFILE": spec.limits.max_open_files, "RLIMIT_FSIZE": spec.limits.max_file_size_bytes}
        gate.write(dataclasses.replace(spec.gate, run_as=None, rlimits=rlimits).encode(), uid, gid)
        volumes = {
            str(spec.workspace): {"bind": WORKSPACE, "mode": "rw"},
            str(spec.run_dir): {"bind": str(spec.run_dir), "mode": "rw"},
            # The file alone, not its folder: nothing else the supervisor keeps there
            # is the child's to see.
            str(gate.path): {"bind": GATE, "mode": "ro"},
        }
        if spec.plugin_dir is not None:
            volumes[str(spec.plugin_dir)] = {"bind": PLUGIN, "mode": "ro"}
        env = {**spec.env, "HOME": WORKSPACE, "TMPDIR": "/tmp", "PATH": "/usr/local/bin:/usr/bin:/bin"}
        command = [
            "--plugin-dir", PLUGIN if spec.plugin_dir is not None else "",
            "--socket", socket_path,
            "--gate-file", GATE,
            "--parent-pid", "1",
            "--workdir", WORKSPACE,
        ]  # fmt: skip
        name = f"clawsup-{spec.sandbox_id}-{os.urandom(3).hex()}"
        self._warden.watch_container(name)
        container = output = None
        try:
            container = self._client.containers.create(
                self._image,
                command=command,
                init=True,
                user=f"{uid}:{gid}",
                network_mode="bridge" if spec.network else "none",
                read_only=True,
                # The child's own /tmp and /dev/shm, each limited to tmp_bytes.
                tmpfs={"/tmp": f"rw,nosuid,nodev,size={spec.limits.tmp_bytes},mode=1777"},
                shm_size=spec.limits.tmp_bytes,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit=spec.limits.memory_bytes,
                memswap_limit=spec.limits.memory_bytes,
                pids_limit=spec.limits.max_processes,
                nano_cpus=int(spec.limits.cpus * NANO),
                # Protected paths read-only over the workspace (sandbox/protected.py).
                volumes={**volumes, **docker_volumes(spec.workspace, spec.protected_paths, WORKSPACE)},
                environment=env,
                labels={LABEL: spec.sandbox_id, STATE_LABEL: self._state},
                log_config=LOG_CONFIG,
                name=name,
            )
            # Attached before it starts, so the stream holds its output from the first
            # byte (the handshake), while the engine's capped log may have lost it.
            output = container.attach(stdout=True, stderr=True, stream=True, logs=False, demux=True)
            container.start()
            return ContainerChild(self._client, container, socket_path, output, gate, self._warden)
        except BaseException:
            if output is not None:
                with contextlib.suppress(Exception):
                    output.close()
            if container is not None:
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
            gate.remove()
            self._warden.forget_container(name)
            raise

    def close(self) -> None:
        self._client.close()
        if self._owns_warden:
            self._warden.close()
