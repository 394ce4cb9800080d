"""A plugin that cannot load fails fast: its host prints a load error line instead of
the handshake and exits with LOAD_ERROR_EXIT (sandbox/handshake.py), and the
supervisor takes the sandbox straight to `failed`, without a restart cycle, because
retrying does not fix a deterministic load error. Status, the start output and the
log say why, with the last frame in the plugin's own code; `clawsup restart` retries
once the file is fixed.

Each test copies tests/plugins/loadable (which loads fine) and breaks it one way.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.sandbox.handshake import LOAD_ERROR_EXIT, LoadError, format_load_error, parse_load_error
from tests.conftest import TEST_PLUGINS, Gateway, make_config, require_backend

pytestmark = pytest.mark.fault

LOADABLE = TEST_PLUGINS / "loadable"
# Without fail-fast, the default budget (5 restarts with backoff) took about 30 s.
FAILED_WITHIN_S = 10

HEADER = "from clawsup.sandbox.api import hookimpl\n"

CAUSES: dict[str, dict[str, Any]] = {
    "missing_entry": {
        "code": None,
        "message": "the entry file 'plugin.py' named in clawsup.plugin.json does not exist in the plugin folder",
        "where": "",
        "traceback": False,
    },
    "syntax_error": {
        "code": HEADER + "\ndef broken(:\n    pass\n",
        "message": "SyntaxError: invalid syntax (plugin.py, line 3)",
        "where": "plugin.py:3",
        "traceback": True,
    },
    "import_error": {
        "code": HEADER + "import clawsup_no_such_module\n",
        "message": "ModuleNotFoundError: No module named 'clawsup_no_such_module'",
        "where": "plugin.py:2",
        "traceback": True,
    },
    "raise_in_register": {
        "code": HEADER + "\n\n@hookimpl\ndef clawsup_register(api):\n    raise ValueError('no API key configured')\n",
        "message": "ValueError: no API key configured",
        "where": "plugin.py:6 in clawsup_register",
        "traceback": True,
    },
    "registers_none": {
        "code": HEADER + "\n\n@hookimpl\ndef clawsup_register(api):\n    pass\n",
        "message": "plugin declares tools loadable_ok but registered none",
        "where": "plugin.py:5 in clawsup_register",
        "traceback": False,
    },
}


@pytest.fixture
def plugin_copy() -> Iterator[Path]:
    """A copy of `loadable` the sandbox's own uid can read (the test may break it)."""
    d = Path(tempfile.mkdtemp(prefix="cs-plugin-", dir="/tmp"))
    os.chmod(d, 0o755)
    folder = d / "loadable"
    shutil.copytree(LOADABLE, folder)
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(d, ignore_errors=True)


def break_plugin(folder: Path, code: str | None) -> None:
    entry = folder / "plugin.py"
    if code is None:
        entry.unlink()
    else:
        entry.write_text(code)
        entry.chmod(0o644)


def fix_plugin(folder: Path) -> None:
    shutil.copy(LOADABLE / "plugin.py", folder / "plugin.py")
    (folder / "plugin.py").chmod(0o644)
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)


@pytest.mark.parametrize("cause", list(CAUSES))
def test_a_plugin_that_cannot_load_fails_at_once_and_says_why(gateway_factory: Any, plugin_copy: Path, cause: str) -> None:
    expected = CAUSES[cause]
    break_plugin(plugin_copy, expected["code"])
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(plugin_copy))
    # A generous budget, as by default: a load error must not spend it.
    cfg["plugins"]["entries"]["loadable"] = {"trust": "trusted", "sandbox": {"restart": {"maxRestarts": 5, "backoffInitialSeconds": 1, "backoffMaxSeconds": 5}}}
    t0 = time.monotonic()
    gw = gateway_factory(cfg)
    assert gw.wait("loadable", "failed", timeout=FAILED_WITHIN_S) == "failed"
    assert time.monotonic() - t0 < FAILED_WITHIN_S + 5

    st = gw.status("loadable")
    assert st["restarts"] == 0 and st["pid"] is None, st
    assert st["last_exit"]["code"] == LOAD_ERROR_EXIT, st
    said = st["last_exit"]["text"]
    assert expected["message"] in said, said
    if expected["where"]:
        assert f"(at {expected['where']})" in said, said
    else:
        assert "(at " not in said, said
    # `clawsup status --json` says it too, and so did the start output.
    r = gw.cli("status", "--json")
    assert r.returncode == 0 and expected["message"] in r.stdout, r.stdout
    assert expected["message"] in "".join(gw.output)

    log = gw.log("loadable")
    assert expected["message"] in log
    if expected["traceback"]:
        assert "Traceback (most recent call last)" in log and expected["message"].split(":")[0] in log
    # One launch, no restart cycle: the host started once.
    assert log.count("clawsup host: the plugin could not load") == 1, log

    assert "loadable_ok" not in gw.tools()
    resp = gw.call("loadable_ok")
    assert resp["error"]["code"] == "sandbox_unavailable" and "failed" in resp["error"]["message"], resp
    assert gw.call("echo", {"text": "others fine"}) == {"ok": True, "data": {"result": "others fine"}}

    # Fixed, a restart brings it up.
    fix_plugin(plugin_copy)
    r = gw.cli("restart", "loadable")
    assert r.returncode == 0, r.stdout + r.stderr
    assert gw.wait("loadable", "ready", timeout=10) == "ready"
    assert gw.call("loadable_ok") == {"ok": True, "data": {"result": "ok"}}


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_an_isolated_plugins_frame_is_named_in_its_own_module(gateway_factory: Any, plugin_copy: Path, backend: str) -> None:
    """The folder is mounted elsewhere inside the sandbox; frames are still named
    relative to it, here in a sibling module the entry imports."""
    require_backend(backend)
    (plugin_copy / "helpers.py").write_text("def ok():\n    return 'ok'\n\nif True\n    pass\n")
    (plugin_copy / "helpers.py").chmod(0o644)
    break_plugin(plugin_copy, HEADER + "import helpers\n")
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(plugin_copy))
    cfg["plugins"]["entries"]["loadable"] = {"sandbox": {"backend": backend}}
    gw = gateway_factory(cfg)
    assert gw.wait("loadable", "failed", timeout=FAILED_WITHIN_S) == "failed"
    st = gw.status("loadable")
    assert st["restarts"] == 0 and st["backend"] == backend, st
    assert "SyntaxError: expected ':' (helpers.py, line 4) (at helpers.py:4)" in st["last_exit"]["text"], st
    assert gw.call("echo", {"text": "others fine"})["ok"]


def test_the_load_error_line_round_trips_and_tolerates_junk() -> None:
    err = LoadError(message="SyntaxError: invalid syntax (plugin.py, line 3)", where="plugin.py:3")
    line = format_load_error(err)
    assert line.startswith("CLAWSUP-LOAD-ERROR|1|") and "\n" not in line
    assert parse_load_error(line) == err
    assert parse_load_error(line + "\n") == err
    for junk in ("", "CLAWSUP|1|unix|/x|grpc", "CLAWSUP-LOAD-ERROR|1|", "CLAWSUP-LOAD-ERROR|1|{", "CLAWSUP-LOAD-ERROR|2|{\"message\": \"x\"}",
                 'CLAWSUP-LOAD-ERROR|1|["x"]', 'CLAWSUP-LOAD-ERROR|1|{"message": 5}', 'CLAWSUP-LOAD-ERROR|1|{"message": ""}'):  # fmt: skip
        assert parse_load_error(junk) is None, junk
    assert parse_load_error('CLAWSUP-LOAD-ERROR|1|{"message": "m", "where": 5}') == LoadError(message="m", where="")


def test_the_load_error_line_stays_one_bounded_line() -> None:
    for message in ("x" * 10_000, "\U0001f600" * 3000, "a\nb\u2028c\x85d", "lone \ud800 surrogate"):
        line = format_load_error(LoadError(message=message, where="w" * 1000))
        assert line.isascii() and len(line) <= 8 * 1024 and len(line.splitlines()) == 1
        back = parse_load_error(line)
        assert back is not None and len(back.message) <= 2000 and len(back.where) <= 300
        assert back.message[:10] == message[:10]
    assert json.loads(format_load_error(LoadError(message="m")).split("|", 2)[2]) == {"message": "m", "where": ""}
