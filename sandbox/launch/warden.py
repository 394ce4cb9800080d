"""The warden: a tiny process that outlives a SIGKILLed supervisor long enough to
kill what its sandboxes left behind.

PR_SET_PDEATHSIG kills each host child when the supervisor dies, but not the
processes a plugin started: they are the host's children, not the supervisor's. Nor
does it reach a container: the engine, not the supervisor, is its parent. The warden
is started once per supervisor, in its own session, with a pipe on stdin. The
supervisor writes `add <pgid> [<cgroup dir>...]` and `del <pgid>` lines as sandboxes
start and die, and `add-container <name>` / `del-container <name>` for containers
(the name is sent before the container is created, so none is ever unlisted). When
the pipe reaches EOF the supervisor is gone (the kernel closes its end however it
died): the warden SIGKILLs every group and cgroup still listed, has the engine remove
every container still listed, and exits, within CONTAINER_DEADLINE_S.
tests/test_faults.py::test_supervisor_sigkill_leaves_no_child,
tests/test_docker_hostile.py::test_containers_die_with_a_sigkilled_supervisor.

Stdlib only, run with `python -I -S`: it must start fast and depend on nothing (so
the engine is spoken to over its HTTP API with http.client, not the docker SDK).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

CONTAINER_DEADLINE_S = 15.0
"""The most the warden spends on the engine: an engine that does not answer must not
keep it alive for good."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")


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


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


def _engine(timeout: float) -> http.client.HTTPConnection:
    """A connection to the engine the supervisor's docker SDK uses (`DOCKER_HOST`,
    else the default socket). Plain tcp is spoken too; TLS is not (its settings are
    the SDK's business), and the next start's stale sweep covers that case."""
    host = os.environ.get("DOCKER_HOST", "") or "unix:///var/run/docker.sock"
    url = urlsplit(host)
    if url.scheme == "unix":
        return _UnixHTTPConnection(url.path, timeout)
    if url.scheme in ("tcp", "http"):
        return http.client.HTTPConnection(url.hostname or "localhost", url.port or 2375, timeout=timeout)
    raise OSError(f"DOCKER_HOST {host!r} is not a unix or plain tcp address")


def _remove_container(name: str, deadline: float) -> None:
    # One request does it: force removal SIGKILLs the container first.
    while (left := deadline - time.monotonic()) > 0:
        try:
            conn = _engine(left)
            try:
                conn.request("DELETE", f"/containers/{name}?force=1&v=1")
                status = conn.getresponse().status
            finally:
                conn.close()
        except OSError as e:
            print(f"clawsup warden: cannot remove container {name}: {e}", file=sys.stderr)
            return
        # 409: a removal is already under way (the engine's own, or a new
        # supervisor's stale sweep); ask again until it is gone.
        if status != 409:
            return
        time.sleep(0.2)


def _remove_containers(names: set[str]) -> None:
    deadline = time.monotonic() + CONTAINER_DEADLINE_S
    threads = [threading.Thread(target=_remove_container, args=(n, deadline), daemon=True) for n in sorted(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def main() -> None:
    # Ctrl-C in the supervisor's terminal is for the supervisor, not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: dict[int, list[str]] = {}
    containers: set[str] = set()
    for raw in sys.stdin.buffer:
        parts = raw.decode(errors="replace").split()
        if len(parts) >= 2 and parts[0] == "add":
            groups[int(parts[1])] = parts[2:]
        elif len(parts) == 2 and parts[0] == "del":
            groups.pop(int(parts[1]), None)
        elif len(parts) == 2 and parts[0] == "add-container" and _NAME.fullmatch(parts[1]):
            containers.add(parts[1])
        elif len(parts) == 2 and parts[0] == "del-container":
            containers.discard(parts[1])
    for pgid, cgroups in groups.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for d in cgroups:
            _kill_cgroup(d)
    if containers:
        _remove_containers(containers)


if __name__ == "__main__":
    main()
