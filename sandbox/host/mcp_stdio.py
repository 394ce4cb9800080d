"""The stdio transport between the sandbox host and the MCP server it starts: the
server's process and the two pipes that carry newline-delimited JSON-RPC, handed to
the `mcp` SDK's `ClientSession` as its stream pair (sandbox/host/mcp_bridge.py).

Our own rather than the SDK's `stdio_client`, for three reasons:
- it hides the process: the host needs the server's exit status, at its exit (not
  when its pipes close), to say how it ended, and must kill its whole group when a
  cancelled call does not stop;
- it buffers a stdout line without bound: a server that writes no newline would grow
  the host until its memory limit killed it, and the message would not say why;
- it logs a traceback for every stdout line that is not JSON-RPC and hands the error
  to the session: a server that prints a banner, or floods stdout, would flood the
  sandbox log.

Here the server runs in its own session and process group, with stdin and stdout on
pipes, the host's scrubbed environment plus the spec's `env`, and the host's cwd (the
workspace). Its stderr goes to the sandbox log, relayed by the host onto its own fd 2
a line at a time rather than inherited, so that the host keeps the last lines: "exited
with code 1 (last stderr: Error: invalid --local-timezone ...)" is what an operator
needs to read in `clawsup mcp list`, not only in the log. A stdout line
is one message; a line longer than `MAX_LINE_BYTES` is a protocol violation (the
server is killed, and the kill says why); a line that is not a JSON-RPC message is
dropped and logged (the first `NOISE_LOGGED_FIRST`, then one count per
`NOISE_COUNT_EVERY`), and never reaches the session.

The server is started (`spawn_server`) before anything imports the SDK: importing it
costs the host about 0.8 s, and the server, in its own process, boots meanwhile
rather than after (scripts/bench.py figure (o)). So this module imports the SDK only
once the pipes open (`stdio_transport`).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from clawsup.sandbox.mcp_spec import McpServerSpec

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.shared.message import SessionMessage

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest stdout line (one JSON-RPC message) the host reads. Far past any sane
message, and a bound on what one line can cost the host's memory (the reader buffers
up to twice this before it stops reading)."""
NOISE_LOGGED_FIRST = 20
NOISE_COUNT_EVERY = 1000
NOISE_SHOWN_CHARS = 200
STDOUT_EOF_GRACE_S = 1.0
"""A server that closed its stdout has this long to exit before it is killed: it can
no longer answer anything."""
STOP_GRACE_S = 0.5
"""At the host's shutdown, after stdin is closed, how long the server has to exit on
its own before its group is killed (the MCP spec's stdio shutdown, short: the host's
own grace is short too)."""

STDERR_CHUNK = 64 * 1024
STDERR_LINE_BOUND = 64 * 1024
"""A stderr line longer than this is relayed in pieces rather than held whole."""
STDERR_TAIL_LINES = 3
STDERR_TAIL_CHARS = 300
STDERR_SETTLE_S = 0.5
"""After the server's exit, how long its last stderr lines have to arrive (a
grandchild holding the pipe open would hold them forever)."""

Say = Callable[[str], None]


class _ServerProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol for a process with stream pipes, plus a future resolved at
    the process's exit itself. `Process.wait()` also waits for the pipes to close, and
    a grandchild that inherited stdout would make an exited server look alive."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[int] = loop.create_future()
        self._process: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._process = cast(asyncio.SubprocessTransport, transport)

    def process_exited(self) -> None:
        super().process_exited()
        code = self._process.get_returncode() if self._process is not None else None
        if not self.exited.done():
            self.exited.set_result(code if code is not None else -1)


@dataclass(eq=False)
class ServerProcess:
    """The MCP server's process, as the host started it. Created by `stdio_transport`,
    which kills its group on the way out; the bridge awaits `exited` and kills it when
    a call it cancelled does not stop."""

    label: str
    """`MCP server 'time'`: how messages name it."""
    pid: int
    exited: asyncio.Future[int]
    """Resolves to the return code (negative: the signal) when the process exits."""
    killed_because: str | None = None
    """Why the host killed it, if it did: the first reason given, a full sentence."""
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    """Its last non-empty stderr lines, each cut to STDERR_TAIL_CHARS."""
    stderr_closed: asyncio.Event = field(default_factory=asyncio.Event)

    def kill(self, because: str) -> None:
        """SIGKILL the server's whole group (it leads its own session). The first
        reason is the one kept: it is what the operator is told."""
        if self.killed_because is None and not self.exited.done():
            self.killed_because = because
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def how_it_ended(self) -> str:
        """`exited with code 3`, `was killed by SIGKILL`; only once `exited` is done."""
        code = self.exited.result()
        if code >= 0:
            return f"exited with code {code}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"

    async def last_words(self) -> str:
        """` (last stderr: ...)` once its stderr has closed (or STDERR_SETTLE_S has
        passed), or "" if it said nothing there."""
        with suppress(TimeoutError):
            async with asyncio.timeout(STDERR_SETTLE_S):
                await self.stderr_closed.wait()
        return f" (last stderr: {' | '.join(self.stderr_tail)})" if self.stderr_tail else ""


@dataclass(frozen=True, eq=False)
class SpawnedServer:
    """A server process `spawn_server` started, not yet connected to a session."""

    process: ServerProcess
    transport: asyncio.SubprocessTransport
    protocol: _ServerProtocol
    started_at: float
    """The loop's clock when it was started: its initialize timeout counts from here."""


async def spawn_server(spec: McpServerSpec, *, say: Say) -> SpawnedServer:
    """Start the server: its own session and process group, pipes on all three
    streams. Raises OSError if it cannot be started. The host has made itself
    non-dumpable before (`refuse_dumps`, sandbox/host/server.py)."""
    loop = asyncio.get_running_loop()
    started_at = loop.time()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ServerProtocol(MAX_LINE_BYTES, loop),
        spec.command,
        *spec.args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **spec.env},
        cwd=os.getcwd(),
        start_new_session=True,
    )
    process = ServerProcess(label=spec.label, pid=transport.get_pid(), exited=protocol.exited)
    say(f"{spec.label}: started {spec.command} as pid {process.pid}")
    return SpawnedServer(process=process, transport=transport, protocol=protocol, started_at=started_at)


def refuse_dumps() -> None:
    """The server runs as the host's uid; non-dumpable, the host's /proc entries
    (environ, mem, fds) are closed to it: defence in depth, not the wall (the
    sandbox is; see README "MCP servers" for what the server can still reach). Cleared
    again in the server by its exec, so the server itself is unaffected."""
    PR_SET_DUMPABLE = 4
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


@asynccontextmanager
async def stdio_transport(
    spawned: SpawnedServer, *, say: Say
) -> AsyncIterator[tuple[ServerProcess, MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]]:
    """Connect a started server's pipes to a session's stream pair and yield them with
    the process. On the way out: stdin closed, `STOP_GRACE_S` for the server to exit,
    then its group killed."""
    import anyio
    from mcp.shared.message import SessionMessage

    transport, protocol, process = spawned.transport, spawned.protocol, spawned.process
    assert protocol.stdin is not None and protocol.stdout is not None and protocol.stderr is not None
    # Unbuffered, as the SDK's own: a line is read only when the session takes the last.
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    pipes = _Pipes(process, say)
    try:
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(pipes.read(protocol.stdout, to_session))
            writer = tg.create_task(pipes.write(from_session, protocol.stdin))
            relay = tg.create_task(pipes.relay_stderr(protocol.stderr))
            try:
                yield process, from_server, to_server
            finally:
                await _stop(process, protocol.stdin)
                await asyncio.wait({relay}, timeout=STDERR_SETTLE_S)
                for task in (reader, writer, relay):
                    task.cancel()
    finally:
        transport.close()


async def _stop(process: ServerProcess, stdin: asyncio.StreamWriter) -> None:
    stdin.close()
    if not process.exited.done():
        await asyncio.wait({process.exited}, timeout=STOP_GRACE_S)
    # Even an exited leader may leave its group behind.
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class _Pipes:
    """The two pump tasks' state: what they count of the server's stdout noise."""

    def __init__(self, process: ServerProcess, say: Say) -> None:
        self._process = process
        self._say = say
        self._noise = 0

    async def read(self, stdout: asyncio.StreamReader, sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """Server stdout -> session, a line at a time. Ends at EOF (the session then
        sees the connection closed), or when the server breaks the line bound."""
        import anyio
        from mcp.shared.message import SessionMessage
        from mcp.types import jsonrpc_message_adapter

        label = self._process.label
        async with sink:
            while True:
                try:
                    line = await stdout.readuntil(b"\n")
                except asyncio.IncompleteReadError as e:
                    line = e.partial
                    if line.strip():
                        self._noisy(line)
                    break
                except asyncio.LimitOverrunError:
                    self._process.kill(
                        f"{label} wrote a stdout line longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB, which is not "
                        "MCP's newline-delimited JSON-RPC; killed it"
                    )
                    return
                if not line.strip():
                    continue
                try:
                    message = jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError:
                    self._noisy(line)
                    continue
                try:
                    await sink.send(SessionMessage(message))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the session is gone: the host is shutting down
        if not self._process.exited.done():
            await asyncio.wait({self._process.exited}, timeout=STDOUT_EOF_GRACE_S)
            self._process.kill(f"{label} closed its stdout but did not exit; killed it")

    def _noisy(self, line: bytes) -> None:
        """A stdout line that is not MCP: some servers print banners or debug output
        there. Logged, bounded, never passed on."""
        self._noise += 1
        n, label = self._noise, self._process.label
        if n <= NOISE_LOGGED_FIRST:
            shown = line.rstrip(b"\r\n")[:NOISE_SHOWN_CHARS].decode("utf-8", errors="backslashreplace")
            more = f" (+{len(line) - NOISE_SHOWN_CHARS} bytes)" if len(line) > NOISE_SHOWN_CHARS + 1 else ""
            self._say(f"{label} wrote a line on stdout that is not MCP (dropped): {shown!r}{more}")
            if n == NOISE_LOGGED_FIRST:
                self._say(f"{label}: further non-MCP stdout lines are dropped and counted here once per {NOISE_COUNT_EVERY}")
        elif n % NOISE_COUNT_EVERY == 0:
            self._say(f"{label}: {n} non-MCP stdout lines dropped so far")

    async def relay_stderr(self, stderr: asyncio.StreamReader) -> None:
        """Server stderr -> the host's fd 2 (the sandbox log, which the supervisor
        reads and tags), whole lines where it can, keeping the last few."""
        pending = b""
        try:
            while chunk := await stderr.read(STDERR_CHUNK):
                pending += chunk
                cut = pending.rfind(b"\n") + 1
                if not cut and len(pending) < STDERR_LINE_BOUND:
                    continue
                whole, pending = (pending[:cut], pending[cut:]) if cut else (pending + b"\n", b"")
                self._relay(whole)
            if pending:
                self._relay(pending + b"\n")
        finally:
            self._process.stderr_closed.set()

    def _relay(self, data: bytes) -> None:
        with suppress(OSError):  # a closed log loses lines, not the server
            view = memoryview(data)
            while view:
                view = view[os.write(2, view) :]
        for line in data.splitlines()[-STDERR_TAIL_LINES:]:
            text = line.decode("utf-8", errors="replace").strip()
            if text:
                self._process.stderr_tail.append(text if len(text) <= STDERR_TAIL_CHARS else text[: STDERR_TAIL_CHARS - 1] + "…")

    async def write(self, source: MemoryObjectReceiveStream[SessionMessage], stdin: asyncio.StreamWriter) -> None:
        """Session -> server stdin. A server that stopped reading holds the writer at
        its full pipe (the session's sends wait; their own deadlines bound them)."""
        async with source:
            async for item in source:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                try:
                    stdin.write(data)
                    await stdin.drain()
                except OSError:
                    return  # the server is gone; its exit watcher says how
