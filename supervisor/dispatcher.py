"""From the inbound queue to replies: route each message, put it in its session, run
the session's turns one at a time, and send each answer back where it came from.

Each session key has a lane: messages are written to the session (and acknowledged)
in arrival order as they come, and its turns run strictly in that order, one at a
time; different sessions' lanes run concurrently. There is no global lock: a slow
turn holds only its own session. `/stop` is handled as it arrives, not queued: it
cancels that session's turn in flight (and, through cancellation, whatever the turn
started) and nothing else.

Created by the gateway; `run()` owns a task group with the inbound and outbound
pumps and one task per live lane.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from loguru import logger

from supervisor.bus import InboundMessage, MessageBus, OutboundMessage
from supervisor.errors import ClawsupError
from supervisor.providers.offline import sleep_turn
from supervisor.routing import Route, Router
from supervisor.session_store import SessionStore

STOP_COMMAND = "/stop"
LANE_IDLE_S = 300.0


class SessionBusy(ClawsupError):
    code = "session_busy"


Progress = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Answer:
    """A turn's reply, and what the session keeps beside it (the turn's tokens)."""

    text: str
    record: dict[str, Any] = field(default_factory=dict)


class Agent(Protocol):
    """What runs a turn: the agent loop, or the placeholder."""

    async def turn(self, route: Route, message: InboundMessage, progress: Progress) -> str | Answer: ...

    async def stop_session(self, session_key: str) -> int:
        """`/stop`: cancel the background work this session started (subagent
        runs); returns how many were running."""
        ...


class PlaceholderAgent:
    """Messaging without sandboxes or a model (the gateway uses the agent loop):
    acknowledges each message with the agent id and the session key, and takes the
    offline model's `/sleep N`. For the in-process benchmark and tests of the
    dispatcher itself."""

    async def turn(self, route: Route, message: InboundMessage, progress: Progress) -> str:
        text = message.text.strip()
        slept = await sleep_turn(text, route.agent_id, route.session_key, progress)
        return slept if slept is not None else f"[{route.agent_id}] received in {route.session_key}: {text}"

    async def stop_session(self, session_key: str) -> int:
        return 0


@dataclass
class _Lane:
    key: str
    queue: asyncio.Queue[tuple[InboundMessage, Route]]
    task: asyncio.Task[None] | None = None
    closing: bool = False
    """Set (synchronously) when the lane decides to end, idle: a message arriving
    after that opens a new lane rather than land in a queue nobody reads."""
    turn: asyncio.Task[str | Answer] | None = None
    turn_of: InboundMessage | None = None


class Dispatcher:
    def __init__(
        self,
        *,
        bus: MessageBus,
        router: Router,
        store: SessionStore,
        agent: Agent,
        channels: Mapping[str, Any],
        session_queue: int = 100,
    ) -> None:
        self.bus = bus
        self.router = router
        self.store = store
        self.agent = agent
        self.channels = channels
        """Channel name -> adapter with `async send(OutboundMessage)`."""
        self._session_queue = session_queue
        self._lanes: dict[str, _Lane] = {}
        self._tg: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            tg.create_task(self._inbound(), name="bus inbound")
            tg.create_task(self._outbound(), name="bus outbound")
            if self.store.fsync == "interval":
                tg.create_task(self.store.flush_periodically(), name="session fsync")

    # -- inbound ---------------------------------------------------------------

    async def _inbound(self) -> None:
        while True:
            msg = await self.bus.inbound.get()
            try:
                route = msg.route or self.router.resolve(msg.source, agent_override=msg.agent_override)
            except Exception as e:  # a router bug must cost this message only
                logger.exception("routing failed for {}", msg.id)
                _fail(msg, ClawsupError(f"routing failed: {e}"))
                continue
            if msg.role == "user" and msg.text.strip() == STOP_COMMAND:
                await self._stop(msg, route)
                continue
            lane = self._lane(route.session_key)
            try:
                lane.queue.put_nowait((msg, route))
            except asyncio.QueueFull:
                # Backpressure for this session alone: the others go on.
                _fail(msg, SessionBusy(f"session {route.session_key} has {lane.queue.qsize()} messages waiting; try again shortly"))

    def _lane(self, key: str) -> _Lane:
        lane = self._lanes.get(key)
        if lane is None or lane.closing or lane.task is None or lane.task.done():
            lane = _Lane(key, asyncio.Queue(self._session_queue))
            assert self._tg is not None
            lane.task = self._tg.create_task(self._guard_lane(lane), name=f"session {key}")
            self._lanes[key] = lane
        return lane

    async def _guard_lane(self, lane: _Lane) -> None:
        """A bug in one session's lane must cost that session only."""
        try:
            await self._run_lane(lane)
        except Exception:
            logger.exception("{}: session lane failed; its waiting messages are refused", lane.key)
            lane.closing = True
            while not lane.queue.empty():
                msg, _ = lane.queue.get_nowait()
                _fail(msg, ClawsupError("the session failed; see the supervisor log"))
            if self._lanes.get(lane.key) is lane:
                del self._lanes[lane.key]

    async def _run_lane(self, lane: _Lane) -> None:
        """Write each message to the session as it comes (acknowledging it), and run
        the turns one at a time, in order. The lane ends when it has been idle for
        LANE_IDLE_S; the next message for its key opens a new one."""
        pending: asyncio.Queue[tuple[InboundMessage, Route] | None] = asyncio.Queue()

        async def accept() -> None:
            while True:
                try:
                    async with asyncio.timeout(LANE_IDLE_S):
                        msg, route = await lane.queue.get()
                except TimeoutError:
                    if pending.empty() and lane.turn is None and lane.queue.empty():
                        lane.closing = True
                        pending.put_nowait(None)
                        return
                    continue
                try:
                    await self.store.append(route.session_key, _record(msg.role, msg, route))
                except OSError as e:
                    logger.error("{}: cannot write the session: {}", route.session_key, e)
                    _fail(msg, ClawsupError(f"the message could not be stored: {e}"))
                    continue
                if not msg.accepted.done():
                    msg.accepted.set_result(route)
                pending.put_nowait((msg, route))

        async def run_turns() -> None:
            while (item := await pending.get()) is not None:
                await self._turn(lane, *item)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(accept(), name=f"session {lane.key} accept")
            tg.create_task(run_turns(), name=f"session {lane.key} turns")
        if self._lanes.get(lane.key) is lane:
            del self._lanes[lane.key]

    async def _turn(self, lane: _Lane, msg: InboundMessage, route: Route) -> None:
        async def progress(text: str) -> None:
            await self._send(msg, route, text, progress=True, final=False)

        t0 = time.monotonic()
        lane.turn = asyncio.ensure_future(self.agent.turn(route, msg, progress))
        lane.turn_of = msg
        try:
            reply = await asyncio.shield(lane.turn)
        except asyncio.CancelledError:
            if lane.turn.cancelled() and not _cancelling():
                reply = None  # stopped by /stop
            else:
                lane.turn.cancel()
                raise
        except Exception as e:
            logger.exception("{}: turn failed", route.session_key)
            reply = f"error: the turn failed: {e}"
        finally:
            lane.turn = lane.turn_of = None
        if reply is None:
            await self.store.append(route.session_key, {"role": "system", "text": "turn stopped by /stop", "inReplyTo": msg.id, "ts": time.time()})
            await self._send(msg, route, "stopped.", final=True)
            return
        answer = reply if isinstance(reply, Answer) else Answer(reply)
        await self.store.append(
            route.session_key,
            {"role": "assistant", "agentId": route.agent_id, "text": answer.text, "inReplyTo": msg.id, "ts": time.time(), "turnS": round(time.monotonic() - t0, 4), **answer.record},
        )
        await self._send(msg, route, answer.text, final=True)

    async def _stop(self, msg: InboundMessage, route: Route) -> None:
        lane = self._lanes.get(route.session_key)
        turn = lane.turn if lane else None
        if not msg.accepted.done():
            msg.accepted.set_result(route)
        runs = await self.agent.stop_session(route.session_key)
        said = [f"cancelled {runs} subagent run{'s' if runs != 1 else ''} (and what they spawned)"] if runs else []
        if turn is not None and not turn.done():
            turn.cancel()
            logger.info("{}: turn stopped by /stop", route.session_key)
            said.insert(0, "stopping the turn in flight")
        await self._send(msg, route, "; ".join(said) + "." if said else "nothing to stop.", final=True)

    # -- outbound --------------------------------------------------------------

    async def _send(self, msg: InboundMessage, route: Route, text: str, *, progress: bool = False, final: bool = True) -> None:
        await self.bus.outbound.put(
            OutboundMessage(target=msg.reply_to, text=text, session_key=route.session_key, agent_id=route.agent_id, in_reply_to=msg.id, progress=progress, final=final)
        )

    async def _outbound(self) -> None:
        while True:
            out = await self.bus.outbound.get()
            channel = self.channels.get(out.target.channel)
            if channel is None:
                logger.warning("reply for channel {!r}, which is not running; dropped", out.target.channel)
                continue
            try:
                await channel.send(out)
            except Exception:
                logger.exception("channel {} failed to deliver a reply", out.target.channel)


def _record(role: str, msg: InboundMessage, route: Route) -> dict[str, Any]:
    src = msg.source
    rec: dict[str, Any] = {
        "role": role,
        "id": msg.id,
        "text": msg.text,
        "ts": time.time(),
        "agentId": route.agent_id,
        "matchedBy": route.matched_by,
        "channel": msg.reply_to.channel,
        "accountId": route.account_id,
        "peer": {"kind": src.peer.kind, "id": src.peer.id},
    }
    if src.thread_id:
        rec["threadId"] = src.thread_id
    return rec


def _fail(msg: InboundMessage, e: Exception) -> None:
    if not msg.accepted.done():
        msg.accepted.set_exception(e)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return bool(task and task.cancelling())
