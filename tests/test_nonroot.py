"""The gateway as an operator without root runs it: clawsup INSTALLED (a wheel, not
this editable checkout) in a venv of the system's Python, started by an ordinary
user on a state directory of its own, end to end; and that user's other processes,
and its plugins on every backend, cannot take the supervisor's secrets through /proc.

scripts/nonroot-setup.sh (run by scripts/test.sh, as root) makes the user and the
venv; this module only checks that they are there and current, then drops to that
user with setpriv for every command. Under CI a missing setup is a failure, never a
skip (as with tests/conftest.py `require_backend`)."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import IN_CI, PLUGINS, READY_MARK, ROOT, TEST_PLUGINS, require_backend, wait_gone

USER = os.environ.get("CLAWSUP_NONROOT_USER", "clawsup-ci")
VENV = Path(os.environ.get("CLAWSUP_NONROOT_VENV", "/opt/clawsup-nonroot"))
SETUP = ROOT / "scripts" / "nonroot-setup.sh"
CLAWSUP = str(VENV / "bin" / "clawsup")
PYTHON = str(VENV / "bin" / "python")
SECRET_NAME = "ANTHROPIC_API_KEY"


def _unavailable(why: str) -> None:
    if IN_CI:
        pytest.fail(f"the non-root tests cannot run in CI: {why}")
    pytest.skip(why)


@dataclass(frozen=True)
class User:
    """The ordinary user every command of this module runs as. Root (the test) drops
    to it with setpriv, which execs: a Popen's pid is the command's own."""

    name: str
    uid: int
    gid: int
    home: str

    def argv(self, *cmd: str, groups: tuple[int, ...] = ()) -> list[str]:
        supplementary = ",".join(str(g) for g in (self.gid, *groups))
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", f"--groups={supplementary}", *cmd]

    def env(self, **extra: str) -> dict[str, str]:
        """A login's environment, not the test's (which names root's pyenv)."""
        env = {"PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": self.home, "LANG": "C.UTF-8", "COLUMNS": "400"}
        if docker_host := os.environ.get("DOCKER_HOST"):
            env["DOCKER_HOST"] = docker_host
        return {**env, **extra}

    def run(self, *cmd: str, cwd: Path, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*cmd), cwd=cwd, env=self.env(), input=stdin, capture_output=True, text=True, timeout=timeout)

    def give(self, path: Path) -> None:
        for p in [path, *path.rglob("*")]:
            os.chown(p, self.uid, self.gid, follow_symlinks=False)


@pytest.fixture(scope="module")
def user() -> User:
    if os.geteuid() != 0:
        _unavailable("becoming an ordinary user takes root")
    if shutil.which("setpriv") is None:
        _unavailable("setpriv is missing (Debian: util-linux)")
    check = subprocess.run(["bash", str(SETUP), "--check"], capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        _unavailable(check.stderr.strip() or f"{SETUP} --check failed")
    pw = pwd.getpwnam(USER)
    u = User(USER, pw.pw_uid, pw.pw_gid, pw.pw_dir)
    # What the bwrap backend does as an ordinary user: a user namespace of its own.
    probe = subprocess.run(
        u.argv("bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"),
        capture_output=True, text=True, timeout=30, env=u.env(), cwd="/",
    )  # fmt: skip
    if probe.returncode != 0:
        _unavailable(f"bwrap cannot make a user namespace for {USER}: {probe.stderr.strip()[-300:]}")
    return u


@pytest.fixture
def home(user: User) -> Iterator[Path]:
    """The user's folder for one test: its config, its plugins, its state directory.
    Short, for the 108-byte socket paths; 0700 and the user's, as the gateway demands."""
    d = Path(tempfile.mkdtemp(prefix="cs-nr-", dir="/tmp"))
    user.give(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def give_plugin(user: User, home: Path, source: Path) -> Path:
    """The user's own copy: a plugin folder an operator would have, readable by it
    wherever the checkout sits."""
    dest = home / "plugins" / source.name
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
    user.give(home / "plugins")
    return dest


class UserGateway:
    """One `clawsup start` of the installed package, as the user. Owned by the test
    (the fixture kills what is left)."""

    def __init__(self, user: User, home: Path, config: dict[str, Any] | None, plugins: list[Path], env: dict[str, str], groups: tuple[int, ...] = ()) -> None:
        self.user, self.home, self.state = user, home, home / "state"
        argv = [CLAWSUP, "start", "--state-dir", str(self.state)]
        if config is not None:
            path = home / "clawsup.json"
            path.write_text(json.dumps(config, indent=2))
            user.give(path)
            argv += ["--config", str(path)]
        for p in plugins:
            argv += ["--plugin", str(p)]
        self.output: list[str] = []
        ready = threading.Event()
        self.proc = subprocess.Popen(
            user.argv(*argv, groups=groups), cwd=home, env=user.env(**env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if READY_MARK in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(90) or not any(READY_MARK in line for line in self.output):
            self.close()
            raise AssertionError(f"clawsup start as {user.name} did not become ready:\n" + "".join(self.output[-60:]))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.user.run(CLAWSUP, *args, "--state-dir", str(self.state), cwd=self.home, timeout=timeout)

    def call(self, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """`clawsup tools call --json` as the user: {"ok": ..., "result"|"error": ...}."""
        r = self.cli("tools", "call", tool, "--args", json.dumps(args or {}), "--json")
        assert r.stdout.strip(), f"clawsup tools call {tool} printed nothing (exit {r.returncode}): {r.stderr}"
        return json.loads(r.stdout)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """`clawsup stop` as the user; then the supervisor and every process of the
        user that served this state directory (hosts, bwrap, containers) are gone."""
        everything = self.descendants()
        r = self.cli("stop")
        assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
        assert self.proc.wait(20) == 0, "".join(self.output[-40:])
        survivors = wait_gone([p.pid for p in everything], timeout=15)
        assert not survivors, f"outlived `clawsup stop`: {[' '.join(psutil.Process(p).cmdline()) for p in survivors if psutil.pid_exists(p)]}"
        assert not user_processes_holding(self.user.uid, str(self.state))

    def close(self) -> None:
        """What a test left running: SIGTERM first, so that the supervisor removes its
        containers; SIGKILL leaves that to its warden, which must stay alive to do it."""
        if self.proc.poll() is None:
            rest = self.descendants()
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            for p in psutil.wait_procs(rest, timeout=15)[1]:
                p.kill()


@pytest.fixture
def start_as_user(user: User, home: Path) -> Iterator[Any]:
    started: list[UserGateway] = []

    def start(config: dict[str, Any] | None = None, plugins: list[Path] | None = None, env: dict[str, str] | None = None, groups: tuple[int, ...] = ()) -> UserGateway:
        gw = UserGateway(user, home, config, plugins or [], env or {}, groups)
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.close()


def fake_secret() -> str:
    return f"sk-test-{secrets.token_hex(16)}"


def user_processes_holding(uid: int, text: str) -> list[str]:
    """Every process of `uid` whose command line names `text` (a state directory)."""
    out = []
    for p in psutil.process_iter(["uids", "cmdline"]):
        if p.info["uids"] and p.info["uids"].real == uid and text in " ".join(p.info["cmdline"] or []):
            out.append(f"{p.pid} {' '.join(p.info['cmdline'])[:200]}")
    return out


# ---------------------------------------------------------------------------------


def test_the_installed_package_runs_not_the_checkout(user: User, home: Path) -> None:
    r = user.run(CLAWSUP, "--help", cwd=home)
    assert r.returncode == 0, f"the installed `clawsup --help` failed as {user.name}:\n{r.stderr[-3000:]}"
    assert "start" in r.stdout and "stop" in r.stdout

    where = user.run(PYTHON, "-I", "-c", (
        "import json, importlib.metadata as m, clawsup, clawsup.sandbox, clawsup.sandbox.host, clawsup.supervisor, clawsup.supervisor.config as c\n"
        "d = m.distribution('clawsup')\n"
        "print(json.dumps({'modules': [clawsup.__file__, clawsup.sandbox.__file__, clawsup.sandbox.host.__file__, clawsup.supervisor.__file__],\n"
        "  'direct_url': json.loads(d.read_text('direct_url.json') or '{}'),\n"
        "  'bundled': str(c.BUNDLED_PLUGINS), 'basics': (c.BUNDLED_PLUGINS / 'basics' / 'clawsup.plugin.json').is_file()}))"
    ), cwd=home)  # fmt: skip
    assert where.returncode == 0, where.stderr[-3000:]
    seen = json.loads(where.stdout)
    site = str(VENV) + "/"
    for module in seen["modules"]:
        assert module.startswith(site) and not module.startswith(str(ROOT) + "/"), f"{module} is not the installed copy in {VENV}"
    assert not seen["direct_url"].get("dir_info", {}).get("editable"), f"{VENV} holds an editable install: {seen['direct_url']}"
    # The bundled default config names `bundled:basics`: without it in the wheel, an
    # installed clawsup cannot run its own first command.
    assert seen["basics"], f"the installed package has no bundled plugins ({seen['bundled']}): `clawsup start` without --config cannot load `bundled:basics`"


def test_end_to_end_as_an_ordinary_user(user: User, home: Path, start_as_user: Any) -> None:
    """The README's first command, as an operator without root: the bundled default
    config (its trusted `basics`) plus chaos, untrusted and so on bwrap in a user
    namespace; a call, a crash and its restart, the operator's commands, and a stop
    that leaves nothing of the user's behind."""
    chaos = give_plugin(user, home, PLUGINS / "chaos")
    gw = start_as_user(config=None, plugins=[chaos])
    started = "".join(gw.output)
    assert psutil.Process(gw.pid).uids().real == user.uid
    assert any("chaos" in line and "bwrap · untrusted" in line for line in gw.output), started

    echoed = gw.call("echo", {"text": "hello from an ordinary user"})
    assert echoed["ok"] and "hello from an ordinary user" in json.dumps(echoed["result"]), echoed
    probe = gw.call("chaos_probe")
    assert probe["ok"], probe
    # In its user namespace the child is the user itself: no root, no other uid.
    assert probe["result"]["uid"] == user.uid, probe["result"]

    before = json.loads(gw.cli("status", "--json").stdout)
    chaos_before = next(s for s in before["sandboxes"] if s["id"] == "chaos")
    assert (chaos_before["state"], chaos_before["backend"], chaos_before["trust"]) == ("ready", "bwrap", "untrusted"), chaos_before

    crashed = gw.call("chaos_crash", {"how": "kill"})
    assert not crashed["ok"], crashed
    assert "chaos" in crashed["error"], crashed
    waited = gw.cli("wait", "chaos", "ready", "--timeout", "30", timeout=60)
    assert waited.returncode == 0 and waited.stdout.strip() == "ready", waited.stdout + waited.stderr
    assert gw.call("chaos_ok")["ok"]

    status = gw.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    after = next(s for s in json.loads(status.stdout)["sandboxes"] if s["id"] == "chaos")
    assert after["state"] == "ready" and after["restarts"] == 1 and after["pid"] != chaos_before["pid"], after
    assert "SIGKILL" in json.dumps(after["last_exit"]), after
    table = gw.cli("status")
    assert table.returncode == 0 and "chaos" in table.stdout and "basics" in table.stdout, table.stdout + table.stderr

    listed = gw.cli("plugins", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    plugins = {p["id"]: p for p in json.loads(listed.stdout)["plugins"]}
    assert (plugins["basics"]["trust"], plugins["chaos"]["trust"], plugins["chaos"]["backend"]) == ("trusted", "untrusted", "bwrap"), plugins
    assert gw.cli("plugins", "list").returncode == 0

    logs = gw.cli("logs", "chaos", "-n", "500")
    assert logs.returncode == 0, logs.stderr
    assert "chaos: crashing now (kill)" in logs.stdout, logs.stdout[-3000:]

    # A grandchild that left its process group: only the sandbox's own walls (its pid
    # namespace, --die-with-parent) can still take it down at stop.
    assert gw.call("chaos_spawn", {"setsid": True})["ok"]
    assert any(p.name() == "sleep" for p in gw.descendants()), [p.cmdline() for p in gw.descendants()]
    gw.stop()
    # Without a supervisor, `clawsup logs` reads the file.
    assert "chaos: crashing now (kill)" in gw.cli("logs", "chaos", "-n", "500").stdout


def test_the_users_other_processes_cannot_read_the_supervisors_secrets(user: User, home: Path, start_as_user: Any) -> None:
    """The operator's own processes (a browser, an editor, a plugin run as the operator)
    share its uid; the supervisor is non-dumpable, so its environment and memory are
    root's to read, and nothing it started keeps the secret where they can read it."""
    secret = fake_secret()
    gw = start_as_user(config=None, env={SECRET_NAME: secret})
    thief = give_plugin(user, home, TEST_PLUGINS / "thief") / "plugin.py"

    # The thief works: a dumpable process of the user with a decoy is robbed.
    decoy = f"sk-decoy-{secrets.token_hex(8)}"
    victim = subprocess.Popen(user.argv("sleep", "120"), env=user.env(**{SECRET_NAME: decoy}), cwd=home)
    try:
        r = user.run(PYTHON, "-I", str(thief), str(gw.pid), SECRET_NAME, cwd=home)
        assert r.returncode == 0, r.stderr[-3000:]
        loot = json.loads(r.stdout)
    finally:
        victim.kill()
        victim.wait(10)
    assert [decoy] in loot["environments_holding_it"].values(), loot

    assert loot["uid"] == user.uid == psutil.Process(gw.pid).uids().real
    assert loot["target_environ"]["read"] == "PermissionError", loot
    assert loot["target_memory"]["read"] == "PermissionError", loot
    assert loot["target_ptrace"] == "EPERM", loot
    holders = {pid: psutil.Process(int(pid)).cmdline() for pid, values in loot["environments_holding_it"].items() if secret in values}
    assert not holders, f"processes of {user.name} whose environment holds the supervisor's {SECRET_NAME}, readable by any process of that user: {holders}"
    gw.stop()


BACKENDS = ["process", "bwrap", "docker"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_plugin_cannot_read_the_supervisors_secrets(backend: str, user: User, home: Path, start_as_user: Any) -> None:
    """A hostile plugin on each backend: trusted on `process` (it runs as the operator
    then), untrusted on the isolating ones. It must find the key nowhere: not in its
    own environment, not in the supervisor's environment or memory, not in any
    process it can see."""
    groups: tuple[int, ...] = ()
    if backend == "docker":
        require_backend("docker")
        # The engine's socket group, for this supervisor only: the user itself stays
        # ordinary for every other test.
        sock = Path(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://"))
        if sock.exists():
            groups = (sock.stat().st_gid,)
    secret = fake_secret()
    thief = give_plugin(user, home, TEST_PLUGINS / "thief")
    config = {
        "plugins": {"load": {"paths": [str(thief)]}, "entries": {"thief": {"trust": "trusted" if backend == "process" else "untrusted", "sandbox": {"backend": backend}}}},
        # Only the thief: the agent's workspace sandbox starts on first use.
        "agents": {"defaults": {"sandbox": {"scope": "session"}}},
    }
    gw = start_as_user(config=config, env={SECRET_NAME: secret}, groups=groups)
    assert gw.output and any("thief" in line and backend in line for line in gw.output), "".join(gw.output)

    took = gw.call("thief_loot", {"target": gw.pid, "name": SECRET_NAME})
    assert took["ok"], took
    loot = took["result"]
    assert loot["own_environment"] is None, f"the {backend} sandbox was handed the supervisor's {SECRET_NAME}"
    for how in ("target_environ", "target_memory"):
        assert secret not in loot[how]["values"], f"{how} of the supervisor read from a {backend} sandbox: {loot}"
        assert loot[how]["read"] in ("PermissionError", "FileNotFoundError"), loot
    assert loot["target_ptrace"] in ("EPERM", "ESRCH"), loot
    assert not [pid for pid, values in loot["environments_holding_it"].items() if secret in values], loot
    if backend == "process":
        # The case that needs the supervisor non-dumpable: same uid, same pid namespace.
        assert loot["uid"] == user.uid and loot["target_visible"], loot
        assert (loot["target_environ"]["read"], loot["target_memory"]["read"], loot["target_ptrace"]) == ("PermissionError", "PermissionError", "EPERM"), loot
    else:
        assert not loot["target_visible"], f"the supervisor's pid is visible from a {backend} sandbox: {loot}"
    gw.stop()
