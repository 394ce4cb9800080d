"""The `cron` tool (OpenClaw's name, in `group:automation`, owner-only unless the
operator's `tools.ownerOnly` says otherwise): the agent lists, adds, removes,
enables, disables and runs its own agent's jobs, and reads their runs. Another
agent's jobs do not exist for it. A job it adds speaks, when it runs, with the
standing of the turn that added it (owner or not), never more.

Its schema and registration as a core tool, the check of what the model wrote, and
its server (`CronToolServer`, over the scheduler). The agent loop calls it through
the `CronTool` port.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawsup.sandbox.manifest import format_validation_error
from clawsup.supervisor.automation.jobs import JobSpec
from clawsup.supervisor.automation.scheduler import Scheduler
from clawsup.supervisor.errors import BadToolArguments
from clawsup.supervisor.sandboxes.registry import CORE_OWNER, Kind, Registration, Registry

CRON_TOOL = "cron"
DESCRIPTION = (
    "Schedule work for yourself: `list` your cron jobs, `add` one (job: name, message, and one of at (ISO time), every "
    "(30m, 1h...) or cron ('0 9 * * mon-fri', with tz), optionally channel and peer for where the reply goes), `remove`, "
    "`enable` or `disable` one by id, `run` one now, or read its `runs`. Each run is a turn of yours in a session of its own."
)


class CronArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["list", "add", "remove", "enable", "disable", "run", "runs"] = Field(description="What to do.")
    id: str | None = Field(default=None, max_length=64, description="The job, for remove, enable, disable, run and runs.")
    job: JobSpec | None = Field(default=None, description="The new job, for add.")
    n: int = Field(default=10, ge=1, le=100, description="For runs: how many of the last runs.")


class CronTool(Protocol):
    async def call(self, args: dict[str, Any], *, agent: str, owner: bool, session: str) -> str:
        """The tool's result text; a refusal raises (the model sees the sentence)."""
        ...


def register_cron_tool(registry: Registry) -> None:
    schema = CronArgs.model_json_schema()
    schema.pop("title", None)
    registry.register(Registration(kind=Kind.TOOL, name=CRON_TOOL, owner=CORE_OWNER, sandbox_id=None, description=DESCRIPTION, input_schema=schema))


class CronToolServer:
    def __init__(self, scheduler: Scheduler) -> None:
        self._cron = scheduler

    async def call(self, args: dict[str, Any], *, agent: str, owner: bool, session: str) -> str:
        try:
            a = CronArgs.model_validate(args)
        except ValidationError as e:
            raise BadToolArguments(CRON_TOOL, format_validation_error(e)) from None
        if a.action == "list":
            return json.dumps({"jobs": self._cron.jobs_json(agent)})
        if a.action == "add":
            if a.job is None:
                raise BadToolArguments(CRON_TOOL, "job: required to add a job")
            job = await self._cron.add(a.job, agent=agent, owner=owner, created_by=f"agent {agent} (session {session})", session=session)
            return json.dumps({"added": job.to_json()})
        if a.id is None:
            raise BadToolArguments(CRON_TOOL, f"id: required to {a.action} a job")
        if a.action == "remove":
            return json.dumps({"removed": (await self._cron.remove(a.id, agent=agent)).id})
        if a.action in ("enable", "disable"):
            job = await self._cron.set_enabled(a.id, a.action == "enable", agent=agent)
            return json.dumps({"id": job.id, "enabled": job.enabled})
        if a.action == "run":
            return json.dumps({"run": self._cron.run_now(a.id, agent=agent).to_json()})
        return json.dumps({"runs": [r.to_json() for r in self._cron.runs(a.id, a.n, agent=agent)]})
