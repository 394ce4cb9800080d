"""The two tools a turn uses to hand work to subagent runs, as the model sees them:
`sessions_spawn` (OpenClaw's input) and `subagents` (list or kill your runs). Their
schemas, their registration as core tools, the check of what the model wrote, and
the port through which the agent loop and a run's services call them (`SpawnTools`,
served by `Subagents`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.agents.tool_policy import CORE_GROUPS
from clawsup.supervisor.errors import BadToolArguments, ClawsupError
from clawsup.supervisor.sandboxes.registry import CORE_OWNER, Kind, Registration, Registry

if TYPE_CHECKING:
    from clawsup.supervisor.agents.runs import Origin

SPAWN_TOOLS = ("sessions_spawn", "subagents")
# What a run never gets from its parent: it reports to one session, it does not
# talk to others, message people or schedule work.
WITHHELD = frozenset(t for g in ("group:sessions", "group:messaging", "group:automation") for t in CORE_GROUPS[g]) | set(SPAWN_TOOLS)


class SpawnRefused(ClawsupError):
    code = "spawn_refused"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SpawnArgs(_Args):
    """OpenClaw's `sessions_spawn` input."""

    task: str = Field(min_length=1, max_length=100_000, description="What the subagent should do; it sees only this, not your conversation.")
    label: str | None = Field(default=None, max_length=80, description="A short name for the run, to find it with the `subagents` tool.")
    agentId: str | None = Field(default=None, description="Hand the task to another agent (if tools.agentToAgent allows); default: your own.")
    model: str | None = Field(default=None, description="The subagent's model, if not the configured one.")
    runTimeoutSeconds: float | None = Field(default=None, gt=0, description="Kill the run after this many seconds.")


class SubagentsArgs(_Args):
    action: Literal["list", "kill"] = Field(default="list", description="`list` your runs, or `kill` one (or `all`).")
    target: str | None = Field(default=None, description="For kill: a run id, a label, or `all`.")


SPAWN_DESCRIPTION = (
    "Hand a task to a subagent that works in the background in its own sandbox. Returns at once with a run id and "
    "the child session key; when the run ends you receive its result as a system message."
)
SUBAGENTS_DESCRIPTION = "List the subagent runs you started (running and finished), or kill one of them (and whatever it spawned)."


def register_spawn_tools(registry: Registry) -> None:
    for name, desc, model in (("sessions_spawn", SPAWN_DESCRIPTION, SpawnArgs), ("subagents", SUBAGENTS_DESCRIPTION, SubagentsArgs)):
        schema = model.model_json_schema()
        schema.pop("title", None)
        registry.register(Registration(kind=Kind.TOOL, name=name, owner=CORE_OWNER, sandbox_id=None, description=desc, input_schema=schema))


A = TypeVar("A", bound=_Args)


def parse_args(model: type[A], tool: str, args: dict[str, Any]) -> A:
    """What the model wrote, checked; a refusal names the field (the model sees it)."""
    try:
        return model.model_validate(args)
    except ValidationError as e:
        raise BadToolArguments(tool, format_validation_error(e)) from None


class SpawnTools(Protocol):
    """The spawn tools' server, as their callers see it."""

    async def call(self, name: str, args: dict[str, Any], origin: Origin) -> str:
        """`sessions_spawn` or `subagents`, for `origin`: the tool's result text.
        Refusals raise (the model sees the sentence)."""
        ...

    async def stop_session(self, session_key: str) -> int:
        """`/stop` in a session: cancel its runs; how many were running."""
        ...
