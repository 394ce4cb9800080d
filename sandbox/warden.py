"""The warden: a tiny process that outlives a SIGKILLed supervisor long enough to
kill what its sandboxes left behind.

PR_SET_PDEATHSIG kills each host child when the supervisor dies, but not the
processes a plugin started: they are the host's children, not the supervisor's. The
warden is started once per supervisor, in its own session, with a pipe on stdin.
The supervisor writes `add <pgid> [<cgroup dir>...]` and `del <pgid>` lines as
sandboxes start and die. When the pipe reaches EOF the supervisor is gone (the kernel
closes its end however it died): the warden SIGKILLs every group and cgroup still
listed, and exits. tests/test_faults.py::test_supervisor_sigkill_leaves_no_child.

Stdlib only, run with `python -I -S`: it must start fast and depend on nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path


def _kill_cgroup(d: str) -> None:
    procs = Path(d) / "cgroup.procs"
    for _ in range(50):
        try:
            pids = [int(x) for x in procs.read_text().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def main() -> None:
    # Ctrl-C in the supervisor's terminal is for the supervisor, not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: dict[int, list[str]] = {}
    for raw in sys.stdin.buffer:
        parts = raw.decode(errors="replace").split()
        if len(parts) >= 2 and parts[0] == "add":
            groups[int(parts[1])] = parts[2:]
        elif len(parts) == 2 and parts[0] == "del":
            groups.pop(int(parts[1]), None)
    for pgid, cgroups in groups.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for d in cgroups:
            _kill_cgroup(d)


if __name__ == "__main__":
    main()
