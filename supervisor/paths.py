"""Where a supervisor keeps its state: `--state-dir`, else `CLAWSUP_HOME`, else
`$XDG_STATE_HOME/clawsup` (by default `~/.local/state/clawsup`).

    <state>/run/control.sock     control API, 0600, in a 0700 directory
    <state>/run/supervisor.pid   held under an flock while a supervisor runs
    <state>/run/hosts/<id>/      a child's socket folder (or <state>/hosts/<id>, below)
    <state>/logs/<sandbox>.log   each sandbox's output and lifecycle, rotated
    <state>/logs/supervisor.log  the supervisor's own log
    <state>/sandboxes/<id>/workspace   the child's cwd and HOME
    <state>/sandboxes/<id>/private     what the supervisor hands the child, its alone

Who may write where. The state directory and every folder above is the
supervisor's alone: created with mkdir (never through a symlink), then checked by
descriptor (a directory, ours, not writable by group or others) before use, else
`clawsup start` refuses with a sentence naming the path and the fix (UnsafeStatePath).
A workspace and a socket folder are the child's: whatever is in them is hostile, and
the supervisor touches their contents only by descriptor, without following
(`workspace_tmp`, sandbox/socket_paths.py, sandbox/launch/process.py `_give`).

Socket paths are never shortened by moving them elsewhere: a path longer than
sun_path is reached through a descriptor of its folder (sandbox/socket_paths.py).
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from clawsup.sandbox.socket_paths import describe_kind
from clawsup.supervisor.errors import ClawsupError

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class UnsafeStatePath(ClawsupError):
    """A folder of the state directory that someone other than the supervisor's user
    could have planted or could change. For the operator."""

    code = "unsafe_state_path"


def resolve_state_dir(flag: str | Path | None) -> Path:
    """The state directory, absolute. Symlinks on the way to it are resolved, but not
    the directory itself: a state directory that is a symlink is refused at start
    rather than silently followed."""
    if flag:
        chosen = Path(flag).expanduser()
    elif env := os.environ.get("CLAWSUP_HOME"):
        chosen = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        chosen = Path(xdg) / "clawsup"
    p = Path(os.path.abspath(chosen))
    return p.parent.resolve() / p.name if p.name else p


def _refuse(path: Path, what: str, fix: str) -> UnsafeStatePath:
    return UnsafeStatePath(f"refusing to use {path}: {what}. {fix}")


def own_dir(path: Path, mode: int | None) -> None:
    """Make `path` a directory of ours, in a folder that is ours: mkdir (which never
    follows a symlink), then checked by descriptor: a directory, not a symlink, ours,
    not writable by group or others. `mode` is then set (None: kept as found)."""
    try:
        os.mkdir(path, 0o700 if mode is None else mode)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, OPEN_DIR)
    except OSError as e:
        try:
            kind = describe_kind(os.lstat(path).st_mode)
        except OSError:
            kind = f"unusable ({e.strerror})"
        raise _refuse(path, f"it is {kind}, not a directory", "clawsup keeps its state only in real directories that it owns; "
                      "remove it, or point --state-dir (or CLAWSUP_HOME) at a real directory") from None  # fmt: skip
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise _refuse(path, f"it belongs to uid {st.st_uid}, not to this supervisor's uid {os.geteuid()}",
                          "Someone else could have planted what is in it; remove it or use another --state-dir")  # fmt: skip
        if st.st_mode & 0o022:
            raise _refuse(path, f"it is writable by {'others' if st.st_mode & 0o002 else 'its group'} (mode {stat.S_IMODE(st.st_mode):o})",
                          f"Anyone who can write it could plant paths in it; `chmod go-w {path}` (after checking its contents) or use another --state-dir")  # fmt: skip
        if mode is not None and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def child_dir(path: Path, mode: int) -> None:
    """A directory the child will own (its workspace, its socket folder), in a folder
    that is ours, so its name cannot have been planted: made if missing, refused if
    it is anything but a directory, and set to `mode` by descriptor."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    fd = os.open(path, OPEN_DIR)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def workspace_tmp(workspace: Path, name: str = ".tmp") -> tuple[Path | None, list[str]]:
    """`<workspace>/.tmp` as a directory (TMPDIR on the process backend), though the
    child may have put anything at that name: it is handled by the workspace's
    descriptor, never followed, never opened but as a directory (a FIFO cannot block
    us). A regular file there is moved aside (the child may want its data), anything
    else (a symlink, a FIFO, a device, a socket) is removed. Returns the directory
    (None if the child keeps winning a race for the name) and what was done, one
    sentence each, for the sandbox's log; never raises for what it finds."""
    notes: list[str] = []
    wfd = os.open(workspace, OPEN_DIR)
    try:
        ws = os.fstat(wfd)
        for _ in range(3):
            try:
                os.mkdir(name, 0o700, dir_fd=wfd)
            except FileExistsError:
                pass
            try:
                fd = os.open(name, OPEN_DIR, dir_fd=wfd)
            except OSError:
                try:
                    st = os.stat(name, dir_fd=wfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    return workspace / name, notes  # a directory we cannot open: the child's business
                if stat.S_ISREG(st.st_mode):
                    aside = f"{name}.moved-{secrets.token_hex(4)}"
                    os.rename(name, aside, src_dir_fd=wfd, dst_dir_fd=wfd)
                    notes.append(f"{name} in the workspace was a regular file, not a directory: moved it aside to {aside}")
                else:
                    os.unlink(name, dir_fd=wfd)
                    notes.append(f"{name} in the workspace was {describe_kind(st.st_mode)}, not a directory: removed it (not followed)")
                continue
            try:
                if os.fstat(fd).st_uid == os.geteuid() != ws.st_uid:
                    # Just made by us in a workspace that is already the child's.
                    os.fchown(fd, ws.st_uid, ws.st_gid)
            finally:
                os.close(fd)
            return workspace / name, notes
        notes.append(f"could not make {name} a directory in the workspace (something keeps replacing it); TMPDIR is not set")
        return None, notes
    finally:
        os.close(wfd)


def _check_ancestors(root: Path) -> None:
    """Every folder above the state directory, on the path as given and on the real
    path, must be one nobody else can change: owned by root or by us, and not
    writable by others (unless sticky, as /tmp is)."""
    me = os.geteuid()
    seen: set[Path] = set()
    for d in (*root.parents, *root.parent.resolve().parents, root.parent.resolve()):
        if d in seen:
            continue
        seen.add(d)
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode):
            continue  # its folder is on the path as given, its target on the real path
        if st.st_uid not in (0, me):
            raise _refuse(root, f"{d} above it belongs to uid {st.st_uid}, who could replace the state directory",
                          "Put the state directory under a folder of yours or root's (--state-dir or CLAWSUP_HOME)")  # fmt: skip
        sticky = bool(st.st_mode & stat.S_ISVTX)
        if not sticky and (st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != os.getegid())):
            raise _refuse(root, f"{d} above it is writable by others (mode {stat.S_IMODE(st.st_mode):o}), who could replace the state directory",
                          "Put the state directory under a folder only you (or root) can write")  # fmt: skip


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def control_socket(self) -> Path:
        return self.run / "control.sock"

    @property
    def pidfile(self) -> Path:
        return self.run / "supervisor.pid"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def sandboxes(self) -> Path:
        return self.root / "sandboxes"

    @property
    def sessions(self) -> Path:
        """One JSONL file per session key (0700: conversations are private)."""
        return self.root / "sessions"

    def sandbox_log(self, sandbox_id: str) -> Path:
        return self.logs / f"{sandbox_id}.log"

    def host_sockets(self, *, other_uid: bool = False) -> Path:
        """The parent of the children's socket folders (each child's own is 0700 and
        the child's). Always under the state directory, however deep: a long path is
        dialled through a descriptor (sandbox/socket_paths.py), never moved to /tmp.

        With `other_uid` (children run as another user) it cannot sit inside `run/`,
        which only the supervisor may enter: it is `<state>/hosts`, 0711, which lets
        a child reach its own folder by name and list nothing."""
        here = self.root / "hosts" if other_uid else self.run / "hosts"
        own_dir(here, 0o711 if other_uid else 0o700)
        return here

    def open_path_for_children(self) -> None:
        """Children that run as another user need to reach their workspace by its
        absolute path (HOME, TMPDIR): the state directory and `sandboxes/` become
        0711, enter-only. `run/` (the control socket) and `logs/` stay 0700."""
        for d in (self.root, self.sandboxes):
            own_dir(d, 0o711)

    def ensure(self) -> None:
        """Create or check the state directory and the supervisor's folders in it;
        raises UnsafeStatePath (a sentence for the operator) when one of them is not
        safely ours."""
        parent = self.root.parent
        if not parent.is_dir():
            os.makedirs(parent, mode=0o700, exist_ok=True)
        _check_ancestors(self.root)
        own_dir(self.root, None)
        own_dir(self.sandboxes, None)
        # The control socket, the logs and the conversations are the supervisor's alone.
        for d in (self.run, self.logs, self.sessions):
            own_dir(d, 0o700)
