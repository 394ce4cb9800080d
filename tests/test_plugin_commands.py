"""Plugins' slash commands end to end, against a real gateway and the commander test
plugin (tests/plugins/commander): a command answers without the model, from any
channel; arguments and owner rights are checked before the plugin is asked; a
command that raises, crashes its sandbox or hangs answers with a reason naming the
plugin, a down plugin's at once and a hung one at its deadline, and `/stop` still
works meanwhile; `/stop` itself can never be a plugin's.

Then the message hooks' call sites in the session lanes, in process (the lanes with
the placeholder agent and a recording stand-in for the plugins' hooks; the hooks
themselves, in sandboxes, are tested with supervisor/hooks.py)."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.sandbox.manifest import ManifestError, load_manifest
from clawsup.supervisor.config import ClawsupConfig
from clawsup.supervisor.messages.bus import InboundMessage, MessageBus, OutboundMessage, ReplyTarget
from clawsup.supervisor.messages.lanes import WITHHELD, PlaceholderAgent, SessionLanes
from clawsup.supervisor.messages.owners import Owners
from clawsup.supervisor.messages.routing import Peer, RouteInput, Router
from clawsup.supervisor.messages.session_store import SessionStore, file_name, read_session
from tests.conftest import TEST_PLUGINS, Gateway, make_config, require_bwrap
from tests.helpers.sse import read_events

COMMANDER = TEST_PLUGINS / "commander"
TOKEN = "test-token-0123456789"
DEADLINE_S = 3


def commander_config(backend: str = "process", **entry: Any) -> dict[str, Any]:
    cfg = make_config(sandbox__defaults__backend=backend)
    cfg["plugins"]["load"]["paths"].append(str(COMMANDER))
    cfg["plugins"]["entries"]["commander"] = {"commandTimeoutSeconds": DEADLINE_S, **({"trust": "trusted"} if backend == "process" else {}), **entry}
    cfg["channels"] = {"http": {"enabled": True, "port": 0, "token": TOKEN}}
    cfg["session"] = {"dmScope": "per-channel-peer"}
    cfg["tools"] = {"owners": ["http:boss"]}
    return cfg


@pytest.fixture
def gw(module_gateways: Any) -> Gateway:
    """One gateway for the tests that leave the plugin as they found it."""
    return module_gateways("commander", commander_config())


# -- talking to it -------------------------------------------------------------


def chat(gw: Gateway, text: str, peer: str = "tester") -> str:
    """One message on the cli channel (the operator's: an owner); its reply."""
    r = gw.cli("chat", "--peer", peer, "-m", text, "--json", timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    return [json.loads(x)["reply"] for x in r.stdout.splitlines() if "reply" in json.loads(x)][-1]


def post(gw: Gateway, peer: str, text: str, timeout: float = 60) -> Iterator[tuple[str, dict[str, Any]]]:
    """One message on the http channel; its server-sent events as they come."""
    port = int((gw.state / "run" / "http.port").read_text())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = {"text": text, "peer": {"kind": "direct", "id": peer}}
        conn.request("POST", "/v1/messages", json.dumps(body), {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        yield from read_events(resp)
    finally:
        conn.close()


def say(gw: Gateway, peer: str, text: str) -> str:
    """The final reply over http."""
    events = list(post(gw, peer, text))
    assert [e for e, _ in events][-1] == "reply", events
    return str(events[-1][1]["text"])


def session(gw: Gateway, key: str) -> list[dict[str, Any]]:
    return read_session(gw.state / "sessions" / file_name(key))


# -- tests -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_a_command_answers_without_the_model_and_stays_out_of_its_history(gateway_factory: Any, backend: str) -> None:
    if backend == "bwrap":
        require_bwrap()
    gw = gateway_factory(commander_config(backend))
    assert gw.status("commander")["backend"] == backend
    assert chat(gw, "/ping") == "pong"
    # OpenClaw's `{"text": ...}` answer is its text; the arguments come whole.
    assert chat(gw, "/echo  hello   world ") == "echo: hello   world"
    # What the plugin is told: who, where, and whether an owner (the cli is).
    told = json.loads(chat(gw, "/WhoAmI"))
    assert told == {
        "args": "",
        "channel": "cli",
        "accountId": "default",
        "peerKind": "direct",
        "peerId": "tester",
        "senderId": "tester",
        "isOwner": True,
        "sessionKey": "agent:main:cli:direct:tester",
        "agentId": "main",
    }
    # A `/x` no plugin offers goes to the agent, as before.
    assert chat(gw, "/nosuch thing").startswith("[main] received in agent:main:cli:direct:tester: /nosuch thing")
    recs = session(gw, "agent:main:cli:direct:tester")
    roles = [(r["role"], r.get("command"), r["text"].splitlines()[0]) for r in recs]
    assert roles[:4] == [("command", "ping", "/ping"), ("command_reply", "ping", "pong"), ("command", "echo", "/echo  hello   world "), ("command_reply", "echo", "echo: hello   world")]
    assert recs[1]["plugin"] == "commander" and recs[1]["outcome"] == "answered" and recs[1]["inReplyTo"] == recs[0]["id"]
    assert "turnUsage" not in recs[1]  # no model call
    # The agent's history holds only what went through the model: its user
    # messages; no command and no command's answer.
    assert [r["text"] for r in recs if r["role"] == "user"] == ["/nosuch thing"]
    # The model still answers the session's next message.
    assert chat(gw, "and now?").startswith("[main] received in agent:main:cli:direct:tester: and now?")
    # Over http too, from a sender who is no owner: a command open to all runs.
    assert say(gw, "stranger", "/ping") == "pong"


def test_a_command_that_takes_no_arguments_refuses_them(gw: Gateway) -> None:
    assert chat(gw, "/ping now", peer="args") == "/ping takes no arguments; send /ping alone."
    assert session(gw, "agent:main:cli:direct:args")[-1]["outcome"] == "refused"


def test_an_owner_only_command_runs_for_owners_and_tells_others_why_not(gw: Gateway) -> None:
    assert chat(gw, "/secret", peer="operator") == "the owner's secret"  # the cli's user is an owner
    assert say(gw, "boss", "/secret") == "the owner's secret"  # tools.owners: http:boss
    refused = say(gw, "stranger", "/secret")
    assert refused == (
        "/secret is for this gateway's owners only (plugin 'commander' made it owner-only), and you are not one here. "
        'An operator can name you an owner in tools.owners ("http:stranger").'
    )
    told = json.loads(say(gw, "boss", "/whoami"))
    assert (told["channel"], told["peerId"], told["isOwner"]) == ("http", "boss", True)
    assert json.loads(say(gw, "stranger", "/whoami"))["isOwner"] is False
    # /help lists what this sender may run.
    for_owner = chat(gw, "/help", peer="operator")
    assert "/ping: Answer pong. (plugin 'commander')" in for_owner
    assert "/echo [args]: Say the arguments back. (plugin 'commander')" in for_owner
    assert "/secret: Only for owners. (plugin 'commander', owners only)" in for_owner
    assert "/stop: stop this session's turn in flight" in for_owner
    for_stranger = say(gw, "stranger", "/commands")
    assert "/ping: Answer pong." in for_stranger and "/secret" not in for_stranger


def test_a_failing_command_says_which_plugin_and_what_happened(gw: Gateway) -> None:
    assert chat(gw, "/boom", peer="fails") == "error: command 'boom' of plugin 'commander' raised RuntimeError: boom on purpose"
    assert chat(gw, "/ghost", peer="fails") == "error: plugin 'commander' declares /ghost but does not offer it (see `clawsup plugins show`)."
    assert gw.status("commander")["state"] == "ready"
    assert chat(gw, "/ping", peer="fails") == "pong"


def test_stop_is_never_a_plugins(gw: Gateway, tmp_path: Path) -> None:
    # The plugin API refused /stop at registration...
    assert chat(gw, "/refused", peer="stopper") == "register_command('stop'): /stop belongs to the gateway"
    # ...and /stop is the gateway's.
    assert chat(gw, "/stop", peer="stopper") == "nothing to stop."
    # A manifest may not declare it either.
    folder = tmp_path / "thief"
    folder.mkdir()
    (folder / "clawsup.plugin.json").write_text(json.dumps({"id": "thief", "version": "0.1.0", "entry": "plugin.py", "contracts": {"commands": ["stop"]}}))
    (folder / "plugin.py").write_text("")
    with pytest.raises(ManifestError, match=r"\['/stop'\] belong to the gateway"):
        load_manifest(folder)


def test_a_hung_command_answers_at_its_deadline_and_stop_cancels_it(gw: Gateway) -> None:
    # /stop cancels a hung command now; the session goes on.
    events: list[tuple[float, str, dict[str, Any]]] = []
    acked = threading.Event()

    def hang() -> None:
        for event, data in post(gw, "hanger", "/hang"):
            events.append((time.monotonic(), event, data))
            if event == "ack":
                acked.set()

    t = threading.Thread(target=hang)
    t.start()
    assert acked.wait(10)
    t0 = time.monotonic()
    # The gateway answers meanwhile: another session, and the control socket.
    assert say(gw, "other", "/ping") == "pong"
    assert gw.request(op="status")["ok"]
    assert say(gw, "hanger", "/stop") == "stopping the turn in flight."
    t.join(10)
    assert not t.is_alive()
    assert [e for _, e, _ in events] == ["ack", "reply"] and events[-1][2]["text"] == "stopped."
    assert events[-1][0] - t0 < DEADLINE_S, "/stop waited for the command's deadline"
    recs = session(gw, "agent:main:http:direct:hanger")
    assert (recs[-1]["role"], recs[-1]["text"]) == ("system", "command /hang stopped by /stop")
    # Left alone, it answers at its deadline, naming the plugin.
    t0 = time.monotonic()
    assert say(gw, "hanger", "/hang") == f"error: command 'hang' of plugin 'commander' did not answer within its {DEADLINE_S} s deadline"
    assert DEADLINE_S <= time.monotonic() - t0 < DEADLINE_S + 3
    assert gw.status("commander")["state"] == "ready"
    assert say(gw, "hanger", "/ping") == "pong"


def test_a_command_whose_plugin_is_down_answers_at_once(gateway_factory: Any) -> None:
    # A long backoff: the plugin stays down while the test asks.
    gw = gateway_factory(commander_config(sandbox={"restart": {"backoffInitialSeconds": 60, "backoffMaxSeconds": 60}}))
    t0 = time.monotonic()
    died = say(gw, "crasher", "/crash")
    assert died.startswith("error: command 'crash' of plugin 'commander' failed: its sandbox died during the call"), died
    assert time.monotonic() - t0 < 10
    gw.wait("commander", "backoff")
    t0 = time.monotonic()
    down = say(gw, "crasher", "/ping")
    assert down == "error: /ping belongs to plugin 'commander', which is down (backoff); try again once it is back (`clawsup status`)."
    assert time.monotonic() - t0 < 2, "a down plugin's command waited"
    # Its owner-only command too (whether it is owner-only is the plugin's word,
    # unknown while it is down): nothing reaches the plugin.
    assert say(gw, "crasher", "/secret").startswith("error: /secret belongs to plugin 'commander', which is down")
    # The rest of the gateway answers.
    assert say(gw, "crasher", "hello").startswith("[main] received in agent:main:http:direct:crasher: hello")
    assert "Not available now: /boom (plugin 'commander', backoff)" in chat(gw, "/help")


def test_the_owner_rule_for_plugin_channels() -> None:
    """`channels.<id>.owners` names senders exactly as the channel reports them;
    `tools.owners` names `channel:peer` pairs; the cli is always an owner."""
    cfg = ClawsupConfig.model_validate({"channels": {"chat": {"owners": ["U123"]}}, "tools": {"owners": ["Chat:Room-1"]}})
    owners = Owners.from_config(cfg)

    async def is_owner(channel: str, peer: str, sender: str | None, kind: str = "group") -> bool:
        who = Peer.of(kind, peer)
        msg = InboundMessage(
            source=RouteInput(channel=channel, peer=who), text="/x", reply_to=ReplyTarget(channel=channel, account_id="default", peer=who), sender_id=sender
        )
        return owners.is_owner(msg)

    def check(channel: str, peer: str, sender: str | None, kind: str = "group") -> bool:
        return asyncio.run(is_owner(channel, peer, sender, kind))

    assert check("chat", "room-9", "U123")
    assert not check("chat", "room-9", "u123")  # ids are the channel's, case and all
    assert not check("chat", "room-9", "U999")
    assert not check("chat", "U123", "U999")  # a sender is named: the peer is not asked
    assert check("chat", "U123", None, "direct")  # no sender: the peer is who wrote
    assert not check("chat", "room-9", "")
    assert check("chat", "room-1", "anyone")  # tools.owners: the whole peer
    assert not check("other", "room-9", "U123")  # another channel's owners do not count
    assert check("cli", "whoever", None, "direct")


# -- the message hooks' call sites ---------------------------------------------------


class RecordingHooks:
    """Stands in for supervisor/hooks.py `Hooks`: records what the lanes ask, and
    answers `message_sending` with `verdict(text)`."""

    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict
        self.observed: list[tuple[str, dict[str, Any], bool]] = []
        self.sending: list[dict[str, Any]] = []
        self.messages: dict[str, InboundMessage] = {}

    def observe(self, hook: str, event: dict[str, Any]) -> None:
        self.observed.append((hook, event, self.messages[event["messageId"]].accepted.done()))

    async def message_sending(self, text: str, *, channel: str, peer_kind: str, peer_id: str, session: str, agent: str) -> str | None:
        self.sending.append({"text": text, "channel": channel, "peer": (peer_kind, peer_id), "session": session, "agent": agent})
        result: str | None = self.verdict(text)
        return result


class Replies:
    def __init__(self) -> None:
        self.got: asyncio.Queue[OutboundMessage] = asyncio.Queue()

    async def send(self, out: OutboundMessage) -> None:
        await self.got.put(out)

    async def final(self) -> OutboundMessage:
        while not (out := await asyncio.wait_for(self.got.get(), 10)).final:
            pass
        return out


async def one_turn(tmp_path: Path, hooks: Any, text: str = "hello") -> tuple[OutboundMessage, list[dict[str, Any]], InboundMessage]:
    cfg = ClawsupConfig.model_validate({"session": {"dmScope": "per-peer"}})
    bus = MessageBus()
    replies = Replies()
    lanes = SessionLanes(bus=bus, router=Router(cfg), store=SessionStore(tmp_path, fsync="never"), agent=PlaceholderAgent(), channels={"chat": replies}, hooks=hooks)
    who = Peer.of("direct", "ann")
    msg = InboundMessage(source=RouteInput(channel="chat", peer=who), text=text, reply_to=ReplyTarget(channel="chat", account_id="default", peer=who, conversation="c"), sender_id="U1")
    if isinstance(hooks, RecordingHooks):
        hooks.messages[msg.id] = msg
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(lanes.run())
        await bus.submit(msg)
        out = await replies.final()
        run.cancel()
    return out, read_session(tmp_path / file_name("agent:main:direct:ann")), msg


async def test_message_sending_may_change_the_reply_and_the_session_keeps_the_answer(tmp_path: Path) -> None:
    hooks = RecordingHooks(lambda text: text.upper())
    out, recs, msg = await one_turn(tmp_path, hooks)
    answer = "[main] received in agent:main:direct:ann: hello"
    assert out.text == answer.upper() and out.final
    assert hooks.sending == [{"text": answer, "channel": "chat", "peer": ("direct", "ann"), "session": "agent:main:direct:ann", "agent": "main"}]
    assert (recs[-1]["role"], recs[-1]["text"], recs[-1]["sent"]) == ("assistant", answer, answer.upper())
    # message_received: once, for the stored and acknowledged message.
    [(hook, event, acked)] = hooks.observed
    assert hook == "message_received" and acked
    assert event == {
        "content": "hello",
        "channel": "chat",
        "accountId": "default",
        "from": {"kind": "direct", "id": "ann"},
        "senderId": "U1",
        "threadId": None,
        "messageId": msg.id,
        "sessionKey": "agent:main:direct:ann",
        "agentId": "main",
    }


async def test_a_cancelled_reply_is_withheld_and_the_channel_still_gets_a_final_message(tmp_path: Path) -> None:
    out, recs, _ = await one_turn(tmp_path, RecordingHooks(lambda text: None))
    assert (out.text, out.final, out.progress) == (WITHHELD, True, False)
    assert recs[-1]["role"] == "assistant" and recs[-1]["text"].endswith("hello") and recs[-1]["withheld"] == "message_sending"


async def test_hooks_that_fail_cost_the_hooks_not_the_reply(tmp_path: Path) -> None:
    class Broken:
        def observe(self, hook: str, event: dict[str, Any]) -> None:
            raise RuntimeError("observe is broken")

        async def message_sending(self, text: str, **where: Any) -> str | None:
            raise RuntimeError("message_sending is broken")

    out, recs, _ = await one_turn(tmp_path, Broken())
    assert out.text.endswith("hello") and "sent" not in recs[-1] and "withheld" not in recs[-1]
