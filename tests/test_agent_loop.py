"""The agent loop end to end against a running supervisor: the offline provider
calling a plugin tool and exec, a plugin crashing mid-turn, the tool policy at call
time, loop detection and the iteration limit; and the Anthropic and LiteLLM paths
through their real SDK clients against local stubs that speak each wire format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clawsup.supervisor.messages.session_store import file_name, read_session
from tests.conftest import PLUGINS, Gateway, make_config
from tests.helpers.model_stubs import Stub
from tests.test_messaging import TOKEN, say


def agent_config(model: str = "offline", **overrides: Any) -> dict[str, Any]:
    cfg = make_config(**overrides)
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    cfg["plugins"]["entries"]["chaos"] = {"sandbox": {"restart": {"backoffInitialSeconds": 0.1}}}
    cfg["agents"]["list"] = [{"id": "main", "default": True, "model": model}]
    cfg["agentLoop"] = {"maxIterations": 8}
    return cfg


def chat(gw: Gateway, text: str, peer: str = "tester") -> list[dict[str, Any]]:
    r = gw.cli("chat", "--peer", peer, "-m", text, "--json", timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    return [json.loads(x) for x in r.stdout.splitlines()]


def reply(events: list[dict[str, Any]]) -> str:
    return [e["reply"] for e in events if "reply" in e][-1]


def records(gw: Gateway, peer: str = "tester") -> list[dict[str, Any]]:
    key = "agent:main:main"  # dmScope main by default
    return read_session(gw.state / "sessions" / file_name(key))


def test_offline_turn_calls_a_plugin_tool(gateway_factory: Any) -> None:
    gw = gateway_factory(agent_config())
    events = chat(gw, '/tool echo {"text": "round trip"}')
    assert {"progress": "calling echo…"} in events
    assert reply(events) == "echo returned: round trip"
    recs = records(gw)
    call = next(r for r in recs if r.get("toolCalls"))
    assert call["toolCalls"][0]["name"] == "echo" and call["toolCalls"][0]["args"] == {"text": "round trip"}
    result = next(r for r in recs if r["role"] == "tool")
    assert result["content"] == "round trip" and result["isError"] is False


def test_offline_turn_calls_exec_in_the_workspace_sandbox(gateway_factory: Any) -> None:
    gw = gateway_factory(agent_config())
    out = reply(chat(gw, '/tool exec {"command": "echo from-exec; pwd"}'))
    assert out.startswith("exec returned:")
    result = json.loads(out.split("returned: ", 1)[1])
    assert result["exit_code"] == 0 and result["output"].startswith("from-exec\n")
    # The workspace sandbox follows the routing: this session's, not a default one.
    assert any(s["id"].startswith("workspace-main-s") for s in gw.request(op="status")["data"]["sandboxes"])


def test_plugin_crash_mid_turn_ends_the_turn_clearly_and_the_next_one_works(gateway_factory: Any) -> None:
    gw = gateway_factory(agent_config())
    out = reply(chat(gw, '/tool chaos_crash {"how": "segfault"}'))
    assert out.startswith("chaos_crash failed:") and "SIGSEGV" in out and "plugin 'chaos'" in out
    recs = records(gw)
    assert [r["role"] for r in recs] == ["user", "assistant", "tool", "assistant"]
    assert recs[2]["isError"] is True
    gw.wait("chaos", "ready")
    assert reply(chat(gw, "/tool chaos_ok {}")).startswith("chaos_ok returned:")
    assert len(records(gw)) == 8  # the session kept everything, in order


def test_a_tool_outside_the_policy_is_refused_and_never_run(gateway_factory: Any) -> None:
    cfg = agent_config(tools={"deny": ["chaos_write"]})
    gw = gateway_factory(cfg)
    out = reply(chat(gw, '/tool chaos_write {"name": "denied.bin", "mb": 1}'))
    assert "chaos_write failed: tool 'chaos_write' is not available in this turn (removed by the global layer)" == out
    assert not (gw.state / "sandboxes" / "chaos" / "workspace" / "denied.bin").exists()
    # And the model was never shown it.
    events = chat(gw, "hello")
    assert "chaos_write" not in reply(events) and "chaos_ok" in reply(events)


def anthropic_cfg(stub: Stub, **overrides: Any) -> dict[str, Any]:
    cfg = agent_config("anthropic/claude-stub", **overrides)
    cfg["providers"] = {"anthropic": {"baseUrl": stub.url, "maxRetries": 2}}
    return cfg


def test_anthropic_tool_use_round_trip_with_streaming(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if n == 1:
            return [{"text": "Let me check. "}, {"tool": "echo", "args": {"text": "via anthropic"}, "id": "toolu_A"}, {"tool": "chaos_raise", "args": {"message": "nope"}, "id": "toolu_B"}]
        return [{"text": "The echo said: via anthropic."}]

    with Stub(script) as stub:
        gw = gateway_factory(anthropic_cfg(stub), env={"ANTHROPIC_API_KEY": "sk-test"})
        out = reply(chat(gw, "please echo"))
        assert out == "The echo said: via anthropic."
        first, second = stub.requests
        assert first["stream"] is True and first["model"] == "claude-stub"
        assert {"echo", "chaos_ok", "exec"} <= {t["name"] for t in first["tools"]}
        assert first["messages"] == [{"role": "user", "content": [{"type": "text", "text": "please echo"}]}]
        # Native blocks: tool_use back from the model, tool_result (with is_error) to it.
        assistant, results = second["messages"][1], second["messages"][2]
        assert [b["type"] for b in assistant["content"]] == ["text", "tool_use", "tool_use"]
        ok, failed = results["content"]
        assert ok == {"type": "tool_result", "tool_use_id": "toolu_A", "content": "via anthropic", "is_error": False}
        assert failed["tool_use_id"] == "toolu_B" and failed["is_error"] is True and "RuntimeError: nope" in failed["content"]


def test_anthropic_overload_is_retried_and_other_errors_are_reported(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if n == 1:
            return [{"status": 529}]
        if "fail" in json.dumps(body["messages"][-1]):
            return [{"status": 400, "message": "prompt is too long"}]
        return [{"text": "fine after a retry"}]

    with Stub(script) as stub:
        gw = gateway_factory(anthropic_cfg(stub), env={"ANTHROPIC_API_KEY": "sk-test"})
        assert reply(chat(gw, "hello")) == "fine after a retry"
        assert len(stub.requests) == 2
        out = reply(chat(gw, "please fail"))
        assert out.startswith("error: the model could not answer:") and "400" in out and "prompt is too long" in out
        roles = [r["role"] for r in records(gw)]
        assert roles == ["user", "assistant", "user", "assistant"]  # the session keeps what it had


def test_litellm_tool_call_round_trip_with_streaming(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if n == 1:
            return [{"tool": "calc", "args": {"expression": "6 * 7"}, "id": "call_1"}]
        return [{"text": "It is 42."}]

    with Stub(script) as stub:
        cfg = agent_config("openai/gpt-stub")
        cfg["providers"] = {"litellm": {"baseUrl": stub.url + "/v1", "apiKeyEnv": "OPENAI_API_KEY", "maxRetries": 0}}
        gw = gateway_factory(cfg, env={"OPENAI_API_KEY": "sk-test"})
        assert reply(chat(gw, "what is six times seven")) == "It is 42."
        first, second = stub.requests
        assert first["stream"] is True and first["messages"][0]["role"] == "system"
        assert "calc" in {t["function"]["name"] for t in first["tools"]}
        call, result = second["messages"][-2], second["messages"][-1]
        assert call["tool_calls"][0]["function"] == {"name": "calc", "arguments": json.dumps({"expression": "6 * 7"})}
        assert result == {"role": "tool", "tool_call_id": "call_1", "content": "42"}


def test_loop_detection_warns_then_stops(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        return [{"tool": "echo", "args": {"text": "again"}, "id": f"toolu_{n}"}]

    with Stub(script) as stub:
        gw = gateway_factory(anthropic_cfg(stub), env={"ANTHROPIC_API_KEY": "sk-test"})
        out = reply(chat(gw, "loop forever"))
        assert out.startswith("stopped: the same tool call kept repeating")
        assert len(stub.requests) == 5
        # After the third identical call the model was warned, once.
        warned = [i for i, r in enumerate(stub.requests) if "repeating the same tool call" in json.dumps(r["messages"])]
        assert warned and warned[0] == 3


def test_iteration_limit_stops_a_turn(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        return [{"tool": "echo", "args": {"text": f"step {n}"}, "id": f"toolu_{n}"}]

    with Stub(script) as stub:
        cfg = anthropic_cfg(stub)
        cfg["agentLoop"] = {"maxIterations": 4}
        gw = gateway_factory(cfg, env={"ANTHROPIC_API_KEY": "sk-test"})
        assert reply(chat(gw, "keep going")) == "stopped: the turn reached its limit of 4 model calls (agentLoop.maxIterations)."
        assert len(stub.requests) == 4


def test_missing_key_is_a_start_error(gateway_factory: Any, state_dir: Path) -> None:
    with pytest.raises(AssertionError, match="ANTHROPIC_API_KEY"):
        gateway_factory(agent_config("anthropic/claude-x"), env={"ANTHROPIC_API_KEY": ""})


def test_tools_of_a_crashed_sandbox_leave_the_next_model_call(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if n == 1:
            return [{"tool": "chaos_crash", "args": {"how": "abort"}, "id": "toolu_1"}]
        return [{"text": "the chaos plugin is gone for now"}]

    with Stub(script) as stub:
        cfg = anthropic_cfg(stub)
        cfg["plugins"]["entries"]["chaos"] = {"sandbox": {"restart": {"backoffInitialSeconds": 30, "backoffMaxSeconds": 30}}}
        gw = gateway_factory(cfg, env={"ANTHROPIC_API_KEY": "sk-test"})
        assert reply(chat(gw, "crash it")) == "the chaos plugin is gone for now"
        first, second = stub.requests
        assert "chaos_ok" in {t["name"] for t in first["tools"]}
        assert not [t["name"] for t in second["tools"] if t["name"].startswith("chaos_")]
        assert second["messages"][-1]["content"][0]["is_error"] is True
        assert "echo" in {t["name"] for t in second["tools"]}


def test_reading_the_same_file_again_and_again_is_a_loop(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        # Different offsets each time, the same file: still going round in circles.
        return [{"tool": "read", "args": {"path": "notes.txt", "offset": n}, "id": f"toolu_{n}"}]

    with Stub(script) as stub:
        gw = gateway_factory(anthropic_cfg(stub), env={"ANTHROPIC_API_KEY": "sk-test"})
        assert reply(chat(gw, "read it")).startswith("stopped: the same tool call kept repeating")
        assert len(stub.requests) == 6


def with_http(cfg: dict[str, Any]) -> dict[str, Any]:
    """The http channel on too: a message over it costs no CLI process (these tests
    send many)."""
    cfg["channels"] = {"http": {"enabled": True, "port": 0, "token": TOKEN}}
    return cfg


def ask(gw: Gateway, text: str) -> str:
    """Send over http (dmScope main: the same session as the cli's); the reply."""
    return [data["text"] for event, data in say(gw, "tester", text) if event == "reply"][-1]


def texts_seen(request: dict[str, Any]) -> list[str]:
    """The text blocks of one Messages API request, in order."""
    return [b["text"] for m in request["messages"] for b in m["content"] if b.get("type") == "text"]


def test_history_is_read_from_the_file_once_then_kept_in_memory(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        return [{"text": f"answer {n}"}]

    with Stub(script) as stub:
        cfg = with_http(anthropic_cfg(stub))
        env = {"ANTHROPIC_API_KEY": "sk-test"}
        gw = gateway_factory(cfg, env=env)
        assert ask(gw, "one") == "answer 1"
        assert ask(gw, "two") == "answer 2"
        assert texts_seen(stub.requests[1]) == ["one", "answer 1", "two"]
        # Written behind the gateway's back: a running session does not read its
        # file again, so its next turn does not see this...
        with open(gw.state / "sessions" / file_name("agent:main:main"), "a") as f:
            f.write(json.dumps({"role": "user", "id": "m-behind-its-back", "text": "written behind its back"}) + "\n")
        assert ask(gw, "three") == "answer 3"
        assert texts_seen(stub.requests[2]) == ["one", "answer 1", "two", "answer 2", "three"]
        # ... and a fresh supervisor reads the file on the session's first turn.
        gw.stop()
        gw = gateway_factory(cfg, env=env)
        assert ask(gw, "four") == "answer 4"
        assert texts_seen(stub.requests[3]) == ["one", "answer 1", "two", "answer 2", "written behind its back", "three", "answer 3", "four"]


def test_history_is_bounded_in_bytes(gateway_factory: Any) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        return [{"text": f"answer {n}"}]

    with Stub(script) as stub:
        cfg = with_http(anthropic_cfg(stub))
        cfg["agentLoop"]["historyBytes"] = 4096
        gw = gateway_factory(cfg, env={"ANTHROPIC_API_KEY": "sk-test"})
        long = ["x" * 1500 + f" #{k}" for k in range(1, 5)]
        for text in long:
            ask(gw, text)
        # Each message is ~1.5 KB: the fourth turn's window holds what fits in 4 KiB,
        # from the end (the oldest dropped first), well inside historyMessages.
        seen = texts_seen(stub.requests[3])
        assert seen == ["answer 2", long[2], "answer 3", long[3]]
        assert sum(len(t) for t in seen) <= 4096
        # The session file keeps everything.
        assert [r["text"] for r in records(gw) if r["role"] == "user"] == long


def test_a_session_file_torn_by_a_crash_is_read_around(gateway_factory: Any, state_dir: Path) -> None:
    def script(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        return [{"text": f"answer {n}"}]

    sessions = state_dir / "sessions"
    sessions.mkdir(mode=0o700)
    (sessions / file_name("agent:main:main")).write_bytes(
        b'{"role":"user","id":"m-1","text":"before the crash"}\n'
        b'{"role":"assistant","text":"noted","inReplyTo":"m-1"}\n'
        b'{"role":"user","id":"m-2","te\x00garbage\n'  # torn mid-file
        b'{"role":"user","id":"m-3","text":"also before"}\n'
        b'{"role":"assistant","text":"half an ans'  # torn at the end
    )
    with Stub(script) as stub:
        gw = gateway_factory(with_http(anthropic_cfg(stub)), env={"ANTHROPIC_API_KEY": "sk-test"})
        assert ask(gw, "after the crash") == "answer 1"
        assert texts_seen(stub.requests[0]) == ["before the crash", "noted", "also before", "after the crash"]
        assert "is not a whole record (a torn write?); skipped" in gw.supervisor_log()
        assert "its last line was torn" in gw.supervisor_log()
        assert ask(gw, "and again") == "answer 2"


@pytest.mark.parametrize(
    "wire",
    [
        {"role": "user", "text": "hello"},
        {"role": "user", "text": "You are repeating yourself", "warning": True},
        {"role": "assistant", "text": "", "toolCalls": [{"id": "t1", "name": "echo", "args": {"text": "x"}}]},
        {"role": "assistant", "text": "done", "toolCalls": []},
        {"role": "tool", "toolCallId": "t1", "name": "echo", "content": "x", "isError": False},
        {"role": "tool", "toolCallId": "t2", "name": "exec", "content": "boom", "isError": True},
    ],
)
def test_messages_keep_their_wire_shape(wire: dict[str, Any]) -> None:
    """What crosses the sandbox wall and what the session file holds: the typed
    messages read it and write it back unchanged."""
    from clawsup.sandbox.agent_loop import message_from_json, message_json

    assert message_json(message_from_json(wire)) == wire


def test_an_unknown_role_is_not_a_message() -> None:
    from clawsup.sandbox.agent_loop import message_from_json

    with pytest.raises(ValueError, match="not a message role: 'system'"):
        message_from_json({"role": "system", "text": "x"})
