from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ToolSpec(_message.Message):
    __slots__ = ("name", "description", "input_schema_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("plugin_id", "plugin_version", "tools", "protocol", "offers")
    PLUGIN_ID_FIELD_NUMBER: _ClassVar[int]
    PLUGIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    plugin_id: str
    plugin_version: str
    tools: _containers.RepeatedCompositeFieldContainer[ToolSpec]
    protocol: str
    offers: _containers.RepeatedCompositeFieldContainer[Offer]
    def __init__(self, plugin_id: _Optional[str] = ..., plugin_version: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[ToolSpec, _Mapping]]] = ..., protocol: _Optional[str] = ..., offers: _Optional[_Iterable[_Union[Offer, _Mapping]]] = ...) -> None: ...

class Offer(_message.Message):
    __slots__ = ("kind", "name", "priority", "description", "accepts_args", "owner_only", "auth")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_ARGS_FIELD_NUMBER: _ClassVar[int]
    OWNER_ONLY_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    priority: int
    description: str
    accepts_args: bool
    owner_only: bool
    auth: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., priority: _Optional[int] = ..., description: _Optional[str] = ..., accepts_args: _Optional[bool] = ..., owner_only: _Optional[bool] = ..., auth: _Optional[str] = ...) -> None: ...

class OfferCall(_message.Message):
    __slots__ = ("kind", "name", "payload_json", "call_id", "timeout_ms")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    payload_json: str
    call_id: str
    timeout_ms: int
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., payload_json: _Optional[str] = ..., call_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class OfferAnswer(_message.Message):
    __slots__ = ("ok", "payload_json", "error", "error_kind")
    OK_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    payload_json: str
    error: str
    error_kind: str
    def __init__(self, ok: _Optional[bool] = ..., payload_json: _Optional[str] = ..., error: _Optional[str] = ..., error_kind: _Optional[str] = ...) -> None: ...

class InvokeToolRequest(_message.Message):
    __slots__ = ("name", "args_json", "call_id", "timeout_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    args_json: str
    call_id: str
    timeout_ms: int
    def __init__(self, name: _Optional[str] = ..., args_json: _Optional[str] = ..., call_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class InvokeToolResponse(_message.Message):
    __slots__ = ("result", "error", "result_is_json")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_IS_JSON_FIELD_NUMBER: _ClassVar[int]
    result: str
    error: ToolFailure
    result_is_json: bool
    def __init__(self, result: _Optional[str] = ..., error: _Optional[_Union[ToolFailure, _Mapping]] = ..., result_is_json: _Optional[bool] = ...) -> None: ...

class ToolFailure(_message.Message):
    __slots__ = ("kind", "message", "traceback")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[ToolFailure.Kind]
        HANDLER_RAISED: _ClassVar[ToolFailure.Kind]
        UNKNOWN_TOOL: _ClassVar[ToolFailure.Kind]
        BAD_ARGUMENTS: _ClassVar[ToolFailure.Kind]
        TIMED_OUT: _ClassVar[ToolFailure.Kind]
        BAD_RESULT: _ClassVar[ToolFailure.Kind]
        TOOL_ERROR: _ClassVar[ToolFailure.Kind]
    KIND_UNSPECIFIED: ToolFailure.Kind
    HANDLER_RAISED: ToolFailure.Kind
    UNKNOWN_TOOL: ToolFailure.Kind
    BAD_ARGUMENTS: ToolFailure.Kind
    TIMED_OUT: ToolFailure.Kind
    BAD_RESULT: ToolFailure.Kind
    TOOL_ERROR: ToolFailure.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    kind: ToolFailure.Kind
    message: str
    traceback: str
    def __init__(self, kind: _Optional[_Union[ToolFailure.Kind, str]] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ("command", "workdir", "timeout_ms", "output_cap", "call_id")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CAP_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    command: str
    workdir: str
    timeout_ms: int
    output_cap: int
    call_id: str
    def __init__(self, command: _Optional[str] = ..., workdir: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., output_cap: _Optional[int] = ..., call_id: _Optional[str] = ...) -> None: ...

class ExecEvent(_message.Message):
    __slots__ = ("output", "result", "host_token")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    HOST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    output: bytes
    result: ExecResult
    host_token: str
    def __init__(self, output: _Optional[bytes] = ..., result: _Optional[_Union[ExecResult, _Mapping]] = ..., host_token: _Optional[str] = ...) -> None: ...

class ExecResult(_message.Message):
    __slots__ = ("exit_code", "signal", "timed_out", "truncated", "duration_s", "output_bytes", "error")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    signal: int
    timed_out: bool
    truncated: bool
    duration_s: float
    output_bytes: int
    error: str
    def __init__(self, exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., timed_out: _Optional[bool] = ..., truncated: _Optional[bool] = ..., duration_s: _Optional[float] = ..., output_bytes: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class RunAgentRequest(_message.Message):
    __slots__ = ("run_id", "task", "max_iterations")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    task: str
    max_iterations: int
    def __init__(self, run_id: _Optional[str] = ..., task: _Optional[str] = ..., max_iterations: _Optional[int] = ...) -> None: ...

class RunAgentResponse(_message.Message):
    __slots__ = ("text", "model_calls", "error")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    text: str
    model_calls: int
    error: str
    def __init__(self, text: _Optional[str] = ..., model_calls: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("reason", "service_stop_ms")
    REASON_FIELD_NUMBER: _ClassVar[int]
    SERVICE_STOP_MS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    service_stop_ms: int
    def __init__(self, reason: _Optional[str] = ..., service_stop_ms: _Optional[int] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HostMessage(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: HostRequest
    def __init__(self, request: _Optional[_Union[HostRequest, _Mapping]] = ...) -> None: ...

class HostRequest(_message.Message):
    __slots__ = ("id", "method", "payload_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    id: int
    method: str
    payload_json: str
    def __init__(self, id: _Optional[int] = ..., method: _Optional[str] = ..., payload_json: _Optional[str] = ...) -> None: ...

class SupervisorMessage(_message.Message):
    __slots__ = ("reply",)
    REPLY_FIELD_NUMBER: _ClassVar[int]
    reply: SupervisorReply
    def __init__(self, reply: _Optional[_Union[SupervisorReply, _Mapping]] = ...) -> None: ...

class SupervisorReply(_message.Message):
    __slots__ = ("id", "ok", "payload_json", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    ok: bool
    payload_json: str
    error: str
    def __init__(self, id: _Optional[int] = ..., ok: _Optional[bool] = ..., payload_json: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...
