"""Where an MCP server's command is installed on this host, and what of that install
its sandbox must see. Run at plan time (supervisor/sandboxes/mcp_plans.py), on the
supervisor's host, before any sandbox exists: `resolve_install` finds the command
(the entry's PATH, or a path) and returns what the host inside the sandbox runs and
the host paths bwrap and docker bind read-only at their own paths
(LaunchSpec.visible_paths).

What is made visible, for the file the command names (its real path, symlinks
followed):
- inside a Python venv (a `pyvenv.cfg` above it): the venv, and the prefix of the
  interpreter it was made from (`home` in pyvenv.cfg, less a trailing /bin); never
  folders its `.pth` files name outside it (see `_venv_needs`);
- a bare Python interpreter outside a venv (`<prefix>/bin/python3.X`): its prefix;
- inside a `node_modules` folder: the outermost `node_modules` above it, where Node
  looks for the package's dependencies;
- anything else: the file alone.
A script's `#!` interpreter is resolved the same way (`/usr/bin/env X` looks X up as
the command was), and the script is then run by that interpreter explicitly, as the
kernel would: inside the sandbox PATH is not the operator's, and on docker it is the
image's.

Never made visible (the file alone is, with a note): the root, the operator's home
folder or a folder holding it, a folder holding (or inside) the clawsup state
directory, a folder holding the config file's folder. Paths under the system
folders (/usr and its links) are the sandbox's already under bwrap, and the image's
under docker: never bound.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from clawsup.sandbox.launch.bwrap import SYSTEM_DIRS
from clawsup.sandbox.launch.launcher import Backend
from clawsup.supervisor.errors import ConfigError

MAX_INTERPRETERS = 4
"""Nested `#!` interpreters followed (Linux itself follows a few levels only)."""
MAX_PTH_PATHS = 32
"""Folders named by one venv's .pth files that the notes mention, at most."""
SHEBANG_BYTES = 256
"""The kernel reads this much of a `#!` line (BINPRM_BUF_SIZE)."""
PYENV_TIMEOUT_S = 20.0
_PYENV_EXEC = re.compile(r'exec "([^"\n]*/libexec/pyenv)" exec "\$program"')
_PYENV_ROOT = re.compile(r'export PYENV_ROOT="([^"\n]*)"')
_PYTHON_NAME = re.compile(r"python\d*(\.\d+)?")


@dataclass(frozen=True, kw_only=True)
class Install:
    """What the sandbox host runs for one stdio server: `command`, then `args_before`
    (a `#!` interpreter chain's arguments and the script), then the entry's args."""

    command: str
    args_before: tuple[str, ...] = ()
    visible_paths: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """Sentences for the supervisor's log: what was not made visible and why."""


@dataclass(frozen=True, kw_only=True)
class Host:
    """What resolution needs to know of this host; the gateway's, or a test's."""

    config_dir: Path
    home: Path
    state_dir: Path | None
    environ: Mapping[str, str]


@dataclass
class _Walk:
    key: str
    """`mcpServers.<id>.command`, for every sentence."""
    search_path: str
    search_from: str
    """Where `search_path` came from, for the not-found sentence."""
    host: Host
    visible: list[str] = field(default_factory=list)
    system: list[str] = field(default_factory=list)
    """What the install takes from this host's system folders (docker has the image's)."""
    notes: list[str] = field(default_factory=list)


def resolve_install(command: str, *, server_id: str, env: Mapping[str, str], backend: Backend, host: Host) -> Install:
    """`env`: the entry's env, `${VAR}` expanded (its PATH, if it sets one, is where
    a bare name is looked up). Raises ConfigError (without a source) naming
    `mcpServers.<id>.command`."""
    key = f"mcpServers.{server_id}.command"
    if "PATH" in env:
        search_path, search_from = env["PATH"], f"mcpServers.{server_id}.env.PATH"
    else:
        search_path, search_from = host.environ.get("PATH", os.defpath), "the supervisor's PATH"
    walk = _Walk(key=key, search_path=search_path, search_from=search_from, host=host)
    found = _find(command, walk)
    if found is None:
        if backend == "docker":
            note = f"{key}: {command!r} is not on this host ({_where(command, walk)}); on the docker backend it is run as is, from the image's PATH"
            return Install(command=command, notes=(note,))
        raise ConfigError("", [
            f"{key}: {command!r} was not found on this host ({_where(command, walk)}). Install it, or give its full path "
            "(a relative path is taken from the config file's folder)"
        ])  # fmt: skip
    run, args = _resolve(found, walk, depth=0)
    visible = _outermost(walk.visible)
    if backend == "docker" and not visible:
        # All of it lies in this host's system folders, which the container does
        # not see: the image's own is run, found as the operator wrote it.
        walk.notes.append(f"{key}: {command!r} is installed under this host's system folders ({found}); on the docker backend the image's own {command!r} is run")
        return Install(command=command, notes=tuple(walk.notes))
    if backend == "docker" and walk.system:
        walk.notes.append(f"{key}: on the docker backend these are the image's, not this host's, and must exist in the image: {', '.join(dict.fromkeys(walk.system))}")
    return Install(command=run, args_before=tuple(args), visible_paths=tuple(visible), notes=tuple(walk.notes))


def _where(command: str, walk: _Walk) -> str:
    if "/" in command:
        return f"looked for {_as_path(command, walk.host.config_dir)}"
    if walk.search_from.endswith(".env.PATH"):
        return f"searched {walk.search_from}"  # the entry's env: its values are never shown
    return f"searched {walk.search_from}: {walk.search_path or '(empty)'}"


def _as_path(command: str, config_dir: Path) -> Path:
    p = Path(command).expanduser()
    return Path(os.path.abspath(p if p.is_absolute() else config_dir / p))


def _find(command: str, walk: _Walk) -> Path | None:
    """The executable a name or a path means, its path as found (links not followed)."""
    if "/" in command:
        p = _as_path(command, walk.host.config_dir)
        if not p.exists():
            return None
        if not p.is_file() or not os.access(p, os.X_OK):
            raise ConfigError("", [f"{walk.key}: {p} is not an executable file"])
        return p
    hit = shutil.which(command, path=walk.search_path)
    return Path(os.path.abspath(hit)) if hit is not None else None


def _resolve(found: Path, walk: _Walk, *, depth: int) -> tuple[str, list[str]]:
    """What runs `found` inside the sandbox: (command, arguments before the entry's),
    adding what it needs to `walk.visible`."""
    if found.parent.name == "shims":
        found = _unshim(found, walk)
    real = Path(os.path.realpath(found))
    if _inside(str(found), SYSTEM_DIRS):
        # Visible already (bwrap binds them; docker has the image's). By the name it
        # was found as: a multi-call binary (busybox) goes by it.
        run = str(found)
        walk.system.append(run)
    else:
        run = _make_visible(found, real, walk)
    interpreter = _shebang(real, walk)
    if interpreter is None:
        return run, []
    if depth >= MAX_INTERPRETERS:
        raise ConfigError("", [f"{walk.key}: {found} goes through more than {MAX_INTERPRETERS} #! interpreters; give the last one as the command"])
    interp, extra = interpreter
    inner, inner_args = _resolve(interp, walk, depth=depth + 1)
    return inner, [*inner_args, *extra, run]


def _make_visible(found: Path, real: Path, walk: _Walk) -> str:
    """Adds the install `found` belongs to; returns its path inside the sandbox."""
    venv = _venv_root(found) or _venv_root(real)
    if venv is not None:
        venv_real = Path(os.path.realpath(venv))
        if why := _unsafe(venv_real, walk.host):
            walk.notes.append(f"{walk.key}: the venv {venv_real} is not made visible ({why}); only {real} is")
        else:
            walk.visible.append(str(venv_real))
            _venv_needs(venv_real, walk)
            # Keep the path through the venv: its bin/python is a link to the base
            # interpreter, which finds the venv by the path it was started as.
            return str(venv_real / found.relative_to(venv)) if _is_relative(found, venv) else str(real)
    if _inside(str(real), SYSTEM_DIRS):
        walk.system.append(str(real))
        return str(real)
    if (prefix := _python_prefix(real)) is not None:
        _add(prefix, walk, what="the interpreter's prefix")
        return str(real)
    if (modules := _outermost_node_modules(real)) is not None:
        if why := _unsafe(modules, walk.host):
            walk.notes.append(f"{walk.key}: {modules} is not made visible ({why}); only {real} is")
        else:
            walk.visible.append(str(modules))
            return str(real)
    if why := _unsafe_file(real, walk.host):
        raise ConfigError("", [f"{walk.key}: {real} cannot be made visible to the sandbox: {why}"])
    walk.visible.append(str(real))
    return str(real)


def _venv_root(p: Path) -> Path | None:
    """The nearest folder above `p` with a pyvenv.cfg (the root itself never counts)."""
    for d in p.parents:
        if d == d.parent:
            return None
        if (d / "pyvenv.cfg").is_file():
            return d
    return None


def _venv_needs(venv: Path, walk: _Walk) -> None:
    """The base interpreter's prefix (`home` in pyvenv.cfg, where a Python is).

    Folders that the venv's .pth files name outside it are not made visible: a .pth
    is package data, written by whatever the operator installed, and binding what it
    names would let a package choose which of the operator's folders the sandbox
    reads (tests/test_mcp_attacks.py). An editable install (`pip install -e`) is one;
    a note says that its folder stays outside."""
    home = ""
    try:
        for line in (venv / "pyvenv.cfg").read_text(errors="replace").splitlines():
            k, sep, v = line.partition("=")
            if sep and k.strip() == "home":
                home = v.strip()
    except OSError:
        pass
    if home:
        base = Path(home)
        if any((base / name).is_file() for name in ("python3", "python")):
            _add(base.parent if base.name == "bin" else base, walk, what="the venv's base interpreter")
        else:
            walk.notes.append(f"{venv}/pyvenv.cfg names home = {home}, where there is no Python; nothing of it is made visible")
    named = 0
    for pth in sorted(venv.glob("lib/python*/site-packages/*.pth")):
        try:
            lines = pth.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if line.startswith("/") and not _is_relative(Path(os.path.realpath(line)), venv) and named < MAX_PTH_PATHS:
                named += 1
                walk.notes.append(
                    f"{pth.name} puts {line} on sys.path (an editable install?); it is not made visible to the sandbox: "
                    "install the package without -e"
                )


def _add(path: Path, walk: _Walk, *, what: str) -> None:
    real = Path(os.path.realpath(path))
    if not real.exists():
        return
    if _inside(str(real), SYSTEM_DIRS):
        walk.system.append(str(real))
        return
    if why := _unsafe(real, walk.host):
        walk.notes.append(f"{walk.key}: {what}, {real}, is not made visible ({why})")
        return
    walk.visible.append(str(real))


def _python_prefix(real: Path) -> Path | None:
    """`<prefix>` for an interpreter at `<prefix>/bin/python3.X` with its standard
    library beside it (`<prefix>/lib/python3.X`): a pyenv version, a uv-managed
    Python, a self-built one."""
    if not _PYTHON_NAME.fullmatch(real.name) or real.parent.name != "bin":
        return None
    prefix = real.parent.parent
    return prefix if any(prefix.glob("lib/python3*/os.py")) else None


def _outermost_node_modules(real: Path) -> Path | None:
    """Node looks for a package's dependencies in every node_modules above it: the
    outermost holds them all (nested ones included)."""
    found = None
    for d in real.parents:
        if d.name == "node_modules":
            found = d
    return found


def _shebang(real: Path, walk: _Walk) -> tuple[Path, list[str]] | None:
    """A script's interpreter (found as the command was) and the arguments the kernel
    would pass it before the script; None for anything else."""
    try:
        with open(real, "rb") as f:
            head = f.read(SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode(errors="replace").strip()
    interp, _, optarg = line.partition(" ")
    optarg = optarg.strip()
    if not interp:
        return None
    if os.path.basename(interp) != "env":
        return _as_path(interp, Path("/")), [optarg] if optarg else []
    words = optarg.split()
    if words[:1] == ["-S"]:
        words = words[1:]
    if not words or words[0].startswith("-") or "=" in words[0]:
        raise ConfigError("", [f"{walk.key}: the #! line of {real} ({line!r}) is not one clawsup can follow; give its interpreter as the command and the script in args"])
    hit = shutil.which(words[0], path=walk.search_path)
    if hit is None:
        raise ConfigError("", [f"{walk.key}: {real} is run by {words[0]!r} (its #! line), which was not found ({_where(words[0], walk)})"])
    return Path(os.path.abspath(hit)), words[1:]


def _unshim(shim: Path, walk: _Walk) -> Path:
    """A version manager's shim finds the real program at run time, with the
    manager's own files; inside the sandbox neither is there. pyenv's is asked
    where the program is, now (from the config's folder, whose .python-version
    counts); other managers' shims are refused."""
    try:
        text = shim.read_text(errors="replace")[:4096]
    except OSError:
        text = ""
    exe, root = _PYENV_EXEC.search(text), _PYENV_ROOT.search(text)
    if exe is None or root is None:
        raise ConfigError("", [
            f"{walk.key}: {shim} is a version manager's shim, which needs the manager inside the sandbox; "
            "give the program's real path instead"
        ])  # fmt: skip
    env = {**walk.host.environ, "PYENV_ROOT": root.group(1)}
    try:
        r = subprocess.run(
            [exe.group(1), "which", shim.name], capture_output=True, text=True, timeout=PYENV_TIMEOUT_S,
            env=env, cwd=walk.host.config_dir, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError("", [f"{walk.key}: {shim} is a pyenv shim and `pyenv which {shim.name}` failed ({e}); give the program's real path instead"]) from e
    out = r.stdout.strip()
    if r.returncode != 0 or not out.startswith("/"):
        why = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1][:300]
        raise ConfigError("", [f"{walk.key}: {shim} is a pyenv shim and `pyenv which {shim.name}` failed ({why}); give the program's real path instead"])
    return Path(out)


def _unsafe(d: Path, host: Host) -> str:
    """Why folder `d` (a real path) must not be bound into a sandbox; "" if it may."""
    if d == d.parent:
        return "it is the root folder"
    home = Path(os.path.realpath(host.home))
    if _is_relative(home, d):
        return "it is the home folder" if d == home else f"it holds the home folder {home}"
    if host.state_dir is not None:
        state = Path(os.path.realpath(host.state_dir))
        if _is_relative(state, d) or _is_relative(d, state):
            return f"clawsup's state directory is {state}"
    config = Path(os.path.realpath(host.config_dir))
    if _is_relative(config, d):
        return f"it holds the config's folder {config}"
    return ""


def _unsafe_file(real: Path, host: Host) -> str:
    if host.state_dir is not None and _is_relative(real, Path(os.path.realpath(host.state_dir))):
        return "it is inside clawsup's state directory"
    return ""


def _is_relative(p: Path, d: Path) -> bool:
    return p == d or d in p.parents


def _inside(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _outermost(paths: list[str]) -> list[str]:
    """Each path once, and none inside another (a bind of the outer one shows it)."""
    out: list[str] = []
    for p in sorted(set(paths), key=lambda x: (len(x), x)):
        if not _inside(p, out):
            out.append(p)
    return sorted(out)
