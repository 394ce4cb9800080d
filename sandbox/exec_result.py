"""What became of one `exec` command: the one result type on both sides of the wire.

The host's exec runner makes it (sandbox/host/exec_runner.py), the host's server sends
it as an `ExecResult` message (sandbox/host/server.py), the supervisor's host client
reads it back (supervisor/sandboxes/host_client.py), and the exec tool and
`clawsup exec run` render it (`to_json`, `describe`). Stdlib only, so that the child,
which cannot import the supervisor, may import it.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecResult:
    exit_code: int | None = None
    """Set when the command exited."""
    signal: int | None = None
    """Set when a signal ended it (at the deadline: SIGTERM, or SIGKILL after the grace)."""
    timed_out: bool = False
    truncated: bool = False
    """Output was left out between the head and the tail (the cap)."""
    duration_s: float = 0.0
    output_bytes: int = 0
    """Everything the command wrote, including what the cap left out."""
    error: str = ""
    """The command could not be started (a bad workdir, a missing shell): nothing ran."""

    def to_json(self) -> dict[str, object]:
        """The fields the model (the exec tool's result) and `clawsup exec run --json`
        see; each adds its own (the output; the rule that refused the command)."""
        return {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "duration_s": round(self.duration_s, 4),
            "output_bytes": self.output_bytes,
        }

    def describe(self) -> str:
        """One line for the sandbox's log (`clawsup logs <workspace sandbox>`)."""
        if self.error:
            return f"not started: {self.error}"
        if self.signal is not None:
            try:
                how = f"killed by {_signal.Signals(self.signal).name}"
            except ValueError:
                how = f"killed by signal {self.signal}"
        else:
            how = f"exit {self.exit_code}"
        extra = (", timed out" if self.timed_out else "") + (f", output cut ({self.output_bytes} bytes)" if self.truncated else "")
        return f"{how} after {self.duration_s:.3f} s{extra}"
