"""The record of one subagent run, who spawned it (`Origin`), and the one report its
parent gets when it ends. Data and arithmetic only: `Subagents` keeps the records,
`RunDriver` moves a run from running to its end, `RunReports` delivers the report."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from clawsup.sandbox.agent_loop import UserMessage
from clawsup.supervisor.agents.loop_detection import LoopWatch
from clawsup.supervisor.agents.providers import Provider, Usage
from clawsup.supervisor.agents.tool_policy import Caller
from clawsup.supervisor.messages.bus import InboundMessage
from clawsup.supervisor.messages.routing import Route

RunStatus = Literal["running", "succeeded", "failed", "timed_out", "cancelled"]
EndStatus = Literal["succeeded", "failed", "timed_out", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Who is calling a spawn tool, as the supervisor knows it: a session's turn
    (depth 0, `message` and `route` say where its announces go) or a run."""

    session_key: str
    agent_id: str
    caller: Caller
    """The turn's identity for the tool policy (channel, sender, owner)."""
    allowed: frozenset[str]
    """The caller's tool set at this call: a run gets no more."""
    depth: int = 0
    run: Run | None = None
    message: InboundMessage | None = None
    route: Route | None = None


@dataclass(eq=False, kw_only=True)
class Run:
    """Made by `Subagents.spawn`; kept there (with the last FINISHED_KEPT ended ones)
    for `status` and the `subagents` tool."""

    run_id: str
    child_key: str
    label: str
    task: str
    agent_id: str
    model: str
    origin: Origin
    timeout_s: float
    sandbox_id: str
    workspace: str
    """The workspace sandbox its file and exec tools use."""
    fresh_workspace: bool
    provider: Provider
    loops: LoopWatch
    """Repeated tool calls, counted here: the run's loop cannot be trusted to."""
    status: RunStatus = "running"
    reason: str = ""
    result: str = ""
    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.monotonic)
    t1: float | None = None
    usage: Usage = field(default_factory=Usage)
    model_calls: int = 0
    children: list[Run] = field(default_factory=list)
    inbox: asyncio.Queue[UserMessage] = field(default_factory=asyncio.Queue)
    """Announces of its own children, for its next model call (or runs.wait)."""
    task_handle: asyncio.Task[None] | None = None
    cancel_reason: str = ""
    reported: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the run has ended, cleaned up and announced."""

    @property
    def depth(self) -> int:
        return self.origin.depth + 1

    @property
    def parent_key(self) -> str:
        return self.origin.session_key

    @property
    def running(self) -> bool:
        return self.status == "running"

    def caller(self) -> Caller:
        """The run's identity for the tool policy: its parent's channel, sender and
        owner, with its own agent and model."""
        return replace(self.origin.caller, agent=self.agent_id, provider=self.model, subagent=True)

    def end(self, status: EndStatus, text: str, reason: str) -> None:
        self.status, self.result, self.reason, self.t1 = status, text, reason, time.monotonic()

    def cancel(self, reason: str) -> None:
        """Cancel its task (which ends it as `cancelled`, with the first reason given)."""
        if self.running and self.task_handle is not None and not self.task_handle.done():
            self.cancel_reason = self.cancel_reason or reason
            self.task_handle.cancel()

    def duration_s(self) -> float:
        return (self.t1 if self.t1 is not None else time.monotonic()) - self.t0

    def subtree(self) -> Iterator[Run]:
        yield self
        for c in self.children:
            yield from c.subtree()

    def stats(self) -> str:
        """The announce's statistics line: this run and every run it spawned."""
        runs = list(self.subtree())
        tokens = Usage()
        for r in runs:
            tokens += r.usage
        return stats_line(len(runs), sum(1 for r in runs if r.status == "succeeded"), self.duration_s(), tokens)

    def report(self) -> str:
        body = self.result or "(no result)"
        if self.reason:
            body = f"{self.reason}\n{self.result}" if self.result else self.reason
        return report(self.run_id, self.label, self.status, self.agent_id, self.child_key, body, self.stats())

    def to_json(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "label": self.label,
            "agentId": self.agent_id,
            "model": self.model,
            "childSessionKey": self.child_key,
            "parentSessionKey": self.parent_key,
            "depth": self.depth,
            "status": self.status,
            "reason": self.reason,
            "result": self.result[:4000],
            "sandbox": self.sandbox_id,
            "workspace": self.workspace,
            "startedAt": self.started_at,
            "durationS": round(self.duration_s(), 3),
            "modelCalls": self.model_calls,
            "tokensIn": self.usage.input_tokens,
            "tokensOut": self.usage.output_tokens,
            "children": [c.to_json() for c in self.children],
        }


def report(run_id: str, label: str, status: str, agent_id: str, child_key: str, body: str, stats: str) -> str:
    """The one message a run's parent gets: who, how it ended, what, and the cost."""
    return f"[subagent run {run_id} {label!r} {status.replace('_', ' ')}] agent {agent_id}, session {child_key}\n{body}\n{stats}"


def stats_line(runs: int, succeeded: int, duration_s: float, tokens: Usage) -> str:
    return (
        f"stats: runs {runs} ({succeeded} succeeded, {runs - succeeded} failed) · duration {duration_s:.1f} s · "
        f"tokens {tokens.input_tokens} in / {tokens.output_tokens} out"
    )
