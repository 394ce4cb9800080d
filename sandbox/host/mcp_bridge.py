"""The sandbox host as the MCP client of one server (role `mcp`, sandbox/handshake.py):
it starts or reaches the server the start gate's `McpServerSpec` names, speaks MCP to
it through the official `mcp` SDK's `ClientSession` (over our own stdio transport,
sandbox/host/mcp_stdio.py, or the SDK's streamable HTTP client), and serves the
server's tools to the supervisor as the host's own (Describe, InvokeTool in
sandbox/host/server.py). The supervisor never speaks MCP, and the server never sees
the supervisor.

What it promises the supervisor:
- The handshake line is printed only after `initialize` and the first `tools/list`,
  both within `spec.initialize_timeout_s` of the start. A server that exits before,
  cannot be started, refuses, or is late is killed, and the host prints a load error
  with `retry=True` (the supervisor restarts it with backoff) instead.
- Served tools are the server's own that `spec.picks`, named `spec.served_name`.
- A call maps its result to text or JSON (`outcome_of`), at most `MAX_RESULT_BYTES`.
  A call cancelled or past its deadline sends `notifications/cancelled` (the SDK
  does); the server then has `spec.cancel_grace_s` to answer a ping, or is killed.
- `notifications/tools/list_changed`: the host lists again (bursts coalesce), swaps
  its table, then asks the supervisor to Describe again (`mcp.tools_changed`).
- After the handshake the server's end is the sandbox's: the host tells the
  supervisor how it ended (`mcp.server_exited`), answers no call in flight (the
  supervisor fails them with the sandbox's death) and exits `SERVER_GONE_EXIT`.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Protocol

import httpx2
import mcp.types as types
from mcp.client._transport import TransportStreams
from mcp.client.extension import UnexpectedClaimedResult
from mcp.client.session import ClientSession, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from clawsup.sandbox.host.mcp_stdio import ServerProcess, SpawnedServer, stdio_transport
from clawsup.sandbox.mcp_spec import McpServerSpec

SERVER_GONE_EXIT = 75
"""The host's exit code when the MCP server ended after the handshake (EX_TEMPFAIL):
the supervisor restarts the sandbox with backoff, like any crash."""
MAX_RESULT_BYTES = 1024 * 1024
"""The most text a call's result carries to the supervisor; the rest is cut, and a
marker says how much."""
MAX_DESCRIBE_BYTES = 3 * 1024 * 1024
"""What the served tools' names, descriptions and schemas may take in all: a Describe
answer must stay under the supervisor's 4 MiB message bound
(supervisor/sandboxes/host_client.py MAX_MESSAGE_BYTES)."""
MAX_LIST_PAGES = 100
MAX_UNSTOPPED_CALLS = 3
"""Calls in a row that were cancelled (or overran) and whose server still answered a
ping: a server that runs its tools in worker threads answers pings while each of
those threads is stuck, until none is left. Past this many, with no call finished
between, it is killed."""
EXIT_REPORT_TIMEOUT_S = 1.0
RELIST_SETTLE_S = 0.05
"""After notifications/tools/list_changed, how long the host lets a burst of them
settle before it lists again."""
CLOSE_TIMEOUT_S = 2.0
"""At the host's shutdown, how long the connection has to close (the stdio transport
gives the server 0.5 s after its stdin closes) before it is cancelled."""
LOGGED_CHARS = 500
CLIENT_INFO = types.Implementation(name="clawsup", version="0.1.0")

FailureKind = Literal["UNKNOWN_TOOL", "BAD_ARGUMENTS", "TIMED_OUT", "BAD_RESULT", "TOOL_ERROR"]
"""The host.proto ToolFailure kinds a call can end with (server.py maps them)."""


class SupervisorRequests(Protocol):
    """What the bridge asks of the host's end of the Connect stream
    (sandbox/host/link.py SupervisorLink)."""

    async def request(self, method: str, payload: dict[str, Any], *, timeout: float | None = ...) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class HostExits:
    """The host's own ways to speak and to end (sandbox/host/server.py), which the
    bridge uses but does not own."""

    say: Callable[[str], None]
    """One line to the sandbox log."""
    fail_start: Callable[[str], NoReturn]
    """Before the handshake: the load error line with retry=True, then exit."""
    exit: Callable[[int], NoReturn]
    """After the handshake: end the host with this code."""


@dataclass(frozen=True, kw_only=True)
class ServedTool:
    name: str
    """The served name: the spec's prefix + the server's name."""
    server_name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class CallOutcome:
    text: str
    is_json: bool = False
    failure: FailureKind | None = None


class McpBridge:
    """The host's MCP client of one server. Created by `open_bridge`, which owns its
    connection and its tasks and returns it once the server has initialized and
    listed its tools; lives until the host stops or the server ends."""

    def __init__(self, spec: McpServerSpec, link: SupervisorRequests, host: HostExits, tg: asyncio.TaskGroup, spawned: SpawnedServer | None) -> None:
        self.spec = spec
        self._spawned = spawned
        self._started_at = spawned.started_at if spawned is not None else asyncio.get_running_loop().time()
        self.label = spec.label
        self.tools: dict[str, ServedTool] = {}
        """Served name -> tool. Replaced whole, never edited: Describe reads it as is."""
        self._link = link
        self._host = host
        self._tg = tg
        self._session: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._process: ServerProcess | None = spawned.process if spawned is not None else None
        self._unstopped = 0
        """Cancelled calls in a row since the last one that finished (MAX_UNSTOPPED_CALLS)."""
        self._url_shown = _shown_url(spec.url)
        self._http_refusal = ""
        self._handshaken = False
        self._closing = asyncio.Event()
        self._gone = False
        self._tools_changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the connection ---------------------------------------------------------

    async def hold_connection(self) -> None:
        """The task that owns the transport and the session (their anyio task groups
        and cancel scopes stay inside it), until the host closes or the server ends."""
        try:
            async with self._transport() as (read, write), ClientSession(
                read, write, message_handler=self._on_message, logging_callback=self._on_log, client_info=CLIENT_INFO
            ) as session:
                self._session.set_result(session)
                await self._closing.wait()
        except Exception as e:  # ExceptionGroup too: the transport's task group failed
            if self._closing.is_set():
                return
            if self.spec.transport == "stdio" and self._process is None:
                await self.server_gone(f"{self.label} could not be started ({self.spec.command}): {_why(e)}")
            elif self._process is not None:
                # Without its pipes the server is of no use; its watcher ends the host.
                self._process.kill(f"{self.label}: the host's stdio transport to it failed ({_why(e)}); killed it")
                await _until_the_end()
            else:
                how = "lost its connection" if self._handshaken else "could not be reached"
                await self.server_gone(f"{self.label} at {self._url_shown} {how}: {_why(e)}{self._refusal()}")

    def _transport(self) -> AbstractAsyncContextManager[TransportStreams]:
        if self.spec.transport == "stdio":
            return self._stdio()
        return self._http()

    @asynccontextmanager
    async def _stdio(self) -> AsyncIterator[TransportStreams]:
        assert self._spawned is not None, "a stdio server is started before the bridge (server.py)"
        async with stdio_transport(self._spawned, say=self._host.say) as (process, read, write):
            self._process = process
            self.spawn(self._watch(process))
            yield read, write

    @asynccontextmanager
    async def _http(self) -> AsyncIterator[TransportStreams]:
        # The SDK's own default client (its timeouts: 30 s, 300 s to read a stream),
        # carrying the operator's headers on every request.
        client = create_mcp_http_client(headers=dict(self.spec.headers))
        client.event_hooks = {"response": [self._note_refusal]}
        async with client, streamable_http_client(self.spec.url, http_client=client) as (read, write):
            yield read, write

    async def _note_refusal(self, response: httpx2.Response) -> None:
        """The SDK reports an HTTP refusal as "Server returned an error response";
        the status (401, 403, 404) is what tells the operator what to fix."""
        if response.status_code >= 400:
            self._http_refusal = f"HTTP {response.status_code} {response.reason_phrase}"

    def _refusal(self) -> str:
        return f" ({self._http_refusal})" if self._http_refusal else ""

    async def _watch(self, process: ServerProcess) -> None:
        await process.exited
        if self._closing.is_set():
            return
        if process.killed_because is not None:
            await self.server_gone(process.killed_because)
        elif self._handshaken:
            # Its stderr is in the sandbox log, and the supervisor's crash line quotes its end.
            await self.server_gone(f"{self.label} {process.how_it_ended()}")
        else:
            # Why a server could not start is most often its last stderr line, and this
            # message is what `clawsup mcp list` shows as its last exit.
            await self.server_gone(f"{self.label} {process.how_it_ended()} before initialize finished{await process.last_words()}")

    def _scrub(self, text: str) -> str:
        """What the host says of the server leaves the sandbox (the log, `clawsup mcp
        list`, a caller's error): the url's query and credentials, and every env and
        header value, never do (an HTTP library's error quotes them)."""
        for secret in sorted({self.spec.url, *self.spec.headers.values(), *self.spec.env.values()}, key=len, reverse=True):
            if len(secret) >= 4:
                text = text.replace(secret, self._url_shown if secret == self.spec.url else "<hidden>")
        return text

    async def server_gone(self, message: str) -> NoReturn:
        """The server ended, cannot be reached, or was killed for cause. Before the
        handshake a load error the supervisor retries; after it, the sandbox's end.
        Never returns: the first caller ends the host, any other waits for it."""
        if self._gone:
            await _until_the_end()
        self._gone = True
        message = self._scrub(message)
        if self._process is not None:
            self._process.kill(message)
        if not self._handshaken:
            self._host.fail_start(message)
        self._host.say(f"clawsup host: {message}; the sandbox ends with it (exit {SERVER_GONE_EXIT})")
        try:
            await self._link.request("mcp.server_exited", {"message": message}, timeout=EXIT_REPORT_TIMEOUT_S)
        except Exception as e:  # best effort: the exit code and the log say it too
            self._host.say(f"clawsup host: could not tell the supervisor ({type(e).__name__}: {e})")
        self._host.exit(SERVER_GONE_EXIT)

    async def start(self) -> None:
        """`initialize` and the first `tools/list`, within the spec's time from the
        start of the server. Returns only when both are done; otherwise the host
        ends here (`server_gone` / `HostExits.fail_start`)."""
        limit = self.spec.initialize_timeout_s
        stage = "initialize"
        try:
            async with asyncio.timeout_at(self._started_at + limit):
                session = await asyncio.shield(self._session)
                await session.initialize()
                stage = "initialize and tools/list"
                self._tools_changed.clear()  # what changed before this listing, it shows
                self.tools = await self._list_tools(session)
        except TimeoutError:
            if self._process is not None:
                self._process.kill(f"{self.label} did not finish {stage} within {limit:g} s; killed it")
                await _until_the_end()  # its watcher says so
            elif self.spec.transport == "stdio":
                await self.server_gone(f"{self.label} could not be started within {limit:g} s ({self.spec.command})")
            else:
                await self.server_gone(f"{self.label} at {self._url_shown} did not finish {stage} within {limit:g} s{self._refusal()}")
        except MCPError as e:
            if e.code == types.CONNECTION_CLOSED and self._process is not None:
                await _until_the_end()  # the server is gone: its watcher says how
            await self.server_gone(f"{self.label} refused {stage}: {e.message} (MCP error {e.code}){self._refusal()}")
        except Exception as e:  # a result that is not MCP, a protocol version we do not speak
            await self.server_gone(f"{self.label} failed during {stage}: {_why(e)}")
        self._handshaken = True
        self._http_refusal = ""  # from here on, a refusal is news
        self.spawn(self._relist_on_change(session))
        served = ", ".join(sorted(self.tools)) or "none"
        self._host.say(f"{self.label}: initialized; serving {len(self.tools)} tool(s): {_cut(served, LOGGED_CHARS)}")

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of the bridge's: in `open_bridge`'s task group, cancelled at close."""
        task = self._tg.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self, connection: asyncio.Task[None]) -> None:
        """The host is stopping: the connection task leaves its session and
        transport (stdin closed, then the server's group killed); the bridge's
        other tasks (the exit watcher, the relister, pings after a cancel) end."""
        self._closing.set()
        await asyncio.wait({connection}, timeout=CLOSE_TIMEOUT_S)
        for task in list(self._tasks):
            task.cancel()

    # -- the tool table ---------------------------------------------------------

    async def _list_tools(self, session: ClientSession) -> dict[str, ServedTool]:
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            listed += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        else:
            self._host.say(f"{self.label}: its tool list runs past {MAX_LIST_PAGES} pages; serving the first {MAX_LIST_PAGES}")
        served: dict[str, ServedTool] = {}
        skipped: list[str] = []
        size = 0
        for tool in listed:
            if not self.spec.picks(tool.name):
                skipped.append(tool.name)
                continue
            name = self.spec.served_name(tool.name)
            if name in served:
                self._host.say(f"{self.label} lists the tool {tool.name!r} twice; serving the first")
                continue
            description = tool.description or tool.title or ""
            size += len(name) + len(description.encode()) + len(json.dumps(tool.input_schema))
            if size > MAX_DESCRIBE_BYTES:
                self._host.say(f"{self.label}: its tools' descriptions and schemas pass {MAX_DESCRIBE_BYTES // (1024 * 1024)} MiB; {tool.name!r} and the rest are not served")
                break
            served[name] = ServedTool(name=name, server_name=tool.name, description=description, input_schema=tool.input_schema)
        if skipped:
            self._host.say(f"{self.label}: not serving {len(skipped)} tool(s) that tools.allow/deny leave out: {_cut(', '.join(skipped), LOGGED_CHARS)}")
        return served

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._tools_changed.set()
        elif isinstance(message, Exception):
            self._host.say(f"{self.label}: the transport reported {_why(message)}")

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self._host.say(f"{self.label} log [{params.level}]: {_cut(str(params.data), LOGGED_CHARS)}")

    async def _relist_on_change(self, session: ClientSession) -> None:
        """One listing at a time; notifications that arrive during one make one more
        (a burst coalesces). The table is swapped whole, then the supervisor is asked
        to Describe again and judge the new list."""
        while True:
            await self._tools_changed.wait()
            # A server that changes several tools often says so once for each.
            await asyncio.sleep(RELIST_SETTLE_S)
            self._tools_changed.clear()
            try:
                async with asyncio.timeout(self.spec.initialize_timeout_s):
                    tools = await self._list_tools(session)
            except TimeoutError:
                self._host.say(f"{self.label} did not answer tools/list within {self.spec.initialize_timeout_s:g} s after tools/list_changed; keeping the tools it had")
                continue
            except MCPError as e:
                if e.code == types.CONNECTION_CLOSED:
                    return
                self._host.say(f"{self.label} refused tools/list after tools/list_changed: {e.message}; keeping the tools it had")
                continue
            except ValidationError as e:
                self._host.say(f"{self.label} answered tools/list with something that is not MCP ({_why(e)}); keeping the tools it had")
                continue
            if tools == self.tools:
                continue  # nothing the supervisor sees has changed: no need to ask it
            before, self.tools = self.tools, tools
            added, removed = sorted(tools.keys() - before.keys()), sorted(before.keys() - tools.keys())
            changed = sorted(n for n in tools.keys() & before.keys() if tools[n] != before[n])
            self._host.say(
                f"{self.label} changed its tools: added {', '.join(added) or 'none'}; removed {', '.join(removed) or 'none'}; "
                f"redescribed {', '.join(changed) or 'none'}"
            )
            try:
                await self._link.request("mcp.tools_changed", {})
            except Exception as e:  # the supervisor refused or is busy: its next Describe sees the new list
                self._host.say(f"clawsup host: the supervisor did not take mcp.tools_changed ({type(e).__name__}: {e})")

    # -- calls --------------------------------------------------------------------

    async def call(self, served: str, args: dict[str, Any], timeout: float | None, call_id: str) -> CallOutcome:
        """One tools/call. No answer at all if the server ends meanwhile: the host
        exits, and the supervisor fails the call with the sandbox's death."""
        tool = self.tools.get(served)
        if tool is None:
            return CallOutcome(failure="UNKNOWN_TOOL", text=f"{self.label} serves no tool named {served!r}")
        session = self._session.result()
        try:
            result = await session.call_tool(tool.server_name, args, read_timeout_seconds=timeout)
        except asyncio.CancelledError:
            # The supervisor gave up on the call; the SDK has sent notifications/cancelled.
            self.spawn(self._expect_stop(session, call_id, served))
            raise
        except MCPError as e:
            if e.code == types.CONNECTION_CLOSED and self._process is not None:
                await _until_the_end()  # the server is gone; the supervisor fails this call
            if e.code == types.CONNECTION_CLOSED:
                # A remote server's stream for this call ended without an answer; the
                # connection itself may be fine (if not, its task ends the host).
                return CallOutcome(failure="TOOL_ERROR", text=self._scrub(f"{self.label} dropped the call to {tool.server_name!r} without an answer ({e.message})"))
            if e.code == types.REQUEST_TIMEOUT:
                self.spawn(self._expect_stop(session, call_id, served))
                return CallOutcome(failure="TIMED_OUT", text=f"{self.label}: tool {served!r} did not finish within {timeout or 0:g} s; sent notifications/cancelled")
            kind: FailureKind = "BAD_ARGUMENTS" if e.code == types.INVALID_PARAMS else "TOOL_ERROR"
            return CallOutcome(failure=kind, text=_bounded(self._scrub(f"{self.label} refused the call to {tool.server_name!r}: {e.message} (MCP error {e.code})")))
        except (ValidationError, UnexpectedClaimedResult, RuntimeError) as e:
            # A result that is not a CallToolResult, or does not match the tool's own
            # outputSchema (the SDK checks), or asks for input we cannot give.
            return CallOutcome(failure="BAD_RESULT", text=_bounded(f"{self.label} answered the call to {tool.server_name!r} with a result clawsup cannot use: {_why(e)}"))
        self._unstopped = 0
        return outcome_of(result)

    async def _expect_stop(self, session: ClientSession, call_id: str, served: str) -> None:
        """After notifications/cancelled the server must show it still answers. One
        that does not (a handler blocking its loop) would hold the call's work and
        every later call: it is killed, and the sandbox ends with it."""
        try:
            # The whole ping, its write too: a server that stopped reading its stdin
            # holds the write at a full pipe, which the SDK's own deadline does not cover.
            async with asyncio.timeout(self.spec.cancel_grace_s):
                await session.send_ping()
            self._unstopped += 1
            if self._unstopped >= MAX_UNSTOPPED_CALLS and self._process is not None:
                self._process.kill(
                    f"{self.label} did not finish {self._unstopped} calls in a row after notifications/cancelled (the last "
                    f"{call_id}, {served}), though it answers pings: its handlers do not stop; killed it"
                )
            return
        except MCPError:
            return  # the connection is gone: its watcher speaks
        except TimeoutError:
            if self._closing.is_set():
                return
            because = f"{self.label} did not stop after notifications/cancelled for call {call_id} ({served}) within {self.spec.cancel_grace_s:g} s"
            if self._process is not None:
                self._process.kill(because + "; killed it")
            else:
                self._host.say(because + "; it is remote, so it is left to its own devices")


async def _until_the_end() -> NoReturn:
    """Parks a task whose story another is ending: the server is gone, and the host
    ends within moments (os._exit), so this task must neither answer nor return."""
    await asyncio.Event().wait()
    raise AssertionError("an event nobody holds was set")


def outcome_of(result: types.CallToolResult) -> CallOutcome:
    """isError -> a TOOL_ERROR with the content as text. Structured content with only
    text beside it (the spec says that text should be the same JSON) -> the JSON. Otherwise
    text: text blocks as they are, other blocks summarised (never dropped silently),
    then the structured JSON if any. At most MAX_RESULT_BYTES."""
    structured = result.structured_content
    if result.is_error:
        text = _as_text(result.content, structured) or "the MCP server reported an error and gave no text"
        return CallOutcome(failure="TOOL_ERROR", text=_bounded(text))
    if structured is not None and all(isinstance(b, types.TextContent) for b in result.content):
        data = json.dumps(structured, ensure_ascii=False)
        if len(data.encode()) <= MAX_RESULT_BYTES:
            return CallOutcome(text=data, is_json=True)
        return CallOutcome(text=_bounded(data))
    return CallOutcome(text=_bounded(_as_text(result.content, structured)))


def _as_text(blocks: list[types.ContentBlock], structured: Any) -> str:
    parts = [_block_text(b) for b in blocks]
    if structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def _block_text(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent):
        return f"[image: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, types.AudioContent):
        return f"[audio: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, types.EmbeddedResource):
        r = block.resource
        size = len(r.text.encode()) if isinstance(r, types.TextResourceContents) else _decoded_size(r.blob)
        kind = f" ({r.mime_type})" if r.mime_type else ""
        return f"[resource: {r.uri}{kind}, {size} bytes]"
    return f"[resource link: {block.uri} {block.name}]"


def _decoded_size(b64: str) -> int:
    """The size of base64 data once decoded, without decoding it."""
    s = "".join(b64.split())
    return len(s) * 3 // 4 - len(s) + len(s.rstrip("="))


def _bounded(text: str) -> str:
    data = text.encode()
    if len(data) <= MAX_RESULT_BYTES:
        return text
    marker = f"\n[… result cut: {{}} of its {len(data)} bytes left out; the limit is {MAX_RESULT_BYTES // 1024} KiB]"
    keep = MAX_RESULT_BYTES - len(marker.format(len(data)).encode())
    return data[:keep].decode(errors="ignore") + marker.format(len(data) - keep)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shown_url(url: str) -> str:
    """A remote server's address as messages show it: scheme, host, port and path;
    never credentials or the query, where hosted servers often carry a key."""
    from urllib.parse import urlsplit

    if not url:
        return ""
    try:
        u = urlsplit(url)
        host = u.hostname or ""
        port = f":{u.port}" if u.port else ""
    except ValueError:
        return "<the configured url>"
    return f"{u.scheme}://{host}{port}{u.path}"


def _why(e: BaseException) -> str:
    """One line for an exception, reaching into a task group's to the first cause."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {_cut(text[0], LOGGED_CHARS)}" if text else type(e).__name__


@asynccontextmanager
async def open_bridge(spec: McpServerSpec, link: SupervisorRequests, host: HostExits, spawned: SpawnedServer | None) -> AsyncIterator[McpBridge]:
    """Start the server (or reach it), initialize, list its tools, and yield the
    bridge; the host prints its handshake inside. Does not return on failure: the
    host ends (`HostExits`). On the way out the connection closes and the server's
    group is killed. `spawned`: the stdio server, already started (server.py), or None
    for a remote one."""
    async with asyncio.TaskGroup() as tg:
        bridge = McpBridge(spec, link, host, tg, spawned)
        connection = bridge.spawn(bridge.hold_connection())
        try:
            await bridge.start()
            yield bridge
        finally:
            await bridge.close(connection)
