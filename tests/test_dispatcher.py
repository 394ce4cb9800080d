"""The dispatcher and the session store in process (no sandbox involved): lanes that
end when idle, per-session backpressure, and a torn session file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from supervisor import dispatcher as dispatcher_module
from supervisor.bus import InboundMessage, MessageBus, ReplyTarget
from supervisor.config import ClawsupConfig
from supervisor.dispatcher import Dispatcher, PlaceholderAgent, SessionBusy
from supervisor.routing import Peer, RouteInput, Router
from supervisor.session_store import SessionStore, read_session


class Collect:
    def __init__(self) -> None:
        self.got: asyncio.Queue = asyncio.Queue()

    async def send(self, out) -> None:  # noqa: ANN001
        await self.got.put(out)


def message(peer: str, text: str) -> InboundMessage:
    p = Peer.of("direct", peer)
    return InboundMessage(
        source=RouteInput(channel="test", peer=p), text=text, reply_to=ReplyTarget(channel="test", account_id="default", peer=p, conversation="c")
    )


async def started(tmp_path: Path, **kw):  # noqa: ANN201
    cfg = ClawsupConfig.model_validate({"session": {"dmScope": "per-peer"}})
    bus = MessageBus()
    chan = Collect()
    d = Dispatcher(bus=bus, router=Router(cfg), store=SessionStore(tmp_path, fsync="never"), agent=PlaceholderAgent(), channels={"test": chan}, **kw)
    return bus, chan, d


async def test_an_idle_lane_ends_and_the_next_message_opens_a_new_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatcher_module, "LANE_IDLE_S", 0.05)
    bus, chan, d = await started(tmp_path)
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(d.run())
        first = message("a", "one")
        await bus.inbound.put(first)
        await first.accepted
        assert (await asyncio.wait_for(chan.got.get(), 5)).text.endswith("one")
        lane_task = d._lanes["agent:main:direct:a"].task
        await asyncio.wait_for(lane_task, 5)  # idle: it ends by itself
        assert "agent:main:direct:a" not in d._lanes
        second = message("a", "two")
        await bus.inbound.put(second)
        await asyncio.wait_for(second.accepted, 5)
        assert (await asyncio.wait_for(chan.got.get(), 5)).text.endswith("two")
        run.cancel()
    recs = read_session(tmp_path / "agent%3Amain%3Adirect%3Aa.jsonl")
    assert [r["text"] for r in recs if r["role"] == "user"] == ["one", "two"]


async def test_a_full_session_refuses_only_itself(tmp_path: Path) -> None:
    bus, chan, d = await started(tmp_path, session_queue=1)
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(d.run())
        slow = message("busy", "/sleep 30")
        await bus.inbound.put(slow)
        await slow.accepted
        # The turn holds the lane; one more fits in its queue, the next is refused.
        queued, refused, other = message("busy", "q"), message("busy", "r"), message("calm", "hello")
        for m in (queued, refused, other):
            await bus.inbound.put(m)
        with pytest.raises(SessionBusy, match="agent:main:direct:busy"):
            await asyncio.wait_for(refused.accepted, 5)
        await asyncio.wait_for(other.accepted, 5)
        run.cancel()


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


async def test_interval_fsync_flushes_what_was_written(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, fsync="interval", interval_s=60)
    await store.append("k", {"role": "user", "text": "x"})
    assert store._dirty  # written, not yet forced
    await store.flush()  # what the periodic task does every interval
    assert not store._dirty
    assert read_session(store.path("k")) == [{"role": "user", "text": "x"}]
    store.close()
