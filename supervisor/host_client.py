"""The supervisor's gRPC client for one sandbox host (one incarnation).

Protobuf types stop here: callers get dataclasses. Every call carries a deadline and
the supervisor's token, and every answer must carry the host's token
(see proto/clawsup/v1/host.proto for why there are two).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clawsup.v1 import host_pb2 as pb
from clawsup.v1 import host_pb2_grpc as pb_grpc
from sandbox.handshake import HOST_TOKEN_METADATA_KEY, TOKEN_METADATA_KEY

_KIND_NAMES = {v: k.lower() for k, v in pb.ToolFailure.Kind.items()}


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


class HostAuthError(Exception):
    """The answer did not carry the host's token: whatever answered is not our child."""


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
                ("grpc.max_receive_message_length", 32 * 1024 * 1024),
            ],
        )
        self._stub = pb_grpc.HostStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._md = ((TOKEN_METADATA_KEY, supervisor_token),)
        self._host_token = host_token

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
        resp = await call
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
        resp = await call
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

    async def exec_events(self, call: Any) -> AsyncIterator[bytes | ExecResult]:
        """The output chunks, then the result; nothing before the host's token, which
        rides in the first event (see host.proto)."""
        first = True
        async for ev in call:
            if first:
                if ev.host_token != self._host_token:
                    raise HostAuthError("the host's answer lacks its token; refusing it")
                first = False
            if ev.WhichOneof("event") == "output":
                yield ev.output
            else:
                r = ev.result
                yield ExecResult(
                    exit_code=r.exit_code if r.HasField("exit_code") else None,
                    signal=r.signal if r.HasField("signal") else None,
                    timed_out=r.timed_out,
                    truncated=r.truncated,
                    duration_s=r.duration_s,
                    output_bytes=r.output_bytes,
                    error=r.error,
                )

    def run_agent(self, run_id: str, task: str, max_iterations: int, timeout: float) -> Any:
        req = pb.RunAgentRequest(run_id=run_id, task=task, max_iterations=max_iterations)
        return self._stub.RunAgent(req, timeout=timeout, metadata=self._md)

    async def run_outcome(self, call: Any) -> tuple[str, str]:
        resp = await call
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
