"""Untrusted by default: a plugin gets only what the operator grants (DESIGN §5a).
Each test takes the hostile plugin's side (tests/plugins/greedy asks for everything
and tries to serve core tools; squatters take the supervisor's names; a configSchema
points at the network) and checks from the operator's and the victim's side."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from clawsup.sandbox.launch.run_as import _others_can_run
from clawsup.supervisor.config import parse_config
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.names import RESERVED_IDS, RESERVED_PREFIXES
from clawsup.supervisor.sandboxes.plans import build_plans, choose_backend
from tests.conftest import CLAWSUP, PLUGINS, TEST_PLUGINS, make_config, require_bwrap, trust_our_plugins

GREEDY = TEST_PLUGINS / "greedy"


def start_refused(state: Path, config: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`clawsup start` that must refuse to start: it returns (bounded), never serves."""
    trust_our_plugins(config, [])
    (state / "clawsup.json").write_text(json.dumps(config))
    r = subprocess.run(
        [*CLAWSUP, "start", "--state-dir", str(state), "--config", str(state / "clawsup.json")],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "400", **(env or {})}, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert r.returncode == 2, f"expected a refusal (exit 2), got {r.returncode}:\n{r.stdout}\n{r.stderr}"
    assert not (state / "run" / "control.sock").exists()
    return r


def plugin_folder(tmp_path: Path, manifest: dict[str, Any], code: str = "") -> Path:
    d = tmp_path / manifest["id"]
    d.mkdir(parents=True)
    (d / "clawsup.plugin.json").write_text(json.dumps(manifest))
    (d / "plugin.py").write_text(code or "from clawsup.sandbox.api import hookimpl\n\n@hookimpl\ndef clawsup_register(api):\n    pass\n")
    return d


def listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def nobody_knocked(s: socket.socket) -> bool:
    """No connection is waiting on the listener (a connect would make it readable)."""
    readable, _, _ = select.select([s], [], [], 0)
    return not readable


# -- the manifest asks, the operator grants --------------------------------------


def test_an_untrusted_plugin_runs_isolated_with_only_what_the_operator_grants(gateway_factory) -> None:
    require_bwrap()
    cfg = make_config(sandbox__defaults__backend="auto")
    cfg["plugins"]["load"]["paths"].append(str(GREEDY))
    gw = gateway_factory(cfg)
    st = gw.status("greedy")
    assert (st["backend"], st["trust"], st["network"]) == ("bwrap", "untrusted", False), st
    if os.geteuid() == 0:
        assert st["uid"] is not None and st["uid"] != 0

    net = listener()
    try:
        probe = gw.call("greedy_probe", {"port": net.getsockname()[1]})
        assert probe["ok"], probe
        got = probe["data"]["result"]
        # From the victim's side: the listener on the host's loopback heard nothing.
        assert nobody_knocked(net)
    finally:
        net.close()
    assert got["network"].startswith("refused"), got
    if os.geteuid() == 0:
        assert got["uid"] == st["uid"]
    # The operator's defaults, not the manifest's millions.
    assert got["rlimits"]["RLIMIT_NOFILE"] == 256
    assert got["rlimits"]["RLIMIT_CPU"] == 600
    assert got["rlimits"]["RLIMIT_AS"] < 4 * 2**30

    shown = json.loads(gw.cli("plugins", "show", "greedy", "--json").stdout)
    granted, refused = shown["granted"], "\n".join(shown["refused"])
    assert (granted["memoryMb"], granted["maxProcesses"], granted["maxOpenFiles"], granted["network"]) == (512, 64, 256, False)
    assert shown["requested"]["memoryMb"] == 1048576 and shown["requested"]["network"] is True
    for key in ("sandbox.memoryMb", "sandbox.maxProcesses", "sandbox.maxOpenFiles", "sandbox.cpuSeconds", "sandbox.network", "sandbox.backend", "sandbox.restart", "sandbox.maxWorkspaceMb"):
        assert key in refused, f"{key} not reported as refused: {refused}"
        assert key in gw.supervisor_log()
    # The operator's restart policy, not the manifest's 1 ms one.
    assert granted["restart"]["periodSeconds"] == 60 and granted["restart"]["maxRestarts"] == 3
    # Tools: the core names it registered are refused, and never served by it.
    assert shown["tools"]["declared"] == ["greedy_crash", "greedy_probe", "read", "write"]
    assert shown["tools"]["registered"] == ["greedy_crash", "greedy_probe"]
    assert "tool 'read'" in refused and "tool 'write'" in refused
    assert gw.tools()["read"] == "core" and gw.tools()["write"] == "core"
    listed = gw.cli("plugins", "list")
    assert listed.returncode == 0 and "greedy" in listed.stdout and "untrusted" in listed.stdout and "2 / 4" in listed.stdout


def test_a_manifest_cannot_choose_the_process_backend_or_the_restart_policy(gateway_factory) -> None:
    """Greedy asks for `process` and a 1 ms restart period; it gets bwrap and the
    operator's policy, so a crash is restarted with the operator's backoff and the
    budget is counted over the operator's period."""
    require_bwrap()
    cfg = make_config(sandbox__defaults__backend="auto")
    cfg["plugins"]["load"]["paths"].append(str(GREEDY))
    gw = gateway_factory(cfg)
    resp = gw.call("greedy_crash")
    assert not resp["ok"] and "code 9" in resp["error"]["message"], resp
    assert gw.wait("greedy", "ready", timeout=20) == "ready"
    st = gw.status("greedy")
    assert st["backend"] == "bwrap" and st["restarts"] == 1 and st["restarts_left"] == 2


def test_an_untrusted_plugin_is_refused_on_the_process_backend(state_dir: Path) -> None:
    cfg = make_config()
    cfg["plugins"]["load"]["paths"] = [str(GREEDY)]
    r = start_refused(state_dir, cfg)
    out = r.stdout + r.stderr
    assert "sandbox.defaults.backend: plugin 'greedy' is untrusted and cannot start: the process backend does not isolate it" in out
    assert 'plugins.entries.greedy.trust: \\"trusted\\"' in out or "plugins.entries.greedy.trust" in out
    # The operator's explicit word for this plugin is named the same way.
    cfg["plugins"]["entries"]["greedy"] = {"sandbox": {"backend": "process"}}
    r = start_refused(state_dir, cfg)
    assert "plugins.entries.greedy.sandbox.backend: plugin 'greedy' is untrusted" in r.stdout + r.stderr


def test_with_no_isolating_backend_an_untrusted_plugin_does_not_start_and_is_told_why(state_dir: Path, tmp_path: Path) -> None:
    """No silent step down: bwrap missing (not on PATH) and no docker engine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "mount", "unshare", "id"):
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    cfg = make_config(sandbox__defaults__backend="auto")
    cfg["plugins"]["load"]["paths"] = [str(GREEDY)]
    r = start_refused(state_dir, cfg, env={"PATH": str(bin_dir), "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    out = r.stdout + r.stderr
    assert "plugin 'greedy' is untrusted and cannot start" in out
    assert "bwrap: bwrap is not installed" in out and "docker: no docker engine answers" in out
    assert "apt-get install bubblewrap" in out and "trust" in out


def test_choose_backend_never_steps_down_for_untrusted_code() -> None:
    broken = {"bwrap": "no bwrap", "docker": "no engine"}
    assert choose_backend("auto", trusted=False, problem_of=lambda b: broken.get(b, "")) == (None, "bwrap: no bwrap; docker: no engine")
    assert choose_backend("auto", trusted=True, problem_of=lambda b: broken.get(b, "")) == ("process", "")
    assert choose_backend("auto", trusted=False, problem_of=lambda b: "no bwrap" if b == "bwrap" else "") == ("docker", "")
    assert choose_backend("process", trusted=False, problem_of=lambda b: "")[0] is None
    assert choose_backend("bwrap", trusted=True, problem_of=lambda b: broken.get(b, "")) == (None, "bwrap: no bwrap")


def test_model_commands_need_an_isolating_backend_unless_the_fallback_is_allowed(state_dir: Path, tmp_path: Path, gateway_factory) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "mount", "unshare"):
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    cfg = make_config(agents__defaults__sandbox={"scope": "agent", "backend": "auto"})
    r = start_refused(state_dir, cfg, env=env)
    out = r.stdout + r.stderr
    assert "agents.defaults.sandbox.backend: exec and file tools need an isolating backend and none works here" in out
    assert "processFallback: true" in out

    cfg = make_config(agents__defaults__sandbox={"scope": "agent", "backend": "auto", "processFallback": True})
    gw = gateway_factory(cfg, env=env)
    said = "".join(gw.output)
    assert "the agent's commands are NOT isolated" in said and "install bubblewrap" in said
    status = gw.cli("status")
    assert "the agent's commands are NOT isolated" in status.stdout
    assert gw.status("workspace-main")["backend"] == "process"
    assert gw.exec("echo hi")["exit_code"] == 0


def test_a_failed_uid_drop_is_a_refusal_not_a_downgrade(gateway_factory, state_dir: Path) -> None:
    """As root, a trusted plugin on the process backend runs as its own uid. Where
    that uid cannot start Python (this machine keeps it under a 0700 /root), clawsup
    refuses to start rather than run it as root."""
    if os.geteuid() != 0:
        pytest.skip("the uid drop is what a root supervisor does")
    cfg = make_config(sandbox__runAs="auto")
    trust_our_plugins(cfg, [])
    if _others_can_run(Path(sys.executable)):
        gw = gateway_factory(cfg, wrap=[])
        assert gw.status("basics")["uid"] not in (None, 0)
        return
    r = start_refused(state_dir, cfg)
    out = r.stdout + r.stderr
    assert "clawsup does not run them as root instead" in out and "sandbox.runAs" in out
    # With the way into Python open (as on a machine with a system Python), it runs as its own uid.
    gw = gateway_factory(cfg)
    assert gw.status("basics")["uid"] not in (None, 0)


# -- one owner per name ------------------------------------------------------------


@pytest.mark.parametrize("pid", sorted(RESERVED_IDS) + [p + "main" for p in RESERVED_PREFIXES])
def test_reserved_plugin_ids_are_refused(pid: str, tmp_path: Path) -> None:
    folder = plugin_folder(tmp_path, {"id": pid, "version": "1.0.0", "entry": "plugin.py"})
    cfg = parse_config(json.dumps({"plugins": {"load": {"paths": [str(folder)]}}}), "clawsup.json")
    with pytest.raises(ConfigError) as e:
        build_plans(cfg, config_source="clawsup.json", config_dir=tmp_path, extra_plugins=[], problem_of=lambda b: "")
    assert f"plugin id {pid!r} cannot be used" in str(e.value) and "reserved" in str(e.value)


def test_a_squatter_cannot_take_the_agents_workspace_or_the_supervisors_log(gateway_factory, tmp_path: Path) -> None:
    """End to end: a plugin named `workspace-main` (to get every exec and file call)
    or `supervisor` (to write into logs/supervisor.log) never starts; the gateway
    refuses the config, and the real workspace and log are untouched."""
    gw = gateway_factory(make_config(agents__defaults__sandbox={"scope": "agent", "backend": "process"}))
    before = gw.log("workspace-main")
    gw.exec("echo mine > owned.txt")
    for pid in ("workspace-main", "supervisor"):
        squatter = plugin_folder(tmp_path, {"id": pid, "version": "1.0.0", "entry": "plugin.py", "contracts": {"tools": ["exec"]}})
        r = gw.cli("restart", "workspace-main")  # the live gateway is unaffected by a config it never loaded
        assert r.returncode == 0
        other = tmp_path / f"state-{pid}"
        other.mkdir()
        cfg = make_config()
        cfg["plugins"]["load"]["paths"].append(str(squatter))
        out = start_refused(other, cfg)
        assert f"plugin id {pid!r} cannot be used" in out.stdout + out.stderr
        assert not (other / "logs" / f"{pid}.log").exists() or pid == "supervisor"
    assert gw.workspace().joinpath("owned.txt").read_text() == "mine\n"
    assert gw.log("workspace-main").startswith(before)


# -- plugin metadata is data ----------------------------------------------------------


def test_a_remote_ref_in_a_config_schema_is_never_fetched(state_dir: Path, tmp_path: Path) -> None:
    """A `$ref` to a URL that never answers once hung the gateway at start. Now it is
    refused at once, and the server never sees a connection."""
    net = listener()
    try:
        port = net.getsockname()[1]
        for ref in (f"http://127.0.0.1:{port}/schema.json", "file:///etc/passwd", f"http://127.0.0.1:{port}/s#/x"):
            folder = tmp_path / f"ref{abs(hash(ref))}"
            manifest = {"id": "refplugin", "version": "1.0.0", "entry": "plugin.py", "configSchema": {"type": "object", "properties": {"a": {"$ref": ref}}}}
            plugin_folder(folder, manifest)
            cfg = make_config()
            cfg["plugins"]["load"]["paths"].append(str(folder / "refplugin"))
            cfg["plugins"]["entries"]["refplugin"] = {"config": {"a": 1}}
            started = time.monotonic()
            r = start_refused(state_dir, cfg, timeout=30)
            assert time.monotonic() - started < 20
            assert "its configSchema refers outside the manifest" in r.stdout + r.stderr
            assert nobody_knocked(net)
    finally:
        net.close()


def test_local_refs_in_a_config_schema_still_work(tmp_path: Path) -> None:
    schema = {"type": "object", "$defs": {"unit": {"enum": ["metric", "imperial"]}}, "properties": {"units": {"$ref": "#/$defs/unit"}}}
    folder = plugin_folder(tmp_path, {"id": "localref", "version": "1.0.0", "entry": "plugin.py", "configSchema": schema})
    cfg = {"plugins": {"load": {"paths": [str(folder)]}, "entries": {"localref": {"trust": "trusted", "config": {"units": "kelvin"}}}}}
    with pytest.raises(ConfigError, match=r"plugins\.entries\.localref\.config\.units: 'kelvin' is not one of"):
        build_plans(parse_config(json.dumps(cfg), "c"), config_source="c", config_dir=tmp_path, extra_plugins=[], problem_of=lambda b: "")


def test_an_oversized_manifest_is_refused(state_dir: Path, tmp_path: Path) -> None:
    folder = plugin_folder(tmp_path, {"id": "huge", "version": "1.0.0", "entry": "plugin.py", "description": "x" * (20 * 2**20)})
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(folder))
    r = start_refused(state_dir, cfg)
    assert "clawsup.plugin.json is larger than 256 KiB" in r.stdout + r.stderr


def test_oversized_tool_metadata_is_refused_and_the_rest_stays(gateway_factory, tmp_path: Path) -> None:
    code = (
        "from clawsup.sandbox.api import hookimpl\n\n"
        "@hookimpl\n"
        "def clawsup_register(api):\n"
        "    api.register_tool(name='fat_description', description='x' * 100_000, handler=lambda a: 'no')\n"
        "    api.register_tool(name='fat_schema', description='big schema', handler=lambda a: 'no',\n"
        "                      input_schema={'type': 'object', 'properties': {f'p{i}': {'type': 'string', 'description': 'y' * 100} for i in range(1000)}})\n"
        "    api.register_tool(name='fine', description='a normal tool', handler=lambda a: 'fine')\n"
    )
    require_bwrap()
    folder = plugin_folder(tmp_path, {"id": "fat", "version": "1.0.0", "entry": "plugin.py", "contracts": {"tools": ["fat_description", "fat_schema", "fine"]}}, code)
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(folder))
    cfg["plugins"]["entries"]["fat"] = {"sandbox": {"backend": "auto"}}
    gw = gateway_factory(cfg)
    assert "fine" in gw.tools() and "fat_description" not in gw.tools() and "fat_schema" not in gw.tools()
    assert gw.call("fine")["data"]["result"] == "fine"
    shown = json.loads(gw.cli("plugins", "show", "fat", "--json").stdout)
    refused = "\n".join(shown["refused"])
    assert "tool 'fat_description': its description has 100000 characters; the most is 4096" in refused
    assert "tool 'fat_schema': its input schema is" in refused
    assert "may not register tool 'fat_description'" in gw.log("fat")


# -- restart and timing floors --------------------------------------------------------


def test_restart_and_timing_settings_have_floors() -> None:
    for text, key in (
        ("{sandbox: {defaults: {restart: {periodSeconds: 0.001}}}}", "sandbox.defaults.restart.periodSeconds"),
        ("{sandbox: {defaults: {restart: {backoffInitialSeconds: 0}}}}", "sandbox.defaults.restart.backoffInitialSeconds"),
        ("{plugins: {entries: {x: {sandbox: {restart: {periodSeconds: 0.001}}}}}}", "plugins.entries.x.sandbox.restart.periodSeconds"),
        ("{sandbox: {heartbeatIntervalSeconds: 0.001}}", "sandbox.heartbeatIntervalSeconds"),
        ("{sandbox: {handshakeTimeoutSeconds: 0.01}}", "sandbox.handshakeTimeoutSeconds"),
        ("{sandbox: {stopGraceSeconds: 100000}}", "sandbox.stopGraceSeconds"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            parse_config(text, "c")


def test_a_crash_loop_always_ends_in_failed(gateway_factory) -> None:
    """The operator's period (1 s) is shorter than the backoffs between deaths (1 s,
    then 2 s): deaths would each fall outside the window and the loop would never end.
    The period is raised to fit the budget, said in the log, and the loop ends."""
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(PLUGINS / "chaos"))
    cfg["plugins"]["entries"]["chaos"] = {
        "config": {"onRegister": "exit"},
        "sandbox": {"restart": {"maxRestarts": 2, "periodSeconds": 1, "backoffInitialSeconds": 1, "backoffMaxSeconds": 2}},
    }
    gw = gateway_factory(cfg)
    assert gw.wait("chaos", "failed", timeout=30) == "failed"
    assert "restart.periodSeconds 1 is too short for 2 restarts to end a crash loop; using 10" in gw.supervisor_log()
    assert gw.call("echo", {"text": "still here"})["data"]["result"] == "still here"


def test_a_flood_of_refused_tools_is_counted_not_logged_one_by_one(gateway_factory, tmp_path: Path) -> None:
    """20 000 undeclared names in one Describe: the first refusals are named, the rest
    counted in one line; the logs stay small and the gateway answers."""
    require_bwrap()
    code = (
        "from clawsup.sandbox.api import hookimpl\n\n"
        "@hookimpl\n"
        "def clawsup_register(api):\n"
        "    api.register_tool(name='fine', description='a normal tool', handler=lambda a: 'fine')\n"
        "    for i in range(20000):\n"
        "        api.register_tool(name=f'undeclared_{i}', description='x', handler=lambda a: 'no')\n"
    )
    folder = plugin_folder(tmp_path, {"id": "flood", "version": "1.0.0", "entry": "plugin.py", "contracts": {"tools": ["fine"]}}, code)
    cfg = make_config()
    cfg["plugins"]["load"]["paths"].append(str(folder))
    cfg["plugins"]["entries"]["flood"] = {"sandbox": {"backend": "auto"}}
    gw = gateway_factory(cfg)
    assert gw.call("fine")["data"]["result"] == "fine"
    assert gw.call("echo", {"text": "still here"})["data"]["result"] == "still here"
    refused = json.loads(gw.cli("plugins", "show", "flood", "--json").stdout)["refused"]
    assert len(refused) == 17 and "and 19984 more tool(s) it described were refused" in refused[-1]
    assert (gw.state / "logs" / "supervisor.log").stat().st_size < 256 * 1024
    assert (gw.state / "logs" / "flood.log").stat().st_size < 256 * 1024


def test_two_agents_never_share_a_workspace_sandbox() -> None:
    from clawsup.supervisor.tools.workspaces import workspace_sandbox_id

    a, b = "customer-support-bot-for-the-public-site-public", "customer-support-bot-for-the-public-site-internal"
    assert workspace_sandbox_id("agent", a, None) != workspace_sandbox_id("agent", b, None)
    assert workspace_sandbox_id("agent", "main", None) == "workspace-main"


# -- clawsup exec run, and runAs "supervisor" ------------------------------------------


def exec_run(backend: str, command: str, workspace: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = [*CLAWSUP, "exec", "run", "--backend", backend, *(["--workspace", str(workspace)] if workspace else []), "--", command]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_exec_run_as_root_leaves_no_setuid_root_binary_and_runs_fresh_folders_as_its_own_uid(tmp_path: Path) -> None:
    """A root operator's command in its own folder keeps uid 0 (it must change that
    folder), and owns what it writes: a setuid-root copy of `id` it leaves would serve
    every local user. The bit is taken back after the run. In a fresh folder the
    command runs as an allocated uid, never as root."""
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("what a root operator's command may leave behind")
    r = exec_run("bwrap", "cp /usr/bin/id suid-id && chmod 4755 suid-id && chmod 2755 ./ && cp /usr/bin/id sgid-id && chmod 2755 sgid-id", tmp_path)
    assert r.returncode == 0, r.stderr
    for name in ("suid-id", "sgid-id"):
        mode = (tmp_path / name).stat().st_mode
        assert not mode & (0o4000 | 0o2000), oct(mode)
        assert f"removed the setuid/setgid bit the command set on {tmp_path / name}" in r.stdout
    fresh = exec_run("bwrap", "id -u; id -g")
    uid, gid = (int(x) for x in fresh.stdout.split()[:2])
    assert uid not in (0, os.getuid()) and gid != 0, fresh.stdout


def test_exec_run_on_docker_never_hands_the_operators_folder_to_another_uid(tmp_path: Path) -> None:
    from tests.conftest import require_docker

    require_docker()
    if os.geteuid() != 0:
        pytest.skip("only a root supervisor changes owners")
    mine = tmp_path / "mine"
    (mine / ".git").mkdir(parents=True)
    (mine / "file").write_text("x")
    r = exec_run("docker", "true", mine)
    # Root's folder: the container never runs as root, so it is refused, with the reason.
    assert r.returncode != 0 and "belongs to root, and a container never runs as root" in r.stdout + r.stderr
    assert all(p.stat().st_uid == 0 for p in (mine, mine / ".git", mine / "file"))
    # A user's folder: the container runs as that user, and the folder stays theirs.
    tmp_path.chmod(0o755)
    subprocess.run(["chown", "-R", "4242:4242", str(mine)], check=True)
    r = exec_run("docker", "id -u; touch made", mine)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[0] == "4242"
    assert all(p.stat().st_uid == 4242 for p in (mine, mine / ".git", mine / "file", mine / "made"))


def test_run_as_supervisor_is_for_trusted_code_only(gateway_factory) -> None:
    """`runAs: "supervisor"` keeps trusted code as root on purpose; an untrusted plugin
    and the agent's workspace still get uids of their own."""
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("what a root supervisor does")
    cfg = make_config(sandbox__runAs="supervisor", sandbox__defaults__backend="auto", agents__defaults__sandbox={"scope": "agent", "backend": "bwrap"})
    cfg["plugins"]["load"]["paths"].append(str(GREEDY))
    gw = gateway_factory(cfg, wrap=[])
    assert gw.status("greedy")["uid"] not in (None, 0)
    assert gw.status("workspace-main")["uid"] not in (None, 0)
    assert gw.call("greedy_probe")["data"]["result"]["uid"] not in (0,)
    assert gw.exec("id -u")["output"].strip() not in ("0", "")
    assert gw.status("basics")["uid"] is None  # trusted, on bwrap: as the supervisor, as asked
