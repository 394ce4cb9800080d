"""One cron run: the job's message as an agent turn, through the session lanes like
any message, in a session of the run's own (`agent:<agent>:cron:<jobId>:run:<runId>`)
or the one the job is bound to; then its reply, delivered through the normal outbound
path to the job's channel and peer, and what became of it recorded.

The turn is a turn like any other: the tool policy sees it from the `cron` channel,
with its job creator's standing as owner (`Job.owner`); its tools run in their
sandboxes; the plugins' message hooks see it. Past the job's timeout the turn is
cancelled as `/stop` cancels one, which cancels its tool calls in flight (an exec's
command and whatever it started are killed by its sandbox host), and the subagent
runs it spawned are stopped with it.

The lanes do not send a cron turn's reply: they hand it here (`InboundMessage.outcome`),
so that the heartbeat can keep an acknowledgement to itself and every delivery's
fate is known (`OutboundMessage.delivered`).

Created by the gateway; the scheduler calls `run` for each run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from loguru import logger

from clawsup.supervisor.agents.tool_policy import CRON_CHANNEL
from clawsup.supervisor.automation import heartbeat
from clawsup.supervisor.automation.jobs import HEARTBEAT_ID, Job, RunRecord
from clawsup.supervisor.messages.bus import InboundMessage, OutboundMessage, ReplyTarget, TurnOutcome
from clawsup.supervisor.messages.routing import DEFAULT_ACCOUNT, Peer, Route, RouteInput

CHANNEL = CRON_CHANNEL
"""The channel a cron turn comes from, for the tool policy (`tools.byChannel.cron`,
and its `cron run` layer)."""
WIND_DOWN_S = 10.0
"""After a timeout: for the cancelled turn to end (its tool calls to be cancelled)."""
DELIVERY_WAIT_S = 30.0
"""For a channel to say what became of a reply."""


class Queue(Protocol):
    async def put(self, item: InboundMessage, /) -> None: ...


class OutQueue(Protocol):
    async def put(self, item: OutboundMessage, /) -> None: ...


class Turns(Protocol):
    """The session lanes, as a cron run needs them."""

    def cancel_turn(self, message_id: str, reason: str) -> bool: ...


class CronRuns:
    def __init__(
        self,
        *,
        inbound: Queue,
        outbound: OutQueue,
        turns: Callable[[], Turns | None],
        stop_session: Callable[[str], Awaitable[int]],
        workspace_of: Callable[[str, str], Path],
        default_timeout_s: float,
    ) -> None:
        """`turns`: the session lanes once they run; `stop_session`: cancels a
        session's subagent runs; `workspace_of(agent, session)`: that turn's workspace
        folder (where HEARTBEAT.md is)."""
        self._inbound = inbound
        self._outbound = outbound
        self._turns = turns
        self._stop_session = stop_session
        self._workspace_of = workspace_of
        self._default_timeout_s = default_timeout_s

    async def run(self, job: Job, rec: RunRecord) -> None:
        key = job.session or f"agent:{job.agent}:cron:{job.id}:run:{rec.run_id}"
        rec.session_key = key
        text, context = job.message, ""
        beat = job.system and job.id == HEARTBEAT_ID
        if beat:
            try:
                tasks = await asyncio.to_thread(heartbeat.read_tasks, self._workspace_of(job.agent, key))
            except heartbeat.HeartbeatFileError as e:
                logger.warning("heartbeat: {}", e)
                rec.status, rec.reason, rec.delivery = "failed", str(e), "silent"
                return
            if not tasks:
                rec.status, rec.reason, rec.delivery = "ok", f"{heartbeat.FILE} lists no active tasks: no turn", "silent"
                return
            text, context = "\n".join(f"- {t}" for t in tasks) if len(tasks) > 1 else tasks[0], heartbeat.INSTRUCTIONS
        target = ReplyTarget(channel=job.channel or CHANNEL, account_id=DEFAULT_ACCOUNT, peer=Peer.of("direct", job.peer or job.id))
        outcome: asyncio.Future[TurnOutcome] = asyncio.get_running_loop().create_future()
        msg = InboundMessage(
            source=RouteInput(channel=CHANNEL, account_id=DEFAULT_ACCOUNT, peer=Peer.of("direct", job.id)),
            text=text,
            reply_to=target,
            route=Route(agent_id=job.agent, matched_by="cron", session_key=key, main_session_key=f"agent:{job.agent}:main", account_id=DEFAULT_ACCOUNT),
            owner=job.owner,
            context=context,
            outcome=outcome,
        )
        timeout = job.timeout_s or self._default_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await self._inbound.put(msg)
                await msg.accepted
                rec.started_at = time.time()
                done = await asyncio.shield(outcome)
        except TimeoutError:
            await self._time_out(msg, outcome, key, timeout, own_session=job.session is None)
            rec.status = "timed_out"
            rec.reason = f"did not finish within {timeout:g} s (timeoutSeconds); its turn was cancelled and what it ran was stopped"
            return
        except asyncio.CancelledError:
            turns = self._turns()
            if turns is not None:
                turns.cancel_turn(msg.id, "because the gateway is stopping")
            outcome.cancel()
            raise
        except Exception as e:  # refused by the lanes: the session could not take it
            rec.status, rec.reason = "failed", f"the turn was not accepted: {e}"
            return
        await self._settle(job, rec, msg, target, done, beat)

    async def _time_out(self, msg: InboundMessage, outcome: asyncio.Future[TurnOutcome], key: str, timeout: float, own_session: bool) -> None:
        turns = self._turns()
        stopping = turns is not None and turns.cancel_turn(msg.id, f"because its cron run passed its timeout ({timeout:g} s)")
        if own_session:
            # Its session is the run's alone, so its subagent runs are the run's. In a
            # bound session they may be the session's user's: those are left alone.
            runs = await self._stop_session(key)
            if runs:
                logger.info("{}: stopped {} subagent run(s) of a timed-out cron run", key, runs)
        if stopping:
            # The lanes settle the outcome once the turn's cancellation has gone
            # through its tool calls.
            try:
                async with asyncio.timeout(WIND_DOWN_S):
                    await asyncio.shield(outcome)
            except TimeoutError:
                logger.warning("{}: the timed-out cron turn did not end within {:g} s of its cancellation", key, WIND_DOWN_S)
        outcome.cancel()  # not started yet: the lanes skip it when its turn comes

    async def _settle(self, job: Job, rec: RunRecord, msg: InboundMessage, target: ReplyTarget, done: TurnOutcome, beat: bool) -> None:
        usage = done.record.get("turnUsage") or {}
        rec.tokens_in, rec.tokens_out = int(usage.get("in", 0)), int(usage.get("out", 0))
        rec.reply = done.text.strip().splitlines()[0][:300] if done.text.strip() else ""
        if done.stopped:
            rec.status, rec.reason, rec.delivery = "failed", f"its turn was stopped {done.stopped}", "none"
            return
        rec.status = "failed" if done.failed else "ok"
        rec.reason = done.text[:300] if done.failed else ""
        if done.withheld:
            rec.delivery = "withheld by a message_sending hook"
        elif beat and heartbeat.is_ack(done.text):
            rec.delivery = "silent: nothing to tell"
        elif job.channel is None:
            rec.delivery = "silent (the job names no channel)"
        else:
            rec.delivery = await self._deliver(job, rec, msg, target, done.text)

    async def _deliver(self, job: Job, rec: RunRecord, msg: InboundMessage, target: ReplyTarget, text: str) -> str:
        delivered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        out = OutboundMessage(target=target, text=text, session_key=rec.session_key, agent_id=job.agent, in_reply_to=msg.id, delivered=delivered)
        try:
            async with asyncio.timeout(DELIVERY_WAIT_S):
                await self._outbound.put(out)
                return f"delivered: {await delivered}"
        except TimeoutError:
            why = f"the channel did not confirm it within {DELIVERY_WAIT_S:g} s"
        except Exception as e:
            why = str(e)
        logger.warning("cron job {} ({}): the reply of run {} to {}:{} was not delivered: {}", job.id, job.name, rec.run_id, job.channel, job.peer, why)
        return f"failed: {why}"
