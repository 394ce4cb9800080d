"""One small tree of errors. Each `str()` is a sentence an operator can act on, and
the model sees the same sentence as a tool result with `is_error` set.

Each class has a stable `code`, which the control API and the http channel send
beside the sentence (`{"code": ..., "message": ...}`); `ErrorCode` lists them all,
including those of errors defined beside the code that raises them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from clawsup.sandbox.launch.launcher import ExitStatus
from clawsup.supervisor.names import owner_label

ErrorCode = Literal[
    "error", "config", "registration_refused", "tool_not_found", "tool_failed", "tool_timeout", "bad_arguments",
    "sandbox_died", "sandbox_unavailable", "unknown_sandbox", "exec_blocked",
    "offer_failed", "blocked_by_hook",  # supervisor/sandboxes/offers.py, supervisor/hooks
    "busy", "session_busy", "gateway_busy",  # supervisor/messages/bus.py
    "spawn_refused",  # supervisor/agents/spawn_tools.py
    "cron",  # supervisor/automation
    "provider_error",  # supervisor/agents/providers
    "already_running",  # supervisor/control/gateway.py
    "unsafe_state_path",  # supervisor/paths.py
    "uid_registry",  # sandbox/launch/uids.py
]  # fmt: skip


class ClawsupError(Exception):
    """Base of every error clawsup raises on purpose."""

    code: ClassVar[ErrorCode] = "error"


class ConfigError(ClawsupError):
    """The operator's config is wrong. Names the key path."""

    code = "config"

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class RegistrationRefused(ClawsupError):
    """A registration the supervisor will not accept. For the plugin's author."""

    code = "registration_refused"

    def __init__(self, owner: str, name: str, reason: str) -> None:
        self.owner = owner
        self.name = name
        self.reason = reason
        super().__init__(f"{owner_label(owner)} may not register tool {name!r}: {reason}")


class ToolNotFound(ClawsupError):
    code = "tool_not_found"

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        hint = f"; available tools: {', '.join(sorted(known))}" if known else "; no tools are registered"
        super().__init__(f"no tool named {name!r} is registered{hint}")


HostFailureKind = Literal[
    "kind_unspecified", "handler_raised", "unknown_tool", "bad_arguments", "timed_out", "bad_result", "tool_error", "unknown"
]
"""How a host says a tool call failed: the names of host.proto's ToolFailure.Kind,
lower case, and `unknown` for a number this supervisor does not know."""
FailureKind = (
    HostFailureKind
    | Literal["transport", "protocol", "auth", "too_large"]
    | Literal["invalid_arguments", "invalid_schema", "schema_too_costly", "not_routable"]
)
"""Why a tool call failed with the sandbox fine: the host said so; the call's
transport broke or the host's answer broke the protocol (host_client.HostMisbehaved);
or the supervisor refused it before dispatch."""


class ToolFailed(ClawsupError):
    """The tool ran and reported an error (its handler raised, or its arguments were
    refused). The sandbox is fine."""

    code: ClassVar[ErrorCode] = "tool_failed"

    def __init__(self, tool: str, owner: str, kind: FailureKind, message: str) -> None:
        self.tool = tool
        self.owner = owner
        self.kind = kind
        self.message = message
        if kind == "tool_error":
            # An expected failure (clawsup.sandbox.api.ToolError) speaks for itself.
            text = f"tool {tool!r}: {message}"
        elif kind == "invalid_arguments":
            text = f"bad arguments for tool {tool!r}: {message}"
        else:
            text = f"tool {tool!r} ({owner_label(owner)}) failed: {message}"
        super().__init__(text)


class ToolTimeout(ClawsupError):
    code = "tool_timeout"

    def __init__(self, tool: str, owner: str, sandbox_id: str, limit_s: float, consequence: str = "") -> None:
        self.tool = tool
        self.owner = owner
        self.sandbox_id = sandbox_id
        self.limit_s = limit_s
        tail = f"; {consequence}" if consequence else ""
        super().__init__(f"tool {tool!r} ({owner_label(owner)}, sandbox {sandbox_id}) did not answer within its {limit_s:g} s timeout{tail}")


class SandboxDied(ClawsupError):
    """The child serving a call died. Carries what an operator needs to act."""

    code = "sandbox_died"

    def __init__(self, *, sandbox_id: str, plugin: str, status: ExitStatus, restarts_left: int | None, stderr_tail: list[str]) -> None:
        self.sandbox_id = sandbox_id
        self.plugin = plugin
        self.status = status
        self.restarts_left = restarts_left
        self.stderr_tail = stderr_tail
        if restarts_left is None:
            nxt = ""
        elif restarts_left > 0:
            nxt = f"; {restarts_left} restart{'s' if restarts_left != 1 else ''} left"
        else:
            nxt = f"; no restarts left, it stays failed until `clawsup restart {sandbox_id}`"
        super().__init__(f"{owner_label(plugin)} (sandbox {sandbox_id}) {status.describe()}{nxt}; see `clawsup logs {sandbox_id}`")


class OfferFailed(ClawsupError):
    """A plugin's offer beyond tools (a hook, a command, a channel's delivery, an
    HTTP route) did not answer: it raised, overran its deadline, its sandbox is down
    or died during the call. `how` says which, for whoever decides what follows (a
    gate refuses the call it guards)."""

    code = "offer_failed"

    def __init__(self, kind: str, name: str, plugin: str, how: str, message: str) -> None:
        self.kind = kind
        self.name = name
        self.plugin = plugin
        self.how = how
        self.message = message
        super().__init__(f"{kind.replace('_', ' ')} {name!r} of {owner_label(plugin)} {message}")


class SandboxUnavailable(ClawsupError):
    """The sandbox exists but cannot take calls right now (starting, backoff, failed)."""

    code = "sandbox_unavailable"

    def __init__(self, sandbox_id: str, plugin: str, state: str, detail: str = "") -> None:
        self.sandbox_id = sandbox_id
        self.plugin = plugin
        self.state = state
        extra = f": {detail}" if detail else ""
        hint = {
            "failed": f"; it crashed too often, fix the cause (`clawsup logs {sandbox_id}`) and run `clawsup restart {sandbox_id}`",
            "backoff": "; it restarts by itself shortly",
        }.get(state, "")
        super().__init__(f"{owner_label(plugin)} (sandbox {sandbox_id}) is {state} and cannot take calls{extra}{hint}")


class UnknownSandbox(ClawsupError):
    code = "unknown_sandbox"

    def __init__(self, sandbox_id: str, known: list[str]) -> None:
        self.sandbox_id = sandbox_id
        super().__init__(f"no sandbox named {sandbox_id!r}; known: {', '.join(sorted(known)) or 'none'}")


class ExecBlocked(ClawsupError):
    """The exec screen refused a command before it was dispatched. Nothing ran."""

    code = "exec_blocked"

    def __init__(self, rule: str, segment: str, text: str) -> None:
        self.rule = rule
        self.segment = segment
        super().__init__(f"command not run: {text}")


class BadToolArguments(ToolFailed):
    """The arguments do not fit the tool's input schema (supervisor/tools/arguments.py) or
    a core tool's own rule; says what was wrong, by path and rule. Nothing ran: the
    handler was never called. The model gets it as a tool error; `clawsup tools
    call` exits 1."""

    code = "bad_arguments"

    def __init__(self, tool: str, problems: str, *, owner: str = "core") -> None:
        self.problems = problems
        super().__init__(tool, owner, "invalid_arguments", problems)
