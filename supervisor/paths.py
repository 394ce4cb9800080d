"""Where a supervisor keeps its state: `--state-dir`, else `CLAWSUP_HOME`, else
`$XDG_STATE_HOME/clawsup` (by default `~/.local/state/clawsup`).

    <state>/run/control.sock     control API, 0600, in a 0700 directory
    <state>/run/supervisor.pid   held under an flock while a supervisor runs
    <state>/logs/<sandbox>.log   each sandbox's output and lifecycle, rotated
    <state>/logs/supervisor.log  the supervisor's own log
    <state>/sandboxes/<id>/workspace   the child's cwd and HOME
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

# sun_path holds 108 bytes; leave room for "/<sandbox id>/host.sock".
MAX_SOCKET_DIR = 60


def resolve_state_dir(flag: str | Path | None) -> Path:
    if flag:
        return Path(flag).expanduser().resolve()
    env = os.environ.get("CLAWSUP_HOME")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return (Path(xdg) / "clawsup").resolve()


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
        """The parent of the children's socket directories (each child's own is 0700),
        short enough for sun_path. Deep state directories get one under the temp dir,
        named after the state dir so that restarts reuse it.

        With `other_uid` (children run as another user) it cannot sit inside `run/`,
        which only the supervisor may enter: it is `<state>/hosts`, 0711, which lets
        a child reach its own directory by name and list nothing."""
        here = self.root / "hosts" if other_uid else self.run / "hosts"
        if len(str(here)) > MAX_SOCKET_DIR:
            digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
            here = Path(tempfile.gettempdir()) / f"clawsup-{os.getuid()}-{digest}"
        here.mkdir(parents=True, exist_ok=True)
        os.chmod(here, 0o711 if other_uid else 0o700)
        return here

    def open_path_for_children(self) -> None:
        """Children that run as another user need to reach their workspace by its
        absolute path (HOME, TMPDIR): the state directory and `sandboxes/` become
        0711, enter-only. `run/` (the control socket) and `logs/` stay 0700."""
        for d in (self.root, self.sandboxes):
            os.chmod(d, 0o711)

    def ensure(self) -> None:
        for d in (self.root, self.sandboxes):
            d.mkdir(parents=True, exist_ok=True)
        # The control socket and the logs are the supervisor's alone.
        for d in (self.run, self.logs):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)
