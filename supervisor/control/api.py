"""The control API: newline-delimited JSON over `<state>/run/control.sock` (0600).

One request per connection. The answer is one line, `{"ok": true, "data": ...}` or
`{"ok": false, "error": {"code": ..., "message": ...}}`; `logs` with `follow` then
sends one `{"line": ...}` per log line until the client hangs up, and `{"skipped": n}`
in place of the n lines a client too slow to take them all missed (they are in the
log file). Requests are checked by pydantic: a bad one gets an error naming the field.

Created by the gateway; lives until the gateway stops, which closes every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal

import psutil
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from clawsup.sandbox.manifest import format_validation_error
from clawsup.sandbox.socket_paths import short_address
from clawsup.supervisor.messages.bus import Busy
from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.sandboxes.lifecycle import SandboxState
from clawsup.supervisor.messages.channels.cli import CliChannel
from clawsup.supervisor.sandboxes.manager import SandboxManager
from clawsup.supervisor.sandboxes.registry import Kind
from clawsup.supervisor.tools.dispatch import ToolDispatcher
from clawsup.supervisor.messages.routing import Route
from clawsup.supervisor.sandboxes.log import Follower, read_tail, tail_lines
from clawsup.supervisor.agents.subagents import Subagents
from clawsup.supervisor.automation.jobs import JobSpec
from clawsup.supervisor.automation.scheduler import Scheduler

MAX_REQUEST = 1024 * 1024
DISCARDED = "the sandbox was discarded; its log ends here"
"""What `logs -f` of a sandbox that is gone (an idle session's) ends with."""
# What a log follower is sent per write: a few thousand lines, one drain.
FOLLOW_BATCH_CHARS = 256 * 1024


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StatusReq(_Req):
    op: Literal["status"]


class ToolsReq(_Req):
    op: Literal["tools"]


class StatsReq(_Req):
    """The supervisor's own footprint (pid, RSS, open fds, asyncio tasks, sandboxes,
    open session files): what scripts/soak.py and the bound tests watch for growth."""

    op: Literal["stats"]


class PluginsReq(_Req):
    op: Literal["plugins"]


class McpReq(_Req):
    """Each configured MCP server's sandbox, for `clawsup mcp list`."""

    op: Literal["mcp"]


class CallReq(_Req):
    op: Literal["call"]
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    timeout: float | None = Field(default=None, gt=0)
    agent: str | None = None
    """Who calls, as the operator says; picks the workspace sandbox of core tools."""
    session: str | None = None
    stream: bool = False
    """Send `{"output": text}` lines as a tool (exec) produces output, before the answer."""


class LogsReq(_Req):
    op: Literal["logs"]
    sandbox: str
    n: int = Field(default=50, ge=0, le=100_000)
    follow: bool = False


class RestartReq(_Req):
    op: Literal["restart"]
    sandbox: str
    timeout: float = Field(default=30.0, gt=0)


class WaitReq(_Req):
    op: Literal["wait"]
    sandbox: str
    states: list[SandboxState]
    timeout: float = Field(default=30.0, gt=0, le=3600)


class WaitRunReq(_Req):
    """Until a subagent run has ended and reported; answers with the run."""

    op: Literal["wait_run"]
    run: str
    timeout: float = Field(default=30.0, gt=0, le=3600)


class WatchReq(_Req):
    """Replies to this cli user that arrive outside a `chat` (the answer to a
    subagent's announce): `{"reply": text, "sessionKey": ...}` lines until the client
    hangs up."""

    op: Literal["watch"]
    peer: str | None = Field(default=None, min_length=1, max_length=256)
    thread: str | None = None


class CronReq(_Req):
    """The cron jobs (supervisor/automation/scheduler.py): `list`, `add` (`job`),
    `rm`, `enable`, `disable`, `run` (now), `runs` (the last `n`), and `wait` until
    job `id` has `count` ended runs (for scripts and tests)."""

    op: Literal["cron"]
    action: Literal["list", "add", "rm", "enable", "disable", "run", "runs", "wait"]
    id: str | None = Field(default=None, min_length=1, max_length=64)
    job: JobSpec | None = None
    n: int = Field(default=20, ge=1, le=10_000)
    count: int = Field(default=1, ge=1, le=10_000)
    timeout: float = Field(default=30.0, gt=0, le=3600)


class StopReq(_Req):
    op: Literal["stop"]


class ChatReq(_Req):
    """One message on the `cli` channel; the answer streams `{"ack": route}`, then
    `{"progress": text}` lines and the final `{"reply": text}`."""

    op: Literal["chat"]
    text: str = Field(min_length=1, max_length=100_000)
    peer: str | None = Field(default=None, min_length=1, max_length=256)
    agent: str | None = None
    thread: str | None = None


Request = Annotated[
    StatusReq | StatsReq | ToolsReq | PluginsReq | McpReq | CallReq | LogsReq | RestartReq | WaitReq | WaitRunReq | StopReq | ChatReq | WatchReq | CronReq,
    Field(discriminator="op"),
]
_REQUEST: TypeAdapter[Request] = TypeAdapter(Request)


async def _until_hangup(reader: asyncio.StreamReader, pump: Coroutine[Any, Any, None]) -> None:
    """Runs `pump` (sending lines to the client) until the client hangs up, the
    pump ends (a followed log closed), or we close. A hang-up, orderly or a reset, is
    how such a request ends, not an error: a reset once surfaced as an exception
    group and a traceback in the supervisor's log (tests/test_hostile_output.py,
    with `clawsup logs -f` killed under load)."""

    async def guarded() -> None:
        with contextlib.suppress(ConnectionError):
            await pump

    async def hangup() -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read(1)

    async with asyncio.TaskGroup() as tg:
        tasks = {tg.create_task(guarded()), tg.create_task(hangup())}
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()


class ControlServer:
    def __init__(
        self,
        path: Path,
        manager: SandboxManager,
        tools: ToolDispatcher,
        on_stop: Callable[[], None],
        chat: CliChannel | None = None,
        subagents: Subagents | None = None,
        cron: Scheduler | None = None,
    ) -> None:
        self._chat = chat
        self._cron = cron
        self._subagents = subagents
        self._path = path
        self._manager = manager
        self._tools = tools
        self._on_stop = on_stop
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        # asyncio's server starts one task per connection; we keep them so that
        # close() can end them before the loop does.
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()
        old = os.umask(0o177)  # born 0600: no window in which others may connect
        try:
            # A deep state directory is reached through a descriptor of run/ (sun_path
            # holds 107 bytes), never by moving the socket to /tmp.
            with short_address(self._path) as address:
                self._server = await asyncio.start_unix_server(self._handle, path=address, limit=MAX_REQUEST)
        finally:
            os.umask(old)
        os.chmod(self._path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in tuple(self._writers):
            w.close()
        if self._handlers:
            _, pending = await asyncio.wait(self._handlers, timeout=1.0)
            for t in pending:
                t.cancel()
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            raw = await reader.readline()
            if not raw:
                return
            try:
                req = _REQUEST.validate_json(raw)
            except ValidationError as e:
                await _send(writer, {"ok": False, "error": {"code": "bad_request", "message": format_validation_error(e)}})
                return
            try:
                await self._dispatch(req, reader, writer)
            except ClawsupError as e:
                await _send(writer, {"ok": False, "error": {"code": e.code, "message": str(e)}})
            except TimeoutError:
                await _send(writer, {"ok": False, "error": {"code": "timeout", "message": "timed out waiting"}})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            logger.exception("control API request failed")
            with contextlib.suppress(Exception):
                await _send(writer, {"ok": False, "error": {"code": "internal", "message": "internal error; see the supervisor log"}})
        finally:
            self._writers.discard(writer)
            self._handlers.discard(task)
            writer.close()

    async def _cron_op(self, req: CronReq) -> Any:
        cron = self._cron
        if cron is None:
            raise ClawsupError("cron is not running here (automation.cron.enabled is false)")
        # The jobs are loaded (and re-armed) once the sandboxes and channels serve.
        async with asyncio.timeout(req.timeout if req.action == "wait" else 60):
            await cron.loaded.wait()
        if req.action == "list":
            return {"jobs": cron.jobs_json()}
        if req.action == "add":
            if req.job is None:
                raise ClawsupError("job: required to add a job")
            return {"job": (await cron.add(req.job, agent=None, owner=True, created_by="operator")).to_json()}
        if req.id is None:
            raise ClawsupError(f"id: required to {req.action} a job")
        match req.action:
            case "rm":
                return {"removed": (await cron.remove(req.id)).id}
            case "enable" | "disable":
                return {"job": (await cron.set_enabled(req.id, req.action == "enable")).to_json()}
            case "run":
                return {"run": cron.run_now(req.id).to_json()}
            case "runs":
                return {"runs": [r.to_json() for r in cron.runs(req.id, req.n)]}
            case _:
                return {"runs": [r.to_json() for r in await cron.wait_runs(req.id, req.count, req.timeout)]}

    async def _dispatch(self, req: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        m = self._manager
        match req:
            case StatusReq():
                runs = self._subagents.tree() if self._subagents else []
                await _send(writer, {"ok": True, "data": {"sandboxes": await m.status(), "runs": runs, "warnings": m.warnings}})
            case StatsReq():
                await _send(writer, {"ok": True, "data": _stats(m)})
            case PluginsReq():
                await _send(writer, {"ok": True, "data": {"plugins": m.plugins()}})
            case McpReq():
                await _send(writer, {"ok": True, "data": {"servers": mcp_servers(m)}})
            case ToolsReq():
                tools = [{"name": r.name, "owner": r.owner, "sandbox": r.sandbox_id, "description": r.description} for r in m.registry.tools()]
                await _send(writer, {"ok": True, "data": {"tools": tools}})
            case CallReq(name=name, args=args, timeout=timeout, agent=agent, session=session, stream=stream):

                async def out(data: bytes) -> None:
                    await _send(writer, {"output": data.decode("utf-8", errors="replace")})

                work = asyncio.ensure_future(self._tools.invoke(name, args, timeout, agent=agent, session=session, on_output=out if stream else None))
                # A caller that hangs up (Ctrl-C on `clawsup tools call`) cancels the
                # call, down to the command running in its sandbox.
                hangup = asyncio.ensure_future(reader.read(1))
                try:
                    await asyncio.wait({work, hangup}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for t in (hangup, work):
                        if not t.done():
                            t.cancel()
                    await asyncio.gather(hangup, work, return_exceptions=True)
                if work.cancelled():
                    logger.info("call of {!r} cancelled: the caller hung up", name)
                    return
                await _send(writer, {"ok": True, "data": {"result": work.result().value()}})
            case RestartReq(sandbox=sid, timeout=timeout):
                state = await m.get(sid).restart(timeout)
                await _send(writer, {"ok": True, "data": {"sandbox": sid, "state": state.value}})
            case WaitReq(sandbox=sid, states=states, timeout=timeout):
                state = await m.get(sid).wait_state(frozenset(states), timeout)
                await _send(writer, {"ok": True, "data": {"sandbox": sid, "state": state.value}})
            case WaitRunReq(run=run_id, timeout=timeout):
                if self._subagents is None:
                    raise ClawsupError("subagent runs are not served here")
                run = await self._subagents.wait(run_id, timeout)
                await _send(writer, {"ok": True, "data": run})
            case LogsReq(sandbox=sid, n=n, follow=follow):
                if sid not in m.sandboxes and (ended := m.ended_log(sid)) is not None:
                    await _send(writer, {"ok": True, "data": {"lines": await asyncio.to_thread(tail_lines, ended, n)}})
                    if follow:
                        await _send(writer, {"ended": DISCARDED})
                    return
                log = m.get(sid).log
                # In one step, with no await between: the past lines end where the
                # follower's first line begins.
                written, end = log.open_written()
                follower = log.follow() if follow else None
                try:
                    writer.write(await asyncio.to_thread(_past_lines, written, n, end))
                    await writer.drain()
                    if follower is not None:
                        await _until_hangup(reader, _forward_log(writer, follower))
                finally:
                    if follower is not None:
                        log.unfollow(follower)
            case ChatReq(text=text, peer=peer, agent=agent, thread=thread):
                if self._chat is None:
                    raise ClawsupError("the cli channel is disabled (channels.cli.enabled)")
                try:
                    async with contextlib.aclosing(self._chat.chat(text, peer=peer, agent=agent, thread=thread)) as items:
                        async for item in items:
                            if isinstance(item, Route):
                                await _send(writer, {"ack": item.to_json()})
                            else:
                                await _send(writer, {"progress" if item.progress else "reply": item.text})
                except Busy as e:  # session_busy or gateway_busy: nothing was kept
                    await _send(writer, {"ok": False, "error": {"code": e.code, "message": str(e), "retryAfterSeconds": e.retry_after_s}})
                    return
                await _send(writer, {"ok": True, "data": {}})
            case WatchReq(peer=peer, thread=thread):
                if self._chat is None:
                    raise ClawsupError("the cli channel is disabled (channels.cli.enabled)")
                with self._chat.watching(peer=peer, thread=thread) as replies:

                    async def forward() -> None:
                        while (out := await replies.get()) is not None:
                            await _send(writer, {"reply": out.text, "sessionKey": out.session_key, "agentId": out.agent_id})

                    await _send(writer, {"ok": True, "data": {}})
                    await _until_hangup(reader, forward())
            case CronReq():
                await _send(writer, {"ok": True, "data": await self._cron_op(req)})
            case StopReq():
                await _send(writer, {"ok": True, "data": {"stopping": True}})
                self._on_stop()
                # Held open: the client learns the supervisor is gone when we close.
                await reader.read()


def mcp_servers(m: SandboxManager) -> list[dict[str, Any]]:
    """For `clawsup mcp list`: each MCP server's sandbox, its state, how it is reached
    and run, the tools it serves now, its restarts, its last exit and what was refused.
    Never the values of its `env` or `headers` (they may be secrets), nor its url."""
    out = []
    for sb in m.sandboxes.values():
        plan, spec = sb.plan, sb.plan.mcp
        if spec is None:
            continue
        out.append({
            "id": spec.server_id,
            "sandbox": sb.id,
            "owner": plan.plugin_id,
            "state": sb.lc.state.value,
            "state_why": sb.lc.why,
            "transport": spec.transport,
            "backend": plan.backend,
            "trust": "trusted" if plan.trusted else "untrusted",
            # What the child really has: the process backend cannot take it away.
            "network": plan.network or plan.backend == "process",
            "prefix": spec.prefix,
            "tools": sorted(r.name for r in m.registry.owned_by(plan.plugin_id) if r.kind is Kind.TOOL),
            "restarts": sb.lc.restarts,
            "last_exit": sb.lc.last_exit.to_json() if sb.lc.last_exit else None,
            "refused": [*plan.refused, *(f"tool {name!r}: {why}" for name, why in sorted(sb.refusals.items()))],
        })  # fmt: skip
    return sorted(out, key=lambda s: s["id"])


def _stats(m: SandboxManager) -> dict[str, Any]:
    me = psutil.Process()
    return {
        "pid": me.pid,
        "rss_bytes": me.memory_info().rss,
        "open_fds": me.num_fds(),
        "tasks": len(asyncio.all_tasks()),
        "sandboxes": len(m.sandboxes),
        "threads": me.num_threads(),
    }


def _past_lines(written: BinaryIO, n: int, end: int) -> bytes:
    """The answer to `logs`, read and encoded in a worker thread: up to 100,000
    lines (`LogsReq.n`) are megabytes to read and to encode."""
    with written:
        lines = read_tail(written, n, end)
    return json.dumps({"ok": True, "data": {"lines": lines}}).encode() + b"\n"


async def _forward_log(writer: asyncio.StreamWriter, follower: Follower) -> None:
    """A follower's lines to its client, in batches, as fast as its socket takes
    them: `drain` makes this wait, never the log or the child."""
    while batch := await follower.take(FOLLOW_BATCH_CHARS):
        writer.write(b"".join(json.dumps({"line": item.rstrip("\n")} if isinstance(item, str) else {"skipped": item.count}).encode() + b"\n" for item in batch))
        await writer.drain()
    await _send(writer, {"ended": DISCARDED})


async def _send(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(json.dumps(obj).encode() + b"\n")
    await writer.drain()


class ControlClient:
    """The CLI's side. Blocking and tiny: the CLI has no event loop of its own."""

    def __init__(self, path: Path, timeout: float = 60.0) -> None:
        self.path = path
        self.timeout = timeout

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            with short_address(self.path) as address:
                s.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            raise SupervisorNotRunning(self.path) from None
        return s

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._connect() as s:
            s.sendall(json.dumps(req).encode() + b"\n")
            f = s.makefile("rb")
            line = f.readline()
            if not line:
                raise ConnectionError("the supervisor closed the connection without answering")
            return _answer(line)

    def stream(self, req: dict[str, Any], timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Send one request and yield every message the supervisor sends back.
        `timeout` bounds each wait for the next message (None: wait for ever)."""
        s = self._connect()
        s.settimeout(timeout)
        with s:
            s.sendall(json.dumps(req).encode() + b"\n")
            for line in s.makefile("rb"):
                yield _answer(line)

    def stop(self) -> None:
        """Ask the supervisor to stop, and return once it has (it closes on exit)."""
        with self._connect() as s:
            s.settimeout(None)
            s.sendall(b'{"op": "stop"}\n')
            f = s.makefile("rb")
            f.readline()
            f.read()


class SupervisorNotRunning(Exception):
    def __init__(self, path: Path) -> None:
        super().__init__(f"no supervisor is running for this state directory (no answer on {path}); start one with `clawsup start`")


def _answer(line: bytes) -> dict[str, Any]:
    """One of the supervisor's answers: a JSON object (arbitrary JSON inside)."""
    answer = json.loads(line)
    if not isinstance(answer, dict):
        raise ConnectionError(f"the supervisor answered with something other than a JSON object: {line[:80]!r}")
    return answer
