"""The supervisor's side of an MCP server's sandbox, with real children: a load error
that says it may pass (`LoadError.retry`, what an MCP host prints when its server
exits or does not finish `initialize`) is a crash, restarted with backoff until the
budget is spent, not `failed` at once; the MCP host's news on its stream
(`mcp.tools_changed`, `mcp.server_exited`) is refused to a plugin; `clawsup mcp
list` without servers says how to add one. The MCP sandboxes themselves, with real
servers, are tests/test_mcp.py's; the judgement of their tools,
tests/test_mcp_registry.py's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.sandbox.handshake import LOAD_ERROR_EXIT
from tests.conftest import PLUGINS, TEST_PLUGINS, make_config

SAYS = "MCP server 'flaky' exited with code 2 before initialize finished (last stderr: boom)"
RETRYABLE = f"""\
import os

from clawsup.sandbox.handshake import LOAD_ERROR_EXIT, LoadError, format_load_error

# What an MCP host does when its server gives up before `initialize` (sandbox/host/mcp_bridge.py).
os.write(1, (format_load_error(LoadError(message={SAYS!r}, retry=True)) + "\\n").encode())
os._exit(LOAD_ERROR_EXIT)
"""


@pytest.fixture
def flaky_plugin() -> Iterator[Path]:
    """A copy of tests/plugins/loadable whose load ends in a retryable load error, in
    a folder the sandbox's own uid can read."""
    d = Path(tempfile.mkdtemp(prefix="cs-plugin-", dir="/tmp"))
    os.chmod(d, 0o755)
    folder = d / "loadable"
    shutil.copytree(TEST_PLUGINS / "loadable", folder)
    os.chmod(folder, 0o755)
    (folder / "plugin.py").write_text(RETRYABLE)
    (folder / "plugin.py").chmod(0o644)
    yield folder
    shutil.rmtree(d, ignore_errors=True)


def test_a_plugin_cannot_make_its_load_error_retryable(gateway_factory: Any, flaky_plugin: Path) -> None:
    """`retry: true` on a load error is an MCP host's word (a server late in
    initialize); a plugin that prints it still fails at once, without a restart loop.
    The MCP side of the rule: tests/test_mcp.py::test_a_server_that_never_initializes_is_killed_then_failed."""
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(flaky_plugin))
    cfg["plugins"]["entries"]["loadable"] = {"trust": "trusted", "sandbox": {"restart": {"maxRestarts": 2, "backoffInitialSeconds": 0.05}}}
    gw = gateway_factory(cfg)
    assert gw.wait("loadable", "failed") == "failed"
    st = gw.status("loadable")
    assert st["restarts"] == 0 and st["last_exit"]["code"] == LOAD_ERROR_EXIT, st
    assert st["last_exit"]["text"] == f"exited with code {LOAD_ERROR_EXIT} (could not load: {SAYS})", st
    log = gw.log("loadable")
    assert len(re.findall(rf"\] pid \d+ exited with code {LOAD_ERROR_EXIT} \(could not load: ", log)) == 1, log
    assert "backoff" not in log


def test_a_plugin_may_not_post_an_mcp_hosts_news(gateway_factory: Any) -> None:
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    gw = gateway_factory(cfg)
    for method, payload in (("mcp.tools_changed", {}), ("mcp.server_exited", {"message": "MCP server 'x' was killed by SIGKILL"})):
        r = gw.call("chaos_ask", {"method": method, "payload": payload})
        assert r["ok"] and r["data"]["result"]["ok"] is False, r
        assert f"plugin 'chaos' is not allowed to call {method!r}" in r["data"]["result"]["error"], r
    # Its tools stay as registered, and its death is told without the words it posted.
    assert gw.tools()["chaos_ok"] == "chaos"
    resp = gw.call("chaos_crash", {"how": "exit", "code": 4})
    assert resp["error"]["code"] == "sandbox_died" and "exited with code 4" in resp["error"]["message"], resp
    assert "MCP server" not in resp["error"]["message"] and "MCP server" not in json.dumps(gw.status("chaos")["last_exit"])


def test_mcp_list_without_servers_says_how_to_add_one(gateway_factory: Any) -> None:
    gw = gateway_factory()
    assert gw.request(op="mcp") == {"ok": True, "data": {"servers": []}}
    r = gw.cli("mcp", "list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"servers": []}, r.stdout + r.stderr
    assert "mcpServers" in r.stderr
    r = gw.cli("mcp", "list")
    assert r.returncode == 0 and "no MCP servers are configured: add them under `mcpServers` in clawsup.json" in r.stdout, r.stdout
