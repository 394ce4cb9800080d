"""What a process-backend child left in the host's shared scratch folders (/tmp and
/dev/shm), removed when its incarnation is closed.

Only for a child that ran as its own uid (one that no user of the machine has, see
sandbox/launch/uids.py): everything that uid owns there is the sandbox's, and nobody
else's files are touched. Never for a child that ran as the supervisor's user or a
named one, whose files there are not the sandbox's to remove. bwrap and docker
children have private ones, gone with their namespace.

The walk never follows a symlink (every folder is opened relative to its parent
with O_NOFOLLOW), stays on the folder's own filesystem, and enters only folders the
uid could have written into (its own, or writable by others), so a busy /tmp costs
little. Bounded in depth and entries; what lies beyond stays. Supervisor-side code,
run when the child is dead, so nothing of the uid is writing meanwhile, and in a
worker thread (ProcessChild.aclose), never on the event loop.
tests/test_sandbox_walls.py.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat

from clawsup.sandbox.launch.launcher import ChildUser, Pacer

SCRATCH = ("/tmp", "/dev/shm")
MAX_DEPTH = 64
MAX_ENTRIES = 100_000


def own_uid(user: ChildUser | None) -> bool:
    """Whether `user` is a sandbox's own uid: not root, not us, no user of the machine."""
    if user is None or user.uid in (0, os.geteuid()):
        return False
    try:
        pwd.getpwuid(user.uid)
    except KeyError:
        return True
    return False


def remove(user: ChildUser, folders: tuple[str, ...] = SCRATCH) -> int:
    """Remove what `user` owns in `folders`; returns how many entries went."""
    budget = [MAX_ENTRIES]
    pacer = Pacer()
    removed = 0
    for top in folders:
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            removed += _sweep(fd, os.fstat(fd).st_dev, user, 0, budget, pacer)
        finally:
            os.close(fd)
    return removed


def _sweep(dfd: int, dev: int, user: ChildUser, depth: int, budget: list[int], pacer: Pacer) -> int:
    removed = 0
    try:
        with os.scandir(dfd) as it:
            names = [e.name for e in it]
    except OSError:
        return 0
    for name in names:
        pacer.tick()
        budget[0] -= 1
        if budget[0] < 0:
            break
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            continue
        mine = st.st_uid == user.uid
        if stat.S_ISDIR(st.st_mode):
            writable = mine or st.st_mode & stat.S_IWOTH or (st.st_gid == user.gid and st.st_mode & stat.S_IWGRP)
            if writable and st.st_dev == dev and depth < MAX_DEPTH:
                with contextlib.suppress(OSError):
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                    try:
                        if os.fstat(sub).st_ino == st.st_ino:
                            removed += _sweep(sub, dev, user, depth + 1, budget, pacer)
                    finally:
                        os.close(sub)
            if mine:
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=dfd)
                    removed += 1
        elif mine:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
                removed += 1
    return removed
