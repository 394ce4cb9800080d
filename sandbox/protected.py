"""Protected paths: the workspace paths that make the host run code later (git's hooks
and config, shell rc files, a plugin's own manifest and entry), read-only to the
sandbox (`LaunchSpec.protected_paths`, `sandbox.protectedPaths`).

The bwrap and docker launchers mount each one read-only over itself, inside the
child's view of the workspace. How each is found, at every launch, is what this
module decides (tests/test_sandbox_walls.py attacks each rule):

* Walked from the workspace one name at a time with O_PATH|O_NOFOLLOW: no symlink is
  ever followed, so no mount source can lie outside the workspace. The descriptors
  themselves are what bwrap mounts (`--ro-bind-fd`), so a name swapped after the
  walk changes nothing.
* A folder on the way to a protected path (`.git` for `.git/hooks`) is bound
  read-write over itself: a mount point cannot be renamed or removed (EBUSY), so the
  child cannot move `.git` aside and build another one beside it.
* A symlink at a protected path, or on the way to one, is refused: a mount cannot
  cover a link, and the child could re-point it. The launch fails with what to do.
  So is a protected file with another hard link (the child could write it through
  the other name).
* A symlink inside a protected folder (`.git/hooks/pre-commit -> ../../scripts/x`,
  a common way to share hooks) makes its target protected too, when it lies inside
  the workspace; the host would follow it.
* A regular file where a folder of a protected path should be (`.git` as a
  worktree's or submodule's gitfile) is itself protected: rewriting it would point
  git at a gitdir of the child's making.
* A missing protected path directly inside an existing `.git` folder is created
  before the launch, as `git init` would have made it (`hooks` a folder, anything
  else an empty file), and protected: otherwise the child could create it.
  Any other missing path is left alone, so that an operator's folder is not littered
  with a dozen empty rc files: it is protected from the launch after it appears. A
  whole `.git` made by a child running as its own uid is that uid's, and git on the
  host refuses to work in a repository another user owns ("dubious ownership").

Supervisor-side code; the file tools check the same list on the host's side
(sandbox/host/files.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

GIT_DIR = ".git"
GIT_FOLDERS = frozenset({"hooks", "info", "objects", "refs", "logs"})
"""Entries of a .git folder that git makes as folders; any other is a file."""
UNWALKED = frozenset({f"{GIT_DIR}/objects", f"{GIT_DIR}/lfs"})
"""Folders of a protected .git not searched for links: content-addressed data that
git never runs, often by the ten thousand, and hard-linked by `git clone --local`."""
MAX_LINKS_FOLLOWED = 256
"""Symlinks inside protected folders whose targets are protected too, at most."""


class ProtectedPathError(OSError):
    """A protected path is in a shape that cannot be made read-only. For the operator:
    the sandbox does not start until the workspace is fixed."""


def normalize(path: str) -> str | None:
    """`path` as clean workspace-relative parts joined by `/`, or None when it is empty,
    absolute or leaves the workspace."""
    if not isinstance(path, str) or path.startswith("/") or "\0" in path:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def covers(protected: Iterable[str], rel: str) -> str | None:
    """The protected path that `rel` (normalized, workspace-relative) is or lies under,
    or None."""
    for p in protected:
        if rel == p or rel.startswith(p + "/"):
            return p
    return None


@dataclass(frozen=True)
class Mount:
    """One bind of a workspace entry over itself, in the child's view."""

    rel: str
    """Workspace-relative path, no symlink on the way."""
    fd: int
    """O_PATH descriptor of the entry; owned by the `Mounts` that holds it."""
    writable: bool
    """True for a folder on the way to a protected path (pinned so it cannot be moved
    aside), False for a protected path itself."""


class Mounts:
    """The mounts of one launch, in the order to apply them (parents first). Created by
    `resolve`; the launcher closes it once the child holds its own view."""

    def __init__(self, mounts: list[Mount]) -> None:
        self.items = mounts

    def close(self) -> None:
        for m in self.items:
            with contextlib.suppress(OSError):
                os.close(m.fd)
        self.items = []

    def __enter__(self) -> Mounts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve(workspace: Path, paths: Iterable[str]) -> Mounts:
    """The mounts that make `paths` read-only in `workspace` (see the module's rules).
    Raises ProtectedPathError when one cannot be protected."""
    wanted = sorted({n for p in paths if (n := normalize(p)) is not None})
    found: dict[str, Mount] = {}
    root = os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for rel in wanted:
            _walk(root, rel, found, workspace)
        links = 0
        for m in list(found.values()):
            if not m.writable and stat.S_ISDIR(os.fstat(m.fd).st_mode):
                for link, target in _link_targets_inside(m.fd, m.rel, workspace):
                    links += 1
                    if links > MAX_LINKS_FOLLOWED:
                        raise ProtectedPathError(
                            f"the workspace's protected folders hold more than {MAX_LINKS_FOLLOWED} symlinks into it; "
                            "replace them with the files they point to"
                        )
                    if covers([r for r, x in found.items() if not x.writable], target):
                        continue
                    if not _walk(root, target, found, workspace):
                        raise ProtectedPathError(
                            f"{workspace / link} is a symlink to {target!r}, which does not exist: the sandbox could create "
                            "it, and the host would then run it. Remove the link, or create what it points to"
                        )
    except BaseException:
        Mounts(list(found.values())).close()
        raise
    finally:
        os.close(root)
    return Mounts(sorted(found.values(), key=lambda m: (m.rel.count("/"), m.rel)))


def _walk(root: int, rel: str, found: dict[str, Mount], workspace: Path) -> bool:
    """Adds the mounts for `rel`; False when it does not exist (and is left alone)."""
    parts = rel.split("/")
    fd = os.dup(root)
    try:
        for i, name in enumerate(parts):
            here = "/".join(parts[: i + 1])
            last = i == len(parts) - 1
            try:
                nfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not (last and parts[i - 1 : i] == [GIT_DIR]):
                    return False
                nfd = _make_git_entry(fd, name)
            st = os.fstat(nfd)
            if stat.S_ISLNK(st.st_mode):
                os.close(nfd)
                raise ProtectedPathError(
                    f"{workspace / here} is a symlink, and {rel!r} is a protected path (sandbox.protectedPaths), which must be "
                    "a real file or folder to be made read-only; replace the link with what it points to, or take the path "
                    "out of sandbox.protectedPaths"
                )
            if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                os.close(nfd)
                raise ProtectedPathError(
                    f"{workspace / here} has {st.st_nlink - 1} other hard link(s), and {rel!r} is a protected path "
                    "(sandbox.protectedPaths): the sandbox could change it through another name. Give it a single name "
                    "(cp it aside and move the copy over it), or take the path out of sandbox.protectedPaths"
                )
            if last or not stat.S_ISDIR(st.st_mode):
                # The protected path itself, or a file where its folder belongs (a
                # gitfile): read-only.
                old = found.get(here)
                if old is not None:
                    os.close(old.fd)
                found[here] = Mount(here, nfd, writable=False)
                return True
            if here not in found:
                found[here] = Mount(here, os.dup(nfd), writable=True)
            os.close(fd)
            fd = nfd
        return True
    finally:
        os.close(fd)


def _make_git_entry(dir_fd: int, name: str) -> int:
    """Create a missing entry of a .git folder as git would, owned by us."""
    if name in GIT_FOLDERS:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=dir_fd)
    else:
        with contextlib.suppress(FileExistsError):
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd))
    return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _link_targets_inside(dir_fd: int, rel: str, workspace: Path) -> list[tuple[str, str]]:
    """(link, target) for the symlinks in a protected folder (recursively, no link
    followed on the way) whose targets lie inside the workspace, both relative to
    it. A file in it with another hard link is refused, as in `_walk`."""
    real_ws = os.path.realpath(workspace)
    out: list[tuple[str, str]] = []
    stack = [(rel, os.open(f"/proc/self/fd/{dir_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))]
    try:
        while stack:
            here, fd = stack[-1]
            with os.scandir(fd) as it:
                entries = list(it)
            stack.pop()
            try:
                for e in entries:
                    if e.is_symlink():
                        # The host resolves it from the link's folder, as that sits in
                        # the real workspace.
                        full = os.path.normpath(os.path.join(real_ws, here, os.readlink(e.name, dir_fd=fd)))
                        if full.startswith(real_ws + "/") and (n := normalize(os.path.relpath(full, real_ws))):
                            out.append((f"{here}/{e.name}", n))
                    elif e.is_file(follow_symlinks=False) and (links := e.stat(follow_symlinks=False).st_nlink) > 1:
                        raise ProtectedPathError(
                            f"{workspace / here / e.name} has {links - 1} other hard link(s), and it lies in the protected folder "
                            f"{rel!r} (sandbox.protectedPaths): the sandbox could change it through another name. Give it a "
                            "single name, or take the folder out of sandbox.protectedPaths"
                        )
                    elif e.is_dir(follow_symlinks=False) and here.count("/") < 32 and f"{here}/{e.name}" not in UNWALKED:
                        with contextlib.suppress(OSError):
                            sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                            stack.append((f"{here}/{e.name}", sub))
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)
    return out


def host_path(workspace: Path, m: Mount) -> str:
    """The mount's source as a host path (for engines that take paths, not fds)."""
    return str(Path(workspace, m.rel))


def docker_volumes(workspace: Path, paths: Iterable[str], inside: str) -> dict[str, dict[str, str]]:
    """`volumes=` entries for the docker SDK: each protected path read-only over
    itself under `inside` (the container's workspace), its folders pinned read-write.
    The engine takes host paths; they were walked without following links just now,
    while no child of this sandbox runs."""
    with resolve(workspace, paths) as ms:
        return {host_path(workspace, m): {"bind": f"{inside}/{m.rel}", "mode": "rw" if m.writable else "ro"} for m in ms.items}
