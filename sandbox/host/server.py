"""The child's gRPC server: serves the one plugin it loaded (or, by its role, the
workspace tools, a subagent's loop, or one MCP server's tools through
sandbox/host/mcp_bridge.py) until told to stop.

Created by `clawsup.sandbox.host.__main__` after the start gate opened; lives as long as the
child process.

The host's own words (diagnostics on stderr, the handshake or load error line on
stdout) go through descriptors it duplicated before any plugin code ran (`say`,
`_announce`): a plugin that closes its stderr or stdout (`os.close(2)`,
`sys.stderr.close()`) must not turn its next handler error into a failed RPC, nor
make its shutdown wait out the grace period (tests/test_handlers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from clawsup.v1 import host_pb2 as pb
from clawsup.v1 import host_pb2_grpc as pb_grpc
from clawsup.sandbox.api import PluginApi, SupervisorRefused, ToolError
from clawsup.sandbox.exec_result import ExecResult
from clawsup.sandbox.handshake import (
    HOST_TOKEN_METADATA_KEY,
    LOAD_ERROR_EXIT,
    TOKEN_METADATA_KEY,
    GatePayload,
    LoadError,
    format_handshake,
    format_load_error,
)
from clawsup.sandbox.host.exec_runner import ExecRunner, become_subreaper
from clawsup.sandbox.host.files import Workspace
from clawsup.sandbox.host.link import SupervisorLink
from clawsup.sandbox.host.services import DEFAULT_STOP_S, Services
from clawsup.sandbox.host.subagent import run_task
from clawsup.sandbox.host.loader import PluginLoadFailed, load_error, load_plugin
from clawsup.sandbox.socket_paths import short_address

if TYPE_CHECKING:
    # Imported where an mcp host starts, not here: the mcp SDK takes longer to import
    # than the rest of the host, and no other sandbox needs it.
    from clawsup.sandbox.host.mcp_bridge import CallOutcome, McpBridge

PROTOCOL = "clawsup.v1"
# The host's own stdout and stderr, duplicated in `run` before the plugin loads.
_streams = {1: 1, 2: 2}
# Sync handlers run here. Threads, not processes: the sandbox is the isolation unit.
HANDLER_THREADS = 8
Kind = pb.ToolFailure.Kind


class HandlerOverran(Exception):
    """A sync handler did not finish within its call's timeout. Distinct from a
    TimeoutError the handler raised itself (an upstream that timed out, common in a
    channel's send), which is an ordinary error of the call (tests/test_handler_timeouts.py)."""


async def _require_token(context: grpc.aio.ServicerContext, token: str) -> None:
    """Aborts the call (UNAUTHENTICATED) unless it carries the supervisor's token."""
    for key, value in context.invocation_metadata() or ():
        if key == TOKEN_METADATA_KEY and value == token:
            return
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)


# The token is checked in each handler rather than by a server interceptor: an
# aio interceptor adds a coroutine hop to every call, measurable against the
# 1.3x-of-bare-echo budget for a tool call (scripts/bench.py figure a).
UNAUTHENTICATED = "missing or wrong clawsup token"


class _GuardedHealth(health.aio.HealthServicer):  # type: ignore[misc]  # grpc_health has no types
    """The standard health service, refusing callers without the token: only the
    supervisor has any business on this socket."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _require_token(context, self._token)
        return await super().Check(request, context)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _require_token(context, self._token)
        async for item in super().Watch(request, context):
            yield item


class HostServicer(pb_grpc.HostServicer):
    """The child's side of host.proto. Created by `serve` from the start gate (role,
    version, both tokens) and what it loaded; lives as long as the child's server."""

    def __init__(
        self,
        *,
        gate: GatePayload,
        api: PluginApi,
        link: SupervisorLink,
        health_servicer: health.aio.HealthServicer,
        stop: asyncio.Event,
        runner: ExecRunner | None = None,
        workspace: Workspace | None = None,
        bridge: McpBridge | None = None,
        services: Services | None = None,
    ) -> None:
        self._role = gate.role
        self._services = services
        self.service_stop_s = DEFAULT_STOP_S
        self._bridge = bridge
        self._runner = runner
        self._workspace = workspace
        self._token = gate.supervisor_token
        self._api = api
        self._version = gate.plugin_version
        self._link = link
        self._health = health_servicer
        self._host_md = ((HOST_TOKEN_METADATA_KEY, gate.host_token),)
        self._stop = stop
        self._pool = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="tool")
        # Sync handlers that outlived their timeout. Threads cannot be interrupted, so
        # while any is still running the host reports NOT_SERVING and the supervisor
        # replaces it (tests/test_faults.py::test_endless_loop_in_handler).
        self._overrun: set[str] = set()

    # Unary answers carry the host token in trailing metadata: it travels with the
    # status in one batch, where initial metadata would cost a batch of its own
    # (about 0.1 ms a call here; scripts/bench.py figure a).

    async def Describe(self, request: pb.DescribeRequest, context: grpc.aio.ServicerContext) -> pb.DescribeResponse:
        await _require_token(context, self._token)
        context.set_trailing_metadata(self._host_md)
        described = self._bridge.tools.values() if self._bridge is not None else (*self._api.tools.values(), *self._api.not_served.values())
        tools = [pb.ToolSpec(name=t.name, description=t.description, input_schema_json=json.dumps(t.input_schema)) for t in described]
        offers = [
            pb.Offer(kind=o.kind, name=o.name, priority=o.priority, description=o.description, accepts_args=o.accepts_args, owner_only=o.owner_only, auth=o.auth)
            for o in self._api.offers.values()
        ]
        return pb.DescribeResponse(
            plugin_id=self._api.plugin_id, plugin_version=self._version, tools=tools, protocol=PROTOCOL, offers=offers
        )

    async def CallOffer(self, request: pb.OfferCall, context: grpc.aio.ServicerContext) -> pb.OfferAnswer:
        await _require_token(context, self._token)
        context.set_trailing_metadata(self._host_md)
        offer = self._api.offers.get((request.kind, request.name))
        if offer is None:
            return pb.OfferAnswer(ok=False, error_kind="unknown", error=f"no {request.kind} {request.name!r} in plugin {self._api.plugin_id!r}")
        if offer.kind == "service":
            why = self._services.start(offer) if self._services is not None else "this host runs no services"
            return pb.OfferAnswer(ok=why is None, payload_json="null", error=why or "", error_kind="unknown" if why else "")
        try:
            payload = json.loads(request.payload_json) if request.payload_json else {}
        except json.JSONDecodeError as e:
            return pb.OfferAnswer(ok=False, error_kind="bad_payload", error=f"the payload is not JSON: {e.msg}")
        timeout = request.timeout_ms / 1000 if request.timeout_ms else None
        what = f"{offer.kind} {offer.name!r}"
        try:
            value = await self._run_handler(what, offer.handler, offer.is_async, payload, timeout, request.call_id)
        except HandlerOverran:
            return pb.OfferAnswer(ok=False, error_kind="timed_out", error=f"{what} did not finish within {timeout:g} s")
        except Exception as e:
            say(f"{what} (call {request.call_id}) raised:\n{traceback.format_exc()}")
            return pb.OfferAnswer(ok=False, error_kind="raised", error=f"{type(e).__name__}: {e}"[:2000])
        except (SystemExit, KeyboardInterrupt) as e:
            say(f"{what} (call {request.call_id}) raised {type(e).__name__}; the call fails, the sandbox lives on")
            return pb.OfferAnswer(ok=False, error_kind="raised", error=f"{type(e).__name__}: a handler cannot end its sandbox")
        try:
            return pb.OfferAnswer(ok=True, payload_json=json.dumps(value))
        except (TypeError, ValueError) as e:
            return pb.OfferAnswer(ok=False, error_kind="bad_result", error=f"{what} returned a {type(value).__name__}, which is not JSON-able: {e}")

    async def InvokeTool(self, request: pb.InvokeToolRequest, context: grpc.aio.ServicerContext) -> pb.InvokeToolResponse:
        await _require_token(context, self._token)
        context.set_trailing_metadata(self._host_md)
        if self._bridge is not None:
            return await self._invoke_mcp(self._bridge, request)
        tool = self._api.tools.get(request.name)
        if tool is None:
            return _failure(Kind.UNKNOWN_TOOL, f"no tool named {request.name!r} in plugin {self._api.plugin_id!r}")
        args = _arguments(request)
        if isinstance(args, pb.InvokeToolResponse):
            return args
        timeout = request.timeout_ms / 1000 if request.timeout_ms else None
        try:
            value = await self._run_handler(f"tool {tool.name!r}", tool.handler, tool.is_async, args, timeout, request.call_id)
        except HandlerOverran:
            return _failure(Kind.TIMED_OUT, f"tool {tool.name!r} did not finish within {timeout:g} s")
        except ToolError as e:
            return _failure(Kind.TOOL_ERROR, str(e))
        except Exception as e:
            tb = traceback.format_exc()
            say(f"tool {tool.name!r} (call {request.call_id}) raised:\n{tb}")
            return _failure(Kind.HANDLER_RAISED, f"{type(e).__name__}: {e}", tb[-4000:])
        except (SystemExit, KeyboardInterrupt) as e:
            # A handler does not decide the sandbox's life: the call fails, the host
            # lives on (tests/test_handlers.py). os._exit still ends it, as a crash.
            tb = traceback.format_exc()
            say(f"tool {tool.name!r} (call {request.call_id}) raised {type(e).__name__}; the call fails, the sandbox lives on:\n{tb}")
            detail = f"({e})" if str(e) else "()"
            return _failure(
                Kind.HANDLER_RAISED,
                f"{type(e).__name__}{detail}: a handler cannot end its sandbox; raise ToolError to fail a call",
                tb[-4000:],
            )
        if isinstance(value, str):
            return pb.InvokeToolResponse(result=value)
        try:
            return pb.InvokeToolResponse(result=json.dumps(value), result_is_json=True)
        except (TypeError, ValueError) as e:
            return _failure(Kind.BAD_RESULT, f"tool {tool.name!r} returned a {type(value).__name__}, which is neither str nor JSON-able: {e}")

    async def _invoke_mcp(self, bridge: McpBridge, request: pb.InvokeToolRequest) -> pb.InvokeToolResponse:
        args = _arguments(request)
        if isinstance(args, pb.InvokeToolResponse):
            return args
        # No timer of our own: the SDK's deadline sends notifications/cancelled and
        # answers TIMED_OUT (the supervisor's gRPC deadline adds a margin for it).
        outcome = await bridge.call(request.name, args, request.timeout_ms / 1000 if request.timeout_ms else None, request.call_id)
        return _mcp_response(outcome)

    async def _run_handler(
        self, what: str, handler: Callable[[dict[str, Any]], Any], is_async: bool, args: dict[str, Any], timeout: float | None, call_id: str
    ) -> Any:
        """One tool's or offer's handler, to its value or its own exception; a sync
        one that outlives `timeout` is a HandlerOverran."""
        if is_async:
            # No timer of our own: at the deadline gRPC cancels this task, and the
            # supervisor reports the timeout.
            return await handler(args)
        return await self._in_thread(what, handler, args, timeout, call_id)

    async def _in_thread(self, what: str, handler: Callable[[dict[str, Any]], Any], args: dict[str, Any], timeout: float | None, call_id: str) -> Any:
        fut = asyncio.get_running_loop().run_in_executor(self._pool, handler, args)
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await asyncio.shield(fut)
        except TimeoutError:
            # Ours only when our deadline expired; otherwise the handler raised it.
            if deadline.expired():
                raise HandlerOverran(what) from None
            raise
        finally:
            if not fut.done():
                await self._mark_overrun(what, call_id, fut)

    async def _mark_overrun(self, name: str, call_id: str, fut: asyncio.Future[Any]) -> None:
        key = f"{name}#{call_id}"
        self._overrun.add(key)
        say(f"{name} (call {call_id}) overran its timeout and cannot be interrupted; reporting NOT_SERVING")
        await self._health.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.NOT_SERVING)

        def finished(_: asyncio.Future[Any]) -> None:
            self._overrun.discard(key)
            if not self._overrun:
                asyncio.ensure_future(self._health.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING))

        fut.add_done_callback(finished)

    async def Exec(self, request: pb.ExecRequest, context: grpc.aio.ServicerContext) -> None:
        await _require_token(context, self._token)
        if self._runner is None or self._workspace is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this host serves a plugin, not a workspace")
        assert self._runner is not None and self._workspace is not None
        # The host token leads the stream, in its first event: the supervisor checks
        # it before it passes on a single byte of output.
        token = [self._host_md[0][1]]

        def event(**kw: Any) -> pb.ExecEvent:
            ev = pb.ExecEvent(host_token=token.pop() if token else "", **kw)
            return ev

        try:
            cwd = self._workspace.directory(request.workdir) if request.workdir else None
            outcome = await self._runner.run(
                request.command,
                cwd=cwd,
                timeout_s=max(request.timeout_ms, 1) / 1000,
                cap=max(request.output_cap, 2),
                emit=lambda data: context.write(event(output=data)),
            )
        except (ToolError, OSError) as e:
            await context.write(event(result=_exec_message(ExecResult(error=str(e)))))
            return
        except asyncio.CancelledError:
            say(f"exec call {request.call_id} cancelled by the supervisor; its processes were killed")
            raise
        await context.write(event(result=_exec_message(outcome)))

    async def RunAgent(self, request: pb.RunAgentRequest, context: grpc.aio.ServicerContext) -> pb.RunAgentResponse:
        await _require_token(context, self._token)
        if self._role != "subagent":
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"this host serves a {self._role}, not a subagent")
        context.set_trailing_metadata(self._host_md)
        say(f"run {request.run_id}: started")
        try:
            out = await run_task(self._link.request, request.task, max(request.max_iterations, 1))
        except SupervisorRefused as e:
            say(f"run {request.run_id}: the supervisor refused: {e}")
            return pb.RunAgentResponse(error=str(e))
        say(f"run {request.run_id}: finished after {out.model_calls} model call(s){f' ({out.error})' if out.error else ''}")
        return pb.RunAgentResponse(text=out.text, model_calls=out.model_calls, error=out.error)

    async def Shutdown(self, request: pb.ShutdownRequest, context: grpc.aio.ServicerContext) -> pb.ShutdownResponse:
        await _require_token(context, self._token)
        context.set_trailing_metadata(self._host_md)
        say(f"shutdown requested by the supervisor: {request.reason or 'no reason given'}")
        if request.service_stop_ms:
            self.service_stop_s = request.service_stop_ms / 1000
        self._stop.set()
        return pb.ShutdownResponse()

    async def Connect(self, request_iterator: AsyncIterator[pb.SupervisorMessage], context: grpc.aio.ServicerContext) -> None:
        await _require_token(context, self._token)
        await context.send_initial_metadata(self._host_md)
        # The stream ends when the supervisor closes it or when we are told to stop;
        # otherwise it would hold server.stop() for its whole grace period.
        async with asyncio.TaskGroup() as tg:
            serve = tg.create_task(self._link.serve(request_iterator, context))
            stopping = tg.create_task(self._stop.wait())
            await asyncio.wait({serve, stopping}, return_when=asyncio.FIRST_COMPLETED)
            serve.cancel()
            stopping.cancel()


def _arguments(request: pb.InvokeToolRequest) -> dict[str, Any] | pb.InvokeToolResponse:
    """A call's arguments as a dict, or the failure that answers a call whose are not."""
    try:
        args = json.loads(request.args_json) if request.args_json else {}
    except json.JSONDecodeError as e:
        return _failure(Kind.BAD_ARGUMENTS, f"arguments are not valid JSON: {e.msg} at position {e.pos}")
    if not isinstance(args, dict):
        return _failure(Kind.BAD_ARGUMENTS, f"arguments must be a JSON object, got {type(args).__name__}")
    return args


def _failure(kind: pb.ToolFailure.Kind, message: str, tb: str = "") -> pb.InvokeToolResponse:
    return pb.InvokeToolResponse(error=pb.ToolFailure(kind=kind, message=message, traceback=tb))


_MCP_FAILURES = {
    "UNKNOWN_TOOL": Kind.UNKNOWN_TOOL, "BAD_ARGUMENTS": Kind.BAD_ARGUMENTS, "TIMED_OUT": Kind.TIMED_OUT,
    "BAD_RESULT": Kind.BAD_RESULT, "TOOL_ERROR": Kind.TOOL_ERROR,
}  # fmt: skip


def _mcp_response(outcome: CallOutcome) -> pb.InvokeToolResponse:
    if outcome.failure is not None:
        return _failure(_MCP_FAILURES[outcome.failure], outcome.text)
    return pb.InvokeToolResponse(result=outcome.text, result_is_json=outcome.is_json)


def _exec_message(r: ExecResult) -> pb.ExecResult:
    """The one way an exec result goes on the wire (read back by
    supervisor/sandboxes/host_client.py `_exec_result`)."""
    return pb.ExecResult(
        exit_code=r.exit_code, signal=r.signal, timed_out=r.timed_out, truncated=r.truncated,
        duration_s=r.duration_s, output_bytes=r.output_bytes, error=r.error,
    )  # fmt: skip


async def serve(plugin_dir: Path, socket_path: str, gate: GatePayload) -> None:
    loop = asyncio.get_running_loop()
    link = SupervisorLink(loop)
    if gate.role == "mcp":
        # The MCP server's tools, no plugin. The server is started, initialized and
        # listed before the handshake: one that cannot be is a load error to retry,
        # not a sandbox that serves nothing.
        assert gate.mcp is not None, "an mcp host's gate names its server"
        from clawsup.sandbox.host.mcp_stdio import refuse_dumps, spawn_server

        refuse_dumps()
        spawned = None
        if gate.mcp.transport == "stdio":
            # Started before the SDK is imported (0.8 s), so that the server boots
            # meanwhile (sandbox/host/mcp_stdio.py).
            try:
                spawned = await spawn_server(gate.mcp, say=say)
            except OSError as e:
                _fail_start(f"{gate.mcp.label} could not be started ({gate.mcp.command}): {e.strerror or e}")
        from clawsup.sandbox.host.mcp_bridge import HostExits, open_bridge

        api = PluginApi(plugin_id=gate.plugin_id, config={}, workspace=Path.cwd())
        async with open_bridge(gate.mcp, link, HostExits(say=say, fail_start=_fail_start, exit=_exit), spawned) as bridge:
            await _listen(socket_path, gate, link, api, bridge=bridge)
        return
    runner = workspace = None
    if gate.role == "workspace":
        # The core exec and file tools, on the workspace that is our cwd. No plugin.
        w = gate.workspace_tools
        api = PluginApi(plugin_id=gate.plugin_id, config={}, workspace=Path.cwd())
        workspace = Workspace(os.getcwd(), read_max_bytes=int(w.get("read_max_bytes", 256 * 1024)), protected=list(w.get("protected_paths", [])))
        workspace.register(api)
        runner = ExecRunner(shell=str(w.get("shell", "/bin/sh")), kill_grace_s=float(w.get("kill_grace_s", 2.0)), env=dict(os.environ))
    elif gate.role == "subagent":
        # An agent loop (RunAgent) and nothing else: no plugin, no tool of its own.
        api = PluginApi(plugin_id=gate.plugin_id, config={}, workspace=Path.cwd())
    else:
        try:
            api = load_plugin(plugin_dir, gate.plugin_id, gate.entry, gate.plugin_config, Path.cwd(), serve_only=gate.tools)
        except Exception as e:
            _fail_load(e, plugin_dir)
    api._outbox = link.request
    api._post = link.post
    services = Services(request=link.request, say=say, exit=_exit) if gate.role == "plugin" else None
    await _listen(socket_path, gate, link, api, runner=runner, workspace=workspace, services=services)


async def _listen(
    socket_path: str,
    gate: GatePayload,
    link: SupervisorLink,
    api: PluginApi,
    *,
    runner: ExecRunner | None = None,
    workspace: Workspace | None = None,
    bridge: McpBridge | None = None,
    services: Services | None = None,
) -> None:
    """Serve gRPC on the socket, print the handshake, and stop when told to: the
    plugin's services first (within the deadline the supervisor gave), then the
    calls in flight."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    health_servicer = _GuardedHealth(gate.supervisor_token)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    servicer = HostServicer(
        gate=gate, api=api, link=link, health_servicer=health_servicer, stop=stop, runner=runner, workspace=workspace, bridge=bridge, services=services
    )
    pb_grpc.add_HostServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]  # generated without stubs
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    _clear_name(socket_path)
    # A socket path too long for sun_path is bound through a descriptor of its folder
    # (held until the server is gone); the supervisor dials it by descriptor too.
    with short_address(socket_path) as address:
        server.add_insecure_port(f"unix:{address}")
        await server.start()
        await health_servicer.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING)
        loop.add_signal_handler(signal.SIGTERM, stop.set)

        _announce(format_handshake(socket_path))
        async with services.running() if services is not None else contextlib.nullcontext():
            await stop.wait()
            if services is not None:
                await services.stop_all(servicer.service_stop_s)
        # In-flight tool calls get this long to finish; the supervisor's own grace
        # period is longer, and it signals the group after that.
        await server.stop(grace=1.0)


def _clear_name(path: str) -> None:
    """Whatever an earlier incarnation (or the plugin, before we bind) left at our
    socket's name goes, without following it: a dangling symlink there would
    otherwise make the bind fail, and a live one make gRPC's own clean-up look
    through it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(path)


def _fail_load(exc: Exception, plugin_dir: Path) -> NoReturn:
    """The plugin cannot load: the traceback to stderr (the sandbox log), the load
    error line in place of the handshake, and exit with LOAD_ERROR_EXIT, which the
    supervisor takes as final: retrying does not fix a deterministic load error
    (tests/test_load_errors.py)."""
    err = load_error(exc, plugin_dir)
    if isinstance(exc, PluginLoadFailed):
        say(f"clawsup host: the plugin could not load: {err.message}")
    else:
        say("clawsup host: the plugin could not load:\n" + "".join(traceback.format_exception(exc)))
    _announce(format_load_error(err))
    os._exit(LOAD_ERROR_EXIT)


def _fail_start(message: str) -> NoReturn:
    """The MCP server did not start (it exited, could not be reached, or did not
    finish initialize in time): the load error line with retry=True in place of the
    handshake. Unlike a plugin's load error this may pass, so the supervisor counts a
    crash and restarts with backoff."""
    say(f"clawsup host: {message}")
    _announce(format_load_error(LoadError(message=message, retry=True)))
    _end_descendants()
    os._exit(LOAD_ERROR_EXIT)


def _exit(code: int) -> NoReturn:
    """End the host now, and whatever still runs below it."""
    _end_descendants()
    _flush_plugin_streams()
    os._exit(code)


def say(text: str) -> None:
    """One diagnostic of the host's own, to the sandbox log. Never raises: whatever
    the plugin did to its stderr, the call or shutdown being described goes on."""
    _flush_plugin_streams()
    _write(_streams[2], text if text.endswith("\n") else text + "\n")


def _announce(line: str) -> None:
    """A protocol line on stdout (handshake or load error), after whatever the
    plugin printed before it."""
    _flush_plugin_streams()
    _write(_streams[1], line + "\n")


def _flush_plugin_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # closed (ValueError), its fd closed (OSError), None (AttributeError)
            pass


def _write(fd: int, text: str) -> None:
    data = text.encode("utf-8", errors="backslashreplace")
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


def _end_descendants() -> None:
    """SIGKILL everything below the host, on its way out (a polite shutdown): a
    process that left our group with setsid is still ours as a subreaper."""
    todo, seen = [os.getpid()], 0
    while todo and seen < 4096:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                seen += 1
                try:
                    os.kill(kid, signal.SIGKILL)  # unreaped, so the number is still that child
                except OSError:
                    pass
                todo.append(kid)


def _keep_streams() -> None:
    """Duplicate stdout and stderr for the host's own use before any plugin code
    runs. The copies are not inherited by anything the host starts."""
    for fd in (1, 2):
        try:
            _streams[fd] = os.dup(fd)
        except OSError:
            pass


def run(plugin_dir: str, socket_path: str, gate: GatePayload) -> None:
    _keep_streams()
    # Where no cgroup holds the sandbox, whatever the plugin starts and orphans,
    # setsid or not, stays below the host while it lives, so that its shutdown (or
    # the supervisor's kill, by pidfd) can end it; nothing else could find it. Not
    # otherwise: a subreaper's orphans stay zombies until it reaps them, and would
    # count against the cgroup's process limit. The workspace host is always one.
    if gate.subreaper or gate.role == "workspace":
        become_subreaper()
    try:
        asyncio.run(serve(Path(plugin_dir), socket_path, gate))
    except SystemExit:
        raise
    except BaseException:
        say(traceback.format_exc())
        _end_descendants()
        os._exit(3)
    _end_descendants()
    _flush_plugin_streams()
    # os._exit, not a normal exit: a sync handler stuck in a worker thread would
    # otherwise keep the interpreter alive at its thread-join on shutdown.
    os._exit(0)
