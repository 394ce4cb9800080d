"""The session lanes (supervisor/messages/lanes.py) and the session store in process (no sandbox involved): lanes that
end with their work, per-session and gateway-wide backpressure with messages that
arrive in separate loop ticks, `/stop` past a full gateway, session files closed
least-recently-used, and a torn session file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from clawsup.supervisor.messages.bus import GatewayBusy, InboundMessage, MessageBus, ReplyTarget
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.messages.lanes import PlaceholderAgent, SessionBusy, SessionLanes
from clawsup.supervisor.messages.routing import Peer, RouteInput, Router
from clawsup.supervisor.messages.session_store import SessionStore, read_session


class Collect:
    def __init__(self) -> None:
        self.got: asyncio.Queue = asyncio.Queue()

    async def send(self, out) -> None:  # noqa: ANN001
        await self.got.put(out)

    async def final_for(self, msg: InboundMessage, timeout: float = 5) -> str:
        """The final reply to `msg` (others are kept for their own waiters)."""
        others = []
        try:
            while True:
                out = await asyncio.wait_for(self.got.get(), timeout)
                if out.in_reply_to == msg.id and out.final:
                    return out.text
                others.append(out)
        finally:
            for o in others:
                self.got.put_nowait(o)


def message(peer: str, text: str) -> InboundMessage:
    p = Peer.of("direct", peer)
    return InboundMessage(
        source=RouteInput(channel="test", peer=p), text=text, reply_to=ReplyTarget(channel="test", account_id="default", peer=p, conversation="c")
    )


def session_file(root: Path, peer: str) -> Path:
    return root / f"agent%3Amain%3Adirect%3A{peer}.jsonl"


async def started(tmp_path: Path, *, inbound: int = 1000, **kw):  # noqa: ANN201
    cfg = ClawsupConfig.model_validate({"session": {"dmScope": "per-peer"}})
    bus = MessageBus(inbound_capacity=inbound)
    chan = Collect()
    d = SessionLanes(bus=bus, router=Router(cfg), store=SessionStore(tmp_path, fsync="never"), agent=PlaceholderAgent(), channels={"test": chan}, **kw)
    return bus, chan, d


async def outcome(msg: InboundMessage) -> str:
    try:
        await asyncio.wait_for(msg.accepted, 5)
    except SessionBusy:
        return "busy"
    return "accepted"


async def test_a_lane_ends_with_its_work_and_the_next_message_opens_a_new_one(tmp_path: Path) -> None:
    bus, chan, d = await started(tmp_path)
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(d.run())
        first = message("a", "one")
        await bus.submit(first)
        await first.accepted
        lane_task = d._lanes["agent:main:direct:a"].task
        assert (await chan.final_for(first)).endswith("one")
        await asyncio.wait_for(lane_task, 5)  # no idle timer: it ends with its last turn
        assert d.lanes() == 0 and bus.held == 0
        second = message("a", "two")
        await bus.submit(second)
        await asyncio.wait_for(second.accepted, 5)
        assert (await chan.final_for(second)).endswith("two")
        run.cancel()
    recs = read_session(session_file(tmp_path, "a"))
    assert [r["text"] for r in recs if r["role"] == "user"] == ["one", "two"]


async def test_a_full_session_refuses_only_itself_however_the_messages_arrive(tmp_path: Path) -> None:
    bus, chan, d = await started(tmp_path, session_queue=2)
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(d.run())
        slow = message("busy", "/sleep 30")
        await bus.submit(slow)
        await slow.accepted
        # One message per loop tick, each one's fate known before the next is sent:
        # the bound must hold across ticks, not only within one.
        results = []
        sent = []
        for i in range(10):
            m = message("busy", f"queued {i}")
            sent.append(m)
            await bus.submit(m)
            results.append(await outcome(m))
        assert results == ["accepted"] * 2 + ["busy"] * 8
        with pytest.raises(SessionBusy, match=r"agent:main:direct:busy is busy: a turn is running and 2 messages are waiting .*bus\.sessionQueue is 2"):
            sent[-1].accepted.result()
        other = message("calm", "hello")
        await bus.submit(other)
        await asyncio.wait_for(other.accepted, 5)
        # Refused messages count for nothing: the gateway holds the turn, two
        # waiting, and the other session's.
        assert bus.held <= 4
        # /stop still reaches the busy session; the two waiting ones then run.
        stop = message("busy", "/stop")
        await bus.submit(stop)
        assert await chan.final_for(stop) == "stopping the turn in flight."
        assert (await chan.final_for(sent[1])).endswith("queued 1")
        run.cancel()
    texts = [r["text"] for r in read_session(session_file(tmp_path, "busy")) if r["role"] == "user"]
    assert texts == ["/sleep 30", "queued 0", "queued 1"]  # nothing of the refused ones was written


async def test_the_gateway_bound_refuses_at_once_and_stop_still_gets_through(tmp_path: Path) -> None:
    bus, chan, d = await started(tmp_path, inbound=3)
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(d.run())
        slow = [message(f"p{i}", "/sleep 30") for i in range(3)]
        for m in slow:
            await bus.submit(m)
            await asyncio.wait_for(m.accepted, 5)
        late = message("p9", "hello")
        with pytest.raises(GatewayBusy, match=r"holds 3 messages not yet answered \(bus\.inboundCapacity is 3\)"):
            await asyncio.wait_for(bus.submit(late), 1)  # refused, never waited for
        assert not late.accepted.done() and bus.held == 3
        stop = message("p0", "/stop")
        await asyncio.wait_for(bus.submit(stop), 1)
        assert await chan.final_for(stop) == "stopping the turn in flight."
        assert await chan.final_for(slow[0]) == "stopped."
        # The stopped turn released its place: a new message is taken again.
        retry = message("p9", "hello again")
        await bus.submit(retry)
        assert (await chan.final_for(retry)).endswith("hello again")
        run.cancel()
    assert not session_file(tmp_path, "p9").read_text().count('"hello"')


async def test_session_files_are_closed_least_recently_used(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, fsync="interval", interval_s=60, max_open=4)

    def open_here() -> int:
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
            except OSError:
                pass
        return n

    await asyncio.gather(*(store.append(f"k{i}", {"role": "user", "text": f"m{i}"}) for i in range(40)))
    for i in range(40):
        await store.append(f"k{i}", {"role": "user", "text": f"again {i}"})
    assert store.open_files() <= 4 and open_here() <= 4
    assert len(store._dirty) <= 4  # a closed file was forced to disk and forgotten
    for i in range(40):
        assert [r["text"] for r in read_session(store.path(f"k{i}"))] == [f"m{i}", f"again {i}"]
    store.close()
    assert open_here() == 0


def test_a_torn_tail_is_kept_aside_and_cut(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, fsync="always")
    path = store.path("agent:main:main")
    path.write_bytes(b'{"role":"user","text":"whole"}\n{"role":"user","te')
    assert [r["text"] for r in read_session(path)] == ["whole"]  # readers skip it

    async def append() -> None:
        await store.append("agent:main:main", {"role": "user", "text": "next"})

    asyncio.run(append())
    store.close()
    assert path.read_bytes() == b'{"role":"user","text":"whole"}\n{"role":"user","text":"next"}\n'
    [aside] = tmp_path.glob("*.torn-*")
    assert aside.read_bytes() == b'{"role":"user","te'


def test_a_tail_read_takes_whole_records_only(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    lines = [f'{{"role":"user","text":"{i:04d}"}}\n'.encode() for i in range(100)]
    path.write_bytes(b"".join(lines))
    tail = read_session(path, max_bytes=len(lines[0]) * 10 + 5)  # ten records and a piece
    assert [r["text"] for r in tail] == [f"{i:04d}" for i in range(90, 100)]


async def test_interval_fsync_flushes_what_was_written(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, fsync="interval", interval_s=60)
    await store.append("k", {"role": "user", "text": "x"})
    assert store._dirty  # written, not yet forced
    await store.flush()  # what the periodic task does every interval
    assert not store._dirty
    assert read_session(store.path("k")) == [{"role": "user", "text": "x"}]
    store.close()


async def test_watches_leave_nothing_behind_and_a_slow_one_holds_a_bounded_backlog() -> None:
    from clawsup.supervisor.messages.bus import OutboundMessage
    from clawsup.supervisor.messages.channels import WATCH_BACKLOG, Conversations, who

    conv = Conversations(MessageBus())
    targets = [ReplyTarget(channel="test", account_id="default", peer=Peer.of("direct", f"u{i}")) for i in range(500)]
    for t in targets:
        with conv.watching(who(t)):
            pass
    assert conv._watchers == {}  # one entry per user who ever watched would grow forever
    with conv.watching(who(targets[0])) as q:
        for i in range(WATCH_BACKLOG * 3):
            await conv.deliver(OutboundMessage(target=targets[0], text=f"r{i}", session_key="s", agent_id="main", in_reply_to=f"m{i}"))
        assert q.qsize() == WATCH_BACKLOG
        assert q.get_nowait().text == f"r{WATCH_BACKLOG * 2}"  # the newest kept, the oldest dropped


class FailingStore(SessionStore):
    """A store whose disk fills up for the turns' answers (the assistant record)."""

    async def append(self, key: str, record: dict) -> None:  # type: ignore[override]
        if record.get("role") == "assistant":
            raise OSError(28, "No space left on device")
        await super().append(key, record)


async def test_a_store_that_fails_for_an_answer_costs_the_record_not_the_session(tmp_path: Path) -> None:
    """A full disk when the answer is kept: the reply still goes out, the messages
    queued behind it are still answered, and nothing stays held in the bus (a lane
    that failed here used to leak the message it was writing, for good)."""
    cfg = ClawsupConfig.model_validate({"session": {"dmScope": "per-peer"}})
    bus = MessageBus(inbound_capacity=10)
    chan = Collect()
    d = SessionLanes(bus=bus, router=Router(cfg), store=FailingStore(tmp_path, fsync="never"), agent=PlaceholderAgent(), channels={"test": chan})
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(d.run())
        msgs = [message("a", f"n{i}") for i in range(3)]
        for m in msgs:
            await bus.submit(m)
        for m in msgs:
            assert (await chan.final_for(m)).endswith(m.text)
        await asyncio.wait_for(_until_no_lanes(d), 5)
        assert bus.held == 0
        run.cancel()


async def _until_no_lanes(d: SessionLanes) -> None:
    while d.lanes():
        await asyncio.sleep(0.01)
