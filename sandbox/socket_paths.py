"""Unix socket paths, for both sides of the wire: how to reach a socket whose path
is too long for sun_path, and how the supervisor dials a socket that lies in a
folder its child can write. Stdlib only: the child imports it too.

Length. sun_path holds 107 bytes and a NUL. A deeper path is reached through a
descriptor of its folder: `/proc/self/fd/N/<name>` is short whatever the folder's
depth, and works for bind and connect alike. So no socket ever needs a folder of
its own elsewhere (a predictable one under /tmp is what a local user plants first).

Dialling into a child's folder. The name of the child's socket is the child's to
change at any moment: into a symlink to a listener of its own (which would receive
the sandbox's tokens), a FIFO, another sandbox's socket. The supervisor opens the
name once, with O_PATH|O_NOFOLLOW (no symlink followed, nothing actually opened, so
a FIFO or a device cannot block it), checks what it got (a socket owned by the
folder's owner, the child), and dials `/proc/self/fd/N`: the kernel connects to
that very inode on every connect and reconnect, whatever the name has become since.
tests/test_hostile_paths.py.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

SUN_PATH_MAX = 107


def fits(path: str | os.PathLike[str]) -> bool:
    return len(os.fsencode(path)) <= SUN_PATH_MAX


@contextlib.contextmanager
def short_address(path: str | os.PathLike[str]) -> Iterator[str]:
    """A path to bind or connect at `path` by name: `path` itself when it fits in
    sun_path, else `/proc/self/fd/N/<name>` through a descriptor of its folder, held
    for the block. Only for folders that the caller trusts (its own): the name is
    followed as usual."""
    text = os.fspath(path)
    if fits(text):
        yield text
        return
    folder, name = os.path.split(text)
    fd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


class UnsafeSocket(Exception):
    """What sits at a child's socket name is not the child's socket."""


def describe_kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "something unknown"


def open_child_socket(path: str | os.PathLike[str]) -> int:
    """An O_PATH descriptor of the socket at `path`, which lies in a folder the
    child may write; dial it as `dial_address(fd)` and close it once the channel is
    closed. The folder itself must be one the child cannot replace (its parent is
    the supervisor's). Raises UnsafeSocket, a sentence, unless the name holds a
    socket owned by the folder's owner (the child's uid, or ours)."""
    folder, name = os.path.split(os.fspath(path))
    dfd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        owner = os.fstat(dfd).st_uid
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            raise UnsafeSocket(f"{path} is gone (the child removed or renamed it)") from None
        st = os.fstat(fd)
        problem = ""
        if not stat.S_ISSOCK(st.st_mode):
            problem = f"{path} is {describe_kind(st.st_mode)}, not a socket"
        elif st.st_uid != owner:
            problem = f"{path} is a socket of uid {st.st_uid}, not of the sandbox's uid {owner} (a link to someone else's)"
        if problem:
            os.close(fd)
            raise UnsafeSocket(problem)
        return fd
    finally:
        os.close(dfd)


def dial_address(fd: int) -> str:
    return f"/proc/self/fd/{fd}"
