"""From inbound message to reply, end to end against a running supervisor: both
channels (cli through `clawsup chat`, http with server-sent events), per-session
order, concurrency between sessions, `/stop`, and durability across `kill -9`."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.supervisor.messages.session_store import file_name, read_session
from tests.conftest import Gateway, make_config
from tests.helpers.sse import read_events

TOKEN = "test-token-0123456789"


def messaging_config(**overrides: Any) -> dict[str, Any]:
    cfg = make_config(**overrides)
    cfg["agents"]["list"] = [{"id": "main", "default": True}, {"id": "work"}]
    cfg["bindings"] = [{"agentId": "work", "match": {"channel": "http", "peer": {"kind": "direct", "id": "boss"}}}]
    cfg["session"] = {"dmScope": "per-channel-peer"}
    cfg["channels"] = {"http": {"enabled": True, "port": 0, "token": TOKEN}}
    return cfg


def http_port(gw: Gateway) -> int:
    return int((gw.state / "run" / "http.port").read_text())


def post(gw: Gateway, body: dict[str, Any], token: str = TOKEN, timeout: float = 60) -> Iterator[tuple[str, dict[str, Any]]]:
    """POST a message; yield the server-sent events (event, data) as they come."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port(gw), timeout=timeout)
    try:
        conn.request("POST", "/v1/messages", json.dumps(body), {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            yield "http", {"status": resp.status, **json.loads(resp.read())}
            return
        yield from read_events(resp)
    finally:
        conn.close()


def say(gw: Gateway, peer: str, text: str, **extra: Any) -> list[tuple[str, dict[str, Any]]]:
    return list(post(gw, {"text": text, "peer": {"kind": "direct", "id": peer}, **extra}))


def first_line(text: str) -> str:
    return text.splitlines()[0]


def session(gw: Gateway, key: str) -> list[dict[str, Any]]:
    return read_session(gw.state / "sessions" / file_name(key))


@pytest.fixture
def gw(gateway_factory: Any) -> Gateway:
    return gateway_factory(messaging_config())


def test_http_channel_end_to_end(gw: Gateway) -> None:
    events = say(gw, "boss", "status report please")
    assert [e for e, _ in events] == ["ack", "reply"]
    ack = events[0][1]
    assert (ack["agentId"], ack["matchedBy"], ack["sessionKey"], ack["accountId"]) == ("work", "binding.peer", "agent:work:http:direct:boss", "default")
    assert first_line(events[1][1]["text"]) == "[work] received in agent:work:http:direct:boss: status report please"
    recs = session(gw, "agent:work:http:direct:boss")
    assert [(r["role"], r["text"]) for r in recs][0] == ("user", "status report please")
    assert recs[1]["role"] == "assistant" and recs[1]["inReplyTo"] == ack["messageId"]
    # Threads get their own key; the account is normalised.
    events = say(gw, "carol", "in a thread", threadId="T-7", accountId=" Default ")
    assert events[0][1]["sessionKey"] == "agent:main:http:direct:carol:thread:t-7"


def test_http_channel_refuses_bad_requests(gw: Gateway) -> None:
    [(kind, data)] = list(post(gw, {"text": "x", "peer": {"kind": "direct", "id": "a"}}, token="wrong-token-0123456789"))
    assert kind == "http" and data["status"] == 401
    [(kind, data)] = list(post(gw, {"text": "x", "peer": {"kind": "robot", "id": "a"}, "channel": "discord"}))
    assert data["status"] == 400 and "peer.kind" in data["error"] and "channel" in data["error"]


def test_cli_channel_end_to_end(gw: Gateway) -> None:
    r = gw.cli("chat", "--peer", "Ann", "-m", "hello", "-m", "/sleep 0.2", "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    acks = [x["ack"] for x in lines if "ack" in x]
    assert acks[0] == {"agentId": "main", "matchedBy": "default", "sessionKey": "agent:main:cli:direct:ann", "mainSessionKey": "agent:main:main", "accountId": "default"}
    assert [x for x in lines if "progress" in x] == [{"progress": "working for 0.2 s…"}]
    assert [first_line(x["reply"]) for x in lines if "reply" in x] == ["[main] received in agent:main:cli:direct:ann: hello", "[main] slept 0.2 s in agent:main:cli:direct:ann"]
    # The operator's channel may name the agent.
    r = gw.cli("chat", "--agent", "work", "-m", "hi")
    assert "[work] received in agent:work:cli:direct:" in r.stdout


def test_replies_go_back_where_each_message_came_from(gateway_factory: Any) -> None:
    cfg = messaging_config()
    cfg["session"] = {"dmScope": "main"}  # one session for every direct message
    gw = gateway_factory(cfg)
    via_http = say(gw, "dave", "over http")
    via_cli = gw.cli("chat", "--peer", "dave", "-m", "over the cli")
    assert via_http[0][1]["sessionKey"] == "agent:main:main"
    assert first_line(via_http[-1][1]["text"]).endswith("over http")
    assert "over the cli\n" in via_cli.stdout
    texts = [r["text"] for r in session(gw, "agent:main:main") if r["role"] == "user"]
    assert texts == ["over http", "over the cli"]


def test_slow_turn_holds_only_its_own_session_and_stop_cancels_it(gw: Gateway) -> None:
    slow: list[tuple[float, str, dict[str, Any]]] = []
    acked = threading.Event()

    def slow_session() -> None:
        for event, data in post(gw, {"text": "/sleep 30", "peer": {"kind": "direct", "id": "slowpoke"}}):
            slow.append((time.monotonic(), event, data))
            if event == "ack":
                acked.set()

    t = threading.Thread(target=slow_session)
    t.start()
    assert acked.wait(10)
    t0 = time.monotonic()
    other = say(gw, "speedy", "are you there?")
    assert first_line(other[-1][1]["text"]).endswith("are you there?")
    assert time.monotonic() - t0 < 2.0, "another session waited for the slow turn"
    assert t.is_alive()
    # /stop on the slow session ends its turn, now.
    stop = say(gw, "slowpoke", "/stop")
    assert stop[-1][1]["text"] == "stopping the turn in flight."
    t.join(10)
    assert not t.is_alive()
    assert [e for _, e, _ in slow] == ["ack", "progress", "reply"]
    assert slow[-1][2]["text"] == "stopped."
    assert slow[-1][0] - t0 < 10
    recs = session(gw, "agent:main:http:direct:slowpoke")
    assert recs[-1]["role"] == "system" and recs[-1]["text"] == "turn stopped by /stop"
    assert "agent:main:http:direct:slowpoke: turn stopped by /stop" in gw.supervisor_log()
    # The session goes on afterwards.
    assert first_line(say(gw, "slowpoke", "still with me?")[-1][1]["text"]).endswith("still with me?")


def test_one_session_is_processed_strictly_in_order(gw: Gateway) -> None:
    n = 12
    replies: dict[int, str] = {}
    threads = []
    for i in range(n):
        acked = threading.Event()
        # Slow and quick turns alternate: a later quick one must still wait its turn.
        text = f"/sleep 0.{(i % 3) * 2}" if i % 2 == 0 else f"msg {i}"

        def send(i: int = i, text: str = text, acked: threading.Event = acked) -> None:
            for event, data in post(gw, {"text": text, "peer": {"kind": "direct", "id": "orderly"}}):
                if event == "ack":
                    acked.set()
                elif event == "reply":
                    replies[i] = data["inReplyTo"]

        th = threading.Thread(target=send)
        th.start()
        threads.append(th)
        assert acked.wait(10)  # the next one is sent after this one is in the session
    for th in threads:
        th.join(30)
    recs = session(gw, "agent:main:http:direct:orderly")
    user_ids = [r["id"] for r in recs if r["role"] == "user"]
    answered = [r["inReplyTo"] for r in recs if r["role"] == "assistant"]
    assert len(user_ids) == n and answered == user_ids
    assert [replies[i] for i in range(n)] == user_ids


def test_acknowledged_messages_survive_kill_9(gateway_factory: Any, state_dir: Path) -> None:
    gw = gateway_factory(messaging_config())
    acked: list[tuple[str, str]] = []
    lock = threading.Lock()
    go = threading.Event()
    under_way = threading.Event()

    def sender(s: int) -> None:
        go.wait()
        for k in range(1000):
            text = f"s{s} message {k}"
            try:
                for event, data in post(gw, {"text": text, "peer": {"kind": "direct", "id": f"peer{s}"}}, timeout=10):
                    if event == "ack":
                        with lock:
                            acked.append((data["sessionKey"], text))
                            if len(acked) >= 150:
                                under_way.set()
            except (OSError, http.client.HTTPException, ValueError):
                return

    threads = [threading.Thread(target=sender, args=(s,)) for s in range(16)]
    for t in threads:
        t.start()
    go.set()
    assert under_way.wait(60), "the burst never got going"  # well under way, across every session
    gw.proc.kill()
    gw.proc.wait(10)
    for t in threads:
        t.join(30)
    assert len({key for key, _ in acked}) == 16

    # A crash can also tear a line: make one, as a write cut short would.
    key0 = "agent:main:http:direct:peer0"
    torn_file = state_dir / "sessions" / file_name(key0)
    with open(torn_file, "ab") as f:
        f.write(b'{"role":"user","id":"m-torn","text":"half a rec')
    before = len(read_session(torn_file))

    gw2 = Gateway(state_dir, messaging_config(), [])
    try:
        stored: dict[str, set[str]] = {}
        for key, text in acked:
            if key not in stored:
                stored[key] = {r["text"] for r in read_session(state_dir / "sessions" / file_name(key)) if r["role"] == "user"}
            assert text in stored[key], f"acknowledged {text!r} is missing from {key}"
        # The torn session takes new messages on a clean line, and loses nothing.
        assert first_line(say(gw2, "peer0", "after the crash")[-1][1]["text"]).endswith("after the crash")
        recs = read_session(torn_file)
        assert len(recs) == before + 2 and recs[-2]["text"] == "after the crash"
        assert list(torn_file.parent.glob(torn_file.name + ".torn-*"))
        assert "its last line was torn" in gw2.supervisor_log()
    finally:
        gw2.stop()


def test_a_port_in_use_stops_the_start_with_a_clear_error(gateway_factory: Any) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = messaging_config()
        cfg["channels"]["http"]["port"] = taken.getsockname()[1]
        with pytest.raises(AssertionError, match=r"channels\.http: cannot listen on 127\.0\.0\.1:\d+"):
            gateway_factory(cfg)


def test_openclaw_sections_load_unchanged_and_unused_keys_are_named(gateway_factory: Any) -> None:
    cfg = messaging_config()
    cfg["agents"]["list"][1]["identity"] = {"name": "Worker", "emoji": "🛠"}
    cfg["session"]["reset"] = {"mode": "daily"}
    cfg["gateway"] = {"port": 18789}
    gw = gateway_factory(cfg)
    log = gw.supervisor_log()
    assert "config keys clawsup does not use" in log
    for key in ("agents.list[1].identity", "session.reset", "gateway"):
        assert key in log
    assert say(gw, "boss", "hi")[0][1]["agentId"] == "work"


def test_stopping_the_gateway_ends_open_conversations_at_once(gw: Gateway) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    working = threading.Event()

    def talk() -> None:
        for event, data in post(gw, {"text": "/sleep 60", "peer": {"kind": "direct", "id": "late"}}):
            events.append((event, data))
            if event == "progress":
                working.set()

    t = threading.Thread(target=talk)
    t.start()
    assert working.wait(10)
    t0 = time.monotonic()
    assert gw.stop() == 0
    t.join(10)
    assert time.monotonic() - t0 < 10
    assert events[-1][0] == "error" and "shutting down" in events[-1][1]["message"]
    # What was acknowledged is in the session even though its turn never finished.
    assert [r["text"] for r in session(gw, "agent:main:http:direct:late")] == ["/sleep 60"]


def test_a_busy_session_refuses_past_its_bound_with_429(gateway_factory: Any) -> None:
    """50 clients post at once to a session whose turn is running: exactly
    `bus.sessionQueue` are taken, every other one gets 429 with Retry-After, and
    none of those is written to the session. The cli gets `session_busy`, and
    `/stop` still gets through."""
    cfg = messaging_config()
    cfg["session"] = {"dmScope": "main"}  # every direct message, http or cli, in one session
    cfg["bus"] = {"sessionQueue": 5}
    gw = gateway_factory(cfg)
    holder: list[tuple[str, dict[str, Any]]] = []
    working = threading.Event()

    def hold() -> None:
        for event, data in post(gw, {"text": "/sleep 60", "peer": {"kind": "direct", "id": "holder"}}):
            holder.append((event, data))
            if event == "progress":
                working.set()

    t = threading.Thread(target=hold)
    t.start()
    assert working.wait(10)

    n = 50
    lock = threading.Lock()
    acked: list[str] = []
    replied: list[str] = []
    refused: list[tuple[int, str | None, dict[str, Any]]] = []
    decided = threading.Semaphore(0)
    barrier = threading.Barrier(n)

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", http_port(gw), timeout=60)
        conn.connect()
        body = json.dumps({"text": f"burst {i}", "peer": {"kind": "direct", "id": f"client{i}"}})
        barrier.wait(10)
        try:
            conn.request("POST", "/v1/messages", body, {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                with lock:
                    refused.append((resp.status, resp.getheader("Retry-After"), json.loads(resp.read())))
                decided.release()
                return
            for event, data in read_events(resp):
                if event == "ack":
                    with lock:
                        acked.append(f"burst {i}")
                    decided.release()
                elif event == "reply":
                    with lock:
                        replied.append(data["text"])
        finally:
            conn.close()

    clients = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for c in clients:
        c.start()
    for _ in range(n):
        assert decided.acquire(timeout=30), f"only {len(acked) + len(refused)} of {n} posts were answered"
    assert len(acked) == 5 and len(refused) == n - 5
    for status, retry_after, body in refused:
        assert status == 429 and retry_after is not None and int(retry_after) >= 1
        assert body["code"] == "session_busy" and body["retryAfterSeconds"] == int(retry_after)
        assert "agent:main:main is busy" in body["error"] and "try again" in body["error"]

    # The operator's channel, same session: a plain message and a non-zero exit.
    r = gw.cli("chat", "--peer", "ops", "-m", "from the cli")
    assert r.returncode != 0
    assert "agent:main:main is busy" in r.stderr and "try again" in r.stderr, r.stderr
    r = gw.cli("chat", "--peer", "ops", "-m", "from the cli", "--json")
    assert r.returncode != 0 and json.loads(r.stdout.splitlines()[-1])["error"]["code"] == "session_busy"

    # /stop gets through the full session; then the five waiting ones are answered.
    assert say(gw, "holder", "/stop")[-1][1]["text"] == "stopping the turn in flight."
    t.join(10)
    assert holder[-1] == ("reply", holder[-1][1]) and holder[-1][1]["text"] == "stopped."
    for c in clients:
        c.join(30)
    assert sorted(first_line(x).rsplit(": ", 1)[1] for x in replied) == sorted(acked)
    users = [r["text"] for r in session(gw, "agent:main:main") if r["role"] == "user"]
    assert users[0] == "/sleep 60" and sorted(users[1:]) == sorted(acked)  # no refused one was written
    assert "from the cli" not in users


def test_a_full_gateway_refuses_with_429_and_stop_still_gets_through(gateway_factory: Any) -> None:
    cfg = messaging_config()
    cfg["bus"] = {"inboundCapacity": 2}
    gw = gateway_factory(cfg)
    working = {p: threading.Event() for p in ("a", "b")}
    ends: dict[str, str] = {}

    def hold(peer: str) -> None:
        for event, data in post(gw, {"text": "/sleep 60", "peer": {"kind": "direct", "id": peer}}):
            if event == "progress":
                working[peer].set()
            elif event == "reply":
                ends[peer] = data["text"]

    threads = [threading.Thread(target=hold, args=(p,)) for p in working]
    for th in threads:
        th.start()
    assert all(w.wait(10) for w in working.values())
    # A third session, on either channel: refused at once, not left waiting.
    t0 = time.monotonic()
    [(kind, data)] = say(gw, "c", "let me in")
    assert kind == "http" and data["status"] == 429 and data["code"] == "gateway_busy"
    assert "bus.inboundCapacity is 2" in data["error"] and time.monotonic() - t0 < 5
    r = gw.cli("chat", "--peer", "ops", "-m", "me too")
    assert r.returncode != 0 and "the gateway is busy" in r.stderr
    # /stop is never refused, full or not.
    assert say(gw, "a", "/stop")[-1][1]["text"] == "stopping the turn in flight."
    threads[0].join(10)
    assert ends["a"] == "stopped."
    assert first_line(say(gw, "c", "let me in")[-1][1]["text"]).endswith("let me in")
    assert [r["text"] for r in session(gw, "agent:main:http:direct:c") if r["role"] == "user"] == ["let me in"]
    assert say(gw, "b", "/stop")[-1][1]["text"] == "stopping the turn in flight."
    threads[1].join(10)
