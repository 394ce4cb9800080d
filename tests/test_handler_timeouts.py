"""A TimeoutError a handler raises itself (its upstream timed out, as a channel's send
may) is that handler's error, not a deadline overrun: the caller sees it as raised,
and the host, which was never held past a deadline, keeps serving. Runs
tests/plugins/timeouter through the real supervisor; a sync command that really
overruns is still timed out (for a tool: tests/test_faults.py::test_endless_loop_in_handler)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import TEST_PLUGINS, Gateway, make_config, wait_gone

pytestmark = pytest.mark.fault

TIMEOUTER = TEST_PLUGINS / "timeouter"
CALL_TIMEOUT_S = 30


def timeouter_config(command_timeout_s: float) -> dict[str, Any]:
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(TIMEOUTER))
    cfg["plugins"]["entries"]["timeouter"] = {"trust": "trusted", "commandTimeoutSeconds": command_timeout_s}
    return cfg


@pytest.fixture
def gw(module_gateways: Any) -> Gateway:
    return module_gateways("timeouter", timeouter_config(CALL_TIMEOUT_S))


def chat(gw: Gateway, text: str) -> str:
    """One message on the cli channel; its reply."""
    r = gw.cli("chat", "--peer", "tester", "-m", text, "--json", timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    return str([json.loads(x)["reply"] for x in r.stdout.splitlines() if "reply" in json.loads(x)][-1])


def assert_host_unharmed(gw: Gateway, pid: int, inner: int) -> None:
    """The same host, ready, never reported as overrun."""
    st = gw.status("timeouter")
    assert (st["state"], st["pid"], st["restarts"]) == ("ready", pid, 0)
    assert gw.call("whoami")["data"]["result"]["pid"] == inner
    assert "overran its timeout" not in gw.log("timeouter")


@pytest.mark.parametrize("tool", ["upstream_sync", "upstream_async"])
def test_a_tools_own_timeout_error_is_its_error(gw: Gateway, tool: str) -> None:
    pid = gw.status("timeouter")["pid"]
    inner = gw.call("whoami")["data"]["result"]["pid"]
    resp = gw.call(tool, timeout=CALL_TIMEOUT_S)
    assert not resp["ok"]
    assert resp["error"]["code"] == "tool_failed", resp
    assert resp["error"]["message"] == f"tool {tool!r} (plugin 'timeouter') failed: TimeoutError: upstream timed out"
    assert "did not" not in resp["error"]["message"]
    assert_host_unharmed(gw, pid, inner)
    assert f"tool {tool!r}" in gw.log("timeouter") and "TimeoutError: upstream timed out" in gw.log("timeouter")


def test_an_offers_own_timeout_error_is_raised_not_timed_out(gw: Gateway) -> None:
    pid = gw.status("timeouter")["pid"]
    inner = gw.call("whoami")["data"]["result"]["pid"]
    assert chat(gw, "/upstream") == "error: command 'upstream' of plugin 'timeouter' raised TimeoutError: upstream timed out"
    assert_host_unharmed(gw, pid, inner)


def test_a_sync_offer_that_overruns_is_still_timed_out(gateway_factory: Any) -> None:
    gw = gateway_factory(timeouter_config(1))
    pid = gw.status("timeouter")["pid"]
    reply = chat(gw, "/stall")
    assert "command 'stall' of plugin 'timeouter'" in reply and "did not answer within its 1 s deadline" in reply, reply
    assert "command 'stall' (call" in gw.wait_log("timeouter", "overran its timeout")
    # Its thread cannot be stopped, so its host is killed and replaced.
    assert wait_gone([pid]) == []
    assert gw.wait("timeouter", "ready") == "ready"
    assert gw.status("timeouter")["pid"] != pid
