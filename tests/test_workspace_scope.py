"""Which workspace sandbox serves a core tool call: by agent, by session, or one for
all, as configured, and never by the tool's arguments."""

from __future__ import annotations

from typing import Any

from tests.conftest import make_config


def call(gw: Any, name: str, args: dict[str, Any], **who: str) -> Any:
    resp = gw.request(op="call", name=name, args=args, **who)
    assert resp["ok"], resp
    return resp["data"]["result"]


def test_agent_scope_gives_each_agent_its_own_workspace(gateway_factory) -> None:
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "agent", "backend": "process"}))
    gw.wait("workspace-main", "ready")
    call(gw, "write", {"path": "who.txt", "content": "main"})
    call(gw, "write", {"path": "who.txt", "content": "ops"}, agent="ops")
    assert call(gw, "read", {"path": "who.txt"}) == "main"
    assert call(gw, "read", {"path": "who.txt"}, agent="ops") == "ops"
    assert gw.status("workspace-ops")["state"] == "ready"
    assert (gw.workspace("workspace-ops") / "who.txt").read_text() == "ops"


def test_shared_scope_is_one_workspace_for_all(gateway_factory) -> None:
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "shared", "backend": "process"}))
    call(gw, "write", {"path": "note.txt", "content": "from main"})
    assert call(gw, "read", {"path": "note.txt"}, agent="ops", session="s9") == "from main"
    ids = {s["id"] for s in gw.request(op="status")["data"]["sandboxes"]}
    assert ids == {"workspace", "basics"}


def test_session_scope_starts_on_first_use_and_stops_when_idle(gateway_factory) -> None:
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "session", "backend": "process", "idleStopSeconds": 1}))
    assert [s["id"] for s in gw.request(op="status")["data"]["sandboxes"]] == ["basics"]
    call(gw, "write", {"path": "s.txt", "content": "kept"}, session="chat-1")
    [sid] = [s["id"] for s in gw.request(op="status")["data"]["sandboxes"] if s["id"].startswith("workspace-main-s")]
    other = call(gw, "exec", {"command": "cat s.txt 2>&1 || true"}, session="chat-2")
    assert "kept" not in other["output"]
    # Idle for a second: stopped, its files kept; the next call starts it again.
    assert gw.wait(sid, "stopped", timeout=15) == "stopped"
    assert "idle" in gw.log(sid)
    assert call(gw, "read", {"path": "s.txt"}, session="chat-1") == "kept"
    assert gw.status(sid)["state"] == "ready"
