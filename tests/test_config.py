"""Bad input gets a clear error that names the key path, and nothing starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from clawsup.sandbox.manifest import ManifestError, load_manifest
from clawsup.supervisor.config import DEFAULT_CONFIG, ClawsupConfig, load_config, parse_config
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.sandboxes.plans import build_plans
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
    # A stop grace of 28 hours would hold every shutdown and idle stop that long.
    bad = tmp_path / "clawsup.json"
    bad.write_text('{sandbox: {stopGraceSeconds: 100000}}')
    r = subprocess.run(
        [sys.executable, "-m", "clawsup.supervisor.control.cli", "start", "--config", str(bad), "--state-dir", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "sandbox.stopGraceSeconds: 100000 is more than the maximum of 60" in " ".join(r.stderr.split())
    assert not (tmp_path / "s" / "run" / "control.sock").exists()


# -- bounds ---------------------------------------------------------------------------

# Each family of numbers, at one of its keys or more: (key path, too small, the minimum,
# too large, the maximum). The bounds and their reasons are in supervisor/config.py.
BOUNDS = [
    # graces: one polite step of a stop or an exec kill
    ("sandbox.stopGraceSeconds", 0.05, 0.1, 100_000, 60),
    ("tools.exec.killGraceSeconds", 0, 0.1, 61, 60),
    # a child coming up
    ("sandbox.handshakeTimeoutSeconds", 0.01, 0.5, 601, 600),
    ("agents.defaults.subagents.startTimeoutSeconds", 0.1, 0.5, 3600, 600),
    # heartbeat
    ("sandbox.heartbeatIntervalSeconds", 0.001, 0.1, 601, 600),
    ("sandbox.heartbeatTimeoutSeconds", 0.01, 0.05, 601, 600),
    ("sandbox.heartbeatMisses", 0, 1, 101, 100),
    # one call, one model request
    ("sandbox.defaults.callTimeoutSeconds", 0, 0.1, 3601, 3600),
    ("plugins.entries.x.sandbox.callTimeoutSeconds", 0.01, 0.1, 86_400, 3600),
    ("providers.anthropic.timeoutSeconds", 0, 0.1, 7200, 3600),
    # a command's or a run's deadline
    ("tools.exec.timeoutSeconds", 0.5, 1, 86_401, 86_400),
    ("tools.exec.maxTimeoutSeconds", 0, 1, 10**9, 86_400),
    ("agents.defaults.subagents.runTimeoutSeconds", 0.5, 1, 86_401, 86_400),
    ("agents.defaults.subagents.maxRunTimeoutSeconds", 0, 1, 10**6, 86_400),
    ("agents.defaults.sandbox.idleStopSeconds", 0.5, 1, 604_801, 604_800),
    # restart policy
    ("sandbox.defaults.restart.maxRestarts", -1, 0, 1001, 1000),
    ("sandbox.defaults.restart.periodSeconds", 0.001, 1, 86_401, 86_400),
    ("plugins.entries.x.sandbox.restart.backoffInitialSeconds", 0, 0.05, 3601, 3600),
    ("sandbox.defaults.restart.backoffMaxSeconds", 0.01, 0.05, 86_400, 3600),
    # memory and tmpfs (MiB)
    ("sandbox.defaults.memoryMb", 16, 32, 1_048_576, 65_536),
    ("plugins.entries.x.sandbox.memoryMb", 1, 32, 536_870_912, 65_536),
    ("agents.defaults.sandbox.memoryMb", 32, 64, 65_537, 65_536),
    ("sandbox.defaults.tmpMb", 0, 1, 65_537, 65_536),
    ("agents.defaults.sandbox.tmpMb", 0, 1, 10**6, 65_536),
    ("plugins.entries.x.sandbox.maxFileSizeMb", 0, 1, 65_537, 65_536),
    ("agents.defaults.sandbox.maxFileSizeMb", 0, 1, 10**6, 65_536),
    # disk (MiB)
    ("sandbox.defaults.maxWorkspaceMb", 0, 1, 1_048_577, 1_048_576),
    ("agents.defaults.sandbox.maxWorkspaceMb", -5, 1, 10**9, 1_048_576),
    # processes, files, CPU
    ("sandbox.defaults.maxProcesses", 4, 8, 1_000_000, 32_768),
    ("plugins.entries.x.sandbox.maxProcesses", 7, 8, 32_769, 32_768),
    ("agents.defaults.sandbox.maxProcesses", 8, 16, 32_769, 32_768),
    ("sandbox.defaults.maxOpenFiles", 16, 32, 1_048_577, 1_048_576),
    ("plugins.entries.x.sandbox.maxOpenFiles", 31, 32, 10**7, 1_048_576),
    ("sandbox.defaults.cpuSeconds", 0, 1, 2_592_001, 2_592_000),
    ("agents.defaults.sandbox.cpuSeconds", 0, 1, 10**8, 2_592_000),
    ("sandbox.defaults.cpus", 0, 0.01, 65, 64),
    ("plugins.entries.x.sandbox.cpus", 0.001, 0.01, 1000, 64),
    # uids
    ("sandbox.uids.first", 999, 1000, 2**31 - 16, 2**31 - 17),
    ("sandbox.uids.count", 15, 16, 2**30 + 1, 2**30),
    # queues (messages in memory)
    ("bus.inboundCapacity", 0, 1, 100_001, 100_000),
    ("bus.outboundCapacity", 0, 1, 10**6, 100_000),
    ("bus.sessionQueue", 0, 1, 100_001, 100_000),
    # output and reads (bytes)
    ("tools.exec.maxOutputBytes", 1023, 1024, 8 * 2**20 + 1, 8 * 2**20),
    ("tools.fs.readMaxBytes", 100, 1024, 2 * 2**20 + 1, 2 * 2**20),
    # sessions, subagents, the agent loop, providers, channels
    ("sessionStore.fsyncIntervalMs", 0, 1, 60_001, 60_000),
    ("sessionStore.maxOpenFiles", 3, 4, 4097, 4096),
    ("agents.defaults.subagents.maxSpawnDepth", 0, 1, 6, 5),
    ("agents.defaults.subagents.maxChildrenPerAgent", 0, 1, 51, 50),
    ("agentLoop.maxIterations", 0, 1, 201, 200),
    ("agentLoop.historyMessages", 0, 1, 10_001, 10_000),
    ("agentLoop.loopDetection.sameCallWarn", 1, 2, 1001, 1000),
    ("agentLoop.loopDetection.sameFileReadsStop", 1, 2, 10**6, 1000),
    ("providers.litellm.maxRetries", -1, 0, 11, 10),
    ("providers.anthropic.maxTokens", 0, 1, 1_000_001, 1_000_000),
    ("channels.http.port", -1, 0, 65_536, 65_535),
]


# Keys checked against each other: the other one's value that lets any bound pass.
PARTNERS = {
    "agents.defaults.subagents.runTimeoutSeconds": ("agents.defaults.subagents.maxRunTimeoutSeconds", 86_400),
    "agents.defaults.subagents.maxRunTimeoutSeconds": ("agents.defaults.subagents.runTimeoutSeconds", 1),
    "sandbox.uids.first": ("sandbox.uids.count", 16),
    "sandbox.uids.count": ("sandbox.uids.first", 1000),
}


def config_with(*pairs: tuple[str, Any]) -> str:
    cfg: dict[str, Any] = {}
    for path, value in pairs:
        node = cfg
        *parents, last = path.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[last] = value
    return json.dumps(cfg)


@pytest.mark.parametrize(("key", "small", "lo", "large", "hi"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_numbers_out_of_bounds_name_the_key_and_the_bound(key: str, small: float, lo: float, large: float, hi: float) -> None:
    for value, expected in ((small, f"{key}: {small} is less than the minimum of {lo}"), (large, f"{key}: {large} is more than the maximum of {hi}")):
        with pytest.raises(ConfigError) as e:
            parse_config(config_with((key, value)), "clawsup.json")
        assert e.value.problems == [expected]
    # The bounds themselves are allowed.
    partner = [PARTNERS[key]] if key in PARTNERS else []
    parse_config(config_with((key, lo), *partner), "clawsup.json")
    parse_config(config_with((key, hi), *partner), "clawsup.json")


def test_a_number_in_the_wrong_unit_is_caught() -> None:
    """512 MiB written in bytes, and NaN (which JSON5 allows and every comparison
    lets through)."""
    with pytest.raises(ConfigError, match=r"sandbox\.defaults\.memoryMb: 536870912 is more than the maximum of 65536"):
        parse_config("{sandbox: {defaults: {memoryMb: 536870912}}}", "c")
    with pytest.raises(ConfigError, match=r"sandbox\.stopGraceSeconds: must be a number, not NaN"):
        parse_config("{sandbox: {stopGraceSeconds: NaN}}", "c")
    with pytest.raises(ConfigError, match=r"sandbox\.stopGraceSeconds: inf is more than the maximum of 60"):
        parse_config("{sandbox: {stopGraceSeconds: Infinity}}", "c")


def test_a_run_timeout_past_the_maximum_is_refused_and_the_default_follows_it_down() -> None:
    # Else every spawn that gives no runTimeoutSeconds would be refused at run time.
    with pytest.raises(ConfigError, match=r"agents\.defaults\.subagents: runTimeoutSeconds: 400 is more than maxRunTimeoutSeconds \(300\)"):
        parse_config("{agents: {defaults: {subagents: {maxRunTimeoutSeconds: 300, runTimeoutSeconds: 400}}}}", "c")
    # A config that only lowers the maximum is a sane one: the default comes down.
    cfg = parse_config("{agents: {defaults: {subagents: {maxRunTimeoutSeconds: 300}}}}", "c")
    assert cfg.agents.defaults.subagents.run_timeout_seconds == 300


def _unbounded(model: type[BaseModel], path: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        out += _unbounded_in(f.annotation, list(f.metadata), f"{path}{f.alias or name}")
    return out


def _unbounded_in(tp: Any, meta: list[Any], key: str) -> list[str]:
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *extra = get_args(tp)
        return _unbounded_in(inner, meta + [m for x in extra for m in (x.metadata if isinstance(x, FieldInfo) else [x])], key)
    if origin in (Union, types.UnionType):
        return [k for a in get_args(tp) if a is not type(None) for k in _unbounded_in(a, meta, key)]
    if origin in (list, dict):
        return _unbounded_in(get_args(tp)[-1], [], key + ("[]" if origin is list else ".<id>"))
    if tp in (int, float):
        low, high = any(isinstance(m, (Ge, Gt)) for m in meta), any(isinstance(m, (Le, Lt)) for m in meta)
        return [] if low and high else [key]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _unbounded(tp, key + ".")
    return []


def test_every_number_in_the_config_has_a_floor_and_a_ceiling() -> None:
    """Walks the whole model, so that a key added later without bounds fails here."""
    assert _unbounded(ClawsupConfig) == []
    # The walk sees bounds where there are some: the manifest's asks have none above.
    from clawsup.sandbox.manifest import SandboxRequest

    assert "memoryMb" in _unbounded(SandboxRequest)


def test_defaults_and_test_configs_are_within_bounds() -> None:
    # pydantic does not check defaults: a default outside its own bounds would pass.
    ClawsupConfig.model_validate(ClawsupConfig().model_dump(by_alias=True, mode="json"))
    load_config(DEFAULT_CONFIG)
    parse_config(json.dumps(make_config()), "make_config")


def test_bundled_plugins_have_valid_manifests() -> None:
    for d in PLUGINS.iterdir():
        if (d / "clawsup.plugin.json").exists():
            m = load_manifest(d)
            assert m.contracts.tools, d


def test_the_same_folder_named_twice_is_one_plugin_not_a_conflict(tmp_path: Path) -> None:
    """The folder from plugins.load.paths and the same folder from --plugin (even
    spelled differently) are one plugin; a different folder with the same id is a
    conflict that names both."""
    cfg = make_config()
    basics = Path(cfg["plugins"]["load"]["paths"][0])
    plans = plans_for(cfg, tmp_path, extra=[basics / ".." / basics.name])
    assert [p.plugin_id for p in plans].count("basics") == 1
    twin = tmp_path / "twin"
    shutil.copytree(basics, twin)
    with pytest.raises(ConfigError, match=r"--plugin .*twin: plugin id 'basics' is also loaded from .*basics"):
        plans_for(cfg, tmp_path, extra=[twin])
