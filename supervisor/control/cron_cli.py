"""`clawsup cron ...`: the operator's view of the cron jobs of a running gateway,
over the control API (supervisor/automation/scheduler.py does the work). Added to
the main app by supervisor/control/cli.py."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from clawsup.supervisor.control.cli_common import JsonFlag, StateDir, call, data_or_fail, out
from clawsup.supervisor.printable import printable

cron_app = typer.Typer(help="Scheduled agent turns: add, list and remove jobs, run one now, read its runs.", no_args_is_help=True)

RUN_STYLE = {"ok": "green", "running": "yellow", "skipped": "dim", "failed": "red", "timed_out": "red"}


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _cron(state_dir: Any, action: str, timeout: float = 60.0, **fields: Any) -> Any:
    return data_or_fail(call(state_dir, {"op": "cron", "action": action, **{k: v for k, v in fields.items() if v is not None}}, timeout))


def _say(data: Any, as_json: bool, done: str) -> None:
    if as_json:
        print(json.dumps(data))
    else:
        out.print(done, highlight=False)


@cron_app.command("list")
def cron_list(state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Every job: its schedule, whether it is enabled, when it runs next, and how its
    last run ended."""
    data = _cron(state_dir, "list")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table()
    for col in ("id", "name", "agent", "schedule", "enabled", "next run", "last run", "reply to"):
        table.add_column(col)
    for j in data["jobs"]:
        last = j.get("last")
        last_s = "-" if last is None else f"[{RUN_STYLE.get(last['status'], '')}]{last['status']}[/] {_when(last.get('endedAt') or last['firedAt'])}"
        target = f"{j['channel']}:{j['peer']}" if j.get("channel") else "(silent)"
        table.add_row(
            j["id"], escape(printable(j["name"])), j["agent"], escape(printable(j["describe"])) + (" [dim](system)[/dim]" if j.get("system") else ""),
            "yes" if j["enabled"] else "[dim]no[/dim]", _when(j.get("nextRunAt")) + (" [yellow](running)[/yellow]" if j.get("running") else ""),
            last_s, escape(printable(target)),
        )  # fmt: skip
    out.print(table)


@cron_app.command("add")
def cron_add(
    name: Annotated[str, typer.Option("--name", help="A short name for the job.")],
    message: Annotated[str, typer.Option("--message", help="What the agent is told at each run.")],
    at: Annotated[Optional[str], typer.Option("--at", help="Once, at this ISO 8601 time (read in --tz without an offset).")] = None,
    every: Annotated[Optional[str], typer.Option("--every", help="Every so often: 90s, 30m, 1h, 1h30m, 2d.")] = None,
    cron: Annotated[Optional[str], typer.Option("--cron", help="A five-field cron expression: '0 9 * * mon-fri'.")] = None,
    tz: Annotated[Optional[str], typer.Option("--tz", help="IANA time zone of --cron and --at (default UTC).")] = None,
    agent: Annotated[Optional[str], typer.Option("--agent", help="The agent that runs it (default: main).")] = None,
    channel: Annotated[Optional[str], typer.Option("--channel", help="Where the reply goes (with --peer); without, the job is silent.")] = None,
    peer: Annotated[Optional[str], typer.Option("--peer", help="Who gets the reply on that channel.")] = None,
    session: Annotated[Optional[str], typer.Option("--session", help="Run in this session rather than one of each run's own.")] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds before a run is cancelled and what it ran is killed.")] = None,
    overlap: Annotated[str, typer.Option("--overlap", help="A run due while the last goes on: skip or queue.")] = "skip",
    misfire: Annotated[str, typer.Option("--misfire", help="Runs missed while the gateway was down: run_once or skip.")] = "run_once",
    disabled: Annotated[bool, typer.Option("--disabled", help="Add it disabled.")] = False,
    state_dir: StateDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Add a job; it is on disk when this returns, and survives any stop."""
    job = {
        "name": name, "message": message, "at": at, "every": every, "cron": cron, "tz": tz, "agent": agent, "channel": channel, "peer": peer,
        "session": session, "timeoutSeconds": timeout, "overlap": overlap, "misfire": misfire, "enabled": not disabled,
    }  # fmt: skip
    data = _cron(state_dir, "add", job={k: v for k, v in job.items() if v is not None})
    if as_json:
        print(json.dumps(data, indent=2))
        return
    j = data["job"]
    out.print(f"added {j['id']} ({escape(printable(j['name']))}) for agent {j['agent']}", highlight=False)


@cron_app.command("rm")
def cron_rm(job_id: str, state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Remove a job (its runs' records go with it)."""
    _say(_cron(state_dir, "rm", id=job_id), as_json, f"removed {job_id}")


@cron_app.command("enable")
def cron_enable(job_id: str, state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Enable a job: it is armed for its next time from now."""
    _say(_cron(state_dir, "enable", id=job_id), as_json, f"enabled {job_id}")


@cron_app.command("disable")
def cron_disable(job_id: str, state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Disable a job: it keeps its runs, and does not run until enabled."""
    _say(_cron(state_dir, "disable", id=job_id), as_json, f"disabled {job_id}")


@cron_app.command("run")
def cron_run(job_id: str, state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Run a job now (its overlap rule still applies)."""
    data = _cron(state_dir, "run", id=job_id)
    if as_json:
        print(json.dumps(data))
        return
    r = data["run"]
    said = f"run {r['runId']} of {job_id}: {r['status']}" + (f" ({escape(printable(r['reason']))})" if r.get("reason") else "")
    out.print(said, highlight=False)


@cron_app.command("runs")
def cron_runs(
    job_id: str,
    n: Annotated[int, typer.Option("-n", help="How many of the last runs.")] = 20,
    state_dir: StateDir = None,
    as_json: JsonFlag = False,
) -> None:
    """A job's last runs: when each was due and fired, how it ended, its tokens, the
    reply's first line and what became of the reply."""
    data = _cron(state_dir, "runs", id=job_id, n=n)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table()
    for col in ("run", "due", "trigger", "status", "took", "tokens in/out", "reply", "delivery", "reason"):
        table.add_column(col)
    for r in data["runs"]:
        took = "-" if r.get("durationS") is None else f"{r['durationS']:.1f} s"
        table.add_row(
            r["runId"], _when(r["due"]), r["trigger"], f"[{RUN_STYLE.get(r['status'], '')}]{r['status']}[/]", took,
            f"{r['tokensIn']} / {r['tokensOut']}", escape(printable(r["reply"])), escape(printable(r["delivery"])), escape(printable(r["reason"])),
        )  # fmt: skip
    out.print(table)
