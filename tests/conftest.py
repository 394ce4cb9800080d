"""Real supervisors for the tests: `clawsup start` as a child process on a fresh
state directory, driven through its control socket and its CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from clawsup.supervisor.control.api import ControlClient
from tests.mcp_fixtures import mcp_server_time  # noqa: F401  (a fixture: mcp-server-time from PyPI, in a venv of its own)

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "plugins"
TEST_PLUGINS = Path(__file__).resolve().parent / "plugins"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
CLAWSUP = [sys.executable, "-m", "clawsup.supervisor.control.cli"]
READY_MARK = "control socket"


def cgroups_available() -> bool:
    from clawsup.sandbox.launch.cgroup import CgroupRoot

    root = CgroupRoot.create()
    if root is None:
        return False
    root.remove()
    return True


def require_kernel_limits(what: str) -> None:
    """Fork and memory bombs only run where a cgroup holds them. In CI a missing
    cgroup is a failure, never a silent skip."""
    if cgroups_available():
        return
    if IN_CI:
        pytest.fail(f"{what} needs a writable cgroup (pids and memory) and CI must provide one")
    pytest.skip(f"{what} needs a writable cgroup; refusing to run it unconfined")


def make_config(**overrides: Any) -> dict[str, Any]:
    """A config tuned for tests: quick backoff and heartbeat, short graces."""
    cfg: dict[str, Any] = {
        "plugins": {"load": {"paths": [str(PLUGINS / "basics")]}, "entries": {}},
        "sandbox": {
            # The suite was written for the process backend (it sees the host's pids
            # and cgroups from outside); tests of the isolating backends say so.
            "defaults": {"backend": "process", "restart": {"maxRestarts": 3, "periodSeconds": 60, "backoffInitialSeconds": 0.1, "backoffMaxSeconds": 1}},
            "handshakeTimeoutSeconds": 10,
            "heartbeatIntervalSeconds": 0.5,
            "heartbeatTimeoutSeconds": 0.5,
            "heartbeatMisses": 2,
            "stopGraceSeconds": 1,
        },
        # Workspace sandboxes start on first use only, so that plugin tests see just
        # their plugins; tests of the core tools set the scope they exercise.
        "agents": {"defaults": {"sandbox": {"scope": "session"}}},
    }
    for path, value in overrides.items():
        node = cfg
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return cfg


def require_backend(name: str) -> None:
    """The bwrap and docker backends' tests need bubblewrap, or an engine and the
    image. scripts/test.sh sets them up, so under CI a missing one is a failure,
    never a skip."""
    if name == "bwrap":
        from clawsup.sandbox.launch.bwrap import bwrap_problem as problem_of
    elif name == "docker":
        from clawsup.sandbox.launch.container import docker_problem as problem_of
    else:
        return
    problem = problem_of()
    if not problem:
        return
    if IN_CI:
        pytest.fail(f"{name} backend unavailable in CI: {problem}")
    pytest.skip(problem)


def require_bwrap() -> None:
    require_backend("bwrap")


def require_docker() -> None:
    require_backend("docker")


def workspace_config(backend: str, **overrides: Any) -> dict[str, Any]:
    """A test config whose default agent has a workspace sandbox on `backend`,
    started with the gateway."""
    cfg = make_config(agents__defaults__sandbox={"scope": "agent", "backend": backend}, **overrides)
    return cfg


# clawsup's own plugins, which the tests run as trusted (so that the process backend
# may run them) unless a test says otherwise. Every other plugin is untrusted, as in
# production.
OUR_PLUGINS = frozenset({"basics", "chaos", "twin"})


def trust_our_plugins(config: dict[str, Any], extra_plugins: list[Path]) -> None:
    from clawsup.sandbox.manifest import load_manifest

    load = config.get("plugins", {}).get("load", {}).get("paths", [])
    entries = config.setdefault("plugins", {}).setdefault("entries", {})
    for folder in [*load, *extra_plugins]:
        path = Path(str(folder).removeprefix("bundled:"))
        if not path.is_absolute():
            path = PLUGINS / path
        try:
            pid = load_manifest(path).id
        except Exception:
            continue
        if pid in OUR_PLUGINS or re.fullmatch(r"basics\d+", pid):  # copies of basics some tests make
            entry = entries.setdefault(pid, {})
            entry.setdefault("trust", "trusted")


def open_paths_wrap() -> list[str]:
    """As root here, Python lives under /root (0700), where a sandbox's own uid cannot
    start it, and clawsup refuses to fall back to root. The supervisor runs in a
    private mount namespace where the way to the interpreter and the code is open
    (tests/helpers/open_paths.py), as it would be on a machine with a system Python."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return []
    return ["unshare", "--mount", "--propagation", "private", sys.executable, str(ROOT / "tests" / "helpers" / "open_paths.py"), sys.executable, str(ROOT), "--"]


class Gateway:
    """One running `clawsup start`."""

    def __init__(
        self, state: Path, config: dict[str, Any] | None, extra_plugins: list[Path], env: dict[str, str] | None = None, wrap: list[str] | None = None
    ) -> None:
        """`config` None runs the bundled default config, as `clawsup start` does;
        `wrap` prefixes the command (it must exec it, keeping the pid)."""
        self.state = state
        argv = [*(open_paths_wrap() if wrap is None else wrap), *CLAWSUP, "start", "--state-dir", str(state)]
        if config is not None:
            trust_our_plugins(config, extra_plugins)
            config_path = state / "clawsup.json"
            config_path.write_text(json.dumps(config, indent=2))
            argv += ["--config", str(config_path)]
        for p in extra_plugins:
            argv += ["--plugin", str(p)]
        self.output: list[str] = []
        self._ready = threading.Event()
        full_env = {**os.environ, "COLUMNS": "400", **(env or {})}
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(60):
            self.kill()
            raise AssertionError("supervisor did not become ready in 60 s:\n" + "".join(self.output[-50:]))
        if not any(READY_MARK in line for line in self.output):
            # Its output ended without the ready line: it is exiting.
            rc = self.proc.wait(30)
            raise AssertionError(f"supervisor exited with {rc}:\n" + "".join(self.output[-50:]))
        self.client = ControlClient(state / "run" / "control.sock")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if READY_MARK in line:
                self._ready.set()
        self._ready.set()

    # -- control API -------------------------------------------------------------
    def request(self, **req: Any) -> dict[str, Any]:
        return self.client.request(req)

    def call(self, name: str, args: dict[str, Any] | None = None, timeout: float | None = None) -> dict[str, Any]:
        req: dict[str, Any] = {"op": "call", "name": name, "args": args or {}}
        if timeout is not None:
            req["timeout"] = timeout
        return self.client.request(req)

    def exec(self, command: str, timeout: float | None = None, **extra: Any) -> dict[str, Any]:
        """The exec tool's result (a dict), or raises AssertionError with the error."""
        args: dict[str, Any] = {"command": command, **extra}
        if timeout is not None:
            args["timeout"] = timeout
        resp = self.client.request({"op": "call", "name": "exec", "args": args})
        assert resp["ok"], resp
        return resp["data"]["result"]

    def workspace(self, sandbox: str = "workspace-main") -> Path:
        return self.state / "sandboxes" / sandbox / "workspace"

    def tools(self) -> dict[str, str]:
        return {t["name"]: t["owner"] for t in self.request(op="tools")["data"]["tools"]}

    def status(self, sandbox: str) -> dict[str, Any]:
        for s in self.request(op="status")["data"]["sandboxes"]:
            if s["id"] == sandbox:
                return s
        raise KeyError(sandbox)

    def wait(self, sandbox: str, *states: str, timeout: float = 20) -> str:
        resp = self.request(op="wait", sandbox=sandbox, states=list(states), timeout=timeout)
        assert resp["ok"], f"{sandbox} never reached {states}: {resp}"
        return resp["data"]["state"]

    def wait_log(self, sandbox: str, text: str | re.Pattern[str], timeout: float = 20) -> str:
        """Follow the sandbox's log (as `clawsup logs -f` does) until a line
        containing `text` (or matching it, a pattern) arrives; bounded by `timeout`."""
        follower = ControlClient(self.client.path, timeout=timeout)
        stream = follower.stream({"op": "logs", "sandbox": sandbox, "n": 1000, "follow": True}, timeout=timeout)
        first = next(stream)

        def found(line: str) -> bool:
            return text in line if isinstance(text, str) else text.search(line) is not None

        for line in first["data"]["lines"]:
            if found(line):
                stream.close()
                return line
        for msg in stream:
            if found(msg.get("line", "")):
                stream.close()
                return msg.get("line", "")
        raise AssertionError(f"log of {sandbox} ended without {text!r}")

    def log(self, sandbox: str) -> str:
        return (self.state / "logs" / f"{sandbox}.log").read_text(errors="replace")

    def supervisor_log(self) -> str:
        return (self.state / "logs" / "supervisor.log").read_text(errors="replace")

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLAWSUP, *args, "--state-dir", str(self.state)], capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "400"}
        )

    # -- process -----------------------------------------------------------------
    def warden_pids(self) -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline", "ppid"]) if p.info["ppid"] == self.proc.pid and "warden.py" in " ".join(p.info["cmdline"] or [])]

    def host_pids(self) -> list[int]:
        """Every live sandbox host of this supervisor (its socket lives under our
        state directory)."""
        out = []
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info["cmdline"] or []
            # The host itself, not a bwrap (or its shell) wrapped around it; in a
            # container it is the image's python3.
            if argv[:1] in ([sys.executable], ["python3"]) and "clawsup.sandbox.host" in argv and str(self.state) in " ".join(argv):
                out.append(p.pid)
        return out

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # Short on purpose: unix socket paths hold 108 bytes.
    d = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def module_gateways() -> Iterator[Any]:
    """Gateways shared by a module's tests (each test must leave them as found):
    `module_gateways(key, config)` starts one per key on first use."""
    started: dict[str, tuple[Gateway, Path]] = {}

    def get(key: str, config: dict[str, Any], env: dict[str, str] | None = None) -> Gateway:
        if key not in started:
            d = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
            started[key] = (Gateway(d, config, [], env), d)
        return started[key][0]

    yield get
    for gw, d in started.values():
        try:
            gw.stop()
        except Exception:
            gw.kill()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def gateway_factory(state_dir: Path) -> Iterator[Any]:
    started: list[Gateway] = []

    def start(
        config: dict[str, Any] | None | str = "test", plugins: list[Path] | None = None, env: dict[str, str] | None = None, wrap: list[str] | None = None
    ) -> Gateway:
        """`config`: a config dict, "test" for make_config(), None for the bundled default."""
        gw = Gateway(state_dir, make_config() if config == "test" else config, plugins or [], env, wrap)  # type: ignore[arg-type]
        started.append(gw)
        return gw

    yield start
    for gw in started:
        try:
            gw.stop()
        except Exception:
            gw.kill()


def wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    """Wait (event-driven, bounded) for processes to exit; return the survivors."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
