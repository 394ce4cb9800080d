"""What a handler may not do to its sandbox: `sys.exit()` or a KeyboardInterrupt, from
a sync or an async handler, fails the call and the host lives on (`os._exit` is still
a crash). A plugin that closes its stderr does not make the host's own diagnostics
fail a call or a shutdown. Runs tests/plugins/quitter through the real supervisor."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import TEST_PLUGINS, Gateway, make_config

pytestmark = pytest.mark.fault

QUITTER = TEST_PLUGINS / "quitter"
GRACE_S = 20


def quitter_gateway(gateway_factory: Any, **overrides: Any) -> Gateway:
    cfg = make_config(**overrides)
    cfg["plugins"]["load"]["paths"].append(str(QUITTER))
    cfg["plugins"]["entries"]["quitter"] = {"trust": "trusted", "sandbox": {"restart": {"backoffInitialSeconds": 30, "backoffMaxSeconds": 30}}}
    return gateway_factory(cfg)


def assert_others_fine(gw: Gateway) -> None:
    assert gw.call("echo", {"text": "still here"}) == {"ok": True, "data": {"result": "still here"}}


@pytest.mark.parametrize(
    ("tool", "says"),
    [
        ("quit_sync", "SystemExit(3): a handler cannot end its sandbox"),
        ("quit_async", "SystemExit(3): a handler cannot end its sandbox"),
        ("interrupt_sync", "KeyboardInterrupt(): a handler cannot end its sandbox"),
        ("interrupt_async", "KeyboardInterrupt(): a handler cannot end its sandbox"),
    ],
)
def test_exit_or_interrupt_in_a_handler_fails_the_call_and_the_host_lives_on(gateway_factory: Any, tool: str, says: str) -> None:
    gw = quitter_gateway(gateway_factory)
    pid = gw.status("quitter")["pid"]
    inner = gw.call("whoami")["data"]["result"]["pid"]
    resp = gw.call(tool, {"code": 3})
    assert not resp["ok"]
    assert resp["error"]["code"] == "tool_failed", resp
    assert f"tool {tool!r} (plugin 'quitter') failed: {says}" in resp["error"]["message"]
    # The same host answers the next call, with all its tools.
    assert gw.call("whoami")["data"]["result"]["pid"] == inner
    st = gw.status("quitter")
    assert (st["state"], st["pid"], st["restarts"]) == ("ready", pid, 0)
    assert tool in gw.tools()
    assert_others_fine(gw)
    log = gw.log("quitter")
    assert f"tool {tool!r}" in log and "the call fails, the sandbox lives on" in log and "Traceback (most recent call last)" in log


def test_os_exit_in_a_handler_is_still_a_crash(gateway_factory: Any) -> None:
    gw = quitter_gateway(gateway_factory)
    resp = gw.call("quit_hard", {"code": 7})
    assert resp["error"]["code"] == "sandbox_died", resp
    assert "plugin 'quitter'" in resp["error"]["message"] and "exited with code 7" in resp["error"]["message"]
    assert gw.wait("quitter", "backoff") == "backoff"
    assert not [n for n in gw.tools() if n in ("whoami", "quit_hard")]
    assert_others_fine(gw)
    assert "exited with code 7" in gw.log("quitter")


@pytest.mark.parametrize("how", ["fd", "object"])
def test_a_plugin_that_closes_its_stderr_still_gets_clear_errors_and_stops_at_once(gateway_factory: Any, how: str) -> None:
    gw = quitter_gateway(gateway_factory, sandbox__stopGraceSeconds=GRACE_S)
    pid = gw.status("quitter")["pid"]
    assert gw.call("close_stderr", {"how": how})["ok"]

    resp = gw.call("fail", {"message": "broken after the close"})
    assert resp["error"]["code"] == "tool_failed", resp
    assert resp["error"]["message"] == "tool 'fail' (plugin 'quitter') failed: RuntimeError: broken after the close"
    resp = gw.call("quit_sync", {"code": 4})
    assert "SystemExit(4)" in resp["error"]["message"], resp
    assert gw.status("quitter")["pid"] == pid
    assert_others_fine(gw)
    # The host's own words still reach the log: it kept its own copy of stderr.
    gw.wait_log("quitter", "RuntimeError: broken after the close", timeout=10)

    # Stopping it takes its Shutdown, not the grace period and a signal.
    t0 = time.monotonic()
    resp = gw.request(op="restart", sandbox="quitter", timeout=GRACE_S * 2)
    elapsed = time.monotonic() - t0
    assert resp["ok"] and resp["data"]["state"] == "ready", resp
    assert elapsed < GRACE_S / 2, f"restart took {elapsed:.1f} s; the grace period is {GRACE_S} s"
    assert gw.status("quitter")["pid"] != pid
    log = gw.log("quitter")
    assert "shutdown requested by the supervisor" in log


def test_every_failure_kind_on_the_wire_has_its_name() -> None:
    """The supervisor names each ToolFailure.Kind of host.proto as before its names
    were a Literal (the proto's, lower case; `unknown` for a number it does not
    know): a kind added to the proto without a name in host_client fails here."""
    from typing import get_args

    from clawsup.supervisor.sandboxes import host_client
    from clawsup.v1 import host_pb2 as pb

    wire = {number: name.lower() for name, number in pb.ToolFailure.Kind.items()}
    assert host_client._KIND_NAMES == wire
    assert set(get_args(host_client.ToolFailureKind)) == {*wire.values(), "unknown"}
