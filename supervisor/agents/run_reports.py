"""How the parent of an ended subagent run hears of it, once: a depth-0 session as a
system message on the bus (which starts a turn: the agent turns it into a reply), a
run as an announce in its inbox (for its next model call). A session's report that
cannot be delivered now (the gateway is stopping) waits in the run journal, and so
do the runs a killed supervisor never saw end: at the next start `report_lost`
tells their sessions. Created by the gateway; used by `RunDriver` (each run's end)
and `Subagents` (the lost runs at start, `close` when the gateway stops)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from loguru import logger

from clawsup.sandbox.agent_loop import UserMessage
from clawsup.supervisor.agents.providers import Usage
from clawsup.supervisor.agents.run_journal import RunJournal, origin_from
from clawsup.supervisor.agents.runs import Run, report, stats_line
from clawsup.supervisor.messages.bus import InboundMessage, ReplyTarget
from clawsup.supervisor.messages.routing import Route, RouteInput
from clawsup.supervisor.messages.session_store import SessionStore


class SessionInbox(Protocol):
    """Where messages for sessions go in (the bus's inbound queue)."""

    async def put(self, item: InboundMessage, /) -> None: ...


class RunReports:
    def __init__(self, *, store: SessionStore, sessions: SessionInbox, journal: RunJournal | None) -> None:
        self._store = store
        self._sessions = sessions
        self._journal = journal
        self._closing = False

    def close(self) -> None:
        """The gateway is stopping: reports to sessions go to the journal from now on,
        and announces to runs are dropped (their parents are being stopped too)."""
        self._closing = True

    async def deliver(self, run: Run) -> None:
        """The run's end in its own session, then its one report to its parent."""
        text = run.report()
        try:
            await self._store.append(run.child_key, {"role": "system", "text": text, "ts": time.time(), "status": run.status, "tokensIn": run.usage.input_tokens, "tokensOut": run.usage.output_tokens})
        except OSError as e:
            logger.error("{}: cannot write the run's end: {}", run.child_key, e)
        parent = run.origin.run
        if parent is not None:
            if parent.running and not self._closing:
                parent.inbox.put_nowait(UserMessage(text, "announce"))
            return
        msg, route = run.origin.message, run.origin.route
        if msg is None or route is None:
            return
        if self._closing:
            if self._journal is not None:
                self._journal.ended(run.run_id, text)
            return
        await self._tell(msg.source, msg.reply_to, route, text, run.run_id)

    async def report_lost(self) -> None:
        """Runs of the supervisor's last life that their sessions never heard of."""
        if self._journal is None:
            return
        for r in await asyncio.to_thread(self._journal.unreported):
            try:
                source, reply_to, route = origin_from(r["origin"])
            except (KeyError, TypeError, ValueError) as e:
                logger.warning("run {} cannot be reported to its session: {}", r.get("runId"), e)
                continue
            ended = r.get("ended")
            if ended:
                text = f"{ended}\n(reported when the gateway started again)"
            else:
                text = await asyncio.to_thread(self._lost_text, r)  # reads the run's whole session file
            logger.warning("subagent run {} ({}) of {} was not reported before the supervisor stopped; reporting it now", r["runId"], r.get("label"), route.session_key)
            await self._tell(source, reply_to, route, text, r["runId"])

    async def _tell(self, source: RouteInput, reply_to: ReplyTarget, route: Route, text: str, run_id: str) -> None:
        """Put a report on the bus; the journal lets go of the run once the report
        is in its session."""
        note = InboundMessage(source=source, text=text, reply_to=reply_to, route=route, role="system")
        journal = self._journal

        def done(fut: asyncio.Future[Route]) -> None:
            if fut.cancelled() or (e := fut.exception()) is not None:
                logger.warning("the report of run {} was not accepted: {}", run_id, "cancelled" if fut.cancelled() else e)
            elif journal is not None:
                journal.reported(run_id)

        note.accepted.add_done_callback(done)
        await self._sessions.put(note)

    def _lost_text(self, r: dict[str, Any]) -> str:
        """What a run's own session says of it, since nothing else is left."""
        records = self._store.read(r["childKey"])
        used = Usage()
        for rec in records:
            u = rec.get("usage") if rec.get("role") == "assistant" else None
            if isinstance(u, dict):
                used += Usage(int(u.get("in", 0)), int(u.get("out", 0)))
        last = max((rec.get("ts", 0) for rec in records), default=0) or r.get("ts", 0)
        body = "the gateway stopped while the run was going (its supervisor was killed or crashed), and the run was lost with it; its session holds what it did"
        return report(r["runId"], r.get("label", r["runId"]), "failed", str(r.get("agentId")), r["childKey"], body, stats_line(1, 0, max(0.0, last - r.get("ts", last)), used))
