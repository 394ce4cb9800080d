"""What every `clawsup` command that talks to a running gateway shares: the consoles,
the `--state-dir` and `--json` options, and the control API call that turns a
refusal into an error message and an exit code (supervisor/control/cli.py lists
them: 1 the operation failed, 3 no supervisor running)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from clawsup.supervisor.control.api import ControlClient, SupervisorNotRunning
from clawsup.supervisor.paths import StatePaths, resolve_state_dir
from clawsup.supervisor.printable import printable_lines

out = Console()
err = Console(stderr=True)

StateDir = Annotated[Optional[Path], typer.Option("--state-dir", help="State directory (default: $CLAWSUP_HOME, else ~/.local/state/clawsup).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def paths_of(state_dir: Path | None) -> StatePaths:
    return StatePaths(resolve_state_dir(state_dir))


def client(state_dir: Path | None, timeout: float = 60.0) -> ControlClient:
    return ControlClient(paths_of(state_dir).control_socket, timeout=timeout)


def fail(message: str, code: int = 1) -> NoReturn:
    # Errors quote children (a tool's error, a stderr tail): no markup, no escapes.
    err.print(f"[red]error:[/red] {escape(printable_lines(message))}", highlight=False)
    raise typer.Exit(code)


def call(state_dir: Path | None, req: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    try:
        return client(state_dir, timeout).request(req)
    except SupervisorNotRunning as e:
        fail(str(e), 3)


def data_or_fail(resp: dict[str, Any]) -> Any:
    if not resp.get("ok"):
        fail(resp.get("error", {}).get("message", "unknown error"))
    return resp["data"]
