"""The session lanes, from the inbound queue to replies: route each message, put it in
its session, run the session's turns one at a time, and send each answer back where
it came from.

Each session key with work has a lane: messages are written to the session (and
acknowledged) in arrival order as they come, and its turns run strictly in that
order, one at a time; different sessions' lanes run concurrently. There is no global
lock: a slow turn holds only its own session. `/stop` is handled as it arrives, not
queued: it cancels that session's turn in flight (and, through cancellation, whatever
the turn started) and nothing else.

A plugin's slash command (supervisor/messages/commands.py) takes its message's turn
instead of the agent: it runs in the lane, in order, where `/stop` can cancel it, and
without the model. Its message and answer are kept in the session as `command` and
`command_reply` records, which the agent's history leaves out (the model never sees
them; the transcript shows what happened).

The plugins' message hooks run here (`MessageHooks`, supervisor/hooks.py): each
user message, once stored and acknowledged, is observed (`message_received`, never
waited for), and each final answer passes `message_sending` before it is sent. A
hook that cancels the answer leaves the session with the answer and the channel with
`WITHHELD`, so that a client waiting for a final reply gets one.

Bounds, each held where a message first arrives (the pump, in one synchronous step,
so that no burst can slip past between loop ticks):
- a session holds the message at its turn and at most `bus.sessionQueue` waiting
  behind it; one more is refused with `SessionBusy` before anything of it is written
  (tests/test_messaging.py::test_a_busy_session_refuses_past_its_bound_with_429);
- the gateway holds at most `bus.inboundCapacity` messages (see supervisor/messages/bus.py);
- a lane lives only while its session has work: when its last turn ends its tasks
  end and it is forgotten, so idle sessions cost nothing
  (tests/test_session_bounds.py).

Created by the gateway; `run()` owns a task group with the inbound and `/stop`
pumps, the outbound pump, and one task per session with work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from loguru import logger

from clawsup.supervisor.messages.bus import STOP_COMMAND, InboundMessage, MessageBus, OutboundMessage, SessionBusy, TurnOutcome
from clawsup.supervisor.errors import ClawsupError
from clawsup.supervisor.agents.providers.offline import sleep_turn
from clawsup.supervisor.config import PeerKind
from clawsup.supervisor.messages.commands import Commands, Invocation
from clawsup.supervisor.messages.routing import Route, Router
from clawsup.supervisor.messages.session_store import SessionStore

__all__ = ["STOP_COMMAND", "Agent", "Answer", "MessageHooks", "NoHooks", "PlaceholderAgent", "Progress", "SessionBusy", "SessionLanes"]


Progress = Callable[[str], Awaitable[None]]
WITHHELD = "[reply withheld by a plugin hook]"
"""Sent, as the final reply, in place of an answer a `message_sending` hook cancelled."""
RecordRole = Literal["user", "system", "command"]
"""A message's record in its session: `command` for a plugin command's, which the
agent's history leaves out."""


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


class MessageHooks(Protocol):
    """What the lanes ask of the plugins' hooks (supervisor/hooks.py `Hooks`)."""

    def observe(self, hook: str, event: dict[str, Any]) -> None:
        """Run an observing hook in the background; never waited for."""
        ...

    async def message_sending(self, text: str, *, channel: str, peer_kind: PeerKind, peer_id: str, session: str, agent: str) -> str | None:
        """The text to send in place of `text`, or None: cancelled."""
        ...


class NoHooks:
    """No plugin hooks: what the lanes use unless the gateway gives them its hooks."""

    def observe(self, hook: str, event: dict[str, Any]) -> None:
        return None

    async def message_sending(self, text: str, *, channel: str, peer_kind: PeerKind, peer_id: str, session: str, agent: str) -> str | None:
        return text


class ReplySink(Protocol):
    """Where a channel's replies go (every `Channel` is one)."""

    async def send(self, out: OutboundMessage) -> None: ...


class PlaceholderAgent:
    """Messaging without sandboxes or a model (the gateway uses the agent loop):
    acknowledges each message with the agent id and the session key, and takes the
    offline model's `/sleep N`. For the in-process benchmark and tests of the
    lanes themselves."""

    async def turn(self, route: Route, message: InboundMessage, progress: Progress) -> str:
        text = message.text.strip()
        slept = await sleep_turn(text, route.agent_id, route.session_key, progress)
        return slept if slept is not None else f"[{route.agent_id}] received in {route.session_key}: {text}"

    async def stop_session(self, session_key: str) -> int:
        return 0


Item = tuple[InboundMessage, Route, Invocation | None]
"""A message, its route, and the plugin command it asks for (None: a turn of the agent)."""


@dataclass
class _Lane:
    """One session's work: made by the pump for the first message of a session with
    none, owned by the lanes' task group, ended when `held` drops to 0."""

    key: str
    unwritten: asyncio.Queue[Item | None] = field(default_factory=asyncio.Queue)
    """Routed here, not yet in the session file."""
    written: asyncio.Queue[Item | None] = field(default_factory=asyncio.Queue)
    """In the session (acknowledged), waiting for their turn."""
    held: int = 0
    """Messages given to this lane whose turn has not ended: what is in the two
    queues plus the one at its turn. The bound is checked against this count."""
    task: asyncio.Task[None] | None = None
    closing: bool = False
    """Set (synchronously) when the lane's last message is done: a message arriving
    after that opens a new lane rather than land in a queue nobody reads."""
    turn: asyncio.Task[str | Answer] | None = None
    turn_of: InboundMessage | None = None
    stop_reason: str = ""
    """Why the turn in flight was cancelled, if not by /stop (`cancel_turn`)."""


class SessionLanes:
    """Routes each inbound message into its session's lane and runs the lanes (see
    above). Created by `Messaging` (or a test) with the bus, router, store, agent
    and channels; `run()` serves until cancelled."""

    def __init__(
        self,
        *,
        bus: MessageBus,
        router: Router,
        store: SessionStore,
        agent: Agent,
        channels: Mapping[str, ReplySink],
        session_queue: int = 100,
        commands: Commands | None = None,
        hooks: MessageHooks | None = None,
    ) -> None:
        """`commands`: the plugins' slash commands (none without); `hooks`: the
        plugins' message hooks (none without)."""
        self.bus = bus
        self.router = router
        self.store = store
        self.agent = agent
        self.channels = channels
        self.commands = commands
        self.hooks: MessageHooks = hooks or NoHooks()
        self._session_queue = session_queue
        self._lanes: dict[str, _Lane] = {}
        self._tg: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            tg.create_task(self._inbound(), name="bus inbound")
            tg.create_task(self._stops(), name="bus stops")
            tg.create_task(self._outbound(), name="bus outbound")
            if self.store.fsync == "interval":
                tg.create_task(self.store.flush_periodically(), name="session fsync")

    def lanes(self) -> int:
        """Sessions with work right now (for stats and tests)."""
        return len(self._lanes)

    # -- inbound ---------------------------------------------------------------

    async def _inbound(self) -> None:
        while True:
            msg = await self.bus.inbound.get()
            if msg.is_stop():  # put on the queue directly rather than submitted
                route = self._route(msg)
                if route is not None:
                    await self._stop(msg, route)
                continue
            self._admit(msg)

    async def _stops(self) -> None:
        """`/stop` has its own way in, so that neither a full gateway nor a long
        inbound queue holds it back."""
        while True:
            msg = await self.bus.stops.get()
            route = self._route(msg)
            if route is not None:
                await self._stop(msg, route)

    def _route(self, msg: InboundMessage) -> Route | None:
        try:
            return msg.route or self.router.resolve(msg.source, agent_override=msg.agent_override)
        except Exception as e:  # a router bug must cost this message only
            logger.exception("routing failed for {}", msg.id)
            self._refuse(msg, ClawsupError(f"routing failed: {e}"))
            return None

    def _admit(self, msg: InboundMessage) -> None:
        """Give the message to its session's lane, or refuse it now. Synchronous on
        purpose: the count checked is the count updated, whatever arrives next."""
        route = self._route(msg)
        if route is None:
            return
        try:
            command = self.commands.parse(msg) if self.commands is not None else None
        except Exception as e:  # as a router bug: this message only
            logger.exception("reading the command of {} failed", msg.id)
            self._refuse(msg, ClawsupError(f"reading the command failed: {e}"))
            return
        lane = self._lane(route.session_key)
        # The gateway's own messages (a subagent's report, `route` set) are bounded
        # by the subagent limits and must reach the session: they are not refused.
        if msg.route is None and lane.held > self._session_queue:
            self._refuse(
                msg,
                SessionBusy(
                    f"session {route.session_key} is busy: a turn is running and {lane.held - 1} message{'s are' if lane.held != 2 else ' is'} "
                    f"waiting behind it (bus.sessionQueue is {self._session_queue}); this one was not kept, try again shortly"
                ),
            )
            return
        lane.held += 1
        lane.unwritten.put_nowait((msg, route, command))

    def _lane(self, key: str) -> _Lane:
        lane = self._lanes.get(key)
        if lane is None or lane.closing or lane.task is None or lane.task.done():
            lane = _Lane(key)
            assert self._tg is not None
            lane.task = self._tg.create_task(self._guard_lane(lane), name=f"session {key}")
            self._lanes[key] = lane
        return lane

    def _refuse(self, msg: InboundMessage, e: Exception) -> None:
        self.bus.release(msg)
        _fail(msg, e)

    def _done(self, lane: _Lane, msg: InboundMessage) -> None:
        """One of the lane's messages is finished with (answered or refused); the
        last one ends the lane."""
        self.bus.release(msg)
        lane.held -= 1
        if lane.held == 0 and not lane.closing:
            lane.closing = True
            lane.unwritten.put_nowait(None)
            lane.written.put_nowait(None)
            if self._lanes.get(lane.key) is lane:
                del self._lanes[lane.key]

    async def _guard_lane(self, lane: _Lane) -> None:
        """A bug in one session's lane must cost that session only."""
        try:
            await self._run_lane(lane)
        except Exception:
            logger.exception("{}: session lane failed; its waiting messages are refused", lane.key)
            lane.closing = True
            for q in (lane.unwritten, lane.written):
                while not q.empty():
                    item = q.get_nowait()
                    if item is not None:
                        self._refuse(item[0], ClawsupError("the session failed; see the supervisor log"))
            if self._lanes.get(lane.key) is lane:
                del self._lanes[lane.key]

    async def _run_lane(self, lane: _Lane) -> None:
        """Write each message to the session as it comes (acknowledging it) while the
        turns run one at a time, in order, in this task. Ends when the lane has
        nothing left (see `_done`)."""

        async def write() -> None:
            while (item := await lane.unwritten.get()) is not None:
                msg, route, command = item
                record = _record("command" if command is not None else msg.role, msg, route)
                if command is not None:
                    record["command"] = command.name
                try:
                    await self.store.append(route.session_key, record)
                except OSError as e:
                    logger.error("{}: cannot write the session: {}", route.session_key, e)
                    _fail(msg, ClawsupError(f"the message could not be stored: {e}"))
                    self._done(lane, msg)
                    continue
                except BaseException:
                    # The lane ends (its group failed or is cancelled) with this
                    # message in hand: refused, and its place in the bus given back,
                    # never left waiting for an answer that cannot come.
                    self._refuse(msg, ClawsupError("the session failed; see the supervisor log"))
                    raise
                if not msg.accepted.done():
                    msg.accepted.set_result(route)
                if msg.role == "user":
                    self._received(msg, route, command)
                lane.written.put_nowait(item)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(write(), name=f"session {lane.key} write")
            while (item := await lane.written.get()) is not None:
                try:
                    await self._turn(lane, *item)
                finally:
                    self._done(lane, item[0])

    async def _turn(self, lane: _Lane, msg: InboundMessage, route: Route, command: Invocation | None) -> None:
        """The message's turn: the agent's, or the plugin command's it asks for; then
        its answer, through `message_sending`, kept and sent."""

        async def progress(text: str) -> None:
            if msg.outcome is None:  # whoever waits for the outcome delivers, not us
                await self._send(msg, route, text, progress=True, final=False)

        if msg.outcome is not None and msg.outcome.done():
            return  # its waiter gave up on it (a cron run's timeout) before its turn came
        t0 = time.monotonic()
        failed = False
        lane.turn = asyncio.ensure_future(self._command(command, msg, route) if command is not None else self.agent.turn(route, msg, progress))
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
            failed = True
        finally:
            lane.turn = lane.turn_of = None
            stop_reason, lane.stop_reason = lane.stop_reason, ""
        if reply is None:
            what = f"command /{command.name}" if command is not None else "turn"
            why = stop_reason or "by /stop"
            await self._keep(route, {"role": "system", "text": f"{what} stopped {why}", "inReplyTo": msg.id, "ts": time.time()})
            if msg.outcome is not None:
                _settle(msg, TurnOutcome(text="", record={}, stopped=why))
                return
            await self._send(msg, route, "stopped.", final=True)
            return
        answer = reply if isinstance(reply, Answer) else Answer(reply)
        sent = await self._sending(msg, route, answer.text)
        record: dict[str, Any] = {
            "role": "command_reply" if command is not None else "assistant",
            "agentId": route.agent_id,
            "text": answer.text,
            "inReplyTo": msg.id,
            "ts": time.time(),
            "turnS": round(time.monotonic() - t0, 4),
            **answer.record,
        }
        if sent is None:
            record["withheld"] = "message_sending"
        elif sent != answer.text:
            record["sent"] = sent
        await self._keep(route, record)
        if msg.outcome is not None:
            _settle(msg, TurnOutcome(text=sent or "", record=answer.record, withheld=sent is None, failed=failed))
            return
        await self._send(msg, route, WITHHELD if sent is None else sent, final=True)

    def cancel_turn(self, message_id: str, reason: str) -> bool:
        """Cancel the turn of message `message_id` if it is in flight (as `/stop`
        does, with `reason` in the session: "because its cron run timed out").
        Whether it was."""
        for lane in self._lanes.values():
            if lane.turn_of is not None and lane.turn_of.id == message_id and lane.turn is not None and not lane.turn.done():
                lane.stop_reason = reason
                lane.turn.cancel()
                return True
        return False

    async def _command(self, command: Invocation, msg: InboundMessage, route: Route) -> Answer:
        assert self.commands is not None, "only a lane with commands parses one"
        said = await self.commands.run(command, msg, route)
        return Answer(said.text, {"command": command.name, "plugin": said.plugin, "outcome": said.outcome})

    async def _sending(self, msg: InboundMessage, route: Route, text: str) -> str | None:
        """The final answer as the `message_sending` hooks leave it; None: withheld.
        A failure of the hooks themselves (a bug: each hook's own failure is theirs
        to judge) costs the hooks, not the answer."""
        target = msg.reply_to
        try:
            return await self.hooks.message_sending(
                text, channel=target.channel, peer_kind=target.peer.kind, peer_id=target.peer.id, session=route.session_key, agent=route.agent_id
            )
        except Exception:
            logger.exception("{}: the message_sending hooks failed; the answer is sent as it was", route.session_key)
            return text

    def _received(self, msg: InboundMessage, route: Route, command: Invocation | None) -> None:
        """`message_received`, for a user's message now in its session."""
        src = msg.source
        event: dict[str, Any] = {
            "content": msg.text,
            "channel": msg.reply_to.channel,
            "accountId": route.account_id,
            "from": {"kind": src.peer.kind, "id": src.peer.id},
            "senderId": msg.sender_id,
            "threadId": src.thread_id,
            "messageId": msg.id,
            "sessionKey": route.session_key,
            "agentId": route.agent_id,
        }
        if command is not None:
            event["command"] = command.name
        try:
            self.hooks.observe("message_received", event)
        except Exception:
            logger.exception("{}: the message_received hooks failed", route.session_key)

    async def _keep(self, route: Route, record: dict[str, Any]) -> None:
        """A turn's outcome into its session. A store that fails (a full disk) costs
        the record, said in the log, not the reply nor the session's lane."""
        try:
            await self.store.append(route.session_key, record)
        except OSError as e:
            logger.error("{}: cannot write the session, the {} record is lost: {}", route.session_key, record.get("role"), e)

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
                out.settle(ClawsupError(f"channel {out.target.channel!r} is not running"))
                continue
            try:
                await channel.send(out)
            except Exception as e:
                logger.exception("channel {} failed to deliver a reply", out.target.channel)
                out.settle(ClawsupError(f"channel {out.target.channel} failed: {type(e).__name__}: {e}"))


def _record(role: RecordRole, msg: InboundMessage, route: Route) -> dict[str, Any]:
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


def _settle(msg: InboundMessage, outcome: TurnOutcome) -> None:
    if msg.outcome is not None and not msg.outcome.done():
        msg.outcome.set_result(outcome)


def _fail(msg: InboundMessage, e: Exception) -> None:
    if not msg.accepted.done():
        msg.accepted.set_exception(e)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return bool(task and task.cancelling())
