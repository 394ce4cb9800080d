"""A cron job and the record of one of its runs: what the store keeps and the
scheduler works on (dataclasses), and `JobSpec`, a job as the operator's CLI and the
agent's `cron` tool describe it (pydantic, checked at the edge; its errors name the
field).

A job is an agent turn on a schedule: its `message` goes to `agent` in a session of
the run's own (`agent:<agent>:cron:<jobId>:run:<runId>`) or in the session it is
bound to, and the reply goes to `channel` and `peer`, or nowhere (a silent job: the
reply is kept in the session and the run's record).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clawsup.supervisor.automation.schedule import Schedule, make_schedule

Overlap = Literal["skip", "queue"]
"""A run due while the last one goes on: skipped (recorded), or queued (one at most)."""
Misfire = Literal["run_once", "skip"]
"""Runs missed while the gateway was down: one run at start, or none (recorded)."""
RunStatus = Literal["running", "ok", "failed", "timed_out", "skipped"]
Trigger = Literal["schedule", "misfire", "manual", "queued"]
HEARTBEAT_ID = "heartbeat"


class JobSpec(BaseModel):
    """A new job, as the CLI and the `cron` tool give it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=80, description="A short name for the job.")
    at: str | None = Field(default=None, description="Run once at this ISO 8601 time (a time without offset is read in tz).")
    every: str | None = Field(default=None, description="Run every so often: 90s, 30m, 1h, 1h30m, 2d.")
    cron: str | None = Field(default=None, description="A five-field cron expression, e.g. '0 9 * * mon-fri'.")
    tz: str | None = Field(default=None, description="The IANA time zone of `cron` (and of a time in `at` without offset); default UTC.")
    agent: str | None = Field(default=None, description="The agent that runs the turn.")
    message: str = Field(min_length=1, max_length=100_000, description="What the agent is told at each run.")
    channel: str | None = Field(default=None, description="Where the reply goes (with peer); without, the job is silent.")
    peer: str | None = Field(default=None, min_length=1, max_length=256, description="Who gets the reply on that channel.")
    session: str | None = Field(default=None, min_length=1, max_length=512, description="Run in this session instead of one of the run's own.")
    enabled: bool = True
    timeoutSeconds: float | None = Field(default=None, ge=1, le=86_400, description="Cancel a run (and kill what it started) after this long.")
    overlap: Overlap = Field(default="skip", description="A run due while the last goes on: skip it, or queue one.")
    misfire: Misfire = Field(default="run_once", description="Runs missed while the gateway was down: run once at start, or skip.")


@dataclass(kw_only=True)
class Job:
    id: str
    name: str
    agent: str
    schedule: Schedule
    message: str
    channel: str | None = None
    peer: str | None = None
    session: str | None = None
    enabled: bool = True
    timeout_s: float | None = None
    overlap: Overlap = "skip"
    misfire: Misfire = "run_once"
    owner: bool = True
    """Whether its creator was an owner: its runs speak with that standing, no more."""
    created_by: str = "operator"
    created_at: float = field(default_factory=time.time)
    system: bool = False
    """The gateway's own (the heartbeat): from the config, not the store."""
    enabled_at: float = 0.0
    """When it was last enabled: what it would have run while disabled is not a
    misfire at the next start."""

    @classmethod
    def from_spec(cls, spec: JobSpec, *, agent: str, now: float, owner: bool, created_by: str) -> Job:
        """Raises ScheduleError (naming the field) for a schedule that cannot be."""
        schedule = make_schedule(at=spec.at, every=spec.every, cron=spec.cron, tz=spec.tz, now=now)
        return cls(
            id=uuid.uuid4().hex[:12],
            name=spec.name,
            agent=agent,
            schedule=schedule,
            message=spec.message,
            channel=spec.channel,
            peer=spec.peer,
            session=spec.session,
            enabled=spec.enabled,
            timeout_s=spec.timeoutSeconds,
            overlap=spec.overlap,
            misfire=spec.misfire,
            owner=owner,
            created_by=created_by,
            created_at=now,
        )

    def with_enabled(self, enabled: bool, now: float) -> Job:
        return replace(self, enabled=enabled, enabled_at=now if enabled else self.enabled_at)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "agent": self.agent,
            "schedule": self.schedule.to_json(),
            "message": self.message,
            "channel": self.channel,
            "peer": self.peer,
            "session": self.session,
            "enabled": self.enabled,
            "timeoutSeconds": self.timeout_s,
            "overlap": self.overlap,
            "misfire": self.misfire,
            "owner": self.owner,
            "createdBy": self.created_by,
            "createdAt": self.created_at,
            "system": self.system,
            "enabledAt": self.enabled_at,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Job:
        """Raises KeyError, TypeError or ValueError (ScheduleError) on a bad record."""
        return cls(
            id=str(d["id"]),
            name=str(d["name"]),
            agent=str(d["agent"]),
            schedule=Schedule.from_json(d["schedule"]),
            message=str(d["message"]),
            channel=d.get("channel"),
            peer=d.get("peer"),
            session=d.get("session"),
            enabled=bool(d.get("enabled", True)),
            timeout_s=d.get("timeoutSeconds"),
            overlap=d.get("overlap", "skip"),
            misfire=d.get("misfire", "run_once"),
            owner=bool(d.get("owner", True)),
            created_by=str(d.get("createdBy", "operator")),
            created_at=float(d.get("createdAt", 0.0)),
            system=bool(d.get("system", False)),
            enabled_at=float(d.get("enabledAt", 0.0)),
        )


@dataclass(kw_only=True)
class RunRecord:
    """One run of a job, or one it skipped. Written when it is fired (status
    `running`) and again when it ends; a run still `running` at the next start was
    lost with the supervisor."""

    job_id: str
    run_id: str
    due: float
    """The time it was due (the scheduled time, even when it ran late)."""
    trigger: Trigger
    fired_at: float
    status: RunStatus = "running"
    session_key: str = ""
    started_at: float | None = None
    """When its turn began (after a free slot, and its session's turns before it)."""
    ended_at: float | None = None
    reason: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    reply: str = ""
    """The reply's first line."""
    delivery: str = ""
    """What became of the reply: "delivered ...", "failed: ...", "silent"."""
    times: int = 1
    """For a skipped run: how many due times it stands for (an overlap skips every
    time due while the run goes on; one record says so, not one per second)."""

    @property
    def duration_s(self) -> float | None:
        return None if self.ended_at is None else round(self.ended_at - self.fired_at, 3)

    def to_json(self) -> dict[str, Any]:
        return {
            "jobId": self.job_id,
            "runId": self.run_id,
            "due": self.due,
            "trigger": self.trigger,
            "firedAt": self.fired_at,
            "status": self.status,
            "sessionKey": self.session_key,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
            "durationS": self.duration_s,
            "reason": self.reason,
            "tokensIn": self.tokens_in,
            "tokensOut": self.tokens_out,
            "reply": self.reply,
            "delivery": self.delivery,
            "times": self.times,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunRecord:
        return cls(
            job_id=str(d["jobId"]),
            run_id=str(d["runId"]),
            due=float(d["due"]),
            trigger=d.get("trigger", "schedule"),
            fired_at=float(d.get("firedAt", d["due"])),
            status=d.get("status", "running"),
            session_key=str(d.get("sessionKey", "")),
            started_at=d.get("startedAt"),
            ended_at=d.get("endedAt"),
            reason=str(d.get("reason", "")),
            tokens_in=int(d.get("tokensIn", 0)),
            tokens_out=int(d.get("tokensOut", 0)),
            reply=str(d.get("reply", "")),
            delivery=str(d.get("delivery", "")),
            times=int(d.get("times", 1)),
        )
