"""The supervisor's gRPC client for one sandbox host (one incarnation).

Protobuf types stop here: callers get dataclasses. Every call carries a deadline and
the supervisor's token, and every answer must carry the host's token
(see proto/clawsup/v1/host.proto for why there are two).

Whatever a host sends is bounded here, on the supervisor's side, because a host runs
the model's commands and a plugin's code under the same uid and may have been taken
over by either: no message may pass `MAX_MESSAGE_BYTES` (a bigger one is refused as
`AnswerTooLarge`), and an exec stream holds the configured output cap whatever the
host does with it (`exec_output_bound`). Tests: tests/test_hostile_output.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clawsup.v1 import host_pb2 as pb
from clawsup.v1 import host_pb2_grpc as pb_grpc
from sandbox.output_cap import HeadTail
from sandbox.handshake import HOST_TOKEN_METADATA_KEY, TOKEN_METADATA_KEY

_KIND_NAMES = {v: k.lower() for k, v in pb.ToolFailure.Kind.items()}

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest message the supervisor takes from a host: a tool result, a Describe
answer, one exec chunk, one request on the child's stream. 4 MiB is a million tokens
or so, far past what a model can use; a Describe answer holds a plugin's tools, each
within supervisor/registry.py's caps. A flood of messages this size costs the
supervisor some ten of them at once in gRPC's and Python's buffers
(tests/test_hostile_output.py measures it under 64 MiB)."""

MARKER_ALLOWANCE = 128
"""Room for the host's own omission marker in the tail (sandbox/host/exec_runner.py
output_cap writes about 50 bytes), so that an honest host's output passes as sent."""


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Description:
    plugin_id: str
    plugin_version: str
    protocol: str
    tools: tuple[ToolSpec, ...]


@dataclass(slots=True, kw_only=True)
class ToolOutcome:
    ok: bool
    text: str
    """The result (a str, or JSON text when `is_json`), or the error message."""
    is_json: bool = False
    error_kind: str = ""
    traceback: str = ""


@dataclass(slots=True, kw_only=True)
class ExecResult:
    exit_code: int | None
    signal: int | None
    timed_out: bool
    truncated: bool
    duration_s: float
    output_bytes: int
    error: str = ""


class HostMisbehaved(Exception):
    """The host's answer breaks the protocol; `kind` names how, for `ToolFailed`."""

    kind = "protocol"


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


def _too_large(e: grpc.aio.AioRpcError, what: str) -> AnswerTooLarge | None:
    """gRPC's refusal of an oversized message, as an error that says so; None for
    any other failure."""
    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    m = _TOO_LARGE.search(e.details() or "")
    return AnswerTooLarge(what, int(m.group(1)) if m else None)


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


class HostClient:
    """Created when a child's handshake arrives; closed when that child dies."""

    def __init__(self, socket_path: str, supervisor_token: str, host_token: str) -> None:
        self.channel = grpc.aio.insecure_channel(
            f"unix:{socket_path}",
            options=[
                # We dial only after the handshake; if the child is gone by then, fail
                # fast rather than sit in gRPC's default 1 s reconnect backoff.
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 500),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = pb_grpc.HostStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._md = ((TOKEN_METADATA_KEY, supervisor_token),)
        self._host_token = host_token

    @staticmethod
    async def _answer(call: Any, what: str) -> Any:
        try:
            return await call
        except grpc.aio.AioRpcError as e:
            if (big := _too_large(e, what)) is not None:
                raise big from None
            raise

    async def _check_host(self, call: Any, *, trailing: bool = True) -> None:
        """Unary answers carry the host token in trailing metadata, the stream in its
        initial metadata (see sandbox/host/server.py)."""
        md = await (call.trailing_metadata() if trailing else call.initial_metadata())
        if md is None or md.get(HOST_TOKEN_METADATA_KEY) != self._host_token:
            raise HostAuthError("the host's answer lacks its token; refusing it")

    async def health(self, timeout: float) -> bool:
        """True when the host says SERVING. Raises grpc.aio.AioRpcError when it does
        not answer within `timeout`."""
        resp = await self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout, metadata=self._md)
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    async def describe(self, timeout: float) -> Description:
        call = self._stub.Describe(pb.DescribeRequest(), timeout=timeout, metadata=self._md)
        resp = await self._answer(call, "its Describe answer")
        await self._check_host(call)
        tools = []
        for t in resp.tools:
            try:
                schema = json.loads(t.input_schema_json) if t.input_schema_json else {}
            except json.JSONDecodeError:
                schema = {}
            tools.append(ToolSpec(name=t.name, description=t.description, input_schema=schema))
        return Description(plugin_id=resp.plugin_id, plugin_version=resp.plugin_version, protocol=resp.protocol, tools=tuple(tools))

    def invoke(self, name: str, args_json: str, call_id: str, timeout: float, margin: float) -> Any:
        """Starts the call and returns the grpc.aio call object, so that the caller
        can track it and cancel it if the child dies. The host gets `timeout` and
        answers TIMED_OUT itself; the gRPC deadline adds `margin` for that answer."""
        req = pb.InvokeToolRequest(name=name, args_json=args_json, call_id=call_id, timeout_ms=max(int(timeout * 1000), 1))
        return self._stub.InvokeTool(req, timeout=timeout + margin, metadata=self._md)

    async def outcome(self, call: Any) -> ToolOutcome:
        resp = await self._answer(call, "a tool's answer")
        await self._check_host(call)
        if resp.WhichOneof("outcome") == "error":
            e = resp.error
            return ToolOutcome(ok=False, text=e.message, error_kind=_KIND_NAMES.get(e.kind, "unknown"), traceback=e.traceback)
        return ToolOutcome(ok=True, text=resp.result, is_json=resp.result_is_json)

    def exec(self, command: str, workdir: str, timeout: float, output_cap: int, call_id: str, margin: float) -> Any:
        """Starts an Exec stream and returns the call (read it with `exec_events`).
        The host enforces `timeout`; the gRPC deadline adds `margin` for the kill
        grace and the last output."""
        req = pb.ExecRequest(
            command=command, workdir=workdir, timeout_ms=max(int(timeout * 1000), 1), output_cap=output_cap, call_id=call_id
        )
        return self._stub.Exec(req, timeout=timeout + margin, metadata=self._md)

    async def exec_events(self, call: Any, output_cap: int) -> AsyncIterator[bytes | ExecResult]:
        """The output chunks, then the result; nothing before the host's token, which
        rides in the first event (see host.proto). At most `output_cap` bytes of
        output come out, plus a marker, whatever the host sends (`exec_output_bound`);
        anything after the result is read and dropped, so that the stream ends
        cleanly."""
        bound = exec_output_bound(output_cap)
        first = True
        done = False
        try:
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
                r = ev.result
                yield ExecResult(
                    exit_code=r.exit_code if r.HasField("exit_code") else None,
                    signal=r.signal if r.HasField("signal") else None,
                    timed_out=r.timed_out,
                    truncated=r.truncated or bound.dropped > 0,
                    duration_s=r.duration_s,
                    output_bytes=max(r.output_bytes, bound.total),
                    error=r.error,
                )
        except grpc.aio.AioRpcError as e:
            if (big := _too_large(e, "a chunk of exec output")) is not None:
                raise big from None
            raise

    def run_agent(self, run_id: str, task: str, max_iterations: int, timeout: float) -> Any:
        req = pb.RunAgentRequest(run_id=run_id, task=task, max_iterations=max_iterations)
        return self._stub.RunAgent(req, timeout=timeout, metadata=self._md)

    async def run_outcome(self, call: Any) -> tuple[str, str]:
        resp = await self._answer(call, "a subagent run's answer")
        await self._check_host(call)
        return resp.text, resp.error

    async def shutdown(self, reason: str, timeout: float) -> None:
        call = self._stub.Shutdown(pb.ShutdownRequest(reason=reason), timeout=timeout, metadata=self._md)
        await call
        await self._check_host(call)

    def connect(self) -> Any:
        """Opens the child's long-lived stream; the caller reads requests and writes
        replies on the returned call. No deadline: it lives as long as the child,
        and ends when either side closes."""
        return self._stub.Connect(metadata=self._md)

    async def check_stream(self, call: Any) -> None:
        await self._check_host(call, trailing=False)

    async def close(self) -> None:
        await self.channel.close(grace=None)
