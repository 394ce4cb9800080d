"""`clawsup`: start the gateway, and talk to a running one over its control socket.

Every command that prints data accepts `--json`. Exit codes: 0 success, 1 the
operation failed (the error text says why), 2 bad usage, 3 no supervisor running.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from clawsup.supervisor.control.api import ControlClient, SupervisorNotRunning
from clawsup.supervisor.control.cli_common import JsonFlag, StateDir, err, out
from clawsup.supervisor.control.cli_common import call as _call
from clawsup.supervisor.control.cli_common import client as _client
from clawsup.supervisor.control.cli_common import data_or_fail as _data_or_fail
from clawsup.supervisor.control.cli_common import fail as _fail
from clawsup.supervisor.control.cli_common import paths_of as _paths
from clawsup.supervisor.control.cron_cli import cron_app
from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.sandboxes.lifecycle import SandboxState, Transition
from clawsup.supervisor.paths import StatePaths, resolve_state_dir
from clawsup.supervisor.printable import printable, printable_lines
from clawsup.supervisor.sandboxes.log import tail_lines

if TYPE_CHECKING:
    # Imported where used: `clawsup status` and the like stay quick to start.
    from clawsup.supervisor.config import ClawsupConfig
    from clawsup.supervisor.sandboxes.manager import SandboxManager
    from clawsup.supervisor.tools.dispatch import ToolDispatcher

app = typer.Typer(help="clawsup: a gateway for personal AI agents where nothing untrusted runs inside the gateway.", no_args_is_help=True, add_completion=False)
tools_app = typer.Typer(help="List and call the tools the sandboxes registered.", no_args_is_help=True)
app.add_typer(tools_app, name="tools")
plugins_app = typer.Typer(help="What each plugin asked for, was granted and registered.", no_args_is_help=True)
app.add_typer(plugins_app, name="plugins")
mcp_app = typer.Typer(help="The MCP servers (`mcpServers`), each in a sandbox of its own.", no_args_is_help=True)
app.add_typer(mcp_app, name="mcp")
route_app = typer.Typer(help="Which agent and session a message would get.", no_args_is_help=True)
app.add_typer(route_app, name="route")
exec_app = typer.Typer(help="Screen or run a shell command the way the exec tool does.", no_args_is_help=True)
app.add_typer(exec_app, name="exec")
app.add_typer(cron_app, name="cron")

RUN_STYLE = {"running": "yellow", "succeeded": "green", "failed": "red", "timed_out": "red", "cancelled": "dim"}
STATE_STYLE = {"ready": "green", "starting": "yellow", "draining": "yellow", "backoff": "magenta", "crashed": "red", "failed": "bold red", "stopped": "dim"}
SERVICE_STYLE = {"running": "green", "starting": "yellow", "crashed": "red", "not": "yellow", "down": "dim"}
"""A service's state (supervisor/sandboxes/supervised.py `services`) by its first word."""
OFFER_KINDS = {"hooks": "hook", "commands": "command", "services": "service", "channels": "channel", "httpRoutes": "http route"}
"""`plugins` rows' `offers` keys (the manifest's contracts), as `plugins show` names them."""


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        print(f"clawsup {version('clawsup')}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the installed version and exit.")] = False,
) -> None:
    # No docstring: the app's help stays the one given to typer.Typer above.
    pass


@app.command()
def start(
    config: Annotated[Optional[Path], typer.Option("--config", help="clawsup.json (JSON5). Default: the bundled config.")] = None,
    state_dir: StateDir = None,
    plugin: Annotated[Optional[list[Path]], typer.Option("--plugin", help="A plugin folder to load on top of the config's. Repeatable.")] = None,
) -> None:
    """Run the gateway in the foreground until Ctrl-C, SIGTERM or `clawsup stop`.

    To debug a stall, CLAWSUP_LOOP_DEBUG_MS=50 runs the event loop in asyncio debug mode and logs each callback that holds it 50 ms or more, and where it was, to supervisor.log."""
    from clawsup.supervisor.control.gateway import GatewayOptions, run_gateway, setup_logging

    paths = _paths(state_dir)
    try:
        paths.ensure()
    except ClawsupError as e:
        _fail(str(e), 2)
    setup_logging(paths)

    def on_transition(t: Transition) -> None:
        style = STATE_STYLE.get(t.new.value, "")
        out.print(f"  [bold]{t.sandbox_id}[/bold] {t.old.value} → [{style}]{t.new.value}[/{style}]" + (f"  [dim]{escape(printable(t.why))}[/dim]" if t.why else ""), highlight=False)

    async def on_ready(manager: SandboxManager, tools: ToolDispatcher) -> None:
        _print_status(await manager.status())
        _print_warnings(manager.warnings)
        out.print(f"[dim]control socket {paths.control_socket}; `clawsup status`, `clawsup logs <sandbox> -f`, Ctrl-C to stop[/dim]")

    opts = GatewayOptions(
        config_path=config.resolve() if config else None,
        state_dir=paths.root,
        extra_plugins=list(plugin or []),
        on_transition=on_transition,
        on_ready=on_ready,
    )
    try:
        code = asyncio.run(run_gateway(opts))
    except ClawsupError as e:
        _fail(str(e), 2)
    raise typer.Exit(code)


def _print_status(sandboxes: list[dict[str, Any]]) -> None:
    table = Table(title="sandboxes", title_justify="left")
    for col in ("id", "state", "backend · trust · uid", "network", "pid / container", "restarts", "uptime", "memory / limit", "tools", "last exit"):
        table.add_column(col, no_wrap=col == "state")
    for s in sandboxes:
        style = STATE_STYLE.get(s["state"], "")
        c = s.get("container")
        where = f"{c['container']} ({c.get('cpu_seconds', 0):.1f}s cpu)" if c else str(s["pid"] or "-")
        used = f"{s['rss_bytes'] / 2**20:.0f}" if s["rss_bytes"] else "-"
        table.add_row(
            escape(printable(s["id"])),
            "[bold red]FAILED[/bold red]" if s["state"] == SandboxState.FAILED.value else f"[{style}]{s['state']}[/{style}]",
            f"{s['backend']} · {s['trust']} · {s['uid'] if s['uid'] is not None else 'as supervisor'}",
            "yes" if s["network"] else "none",
            where,
            str(s["restarts"]),
            f"{s['uptime_s']:.0f}s" if s["uptime_s"] is not None else "-",
            f"{used} / {s['memory_limit_bytes'] / 2**20:.0f} MiB",
            escape(printable(", ".join(s["tools"]) or "-")),
            escape(printable((s["last_exit"] or {}).get("text", "-"))),
        )
    out.print(table)
    _print_services(sandboxes)
    _print_failed(sandboxes)


def _print_services(sandboxes: list[dict[str, Any]]) -> None:
    """The plugins' background services, one row each, under the sandboxes: a
    crashed one says why (its error) while its sandbox restarts."""
    rows = [(s["id"], name, state) for s in sandboxes for name, state in sorted((s.get("services") or {}).items())]
    if not rows:
        return
    table = Table(title="services", title_justify="left")
    for col in ("sandbox", "service", "state"):
        table.add_column(col)
    for sid, name, state in rows:
        table.add_row(escape(printable(sid)), escape(printable(name)), _service_state(state))
    out.print(table)


def _service_state(state: str) -> str:
    style = SERVICE_STYLE.get(state.split(" ", 1)[0].rstrip(":"), "")
    text = escape(printable(state))
    return f"[{style}]{text}[/{style}]" if style else text


def _print_failed(sandboxes: list[dict[str, Any]]) -> None:
    """A failed sandbox waits for an operator: one line each under the table, with
    why and what to do, in words that need no colour (status is often piped)."""
    for s in sandboxes:
        if s["state"] != SandboxState.FAILED.value:
            continue
        sid = escape(printable(s["id"]))
        how = escape(printable((s["last_exit"] or {}).get("text", "failed")))
        out.print(
            f"[bold red]FAILED:[/bold red] sandbox {sid} {how}, and will not restart by itself; "
            f"`clawsup restart {sid}` tries again, `clawsup logs {sid}` shows why.",
            highlight=False, soft_wrap=True,
        )  # fmt: skip


def _print_warnings(warnings: list[str]) -> None:
    for w in warnings:
        out.print(f"[bold yellow]warning:[/bold yellow] {escape(printable(w))}", highlight=False)


def _print_runs(sessions: list[dict[str, Any]]) -> None:
    """Subagent runs as a tree under the session that spawned them."""
    if not sessions:
        return
    tree = Tree("subagent runs", guide_style="dim")

    def add(node: Tree, run: dict[str, Any]) -> None:
        style = RUN_STYLE.get(run["status"], "")
        label = (
            f"[bold]{escape(run['runId'])}[/bold] {escape(printable(repr(run['label'])))} [{style}]{run['status']}[/{style}] agent {escape(run['agentId'])} · "
            f"{run['durationS']:.1f} s · tokens {run['tokensIn']} in / {run['tokensOut']} out"
            + (f" [dim]({escape(printable(run['reason']))})[/dim]" if run["reason"] else "")
        )
        child = node.add(label, highlight=False)
        for c in run["children"]:
            add(child, c)

    for s in sessions:
        node = tree.add(f"[cyan]{s['session']}[/cyan]")
        for run in s["runs"]:
            add(node, run)
    out.print(tree, highlight=False)


@app.command()
def status(state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Each sandbox: state, pid (or container id and CPU time), restarts, uptime,
    memory, tools, last exit; the plugins' services and their states; then subagent
    runs, as a tree under their sessions."""
    data = _data_or_fail(_call(state_dir, {"op": "status"}))
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        _print_status(data["sandboxes"])
        _print_warnings(data.get("warnings", []))
        _print_runs(data.get("runs", []))


@plugins_app.command("list")
def plugins_list(state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Each plugin: trust, backend, uid, state, tools registered of those declared,
    its other offers (hooks, commands, services, channels, HTTP routes) registered of
    those declared, and how many of its asks were refused."""
    data = _data_or_fail(_call(state_dir, {"op": "plugins"}))
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table()
    for col in ("id", "version", "trust", "backend", "uid", "state", "network", "tools (registered / declared)", "other offers", "refused"):
        table.add_column(col)
    for p in data["plugins"]:
        t = p["tools"]
        table.add_row(
            escape(printable(p["id"])), escape(printable(p["version"])), p["trust"], p["backend"],
            str(p["uid"]) if p["uid"] is not None else "as supervisor", p["state"],
            "yes" if p["granted"]["network"] else "none",
            f"{len(t['registered'])} / {len(t['declared'])}", _offer_counts(p.get("offers") or {}),
            str(len(p["refused"])) if p["refused"] else "-",
        )  # fmt: skip
    out.print(table)


def _offer_counts(offers: dict[str, Any]) -> str:
    """`2 / 2 hooks, 0 / 1 service`: registered of declared, for the kinds declared."""
    parts = []
    for key, label in OFFER_KINDS.items():
        o = offers.get(key) or {}
        declared, registered = len(o.get("declared", [])), len(o.get("registered", []))
        if declared or registered:
            parts.append(f"{registered} / {declared} {label}{'' if declared == 1 else 's'}")
    return ", ".join(parts) or "-"


@plugins_app.command("show")
def plugins_show(plugin_id: str, state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """One plugin: what its manifest asked for against what it was granted, trust,
    backend and uid, tools declared against registered, every other offer (hooks with
    their priority, commands, services with their state, channels, HTTP routes with
    their auth), what the operator granted those, and every refusal."""
    data = _data_or_fail(_call(state_dir, {"op": "plugins"}))
    found = [p for p in data["plugins"] if p["id"] == plugin_id]
    if not found:
        _fail(f"no plugin {plugin_id!r} is loaded (loaded: {', '.join(p['id'] for p in data['plugins']) or 'none'})")
    p = found[0]
    if as_json:
        print(json.dumps(p, indent=2))
        return
    out.print(f"[bold]{escape(printable(p['id']))}[/bold] {escape(printable(p['version']))}  [dim]{escape(printable(p['folder']))}[/dim]", highlight=False)
    uid = p["uid"] if p["uid"] is not None else "as the supervisor"
    out.print(f"  {p['trust']}, backend {p['backend']}, uid {uid}, {p['state']}", highlight=False)
    table = Table(title="limits", title_justify="left")
    for col in ("key", "manifest asks", "granted"):
        table.add_column(col)
    asked = p["requested"]
    for key, value in p["granted"].items():
        ask = asked.get(key)
        table.add_row(key, escape(printable(json.dumps(ask))) if ask is not None else "-", escape(json.dumps(value)))
    out.print(table)
    declared, registered = p["tools"]["declared"], set(p["tools"]["registered"])
    out.print("  tools: " + (", ".join(f"{n}" + ("" if n in registered else " (not registered)") for n in declared) or "none declared"), highlight=False)
    offers = _offer_table(p)
    if offers.row_count:
        out.print(offers)
        out.print(_grants_table(p))
    for line in p["refused"]:
        out.print(f"  [yellow]refused[/yellow] {escape(printable(line))}", highlight=False)


def _offer_table(p: dict[str, Any]) -> Table:
    """Each offer beyond tools its manifest declares, with what its registration
    says (a hook's priority and how it runs, a command's args and who may run it, a
    route's auth) and its state: registered or not, a service's own."""
    table = Table(title="offers", title_justify="left")
    for col in ("kind", "name", "details", "state"):
        table.add_column(col)
    grants = p.get("grants") or {}
    pid = p["id"]
    for key, label in OFFER_KINDS.items():
        o = (p.get("offers") or {}).get(key) or {}
        registered = {r["name"]: r for r in o.get("registered", [])}
        for name in sorted({*o.get("declared", []), *registered}):
            r = registered.get(name)
            shown, details = name, ""
            if key == "hooks":
                details = (f"priority {r['priority']} · " if r else "") + _hook_how(name, grants)
            elif key == "commands":
                shown = f"/{name}"
                if r:
                    details = f"{'takes args' if r['acceptsArgs'] else 'no args'} · {'owner only' if r['ownerOnly'] else 'anyone'} · {r['description']}"
            elif key == "channels":
                details = "enabled" if name in grants.get("channelsEnabled", []) else f"not enabled (channels.{name})"
            elif key == "httpRoutes":
                shown = f"/plugins/{pid}/{name}"
                details = f"auth {r['auth']}" if r else ""
            if key == "services":
                state = _service_state((p.get("services") or {}).get(name, "not registered" if r is None else "registered"))
            else:
                state = "registered" if r else "[yellow]not registered[/yellow]"
            table.add_row(label, escape(printable(shown)), escape(printable(details)) or "-", state)
    return table


def _hook_how(name: str, grants: dict[str, Any]) -> str:
    """How a hook runs (sandbox/offers.py), and what its grant lets it see."""
    from clawsup.sandbox import offers as hooks

    if name in hooks.GATE_HOOKS:
        how = f"gate, fails {'open' if grants.get('failOpen') else 'closed'}"
    else:
        how = "modifying" if name in hooks.MODIFYING_HOOKS else "observing"
    if name in hooks.CONTENT_HOOKS and name not in grants.get("hooksAllow", []):
        how += ", its own tools only" if name in ("before_tool_call", "after_tool_call") else ", not granted"
    return how


def _grants_table(p: dict[str, Any]) -> Table:
    """What the operator granted the plugin's offers, by the config key that sets it."""
    g = p.get("grants") or {}
    pid = escape(printable(p["id"]))
    table = Table(title=f"granted by the operator (plugins.entries.{pid})", title_justify="left")
    for col in ("key", "granted"):
        table.add_column(col)
    rows = [
        ("hooks.allow", ", ".join(g.get("hooksAllow", [])) or "none: its tool hooks see its own tools only"),
        ("hooks.failOpen", g.get("failOpen")),
        ("hooks.timeoutSeconds", g.get("hookTimeoutSeconds")),
        ("commandTimeoutSeconds", g.get("commandTimeoutSeconds")),
        ("http.allowPluginAuth", g.get("httpPluginAuth")),
        ("http.timeoutSeconds", g.get("httpTimeoutSeconds")),
        ("channels.<id> (enabled)", ", ".join(g.get("channelsEnabled", [])) or "none"),
    ]
    for key, value in rows:
        if value is not None:
            table.add_row(key, escape(printable(value if isinstance(value, str) else json.dumps(value))))
    return table


MCP_HINT = "no MCP servers are configured: add them under `mcpServers` in clawsup.json (the block Claude Desktop, Cursor and Nanobot use), then restart the supervisor"


@mcp_app.command("list")
def mcp_list(state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Each MCP server: its sandbox, state, transport, backend and trust, the tools it
    serves, restarts and last exit (never its env or header values)."""
    data = _data_or_fail(_call(state_dir, {"op": "mcp"}))
    if as_json:
        print(json.dumps(data, indent=2))
        if not data["servers"]:
            err.print(f"[dim]{MCP_HINT}[/dim]", highlight=False)
        return
    if not data["servers"]:
        out.print(MCP_HINT, highlight=False)
        return
    table = Table()
    for col in ("id", "sandbox", "state", "transport", "backend · trust", "tools", "restarts", "last exit"):
        table.add_column(col, no_wrap=col == "state")
    for s in data["servers"]:
        style = STATE_STYLE.get(s["state"], "")
        table.add_row(
            escape(printable(s["id"])), escape(printable(s["sandbox"])),
            "[bold red]FAILED[/bold red]" if s["state"] == SandboxState.FAILED.value else f"[{style}]{s['state']}[/{style}]",
            s["transport"], f"{s['backend']} · {s['trust']}",
            escape(printable(", ".join(s["tools"]) or "-")), str(s["restarts"]),
            escape(printable((s["last_exit"] or {}).get("text", "-"))),
        )  # fmt: skip
    out.print(table)
    for s in data["servers"]:
        for line in s["refused"]:
            out.print(f"  [yellow]refused[/yellow] {escape(printable(s['id']))}: {escape(printable(line))}", highlight=False)
    _print_failed([{"id": s["sandbox"], "state": s["state"], "last_exit": s["last_exit"]} for s in data["servers"]])


@tools_app.command("list")
def tools_list(state_dir: StateDir = None, as_json: JsonFlag = False) -> None:
    """Every registered tool with its owner."""
    data = _data_or_fail(_call(state_dir, {"op": "tools"}))
    if as_json:
        print(json.dumps({"tools": [{k: t[k] for k in ("name", "owner", "description")} for t in data["tools"]]}, indent=2))
        return
    table = Table()
    for col in ("name", "owner", "description"):
        table.add_column(col)
    for t in data["tools"]:
        table.add_row(t["name"], t["owner"], escape(printable(t["description"])))
    out.print(table)


@tools_app.command("call")
def tools_call(
    name: str,
    args: Annotated[str, typer.Option("--args", help="The arguments, a JSON object.")] = "{}",
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds; capped by the plugin's call timeout.")] = None,
    agent: Annotated[Optional[str], typer.Option("--agent", help="Call as this agent (picks its workspace sandbox).")] = None,
    session: Annotated[Optional[str], typer.Option("--session", help="Call in this session (with scope `session`).")] = None,
    state_dir: StateDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Call a tool through the same supervisor path an agent uses. Output that a
    tool streams (exec) is printed as it comes, unless --json."""
    try:
        parsed = json.loads(args)
    except json.JSONDecodeError as e:
        _fail(f"--args is not valid JSON: {e.msg} at position {e.pos}", 2)
    if not isinstance(parsed, dict):
        _fail("--args must be a JSON object, such as '{\"text\": \"hi\"}'", 2)
    req: dict[str, Any] = {"op": "call", "name": name, "args": parsed, "stream": not as_json}
    for key, value in (("timeout", timeout), ("agent", agent), ("session", session)):
        if value is not None:
            req[key] = value
    resp: dict[str, Any] = {}
    streamed = False
    try:
        for msg in _client(state_dir, (timeout or 3600) + 30).stream(req):
            if "output" in msg:
                sys.stdout.write(printable_lines(msg["output"]))
                sys.stdout.flush()
                streamed = True
                continue
            resp = msg
            break
    except SupervisorNotRunning as e:
        _fail(str(e), 3)
    if streamed and resp.get("ok") and isinstance(resp["data"]["result"], dict):
        # The output was shown as it came; the rest of the result follows it.
        resp["data"]["result"] = {k: v for k, v in resp["data"]["result"].items() if k != "output"}
    if as_json:
        body = {"ok": True, "result": resp["data"]["result"]} if resp.get("ok") else {"ok": False, "error": resp["error"]["message"]}
        print(json.dumps(body))
        raise typer.Exit(0 if resp.get("ok") else 1)
    if not resp.get("ok"):
        _fail(resp["error"]["message"])
    result = resp["data"]["result"]
    print(printable_lines(result) if isinstance(result, str) else json.dumps(result, indent=2))


@app.command()
def logs(
    sandbox: str,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option("-n", "--lines", help="How many past lines.")] = 50,
    state_dir: StateDir = None,
) -> None:
    """A sandbox's output and lifecycle events. Works without a running supervisor
    (without -f)."""
    paths = _paths(state_dir)
    try:
        stream = _client(state_dir).stream({"op": "logs", "sandbox": sandbox, "n": lines, "follow": follow})
        first = next(stream)
    except SupervisorNotRunning:
        path = paths.sandbox_log(sandbox)
        if not path.exists():
            _fail(f"no log for sandbox {sandbox!r} in {paths.logs}", 1)
        # Escaped again (supervisor/printable.py): a log written before escaping, or
        # by other hands, still cannot drive the terminal.
        for line in tail_lines(path, lines):
            print(printable(line))
        if follow:
            err.print("[yellow]the supervisor is not running; nothing more will come[/yellow]")
        return
    for line in _data_or_fail(first)["lines"]:
        print(printable(line))
    sys.stdout.flush()
    try:
        for msg in stream:
            if "skipped" in msg:  # this follower fell behind (supervisor/control/api.py)
                print(f"[clawsup: {msg['skipped']:,} lines skipped: this follower fell behind; they are in the log file]", flush=True)
            elif "ended" in msg:
                print(f"[clawsup: {msg['ended']}]", flush=True)
                break
            else:
                print(printable(msg["line"]), flush=True)
    except KeyboardInterrupt:
        pass


@app.command()
def restart(
    sandbox: str,
    timeout: Annotated[float, typer.Option("--timeout")] = 30.0,
    state_dir: StateDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Stop a sandbox if it runs, forget its past crashes, and start it again."""
    resp = _call(state_dir, {"op": "restart", "sandbox": sandbox, "timeout": timeout}, timeout=timeout + 10)
    data = _data_or_fail(resp)
    if as_json:
        print(json.dumps(data))
    else:
        out.print(f"{sandbox}: {data['state']}")
    if data["state"] != "ready":
        raise typer.Exit(1)


@app.command()
def wait(
    sandbox: str,
    states: Annotated[list[SandboxState], typer.Argument(help="One or more states to wait for.")],
    timeout: Annotated[float, typer.Option("--timeout")] = 30.0,
    state_dir: StateDir = None,
) -> None:
    """Block until a sandbox reaches one of the given states (for scripts)."""
    resp = _call(state_dir, {"op": "wait", "sandbox": sandbox, "states": [s.value for s in states], "timeout": timeout}, timeout=timeout + 10)
    print(_data_or_fail(resp)["state"])


@app.command()
def stop(state_dir: StateDir = None) -> None:
    """Stop the running supervisor and all its sandboxes; returns once it is gone."""
    try:
        _client(state_dir).stop()
    except SupervisorNotRunning as e:
        _fail(str(e), 3)
    out.print("stopped")




def _load(config: Path | None) -> tuple[ClawsupConfig, str]:
    from clawsup.supervisor.config import DEFAULT_CONFIG, load_config

    path = config or DEFAULT_CONFIG
    try:
        return load_config(path), str(path)
    except ClawsupError as e:
        _fail(str(e), 2)


ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="clawsup.json to take tools.exec from (default: the bundled one).")]


@exec_app.command("check")
def exec_check(command: str, config: ConfigOpt = None, as_json: JsonFlag = False) -> None:
    """Screen COMMAND with the exec deny/allow lists; exit 0 if allowed, 1 if not."""
    from clawsup.supervisor.tools.workspace_settings import screen_from_config

    cfg, _ = _load(config)
    v = screen_from_config(cfg).check(command)
    if as_json:
        print(json.dumps(v.to_json()))
    else:
        (out if v.allowed else err).print(v.explain(), highlight=False)
    raise typer.Exit(0 if v.allowed else 1)


@exec_app.command("run")
def exec_run(
    command: Annotated[list[str], typer.Argument(help="The command (after --); several words are joined with spaces.")],
    backend: Annotated[Optional[str], typer.Option("--backend", help="process, bwrap or docker (default: agents.defaults.sandbox.backend).")] = None,
    workspace: Annotated[Optional[Path], typer.Option("--workspace", help="Run in this folder (default: a fresh empty one).", file_okay=False, exists=True)] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds (default tools.exec.timeoutSeconds).", min=0.001)] = None,
    max_output: Annotated[Optional[int], typer.Option("--max-output", help="Output cap in bytes.", min=2)] = None,
    config: ConfigOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Run one command through the exec tool's screen and sandbox, without a
    running supervisor. Output streams; the exit code is the command's (126 if
    refused, 124 if timed out, 128+N if killed by signal N)."""
    from clawsup.supervisor.tools.exec_once import run_once

    if backend is not None:
        from clawsup.sandbox.launch.backends import backend_named

        try:
            backend_named(backend)
        except ValueError as e:
            _fail(f"--backend: {e}", 2)
    cfg, source = _load(config)
    text = " ".join(command)
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING", format="{level}: {message}")

    async def show(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    try:
        r = asyncio.run(
            run_once(text, cfg=cfg, source=source, backend=backend, workspace=workspace, timeout=timeout, max_output=max_output, on_output=show)
        )
    except ClawsupError as e:
        _fail(str(e), 2 if e.code == "config" else 1)
    if r.blocked_by is not None:
        err.print(f"[red]refused[/red] by rule {r.blocked_by!r}: it matched {r.segment!r}; nothing ran", highlight=False)
    if as_json:
        sys.stdout.write(("\n" if not r.blocked_by else "") + json.dumps(r.to_json()) + "\n")
    if r.blocked_by is not None:
        raise typer.Exit(126)
    if r.timed_out:
        raise typer.Exit(124)
    raise typer.Exit(r.exit_code if r.exit_code is not None else 128 + (r.signal or 0))


@route_app.command("explain")
def route_explain(
    channel: Annotated[str, typer.Option("--channel", help="The channel the message came in on.")],
    peer_kind: Annotated[str, typer.Option("--peer-kind", help="direct (or dm), group or channel.")],
    peer_id: Annotated[str, typer.Option("--peer-id")],
    account: Annotated[Optional[str], typer.Option("--account", help="Account id (default: the default account).")] = None,
    parent_kind: Annotated[Optional[str], typer.Option("--parent-kind", help="A thread's parent peer.")] = None,
    parent_id: Annotated[Optional[str], typer.Option("--parent-id")] = None,
    guild: Annotated[Optional[str], typer.Option("--guild")] = None,
    roles: Annotated[Optional[str], typer.Option("--roles", help="The member's role ids, comma-separated.")] = None,
    team: Annotated[Optional[str], typer.Option("--team")] = None,
    thread: Annotated[Optional[str], typer.Option("--thread", help="Thread id.")] = None,
    config: ConfigOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Resolve a message's agent and session key from the config alone, without a
    running gateway (the same router the gateway uses)."""
    from clawsup.supervisor.messages.routing import Peer, RouteInput, Router

    kinds = ("direct", "dm", "group", "channel")
    for flag, kind in (("--peer-kind", peer_kind), ("--parent-kind", parent_kind)):
        if kind is not None and kind.strip().lower() not in kinds:
            _fail(f"{flag} must be one of {', '.join(kinds)}, not {kind!r}", 2)
    if (parent_kind is None) != (parent_id is None):
        _fail("--parent-kind and --parent-id go together", 2)
    cfg, _ = _load(config)
    msg = RouteInput(
        channel=channel,
        account_id=account,
        peer=Peer.of(peer_kind, peer_id),
        parent_peer=Peer.of(parent_kind, parent_id) if parent_kind and parent_id else None,
        guild_id=guild,
        member_role_ids=tuple(r for r in (roles or "").split(",") if r.strip()),
        team_id=team,
        thread_id=thread,
    )
    from loguru import logger

    logger.remove()
    route = Router(cfg).resolve(msg)
    for w in route.warnings:
        err.print(f"[yellow]warning:[/yellow] {w}", highlight=False)
    if as_json:
        print(json.dumps(route.to_json()))
        return
    for k, v in route.to_json().items():
        out.print(f"{k:<15} {v}", highlight=False)


@app.command()
def chat(
    agent: Annotated[Optional[str], typer.Option("--agent", help="Talk to this agent (default: as routed).")] = None,
    peer: Annotated[Optional[str], typer.Option("--peer", help="Who you are on the cli channel (default: your user name).")] = None,
    thread: Annotated[Optional[str], typer.Option("--thread", help="A thread id.")] = None,
    message: Annotated[Optional[list[str]], typer.Option("--message", "-m", help="Send this and exit (repeatable), instead of the REPL.")] = None,
    state_dir: StateDir = None,
    as_json: JsonFlag = False,
) -> None:
    """A REPL on the cli channel of the running supervisor. Each line is a message;
    replies stream back. Ctrl-C while a turn runs sends /stop for this session;
    Ctrl-D leaves."""
    client = _client(state_dir, timeout=None)  # type: ignore[arg-type]
    base = {"op": "chat", "peer": peer, "agent": agent, "thread": thread}

    def send(text: str) -> bool:
        try:
            for m in client.stream({**base, "text": text}):
                if as_json:
                    print(json.dumps(m), flush=True)
                    if not m.get("ok", True):  # refused (session_busy...): exit 1 here too
                        return False
                elif "ack" in m:
                    a = m["ack"]
                    err.print(f"[dim]→ {a['agentId']} ({a['matchedBy']}) · {a['sessionKey']}[/dim]", highlight=False)
                elif "progress" in m:
                    err.print(f"[dim]… {escape(printable(m['progress']))}[/dim]", highlight=False)
                elif "reply" in m:
                    # A model's words can carry a plugin's bytes: shown, never obeyed.
                    out.print(printable_lines(m["reply"]), highlight=False, markup=False)
                elif not m.get("ok", True):
                    err.print(f"[red]error:[/red] {escape(printable_lines(m['error']['message']))}", highlight=False)
                    return False
        except SupervisorNotRunning as e:
            _fail(str(e), 3)
        return True

    if message:
        ok = all([send(t) for t in message])
        raise typer.Exit(0 if ok else 1)

    def watch() -> None:
        """Answers that come on their own (a subagent run reported back) are printed
        as they arrive."""
        with contextlib.suppress(Exception):
            for m in client.stream({"op": "watch", "peer": peer, "thread": thread}):
                if "reply" in m:
                    if as_json:
                        print(json.dumps({"background": m}), flush=True)
                    else:
                        err.print(f"[dim]← {m['agentId']} · {m['sessionKey']} (after a background run)[/dim]", highlight=False)
                        out.print(printable_lines(m["reply"]), highlight=False, markup=False)

    threading.Thread(target=watch, daemon=True, name="watch").start()
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("you> " if interactive else "")
        except EOFError:
            break
        except KeyboardInterrupt:
            print()
            break
        if not line.strip():
            continue
        try:
            send(line)
        except KeyboardInterrupt:
            err.print("[yellow]stopping the turn…[/yellow]")
            send("/stop")


@tools_app.command("explain")
def tools_explain(
    agent: Annotated[Optional[str], typer.Option("--agent", help="The agent (default: the default agent).")] = None,
    provider: Annotated[Optional[str], typer.Option("--provider", help="provider/model, e.g. anthropic/claude-sonnet-4-5.")] = None,
    channel: Annotated[Optional[str], typer.Option("--channel")] = None,
    group_id: Annotated[Optional[str], typer.Option("--group-id")] = None,
    sender: Annotated[Optional[str], typer.Option("--sender")] = None,
    owner: Annotated[bool, typer.Option("--owner", help="The caller is an owner.")] = False,
    subagent: Annotated[bool, typer.Option("--subagent", help="A subagent's turn.")] = False,
    config: ConfigOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Which tools a turn would be shown (and may call), and which layer removed each
    of the others, from the config and the plugins' manifests alone."""
    from loguru import logger

    from clawsup.supervisor.sandboxes.plans import build_plans
    from clawsup.supervisor.agents.tool_policy import Caller, decide
    from clawsup.supervisor.agents.spawn_tools import SPAWN_TOOLS, WITHHELD
    from clawsup.supervisor.tools.core import CORE_TOOLS

    logger.remove()
    cfg, source = _load(config)
    cfg_dir = (config or Path(source)).resolve().parent
    try:
        plans = build_plans(cfg, config_source=source, config_dir=cfg_dir, extra_plugins=[])
    except ClawsupError as e:
        _fail(str(e), 2)
    available = {name: "core" for name in (*CORE_TOOLS, *SPAWN_TOOLS)}
    for plan in plans:
        available.update({t: plan.plugin_id for t in plan.declared_tools})
    agent_id = (agent or cfg.agents.default_id()).lower()
    entry = next((a for a in cfg.agents.entries if a.id == agent_id), None)
    if entry is None and cfg.agents.entries:
        _fail(f"no agent {agent_id!r} in agents.list (known: {', '.join(cfg.agents.ids())})", 2)
    d = decide(
        cfg.tools.policy(),
        entry.tools if entry else None,
        Caller(agent=agent_id, provider=provider or "", channel=channel or "", group_id=group_id, sender=sender, owner=owner, subagent=subagent),
        available,
    )
    if subagent:
        # What runs never get from their parent (the spawn tools come back below
        # agents.defaults.subagents.maxSpawnDepth; this shows a leaf).
        gone = set(d.tools) & WITHHELD
        d = replace(d, tools=tuple(t for t in d.tools if t not in gone), removed={**d.removed, **{t: "withheld from subagent runs" for t in gone}})
    for w in d.warnings:
        err.print(f"[yellow]warning:[/yellow] {w}", highlight=False)
    if as_json:
        print(json.dumps(d.to_json()))
        return
    out.print(f"shown and callable: {', '.join(d.tools) or '(none)'}", highlight=False)
    for tool, layer in sorted(d.removed.items()):
        out.print(f"  removed {tool:<20} by {layer}", highlight=False)


if __name__ == "__main__":
    app()
