"""Test helper: run a command in a private mount namespace where every directory on
the way to the given paths can be entered by other users, without touching the real
file system. This machine keeps Python under /root (mode 0700), where no
unprivileged user could start it; the privilege-drop tests need one that can.

    unshare --mount --propagation private python open_paths.py PATH... -- CMD ARG...

Each closed ancestor is replaced, in this namespace only, by a 0755 directory whose
entries are bind mounts of the original's entries.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path


def open_dir(d: Path) -> None:
    shadow = Path(tempfile.mkdtemp(prefix="open-"))
    os.chmod(shadow, 0o755)
    for entry in os.scandir(d):
        target = shadow / entry.name
        if entry.is_dir(follow_symlinks=False):
            target.mkdir()
        elif entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
            continue
        else:
            target.touch()
        subprocess.run(["mount", "--bind", entry.path, str(target)], check=True)
    subprocess.run(["mount", "--rbind", str(shadow), str(d)], check=True)


def main() -> None:
    sep = sys.argv.index("--")
    paths, cmd = sys.argv[1:sep], sys.argv[sep + 1 :]
    done: set[Path] = set()
    for p in paths:
        for d in reversed(Path(p).resolve().parents):
            if d in done or d == Path("/"):
                continue
            done.add(d)
            if not os.stat(d).st_mode & stat.S_IXOTH:
                open_dir(d)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
