"""clawsup as a user gets it: an sdist and a wheel built from this checkout, the wheel
installed (not editable) in a fresh venv next to supervisord, and the README's first
command run from that venv: `clawsup start` on the bundled config, a tool call, a stop.
The installed package also wants, and its copy of scripts/build-sandbox-image builds,
the same docker image as a checkout of the same code.

supervisord's import name is `supervisor`, the name clawsup's folder has in this
repository; the two must install side by side. The expected contents of the wheel are
a table in this module, not read back from setup.py or pyproject.toml.

Needs `build` (the test extras) and a package index that has `supervisor`. Under CI
a missing piece is a failure, never a skip."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import IN_CI, READY_MARK, ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
DIST_INFO = f"clawsup-{VERSION}.dist-info"
DATA = f"clawsup-{VERSION}.data/data"

# Import name -> the repository folder it installs from: every .py under the folder
# must be in the wheel (packages are found, not listed).
FOLDERS = {
    "clawsup": "proto/clawsup",
    "clawsup/supervisor": "supervisor",
    "clawsup/sandbox": "sandbox",
    "clawsup/plugins": "plugins",
}
# What is not Python and must ship anyway.
PACKAGE_DATA = [
    "clawsup/supervisor/default_config.json5",
    "clawsup/v1/host.proto",
    "clawsup/v1/host_pb2.pyi",
    *(f"clawsup/plugins/{p}/{f}" for p in ("basics", "chaos") for f in ("clawsup.plugin.json", "plugin.py")),
    # The docker image's recipe, for sandbox/launch/image.py in an installed package.
    f"{DATA}/share/clawsup/Dockerfile.sandbox",
    f"{DATA}/share/clawsup/build-sandbox-image",
]
# Not the source of a build: what a fresh clone does not have.
NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache")

# The suite's timeout counts fixtures: a test may wait for the builds, and the venv's
# test for a whole install (each step has its own, shorter bound below).
pytestmark = pytest.mark.timeout(900)


def _unavailable(why: str) -> None:
    if IN_CI:
        pytest.fail(f"the install test cannot run in CI: {why}")
    pytest.skip(why)


def _start(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, merge: bool = False) -> subprocess.Popen[str]:
    """In a process group of its own: `build` and `pip --python` run more Pythons
    below them, which a timeout or a failed test must stop too (_stop)."""
    stderr = subprocess.STDOUT if merge else subprocess.PIPE
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=cwd, start_new_session=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    """Only a leader not yet reaped: its pid is still its group's, never another's."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = _start(argv, env, cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        _stop(proc)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@dataclass(frozen=True)
class Dist:
    src: Path  # the copy of the tree the wheels were built from
    sdist: Path
    wheel: Path  # from the source tree, as `pip install .` builds it
    wheel_from_sdist: Path


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    # Outside the checkout; gone with the module (the venv alone is a few hundred MB).
    d = Path(tempfile.mkdtemp(prefix="cs-inst-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def dist(workdir: Path) -> Dist:
    """`python -m build` with its isolated environments, so that [build-system] is
    tested too. Each build gets a copy of the tree: an in-tree build leaves build/
    behind, whose stale files would go into the next wheel, and other runs of the
    suite may build at the same time. The two builds run side by side."""
    if importlib.util.find_spec("build") is None:
        _unavailable("the `build` package is missing (pip install -e '.[test]')")
    jobs = {
        # No --sdist/--wheel: an sdist, then a wheel built from that sdist.
        "from-sdist": [],
        "from-tree": ["--wheel"],
    }
    procs: list[tuple[list[str], subprocess.Popen[str]]] = []
    try:
        for name, flags in jobs.items():
            src = workdir / f"src-{name}"
            shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
            argv = [sys.executable, "-m", "build", *flags, "--outdir", str(workdir / name), str(src)]
            procs.append((argv, _start(argv, merge=True)))
        for argv, proc in procs:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{out[-5000:]}"
    finally:
        for _, proc in procs:
            _stop(proc)
    [sdist] = (workdir / "from-sdist").glob("*.tar.gz")
    [wheel_from_sdist] = (workdir / "from-sdist").glob("*.whl")
    [wheel] = (workdir / "from-tree").glob("*.whl")
    return Dist(workdir / "src-from-tree", sdist, wheel, wheel_from_sdist)


def members(wheel: Path) -> dict[str, str]:
    """Name -> sha256 of every file in the wheel but its RECORD (which lists them)."""
    with zipfile.ZipFile(wheel) as z:
        return {n: hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist() if n != f"{DIST_INFO}/RECORD"}


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def env(self) -> dict[str, str]:
        """An operator's shell with the venv active: no API key, nothing of the suite's."""
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return {**env, "PATH": f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}", "VIRTUAL_ENV": str(self.root), "COLUMNS": "400"}

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return _run([str(self.bin / argv[0]), *argv[1:]], timeout, env=self.env(), cwd=self.root.parent)


def fresh_venv(dist: Dist, workdir: Path) -> Venv:
    """A fresh venv of the suite's interpreter holding the wheel and supervisord. The
    suite's own pip installs into it (--python), so the venv needs no pip of its own.
    Constrained to the versions the suite runs with: nothing to resolve, and pip's
    cache holds them from the suite's own install. --no-compile: the gateway compiles
    what it imports, a fraction of what compiling every dependency here would cost."""
    root = workdir / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], 60)
    pins = workdir / "pins.txt"
    pins.write_text(
        "".join(f"{d.metadata['Name']}=={d.version}\n" for d in importlib.metadata.distributions() if d.metadata["Name"] and d.metadata["Name"].lower() not in ("clawsup", "supervisor"))
    )
    _run(
        [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "--quiet", "--disable-pip-version-check", "--no-compile",
         "--constraint", str(pins), str(dist.wheel), "supervisor"],
        480,
    )  # fmt: skip
    return Venv(root)


# ---------------------------------------------------------------------------------


def test_the_wheel_installs_clawsup_and_nothing_else_at_the_top(dist: Dist) -> None:
    tops = {name.split("/")[0] for name in members(dist.wheel)}
    assert tops == {"clawsup", DIST_INFO, f"clawsup-{VERSION}.data"}, sorted(tops)
    data = [n for n in members(dist.wheel) if n.startswith(f"clawsup-{VERSION}.data/")]
    assert all(n.startswith(f"{DATA}/share/clawsup/") for n in data), data
    with zipfile.ZipFile(dist.wheel) as z:
        assert z.read(f"{DIST_INFO}/top_level.txt").decode().split() == ["clawsup"]
        entry_points = z.read(f"{DIST_INFO}/entry_points.txt").decode()
    assert "clawsup = clawsup.supervisor.control.cli:app" in entry_points, entry_points


def test_the_wheel_holds_every_module_and_the_package_data(dist: Dist) -> None:
    names = set(members(dist.wheel))
    missing = [n for n in PACKAGE_DATA if n not in names]
    for package, folder in FOLDERS.items():
        for py in sorted((ROOT / folder).rglob("*.py")):
            rel = py.relative_to(ROOT / folder)
            if "__pycache__" not in rel.parts and f"{package}/{rel}" not in names:
                missing.append(f"{package}/{rel} (from {folder}/{rel})")
    assert not missing, f"missing from {dist.wheel.name}: {missing}"


def test_a_wheel_built_from_the_sdist_is_the_same_wheel(dist: Dist) -> None:
    """The sdist is complete: what it builds is what the tree builds, file for file."""
    from_tree, from_sdist = members(dist.wheel), members(dist.wheel_from_sdist)
    assert sorted(from_tree) == sorted(from_sdist), {"only from the tree": sorted(set(from_tree) - set(from_sdist)), "only from the sdist": sorted(set(from_sdist) - set(from_tree))}
    differ = [n for n in from_tree if from_tree[n] != from_sdist[n]]
    assert not differ, f"built differently from the sdist: {differ}"
    with tarfile.open(dist.sdist) as t:
        in_sdist = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
    for needed in ("pyproject.toml", "setup.py", "README.md", "Dockerfile.sandbox", "scripts/build-sandbox-image"):
        assert needed in in_sdist, f"{needed} is not in {dist.sdist.name}"


def check_versions_and_imports(venv: Venv) -> None:
    assert venv.run("clawsup", "--version").stdout.strip() == f"clawsup {VERSION}"
    assert venv.run("supervisord", "--version").stdout.strip()[:1].isdigit()

    probe = venv.run("python", "-I", "-c", (
        "import importlib.util, json, clawsup, clawsup.supervisor, clawsup.sandbox.host, clawsup.v1.host_pb2, supervisor, supervisor.supervisord\n"
        "print(json.dumps({'clawsup': [clawsup.__file__, clawsup.supervisor.__file__, clawsup.sandbox.host.__file__],\n"
        "  'supervisord': supervisor.supervisord.__file__, 'sandbox': importlib.util.find_spec('sandbox') is not None}))"
    ))  # fmt: skip
    seen = json.loads(probe.stdout)
    site = str(venv.root) + "/"
    for module in [*seen["clawsup"], seen["supervisord"]]:
        assert module.startswith(site) and not module.startswith(str(ROOT) + "/"), f"{module} is not installed in {venv.root}"
    assert not seen["sandbox"], "a top-level `sandbox` is installed: clawsup's must be clawsup.sandbox"


def start_call_stop(venv: Venv, workdir: Path, state: Path) -> None:
    """`clawsup start` on the bundled config (no API key, no network), a tool call
    through the running gateway, and `clawsup stop`."""
    argv = [str(venv.bin / "clawsup"), "start", "--state-dir", str(state)]
    if os.geteuid() == 0 and shutil.which("unshare"):
        # As root the children run as uids of their own, which must be able to start
        # the venv's interpreter; this machine keeps it under /root (0700). As in
        # tests/conftest.py: a mount namespace where the way to it is open.
        argv = ["unshare", "--mount", "--propagation", "private", sys.executable, str(ROOT / "tests" / "helpers" / "open_paths.py"), sys.executable, str(venv.root / "lib"), "--", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=venv.env(), cwd=workdir)
    output: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if READY_MARK in line:
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(90) and any(READY_MARK in line for line in output), "the installed `clawsup start` did not become ready:\n" + "".join(output[-60:])
        called = venv.run("clawsup", "tools", "call", "calc", "--args", '{"expression": "6 * 7"}', "--json", "--state-dir", str(state))
        result = json.loads(called.stdout)
        assert result["ok"] and "42" in json.dumps(result["result"]), result
        stopped = venv.run("clawsup", "stop", "--state-dir", str(state))
        assert "stopped" in stopped.stdout, stopped.stdout
        assert proc.wait(30) == 0, "".join(output[-60:])
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def checkout_image_tag(src: Path, workdir: Path) -> str:
    """image_tag() of a checkout of the code the wheel holds: the copy, seen in the
    namespace's shape (as scripts/typecheck does), ahead of the editable install (whose
    finder comes after sys.path), so that edits to this work tree since do not count."""
    shape = workdir / "shape" / "clawsup"
    shape.mkdir(parents=True)
    (shape / "__init__.py").symlink_to(src / "proto" / "clawsup" / "__init__.py")
    (shape / "v1").symlink_to(src / "proto" / "clawsup" / "v1")
    (shape / "sandbox").symlink_to(src / "sandbox")
    code = f"import sys; sys.path.insert(0, {str(shape.parent)!r}); from clawsup.sandbox.launch.image import image_tag, ROOT; assert str(ROOT) == {str(src)!r}, ROOT; print(image_tag())"
    return _run([sys.executable, "-c", code], 60).stdout.strip()


def check_the_docker_image(dist: Dist, venv: Venv, workdir: Path) -> None:
    """The docker image's tag is a hash of the runtime: an installed package, which
    finds the recipe under <prefix>/share/clawsup, asks for the image a checkout of
    the same code builds; and the build script, run from there, puts the same runtime
    into the image. (Only the context: the docker build itself is the docker tests'.)"""
    installed = venv.run("python", "-c", "from clawsup.sandbox.launch.image import image_tag; print(image_tag())").stdout.strip()
    assert installed == checkout_image_tag(dist.src, workdir)

    context = workdir / "context"
    script = venv.root / "share" / "clawsup" / "build-sandbox-image"
    _run(["bash", str(script), "--context", str(context)], 60, env={**venv.env(), "PYTHON": str(venv.bin / "python")}, cwd=workdir)
    expected = {"Dockerfile": (dist.src / "Dockerfile.sandbox").read_bytes(), "clawsup/__init__.py": (dist.src / "proto" / "clawsup" / "__init__.py").read_bytes()}
    expected |= {f"clawsup/v1/{n}": b for n, b in files_under(dist.src / "proto" / "clawsup" / "v1").items()}
    expected |= {f"sandbox/{n}": b for n, b in files_under(dist.src / "sandbox").items()}
    got = files_under(context)
    assert sorted(got) == sorted(expected), {"missing": sorted(set(expected) - set(got)), "extra": sorted(set(got) - set(expected))}
    assert [n for n in got if got[n] != expected[n]] == []


def test_the_wheel_in_a_fresh_venv_beside_supervisord(dist: Dist, workdir: Path, state_dir: Path) -> None:
    """What CI promises an operator: the wheel and supervisord installed together,
    both importable and both answering; the docker image an installed package wants;
    and the README's first command. One test, so that the install (the slow part) is
    done once however the suite's workers share the module's tests."""
    venv = fresh_venv(dist, workdir)
    check_versions_and_imports(venv)
    check_the_docker_image(dist, venv, workdir)
    start_call_stop(venv, workdir, state_dir)
