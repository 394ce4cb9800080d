"""The `docker` backend: the sandbox host in a hardened container, through the
`docker` SDK (so `DOCKER_HOST` can point at another engine).

Each child is one container of the image scripts/build-sandbox-image built for this
very runtime (the tag carries its hash; a missing image is an error that says how to
build it). Defaults: no network unless the manifest asks; a read-only root with a
tmpfs /tmp; every capability dropped and no-new-privileges; a non-root user (the
sandbox's own uid when the supervisor is root); memory, pids and CPU limits; the
workspace bound read-write at /workspace and the socket folder at its own path, so
gRPC travels over the same unix socket as with the other backends; an MCP server's
install (LaunchSpec.visible_paths) read-only at its own paths; labels that say
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
the engine's log keeps. The supervisor's warden (sandbox/launch/warden.py) is told each
container's name before it is created, and removes those still listed if the
supervisor dies, even by SIGKILL. Supervisor-side code.

Every engine call is blocking HTTP, so none runs on the supervisor's event loop: they
go to the launcher's own small pool of threads (ENGINE_THREADS, so that a slow engine
holds up engine calls, not the loop's other worker threads). `clawsup status` asks
`usage()`, which returns the last sample and starts a new one at most once a second
(USAGE_MAX_AGE_S). The SDK's client is shared by these threads, as it already was by
the wait and output threads: its transport is a urllib3 pool, which is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import stat
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import docker
import requests
import docker.errors
import docker.types
from loguru import logger

from clawsup.sandbox.launch.bwrap import SYSTEM_DIRS, visible_binds
from clawsup.sandbox.launch.image import image_tag
from clawsup.sandbox.launch.launcher import Backend, Child, ChildUser, ExitStatus, LaunchSpec, cleanup_in_thread, in_thread, outlast
from clawsup.sandbox.protected import docker_volumes
from clawsup.sandbox.launch.process import Warden, _give, chown_dir

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
ENGINE_THREADS = 8
"""Engine calls at once from one launcher (launch steps, kills, stats, removals)."""
SAMPLE_THREADS = 2
"""Usage samples at once, apart from the engine calls that launch and kill."""
USAGE_MAX_AGE_S = 1.0
"""A container's usage sample is taken at most this often, however often status asks."""
FIRST_SAMPLE_WAIT_S = 2.0
"""The most a status poll waits for a container's first sample (later polls get the
last one at once)."""
KILL_NOW_WAIT_S = 5.0
"""The most `kill_all_now` waits for the engine's answer."""
POOL_SIZE = 64
"""Engine connections kept: each container holds two for its life (its wait and its
output stream), and the SDK's default of 10 discards connections with a warning."""


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
    """One container. `pid` is the host pid of its init, for display only. Created in a
    worker thread by DockerLauncher.launch (it asks the engine); owned by the
    supervisor's incarnation, released by `aclose()`."""

    def __init__(
        self, client: docker.DockerClient, container: Any, socket_path: str, output: Any, gate: _Gate, warden: Warden, engine: Executor,
        sampler: Executor | None = None,
    ) -> None:
        """`output`: the attach stream, made before the container started. Owned by
        the launch until aclose() removes the container, the gate and the warden's
        entry. `engine`: the launcher's threads for engine calls."""
        self._client = client
        self.container = container
        self.socket_path = socket_path
        self._gate = gate
        self._warden = warden
        self._engine = engine
        self._sampler = sampler or engine
        """Usage samples have threads of their own: a slow engine answering stats
        must not queue a kill behind them."""
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
        self._closed = False
        self._sample: dict[str, Any] | None = None
        self._sample_started = -USAGE_MAX_AGE_S
        self._sampling: asyncio.Future[None] | None = None
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

    async def signal_group(self, sig: int) -> None:
        if self.exited:
            return
        await in_thread(lambda: self._kill(sig), executor=self._engine)

    def _kill(self, sig: int | None = None) -> None:
        # An engine that answers with an error, or not at all (requests' connection
        # errors and timeouts): the container's death is then the warden's to see to.
        with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
            if sig is None:
                self.container.kill()
            else:
                self.container.kill(signal=int(sig))

    async def kill_all(self) -> None:
        # Once the container's init has exited, the kernel has killed everything in
        # its pid namespace: nothing to ask the engine.
        if self.exited:
            return
        await in_thread(self._kill, executor=self._engine)

    def kill_all_now(self) -> None:
        """Sync, for a `finally` that cannot await (see clawsup.sandbox.launch.launcher.Child): the
        kill is asked in a thread and waited for at most KILL_NOW_WAIT_S; the warden
        removes the container if this process is on its way out anyway."""
        if self.exited:
            return
        t = threading.Thread(target=self._kill, daemon=True, name=f"kill {self.container_id}")
        t.start()
        t.join(KILL_NOW_WAIT_S)

    async def diagnose(self) -> str:
        if self._oom:
            return "memory limit"
        return "process limit reached" if await in_thread(self._pids_limit_hit) else ""

    def rss_bytes(self) -> int | None:
        """From the last usage sample (no engine call here)."""
        if self.exited or self._sample is None:
            return None
        value = self._sample.get("memory_bytes")
        return value if isinstance(value, int) else None

    async def usage(self) -> dict[str, Any]:
        """For `clawsup status`: the container, its memory and its CPU time, from the
        last sample; a new one is started when that is older than USAGE_MAX_AGE_S
        and none is in flight. Only the very first poll waits, for the first sample,
        at most FIRST_SAMPLE_WAIT_S."""
        out: dict[str, Any] = {"container": self.container_id}
        if self.exited or self._closed:
            return out
        now = time.monotonic()
        if now - self._sample_started >= USAGE_MAX_AGE_S and (self._sampling is None or self._sampling.done()):
            self._sample_started = now
            with contextlib.suppress(RuntimeError):  # the launcher's pool is shut down
                self._sampling = asyncio.get_running_loop().run_in_executor(self._sampler, self._take_sample)
        if self._sample is None and self._sampling is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FIRST_SAMPLE_WAIT_S):
                    await asyncio.shield(self._sampling)
        return {**out, **(self._sample or {})}

    def _take_sample(self) -> None:
        sample: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            st = self.container.stats(stream=False, one_shot=True)
            sample["cpu_seconds"] = round(st["cpu_stats"]["cpu_usage"]["total_usage"] / NANO, 3)
            sample["memory_bytes"] = int(st["memory_stats"]["usage"])
        self._sample = sample

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (self.stdout_fd, self.stderr_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        await cleanup_in_thread(self._remove, executor=self._engine)

    def _remove(self) -> None:
        # Force: a container still running is killed first. Its wait and output
        # threads end with it.
        self._gate.remove()
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except Exception as e:
            # The warden keeps it listed, and removes it when the supervisor goes;
            # the next supervisor's stale sweep, at the latest.
            logger.warning("{}: could not remove container {}: {}", self.container_id, self._name, e)
            return
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
    """Starts containers. Created by the gateway (or `clawsup exec run`); its
    constructor asks the engine (the client's version, the stale sweep), so the
    caller runs it in a worker thread. `aclose()` once its children are closed."""

    name: ClassVar[Backend] = "docker"

    def __init__(self, state_dir: Path, warden: Warden | None = None) -> None:
        """`warden`: the supervisor's, shared with its other launchers (its owner closes
        it); by default the launcher has its own."""
        self._client = docker.from_env(timeout=60, max_pool_size=POOL_SIZE)
        self._image = image_tag()
        self._state = str(state_dir)
        self._owns_warden = warden is None
        self._warden = warden or Warden()
        self._engine = ThreadPoolExecutor(ENGINE_THREADS, thread_name_prefix="docker engine")
        self._sampler = ThreadPoolExecutor(SAMPLE_THREADS, thread_name_prefix="docker stats")
        self.checkpoint: Callable[[str], Awaitable[None]] | None = None
        """Awaited between the steps of a launch with the next step's name
        ("prepare", "create", "attach", "start", "return"): where
        tests/test_launchers.py cancels a launch midway. None in service."""
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
        # Each step in a worker thread (the chown walk in the loop's pool, engine
        # calls in ours); `_ContainerStart` records what each one made, so that a
        # failure or a cancellation anywhere removes exactly that.
        start = _ContainerStart(self, spec)
        try:
            await self._at("prepare")
            await in_thread(start.prepare)
            await self._at("create")
            await in_thread(start.create, executor=self._engine)
            await self._at("attach")
            await in_thread(start.attach, executor=self._engine)
            await self._at("start")
            await in_thread(start.start, executor=self._engine)
            await self._at("return")
            return await in_thread(start.child, executor=self._engine)
        except BaseException as e:
            fut = asyncio.get_running_loop().run_in_executor(self._engine, start.undo)
            cancelled = await outlast(fut)
            if not fut.cancelled() and (err := fut.exception()) is not None:
                logger.opt(exception=err).error("{}: removing container {} after a failed launch failed", spec.sandbox_id, start.name)
            if cancelled and not isinstance(e, asyncio.CancelledError):
                raise asyncio.CancelledError() from e  # what the caller must see
            raise

    async def _at(self, step: str) -> None:
        if self.checkpoint is not None:
            await self.checkpoint(step)

    async def aclose(self) -> None:
        await cleanup_in_thread(self._close)

    def _close(self) -> None:
        self._engine.shutdown(wait=False, cancel_futures=True)
        self._sampler.shutdown(wait=False, cancel_futures=True)
        self._client.close()
        if self._owns_warden:
            self._warden.close()


class _ContainerStart:
    """One container launch in progress: what it has made so far. Each step is a
    method run in a worker thread; `undo` removes whatever exists."""

    def __init__(self, launcher: DockerLauncher, spec: LaunchSpec) -> None:
        if spec.private_dir is None:
            raise ValueError(f"{spec.sandbox_id}: the docker backend needs the sandbox's private folder for its start gate (LaunchSpec.private_dir)")
        self.launcher = launcher
        self.spec = spec
        self.socket_path = str(spec.run_dir / "host.sock")
        self.name = f"clawsup-{spec.sandbox_id}-{os.urandom(3).hex()}"
        self.gate = _Gate(spec.private_dir)
        self.uid, self.gid = os.getuid(), os.getgid()
        self.watched = False
        self.container: Any = None
        self.output: Any = None
        self.result: ContainerChild | None = None

    def prepare(self) -> None:
        spec = self.spec
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
            # uid (sandbox/launch/uids.py); a caller that does not (scripts/bench.py) gets nobody.
            u = ChildUser("nobody", 65534, 65534)
        if u is not None:
            self.uid, self.gid = u.uid, u.gid
            if not spec.operator_workspace:
                _give(spec.workspace, u)
            chown_dir(spec.run_dir, u.uid, u.gid)
        rlimits = {"RLIMIT_CORE": 0, "RLIMIT_CPU": spec.limits.cpu_seconds, "RLIMIT_NOFILE": spec.limits.max_open_files, "RLIMIT_FSIZE": spec.limits.max_file_size_bytes}
        self.gate.write(dataclasses.replace(spec.gate, run_as=None, rlimits=rlimits).encode(), self.uid, self.gid)

    def create(self) -> None:
        spec = self.spec
        volumes = {
            str(spec.workspace): {"bind": WORKSPACE, "mode": "rw"},
            str(spec.run_dir): {"bind": str(spec.run_dir), "mode": "rw"},
            # The file alone, not its folder: nothing else the supervisor keeps there
            # is the child's to see.
            str(self.gate.path): {"bind": GATE, "mode": "ro"},
        }
        if spec.plugin_dir is not None:
            volumes[str(spec.plugin_dir)] = {"bind": PLUGIN, "mode": "ro"}
        # What an MCP server's command needs from this host, at its own paths. Never
        # over the image's system folders: the container runs the image's /usr.
        for path in visible_binds(spec, list(SYSTEM_DIRS), own=[WORKSPACE, PLUGIN, os.path.dirname(GATE), "/proc", "/dev", "/sys", "/etc"]):
            volumes.setdefault(path, {"bind": path, "mode": "ro"})
        env = {**spec.env, "HOME": WORKSPACE, "TMPDIR": "/tmp", "PATH": "/usr/local/bin:/usr/bin:/bin"}
        command = [
            "--plugin-dir", PLUGIN if spec.plugin_dir is not None else "",
            "--socket", self.socket_path,
            "--gate-file", GATE,
            "--parent-pid", "1",
            "--workdir", WORKSPACE,
        ]  # fmt: skip
        # Listed before it exists, so that no moment leaves it unlisted.
        self.launcher._warden.watch_container(self.name)
        self.watched = True
        self.container = self.launcher._client.containers.create(
            self.launcher._image,
            command=command,
            init=True,
            user=f"{self.uid}:{self.gid}",
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
            labels={LABEL: spec.sandbox_id, STATE_LABEL: self.launcher._state},
            log_config=LOG_CONFIG,
            name=self.name,
        )

    def attach(self) -> None:
        # Attached before it starts, so the stream holds its output from the first
        # byte (the handshake), while the engine's capped log may have lost it.
        self.output = self.container.attach(stdout=True, stderr=True, stream=True, logs=False, demux=True)

    def start(self) -> None:
        self.container.start()

    def child(self) -> ContainerChild:
        self.result = ContainerChild(self.launcher._client, self.container, self.socket_path, self.output, self.gate, self.launcher._warden, self.launcher._engine, self.launcher._sampler)
        return self.result

    def undo(self) -> None:
        if self.result is not None:
            for fd in (self.result.stdout_fd, self.result.stderr_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.output is not None:
            with contextlib.suppress(Exception):
                self.output.close()
        self.gate.remove()
        if self.watched:
            # By name: a create that failed on our side may still have made it.
            try:
                self.launcher._client.api.remove_container(self.name, force=True)
            except docker.errors.NotFound:
                pass
            # Anything else (an engine that does not answer): the warden keeps it
            # listed and removes it when the supervisor goes.
            self.launcher._warden.forget_container(self.name)
