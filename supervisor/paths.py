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

    def sandbox_log(self, sandbox_id: str) -> Path:
        return self.logs / f"{sandbox_id}.log"

    def host_sockets(self) -> Path:
        """A 0700 directory for the children's sockets, short enough for sun_path.
        Deep state directories get one under the temp dir, named after the state
        dir so that restarts reuse it."""
        here = self.run / "hosts"
        if len(str(here)) > MAX_SOCKET_DIR:
            digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
            here = Path(tempfile.gettempdir()) / f"clawsup-{os.getuid()}-{digest}"
        here.mkdir(parents=True, exist_ok=True)
        os.chmod(here, 0o700)
        return here

    def ensure(self) -> None:
        for d in (self.root, self.logs, self.sandboxes):
            d.mkdir(parents=True, exist_ok=True)
        self.run.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run, 0o700)
