"""The supervisor's gRPC client for one sandbox host (one incarnation).

gRPC and protobuf stop here: callers get dataclasses and the typed errors below
(`HostUnreachable`, `CallAborted`, `HostMisbehaved` and its kinds), never a gRPC call
object or status code. Every call carries a deadline and
the supervisor's token, and every answer must carry the host's token
(see proto/clawsup/v1/host.proto for why there are two).

Whatever a host sends is bounded here, on the supervisor's side, because a host runs
the model's commands and a plugin's code under the same uid and may have been taken
over by either: no message may pass `MAX_MESSAGE_BYTES` (a bigger one is refused as
`AnswerTooLarge`), and an exec stream holds the configured output cap whatever the
host does with it (`exec_output_bound`). Tests: tests/test_hostile_output.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, Protocol, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clawsup.v1 import host_pb2 as pb
from clawsup.v1 import host_pb2_grpc as pb_grpc
from clawsup.sandbox.exec_result import ExecResult
from clawsup.sandbox.output_cap import HeadTail
from clawsup.sandbox.handshake import HOST_TOKEN_METADATA_KEY, TOKEN_METADATA_KEY
from clawsup.supervisor.errors import HostFailureKind
from clawsup.supervisor.sandboxes.registry import OfferSpec
from clawsup.supervisor.tools.spec import ToolSpec

ToolFailureKind = HostFailureKind

_KIND_NAMES: dict[int, ToolFailureKind] = {
    pb.ToolFailure.KIND_UNSPECIFIED: "kind_unspecified",
    pb.ToolFailure.HANDLER_RAISED: "handler_raised",
    pb.ToolFailure.UNKNOWN_TOOL: "unknown_tool",
    pb.ToolFailure.BAD_ARGUMENTS: "bad_arguments",
    pb.ToolFailure.TIMED_OUT: "timed_out",
    pb.ToolFailure.BAD_RESULT: "bad_result",
    pb.ToolFailure.TOOL_ERROR: "tool_error",
}

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest message the supervisor takes from a host: a tool result, a Describe
answer, one exec chunk, one request on the child's stream. 4 MiB is a million tokens
or so, far past what a model can use; a Describe answer holds a plugin's tools, each
within supervisor/sandboxes/registry.py's caps. A flood of messages this size costs the
supervisor some ten of them at once in gRPC's and Python's buffers
(tests/test_hostile_output.py measures it under 64 MiB)."""

MARKER_ALLOWANCE = 128
"""Room for the host's own omission marker in the tail (sandbox/host/exec_runner.py
output_cap writes about 50 bytes), so that an honest host's output passes as sent."""


Metadata = Mapping[str, str | bytes]


class _Call(Protocol):
    """What this client does with any of grpc.aio's call objects (grpc ships no types)."""

    def cancel(self) -> bool: ...

    def done(self) -> bool: ...


class _UnaryCall(_Call, Protocol):
    def trailing_metadata(self) -> Awaitable[Metadata | None]: ...


class _ConnectCall(_Call, Protocol):
    """The Connect stream: HostMessages in, SupervisorMessages out."""

    def initial_metadata(self) -> Awaitable[Metadata | None]: ...

    def read(self) -> Awaitable[object]:
        """The next HostMessage, or grpc.aio.EOF."""
        ...

    def write(self, message: pb.SupervisorMessage) -> Awaitable[None]: ...


_C = TypeVar("_C", bound=_Call)


@dataclass(frozen=True, kw_only=True)
class UnreadableTool:
    """A described tool that cannot be registered as sent: its schema is not a JSON
    object the supervisor can read. Never read as "accepts anything"."""

    name: str
    problem: str


@dataclass(frozen=True, kw_only=True)
class Description:
    plugin_id: str
    plugin_version: str
    protocol: str
    tools: tuple[ToolSpec | UnreadableTool, ...]
    offers: tuple[OfferSpec, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OfferOutcome:
    ok: bool
    payload_json: str = "null"
    error: str = ""
    error_kind: str = ""


@dataclass(slots=True, kw_only=True)
class ToolOutcome:
    ok: bool
    text: str
    """The result (a str, or JSON text when `is_json`), or the error message."""
    is_json: bool = False
    error_kind: ToolFailureKind | Literal[""] = ""
    """How it failed; empty when `ok`."""
    traceback: str = ""


def _exec_result(m: pb.ExecResult) -> ExecResult:
    """The one way an exec result comes off the wire (sent by sandbox/host/server.py
    `_exec_message`)."""
    return ExecResult(
        exit_code=m.exit_code if m.HasField("exit_code") else None,
        signal=m.signal if m.HasField("signal") else None,
        timed_out=m.timed_out,
        truncated=m.truncated,
        duration_s=m.duration_s,
        output_bytes=m.output_bytes,
        error=m.error,
    )


class HostUnreachable(Exception):
    """The host did not answer: the transport failed or the deadline passed. Usually the
    child has just died (the supervisor's exit watcher will say how)."""

    def __init__(self, status: str, details: str) -> None:
        self.status = status
        """gRPC's status name, for the log: UNAVAILABLE, DEADLINE_EXCEEDED..."""
        self.details = details
        super().__init__(f"{status}: {details}")

    @property
    def deadline(self) -> bool:
        return self.status == "DEADLINE_EXCEEDED"


class CallAborted(Exception):
    """The supervisor ended this call itself (`HostClient.abort_all`), because the child
    died: the caller should report the death, not this."""


class HostMisbehaved(Exception):
    """The host's answer breaks the protocol; `kind` names how, for `ToolFailed`."""

    kind: ClassVar[Literal["protocol", "auth", "too_large"]] = "protocol"


class HostAuthError(HostMisbehaved):
    """The answer did not carry the host's token: whatever answered is not our child."""

    kind = "auth"


class AnswerTooLarge(HostMisbehaved):
    """A message from the host passed `MAX_MESSAGE_BYTES`; it was refused unread."""

    kind = "too_large"

    def __init__(self, what: str, size: int | None) -> None:
        self.what = what
        self.size = size
        sent = f" sent {size} bytes as" if size is not None else " sent"
        super().__init__(
            f"the sandbox{sent} {what}, more than the {MAX_MESSAGE_BYTES // 2**20} MiB the supervisor takes in one message; "
            "it was refused. A tool should return less and leave bulk data in a file of its workspace"
        )


_TOO_LARGE = re.compile(r"larger than max \((\d+) vs")


def _typed(e: grpc.aio.AioRpcError, what: str) -> Exception:
    """A gRPC failure as one of ours: an oversized message refused says so, anything
    else is a host that did not answer."""
    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and (m := _TOO_LARGE.search(e.details() or "")) is not None:
        return AnswerTooLarge(what, int(m.group(1)))
    return HostUnreachable(e.code().name, e.details() or "")


def exec_output_bound(cap: int) -> HeadTail:
    """The exec output cap, held again on the supervisor's side (sandbox/output_cap.py).
    An honest host already keeps at most `cap` bytes; a hijacked one may send
    anything, and a flood must cost the supervisor no more than the cap. The ring has
    room for the host's own marker, so an honest host's output passes unchanged.
    One per exec stream, owned by `HostClient.exec_events`."""
    return HeadTail(
        cap,
        tail_extra=MARKER_ALLOWANCE,
        marker=lambda n: f"\n[... {n} bytes omitted by the supervisor: the sandbox sent more than the {max(cap, 2)} byte cap ...]\n",
    )


@dataclass(frozen=True, kw_only=True)
class ChildRequest:
    """One request a child sends on its stream (see supervisor/sandboxes/child_requests.py)."""

    id: int
    """0: fire and forget, no reply."""
    method: str
    payload_json: str


@dataclass(frozen=True, kw_only=True)
class ChildReply:
    id: int
    ok: bool
    payload_json: str = ""
    error: str = ""


class ChildStream:
    """The child's long-lived request stream (Connect): the requests it sends, and our
    replies. Errors come out typed, like the client's."""

    def __init__(self, call: _ConnectCall, host_token: str) -> None:
        self._call = call
        self._host_token = host_token
        self._writing = asyncio.Lock()  # one write at a time on a gRPC stream

    async def open(self) -> None:
        try:
            md = await self._call.initial_metadata()
        except grpc.aio.AioRpcError as e:
            raise _typed(e, "its stream") from None
        if md is None or md.get(HOST_TOKEN_METADATA_KEY) != self._host_token:
            raise HostAuthError("the host's answer lacks its token; refusing it")

    async def requests(self) -> AsyncIterator[ChildRequest]:
        """Each request the child sends, until it closes the stream."""
        try:
            while isinstance(msg := await self._call.read(), pb.HostMessage):
                if msg.HasField("request"):
                    r = msg.request
                    yield ChildRequest(id=r.id, method=r.method, payload_json=r.payload_json)
        except grpc.aio.AioRpcError as e:
            raise _typed(e, "a request on its stream") from None

    async def reply(self, reply: ChildReply) -> None:
        """Sends one reply; a stream already gone (the child died) is not an error
        here: the exit watcher reports the death."""
        message = pb.SupervisorMessage(reply=pb.SupervisorReply(id=reply.id, ok=reply.ok, payload_json=reply.payload_json, error=reply.error))
        async with self._writing:
            with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
                await self._call.write(message)

    def close(self) -> None:
        self._call.cancel()


class HostClient:
    """Created when a child's handshake arrives; closed when that child dies. Every
    call it has in flight is tracked, so that the child's death ends them all at once
    (`abort_all`) rather than at their deadlines."""

    def __init__(self, socket_path: str, supervisor_token: str, host_token: str) -> None:
        self.channel = grpc.aio.insecure_channel(
            f"unix:{socket_path}",
            options=[
                # We dial only after the handshake; if the child is gone by then, fail
                # fast rather than sit in gRPC's default 1 s reconnect backoff.
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 500),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # Every host is dialled as /proc/self/fd/N, and N is reused: the next
                # incarnation's socket often gets the number of the last one's. From
                # gRPC's global pool a new channel was then handed the dead one's
                # subchannel, which kept failing with ENOENT, and every bring-up after
                # a crash failed until the supervisor restarted (CI, the forger's
                # crash test). A pool per channel shares nothing.
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )
        self._stub = pb_grpc.HostStub(self.channel)  # type: ignore[no-untyped-call]  # generated without stubs
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._md = ((TOKEN_METADATA_KEY, supervisor_token),)
        self._host_token = host_token
        self._inflight: set[_Call] = set()
        self._aborted = False

    @contextlib.contextmanager
    def _tracked(self, call: _C, what: str) -> Iterator[_C]:
        """One call: tracked while it runs, cancelled if its caller leaves early, and
        its failure turned into our errors. A call cancelled by `abort_all` raises
        CallAborted; the caller's own cancellation stays a cancellation."""
        self._admit(call)
        try:
            yield call
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._aborted and (task is None or not task.cancelling()):
                raise CallAborted() from None
            raise
        except grpc.aio.AioRpcError as e:
            if self._aborted and e.code() == grpc.StatusCode.CANCELLED:
                raise CallAborted() from None
            raise _typed(e, what) from None
        finally:
            self._inflight.discard(call)
            if not call.done():
                call.cancel()

    def _admit(self, call: _Call) -> None:
        if self._aborted:
            call.cancel()
            raise CallAborted()
        self._inflight.add(call)

    def abort_all(self) -> None:
        """The child is dead: every call in flight, and any started later, ends with
        CallAborted."""
        self._aborted = True
        for call in tuple(self._inflight):
            call.cancel()

    async def _check_host(self, call: _UnaryCall) -> None:
        """Unary answers carry the host token in trailing metadata (see
        sandbox/host/server.py)."""
        md = await call.trailing_metadata()
        if md is None or md.get(HOST_TOKEN_METADATA_KEY) != self._host_token:
            raise HostAuthError("the host's answer lacks its token; refusing it")

    async def health(self, timeout: float) -> bool:
        """True when the host says SERVING. Raises HostUnreachable when it does not
        answer within `timeout`."""
        with self._tracked(self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout, metadata=self._md), "its health answer") as call:
            resp = await call
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def describe(self, timeout: float) -> Description:
        with self._tracked(self._stub.Describe(pb.DescribeRequest(), timeout=timeout, metadata=self._md), "its Describe answer") as call:
            resp = await call
            await self._check_host(call)
        tools: list[ToolSpec | UnreadableTool] = []
        for t in resp.tools:
            try:
                parsed = json.loads(t.input_schema_json) if t.input_schema_json else {}
            except (json.JSONDecodeError, RecursionError) as e:
                tools.append(UnreadableTool(name=t.name, problem=f"its input schema is not JSON the supervisor can read ({type(e).__name__})"))
                continue
            if not isinstance(parsed, dict):
                tools.append(UnreadableTool(name=t.name, problem=f"its input schema is a JSON {type(parsed).__name__}, not an object"))
                continue
            tools.append(ToolSpec(name=t.name, description=t.description, input_schema=parsed))
        offers = tuple(
            OfferSpec(kind=o.kind, name=o.name, priority=o.priority, description=o.description, accepts_args=o.accepts_args, owner_only=o.owner_only, auth=o.auth)
            for o in resp.offers
        )
        return Description(plugin_id=resp.plugin_id, plugin_version=resp.plugin_version, protocol=resp.protocol, tools=tuple(tools), offers=offers)

    async def call_offer(self, kind: str, name: str, payload_json: str, call_id: str, timeout: float, margin: float) -> OfferOutcome:
        """One call of an offer beyond tools (a hook, a command, a channel's send, an
        HTTP request, a service's start). The host gets `timeout`; the gRPC deadline
        adds `margin` for its answer."""
        req = pb.OfferCall(kind=kind, name=name, payload_json=payload_json, call_id=call_id, timeout_ms=max(int(timeout * 1000), 1))
        with self._tracked(self._stub.CallOffer(req, timeout=timeout + margin, metadata=self._md), f"a {kind}'s answer") as call:
            resp = await call
            await self._check_host(call)
        return OfferOutcome(ok=resp.ok, payload_json=resp.payload_json or "null", error=resp.error, error_kind=resp.error_kind)

    async def invoke(self, name: str, args_json: str, call_id: str, timeout: float, margin: float) -> ToolOutcome:
        """One tool call. The host gets `timeout` and answers TIMED_OUT itself; the
        gRPC deadline adds `margin` for that answer."""
        req = pb.InvokeToolRequest(name=name, args_json=args_json, call_id=call_id, timeout_ms=max(int(timeout * 1000), 1))
        with self._tracked(self._stub.InvokeTool(req, timeout=timeout + margin, metadata=self._md), "a tool's answer") as call:
            resp = await call
            await self._check_host(call)
        if resp.WhichOneof("outcome") == "error":
            e = resp.error
            return ToolOutcome(ok=False, text=e.message, error_kind=_KIND_NAMES.get(e.kind, "unknown"), traceback=e.traceback)
        return ToolOutcome(ok=True, text=resp.result, is_json=resp.result_is_json)

    async def exec(self, command: str, workdir: str, timeout: float, output_cap: int, call_id: str, margin: float) -> AsyncIterator[bytes | ExecResult]:
        """One Exec stream: the output chunks, then the result; nothing before the
        host's token, which rides in the first event (see host.proto). The host
        enforces `timeout`; the gRPC deadline adds `margin` for the kill grace and the
        last output. At most `output_cap` bytes of output come out, plus a marker,
        whatever the host sends (`exec_output_bound`); anything after the result is
        read and dropped, so that the stream ends cleanly."""
        req = pb.ExecRequest(
            command=command, workdir=workdir, timeout_ms=max(int(timeout * 1000), 1), output_cap=output_cap, call_id=call_id
        )
        bound = exec_output_bound(output_cap)
        first = True
        done = False
        with self._tracked(self._stub.Exec(req, timeout=timeout + margin, metadata=self._md), "a chunk of exec output") as call:
            async for ev in call:
                if first:
                    if ev.host_token != self._host_token:
                        raise HostAuthError("the host's answer lacks its token; refusing it")
                    first = False
                if done:
                    continue
                if ev.WhichOneof("event") == "output":
                    if now := bound.feed(ev.output):
                        yield now
                    continue
                done = True
                if tail := bound.finish():
                    yield tail
                r = _exec_result(ev.result)
                # What the host says it sent, unless it sent more (the bound above).
                yield replace(r, truncated=r.truncated or bound.dropped > 0, output_bytes=max(r.output_bytes, bound.total))

    async def run_agent(self, run_id: str, task: str, max_iterations: int, timeout: float) -> tuple[str, str]:
        """A subagent's loop, run by the host: (result text, error)."""
        req = pb.RunAgentRequest(run_id=run_id, task=task, max_iterations=max_iterations)
        with self._tracked(self._stub.RunAgent(req, timeout=timeout, metadata=self._md), "a subagent run's answer") as call:
            resp = await call
            await self._check_host(call)
        return resp.text, resp.error

    async def shutdown(self, reason: str, timeout: float, service_stop: float = 0.0) -> None:
        """`service_stop`: how long the plugin's services' `stop` may take (0: the
        host's default)."""
        req = pb.ShutdownRequest(reason=reason, service_stop_ms=int(service_stop * 1000))
        with self._tracked(self._stub.Shutdown(req, timeout=timeout, metadata=self._md), "its Shutdown answer") as call:
            await call
            await self._check_host(call)

    async def connect(self) -> ChildStream:
        """Opens the child's long-lived stream. No deadline: it lives as long as the
        child, and ends when either side closes."""
        stream = ChildStream(self._stub.Connect(metadata=self._md), self._host_token)
        await stream.open()
        return stream

    async def close(self) -> None:
        await self.channel.close(grace=None)
