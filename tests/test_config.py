"""Bad input gets a clear error that names the key path, and nothing starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.manifest import ManifestError, load_manifest
from supervisor.config import DEFAULT_CONFIG, load_config, parse_config
from supervisor.errors import ConfigError
from supervisor.plans import build_plans
from tests.conftest import PLUGINS, make_config, trust_our_plugins


def plans_for(cfg_dict: dict, tmp_path: Path, extra: list[Path] | None = None):
    trust_our_plugins(cfg_dict, extra or [])
    cfg = parse_config(json.dumps(cfg_dict), "clawsup.json")
    return build_plans(cfg, config_source="clawsup.json", config_dir=tmp_path, extra_plugins=extra or [])


def test_default_config_loads_the_safe_bundled_plugins(tmp_path: Path) -> None:
    cfg = load_config(DEFAULT_CONFIG)
    plans = build_plans(cfg, config_source="default", config_dir=DEFAULT_CONFIG.parent, extra_plugins=[])
    assert [p.plugin_id for p in plans] == ["basics"]
    assert "chaos" not in DEFAULT_CONFIG.read_text().split("paths:")[1].split("]")[0]


def test_bad_value_names_the_key_path() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config('{sandbox: {defaults: {memoryMb: 3}}}', "clawsup.json")
    assert "sandbox.defaults.memoryMb" in str(e.value) and "clawsup.json" in str(e.value)


def test_unknown_key_names_the_key_path() -> None:
    with pytest.raises(ConfigError, match=r"plugins\.entries\.basics\.enabeld: Extra inputs"):
        parse_config('{plugins: {entries: {basics: {enabeld: false}}}}', "c")


def test_json5_syntax_error_is_reported() -> None:
    with pytest.raises(ConfigError, match="not valid JSON5"):
        parse_config("{plugins: ", "c")


def test_plugin_config_is_checked_against_its_schema(tmp_path: Path) -> None:
    cfg = make_config()
    cfg["plugins"]["entries"]["basics"] = {"config": {"defaultTimezone": 7, "colour": "red"}}
    with pytest.raises(ConfigError) as e:
        plans_for(cfg, tmp_path)
    text = str(e.value)
    assert "plugins.entries.basics.config.defaultTimezone: 7 is not of type 'string'" in text
    assert "plugins.entries.basics.config: Additional properties are not allowed ('colour' was unexpected)" in text


def test_missing_plugin_folder_names_the_entry(tmp_path: Path) -> None:
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append("does/not/exist")
    with pytest.raises(ConfigError, match=r"plugins\.load\.paths\[1\]: plugin folder .*no clawsup.plugin.json"):
        plans_for(cfg, tmp_path)


def test_entry_for_unknown_plugin_is_an_error(tmp_path: Path) -> None:
    cfg = make_config()
    cfg["plugins"]["entries"]["wether"] = {"enabled": True}
    with pytest.raises(ConfigError, match=r"plugins\.entries\.wether: no plugin with this id is loaded"):
        plans_for(cfg, tmp_path)


def test_disabled_plugin_is_not_planned(tmp_path: Path) -> None:
    cfg = make_config()
    cfg["plugins"]["entries"]["basics"] = {"enabled": False}
    assert plans_for(cfg, tmp_path) == []


def test_each_limit_is_the_stricter_of_the_ask_and_the_grant(tmp_path: Path) -> None:
    cfg = make_config()
    cfg["sandbox"]["defaults"].update(memoryMb=300, cpuSeconds=99)
    cfg["plugins"]["entries"]["basics"] = {"sandbox": {"callTimeoutSeconds": 4, "restart": {"maxRestarts": 9}}}
    [plan] = plans_for(cfg, tmp_path)
    assert plan.limits.memory_bytes == 256 * 2**20  # the manifest asks for 256, under the operator's 300
    assert plan.limits.cpu_seconds == 99  # the operator's default; the manifest asks nothing
    assert plan.limits.call_timeout_s == 4  # the operator's grant, under the manifest's 5
    assert plan.restart.max_restarts == 9 and plan.restart.backoff_initial_s == 0.1
    # Asking for 5 s against a grant of 4 is asking for more: loaded, with the key named.
    assert plan.refused == ("sandbox.callTimeoutSeconds: asked 5, granted 4 (raise it in plugins.entries.basics.sandbox.callTimeoutSeconds)",)


def test_unknown_backend_is_refused(tmp_path: Path) -> None:
    cfg = make_config()
    cfg["plugins"]["entries"]["basics"] = {"sandbox": {"backend": "vm"}}
    with pytest.raises(ConfigError, match=r"plugins\.entries\.basics\.sandbox\.backend: Input should be 'auto', 'process', 'bwrap' or 'docker'"):
        plans_for(cfg, tmp_path)


def test_bad_manifest_names_the_field(tmp_path: Path) -> None:
    d = tmp_path / "p"
    d.mkdir()
    (d / "clawsup.plugin.json").write_text(json.dumps({"id": "Bad Id", "version": "1", "entry": "x.py", "sandbox": {"memoryMb": 1}}))
    with pytest.raises(ManifestError) as e:
        load_manifest(d)
    assert "id: String should match pattern" in str(e.value)
    assert "sandbox.memoryMb" in str(e.value)


def test_start_with_bad_config_exits_2_with_the_key_path(tmp_path: Path) -> None:
    bad = tmp_path / "clawsup.json"
    bad.write_text('{sandbox: {heartbeatMisses: 0}}')
    r = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "start", "--config", str(bad), "--state-dir", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "sandbox.heartbeatMisses" in r.stderr and "greater than or equal to 1" in r.stderr


def test_bundled_plugins_have_valid_manifests() -> None:
    for d in PLUGINS.iterdir():
        if (d / "clawsup.plugin.json").exists():
            m = load_manifest(d)
            assert m.contracts.tools, d
