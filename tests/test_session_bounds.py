"""What the gateway holds does not grow with the number of sessions: 2,000 peers each
send a message to a real gateway (offline model, http channel), and afterwards its
open descriptors and asyncio tasks are back within a small constant of before, its
open session files within `sessionStore.maxOpenFiles`, and every message was
answered. Lanes end with their work, session files are closed least-recently-used,
histories are kept for a bounded number of sessions (supervisor/messages/lanes.py,
supervisor/messages/session_store.py, supervisor/agents/loop.py)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import aiohttp
import pytest

from tests.conftest import Gateway, make_config

TOKEN = "test-token-0123456789"
SESSIONS = 2000
PARALLEL = 24
MAX_OPEN = 16
SLACK = 8
"""Descriptors and tasks that may come and go whatever the load (a control
connection, a worker thread's wakeup pipe, a heartbeat in flight)."""


def bounds_config() -> dict[str, Any]:
    cfg = make_config()
    cfg["session"] = {"dmScope": "per-channel-peer"}
    cfg["channels"] = {"http": {"enabled": True, "port": 0, "token": TOKEN}}
    # `interval`: the test is about what stays open, not about the disk's flush rate.
    cfg["sessionStore"] = {"fsync": "interval", "fsyncIntervalMs": 50, "maxOpenFiles": MAX_OPEN}
    return cfg


def stats(gw: Gateway) -> dict[str, Any]:
    resp = gw.request(op="stats")
    assert resp["ok"], resp
    return resp["data"]


def open_session_files(gw: Gateway) -> int:
    sessions = str(gw.state / "sessions")
    n = 0
    for fd in os.listdir(f"/proc/{gw.proc.pid}/fd"):
        try:
            n += os.readlink(f"/proc/{gw.proc.pid}/fd/{fd}").startswith(sessions)
        except OSError:
            pass  # closed while we looked
    return n


async def talk(port: int, peers: range) -> dict[str, str]:
    """One message from each peer, at most PARALLEL at a time, each on a connection
    of its own; peer -> the reply's text."""
    replies: dict[str, str] = {}
    gate = asyncio.Semaphore(PARALLEL)
    url = f"http://127.0.0.1:{port}/v1/messages"
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def one(session: aiohttp.ClientSession, peer: str) -> None:
        async with gate, session.post(url, json={"text": f"hello from {peer}", "peer": {"kind": "direct", "id": peer}}, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            event = None
            async for raw in resp.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "reply":
                    replies[peer] = json.loads(line[6:])["text"]
                elif line.startswith("data: ") and event == "error":
                    raise AssertionError(f"{peer}: {line}")

    connector = aiohttp.TCPConnector(limit=PARALLEL, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with asyncio.TaskGroup() as tg:
            for i in peers:
                tg.create_task(one(session, f"peer{i:04d}"))
    return replies


def settled(gw: Gateway, before: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
    """The stats once the last connections and lanes have wound down (they end on
    their own, right after the last reply): polled, with a bound."""
    deadline = time.monotonic() + timeout
    while True:
        now = stats(gw)
        if (now["tasks"] <= before["tasks"] + SLACK and now["open_fds"] <= before["open_fds"] + MAX_OPEN + SLACK) or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


@pytest.mark.timeout(240)
def test_two_thousand_sessions_leave_descriptors_and_tasks_flat(gateway_factory: Any) -> None:
    gw = gateway_factory(bounds_config())
    port = int((gw.state / "run" / "http.port").read_text())
    # Warm up what is made once (the worker threads, the provider, a first file).
    assert len(asyncio.run(talk(port, range(SESSIONS, SESSIONS + 5)))) == 5
    before = settled(gw, stats(gw))

    t0 = time.monotonic()
    replies = asyncio.run(talk(port, range(SESSIONS)))
    took = time.monotonic() - t0
    after = settled(gw, before)

    # Every message was answered, each in its own session.
    assert len(replies) == SESSIONS
    for peer, text in replies.items():
        assert text.startswith(f"[main] received in agent:main:http:direct:{peer}: hello from {peer}"), text
    assert len(list((gw.state / "sessions").glob("*.jsonl"))) == SESSIONS + 5
    # Flat: within a constant of before, nowhere near one per session.
    assert after["tasks"] <= before["tasks"] + SLACK, (before, after)
    assert after["open_fds"] <= before["open_fds"] + MAX_OPEN + SLACK, (before, after)
    assert open_session_files(gw) <= MAX_OPEN
    assert took < 90, f"2,000 sessions took {took:.0f} s"
    # The gateway still answers, and a session seen long ago is picked up again
    # (its file reopened, its history read again).
    again = asyncio.run(talk(port, range(1)))
    assert again["peer0000"].startswith("[main] received in agent:main:http:direct:peer0000: hello from peer0000")
