"""`mcpServers` entries into sandbox plans (supervisor/sandboxes/mcp_plans.py), and a
stdio server's install made visible inside its sandbox (supervisor/sandboxes/
mcp_install.py, the bwrap and docker binds of LaunchSpec.visible_paths).

Plan tests use real files: venvs made here with `python -m venv`, scripts with `#!`
lines, symlink chains, node_modules trees. The sandbox tests launch real children;
the attacker-side test runs a hostile plugin beside an MCP server that was handed a
secret and looks for the secret everywhere an operator or another child could."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

import pytest

from clawsup.sandbox.launch.launcher import LaunchSpec
from clawsup.supervisor.config import parse_config
from clawsup.supervisor.errors import ConfigError
from clawsup.supervisor.sandboxes.mcp_plans import build_mcp_plans, initialize_timeout
from clawsup.supervisor.sandboxes.plans import SandboxPlan
from tests.conftest import TEST_PLUGINS, make_config, require_backend
from tests.test_launchers import handshake, launcher_for, make_spec

BASE_PREFIX = os.path.realpath(sys.base_prefix)
"""The prefix of the interpreter the test venvs are made from."""


def plans(
    servers: dict[str, Any], tmp_path: Path, *, environ: dict[str, str] | None = None, broken: dict[str, str] | None = None, state: Path | None = None, **cfg: Any
) -> list[SandboxPlan]:
    """The plans of `servers` as `mcpServers`, the config in `tmp_path/config`, the
    state directory `tmp_path/state` (or `state`), the home `tmp_path/home`.
    `broken`: backends that do not work here, and why."""
    config_dir, home = tmp_path / "config", tmp_path / "home"
    state = state or tmp_path / "state"
    for d in (config_dir, state, home):
        d.mkdir(exist_ok=True)
    parsed = parse_config(json.dumps({"mcpServers": servers, **cfg}), str(config_dir / "clawsup.json"))
    env = {"PATH": os.environ["PATH"]} if environ is None else environ
    return build_mcp_plans(parsed, config_dir=config_dir, state_dir=state, environ=env, home=home, problem_of=lambda b: (broken or {}).get(b, ""))


def problems(servers: dict[str, Any], tmp_path: Path, **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as e:
        plans(servers, tmp_path, **kw)
    return e.value.problems


def one(servers: dict[str, Any], tmp_path: Path, **kw: Any) -> SandboxPlan:
    [p] = plans(servers, tmp_path, **kw)
    return p


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def make_venv(where: Path, *, system_site_packages: bool = False) -> Path:
    """A real venv of this interpreter (no pip: resolution needs only its layout)."""
    args = [sys.executable, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site_packages else []), str(where)]
    subprocess.run(args, check=True, capture_output=True, timeout=120)
    return where


def console_script(venv: Path, name: str, module: str) -> Path:
    """What pip writes for an entry point: a script whose #! is the venv's python."""
    return executable(venv / "bin" / name, f"#!{venv}/bin/python\nimport sys\nfrom {module} import main\nsys.exit(main())\n")


# -- the entry ---------------------------------------------------------------------


def test_an_entry_becomes_a_plan_of_its_own(tmp_path: Path) -> None:
    p = one({"Time": {"command": "sh", "args": ["-c", "exit 0"], "tools": {"allow": ["get_*"], "deny": ["get_secret"]}, "callTimeoutSeconds": 7}}, tmp_path)
    assert (p.sandbox_id, p.plugin_id, p.role, p.plugin_dir, p.entry, p.declared_tools, p.plugin_config) == ("mcp-time", "mcp:Time", "mcp", None, "", frozenset(), {})
    assert p.mcp is not None
    assert (p.mcp.server_id, p.mcp.transport, p.mcp.prefix, p.mcp.allow, p.mcp.deny) == ("Time", "stdio", "Time_", ["get_*"], ["get_secret"])
    assert p.mcp.command == "/bin/sh" or p.mcp.command.endswith("/sh")
    assert p.mcp.args == ["-c", "exit 0"]
    assert p.limits.call_timeout_s == 7
    assert p.backend == "bwrap" and not p.trusted


def test_ids_equal_once_lower_cased_are_refused(tmp_path: Path) -> None:
    [line] = problems({"Docs": {"command": "sh"}, "docs": {"command": "sh"}}, tmp_path)
    assert "mcpServers.docs" in line and "mcpServers.Docs" in line and "mcp-docs" in line


@pytest.mark.parametrize("entry", [{"command": "sh", "url": "https://x.invalid/mcp"}, {"args": ["x"]}])
def test_a_server_needs_either_a_command_or_a_url(entry: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        plans({"x": entry}, tmp_path)
    assert any(p.startswith("mcpServers.x") and "either `command`" in p for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("bad", ["-x", "has space", "a.b", "x" * 49])
def test_a_bad_id_is_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        plans({bad: {"command": "sh"}}, tmp_path)
    assert any("mcpServers" in p for p in e.value.problems), e.value.problems


def test_the_sse_transport_is_refused_with_the_way_out(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        plans({"old": {"type": "sse", "url": "https://x.invalid/sse"}}, tmp_path)
    assert any("mcpServers.old" in p and "streamable HTTP" in p for p in e.value.problems), e.value.problems


def test_a_url_must_be_http(tmp_path: Path) -> None:
    assert problems({"r": {"url": "file:///etc/passwd"}}, tmp_path) == [
        "mcpServers.r.url: must be an http:// or https:// address (the server's streamable HTTP endpoint)"
    ]


def test_disabled_entries_make_no_plan_and_are_not_judged(tmp_path: Path) -> None:
    servers = {
        "off": {"command": "no-such-command-anywhere", "enabled": False},
        "cline": {"command": "no-such-command-anywhere", "disabled": True, "env": {"K": "${NOT_SET_ANYWHERE}"}},
        "on": {"command": "sh"},
    }
    assert [p.sandbox_id for p in plans(servers, tmp_path)] == ["mcp-on"]


def test_other_clients_keys_are_accepted(tmp_path: Path) -> None:
    p = one({"t": {"command": "sh", "autoApprove": ["x"], "timeout": 60}}, tmp_path)
    assert p.sandbox_id == "mcp-t"


# -- trust and backend -------------------------------------------------------------


def test_an_untrusted_server_is_refused_the_process_backend_with_the_way_out(tmp_path: Path) -> None:
    [line] = problems({"t": {"command": "sh", "sandbox": {"backend": "process"}}}, tmp_path)
    assert line.startswith("mcpServers.t.sandbox.backend: MCP server 't' is untrusted and cannot start"), line
    assert 'mcpServers.t.trust: "trusted"' in line
    p = one({"t": {"command": "sh", "trust": "trusted", "sandbox": {"backend": "process"}}}, tmp_path)
    assert (p.backend, p.trusted) == ("process", True)


def test_auto_never_steps_down_to_process_for_an_untrusted_server(tmp_path: Path) -> None:
    broken = {"bwrap": "no bwrap", "docker": "no engine"}
    [line] = problems({"t": {"command": "sh"}}, tmp_path, broken=broken)
    assert line.startswith("sandbox.defaults.backend: MCP server 't' is untrusted"), line
    assert one({"t": {"command": "sh", "trust": "trusted"}}, tmp_path, broken=broken).backend == "process"
    assert one({"t": {"command": "sh"}}, tmp_path, broken={"bwrap": "no bwrap"}).backend == "docker"


def test_limits_and_restart_follow_a_plugins_rules(tmp_path: Path) -> None:
    p = one(
        {"t": {"command": "sh", "sandbox": {"memoryMb": 300, "restart": {"maxRestarts": 2}}}},
        tmp_path,
        sandbox={"defaults": {"memoryMb": 600, "maxProcesses": 40, "restart": {"backoffInitialSeconds": 0.2}}},
    )
    assert p.limits.memory_bytes == 300 * 2**20 and p.limits.max_processes == 40
    assert (p.restart.max_restarts, p.restart.backoff_initial_s) == (2, 0.2)


# -- network -----------------------------------------------------------------------


def test_the_network_by_default_a_remote_server_has_it_a_command_has_the_defaults(tmp_path: Path) -> None:
    got = {p.sandbox_id: p.network for p in plans({"r": {"url": "https://x.invalid/mcp"}, "c": {"command": "sh"}, "n": {"command": "sh", "network": True}}, tmp_path)}
    assert got == {"mcp-r": True, "mcp-c": False, "mcp-n": True}
    assert one({"c": {"command": "sh"}}, tmp_path, sandbox={"defaults": {"network": True}}).network is True
    assert one({"c": {"command": "sh", "sandbox": {"network": True}}}, tmp_path).network is True


@pytest.mark.parametrize(("entry", "key"), [({"network": False}, "mcpServers.r.network"), ({"sandbox": {"network": False}}, "mcpServers.r.sandbox.network")])
def test_a_remote_server_without_the_network_is_refused(entry: dict[str, Any], key: str, tmp_path: Path) -> None:
    [line] = problems({"r": {"url": "https://x.invalid/mcp", **entry}}, tmp_path)
    assert line.startswith(f"{key}: false, but 'r' is a remote server"), line


# -- ${VAR} ------------------------------------------------------------------------


def test_vars_expand_from_the_supervisors_environment_for_that_entry_only(tmp_path: Path) -> None:
    environ = {"PATH": os.environ["PATH"], "DOCS_TOKEN": "tok-1", "EMPTY": ""}
    servers = {
        "docs": {"url": "https://x.invalid/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}", "X-Plain": "a $DOCS_TOKEN ${ not a var}"}},
        "cmd": {"command": "sh", "env": {"A": "${DOCS_TOKEN}/${MISSING:-fallback}", "B": "${EMPTY:-used when empty}", "C": "${EMPTY}"}},
        "other": {"command": "sh"},
    }
    got = {p.sandbox_id: p.mcp for p in plans(servers, tmp_path, environ=environ)}
    assert got["mcp-docs"] is not None and got["mcp-cmd"] is not None and got["mcp-other"] is not None
    assert got["mcp-docs"].headers == {"Authorization": "Bearer tok-1", "X-Plain": "a $DOCS_TOKEN ${ not a var}"}
    assert got["mcp-cmd"].env == {"A": "tok-1/fallback", "B": "used when empty", "C": ""}
    assert got["mcp-other"].env == {}
    # The values never show in a plan's or a spec's repr (which a log line could hold).
    assert "tok-1" not in repr(got["mcp-docs"]) and "tok-1" not in repr(plans(servers, tmp_path, environ=environ))


def test_an_unset_var_is_an_error_naming_the_key_path_and_never_the_value(tmp_path: Path) -> None:
    environ = {"PATH": os.environ["PATH"], "SET_ONE": "secret-value"}
    found = problems(
        {
            "docs": {"url": "https://x.invalid/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}},
            "cmd": {"command": "sh", "env": {"K": "${SET_ONE}${A_VAR}${B_VAR}"}},
        },
        tmp_path,
        environ=environ,
    )
    assert found == [
        "mcpServers.docs.headers.Authorization: ${DOCS_TOKEN} is not set in the supervisor's environment (set it where `clawsup start` runs, or give a default: ${DOCS_TOKEN:-value})",
        "mcpServers.cmd.env.K: ${A_VAR} is not set in the supervisor's environment (set it where `clawsup start` runs, or give a default: ${A_VAR:-value})",
        "mcpServers.cmd.env.K: ${B_VAR} is not set in the supervisor's environment (set it where `clawsup start` runs, or give a default: ${B_VAR:-value})",
    ]
    assert not any("secret-value" in line for line in found)


# -- tool names --------------------------------------------------------------------


def test_the_tool_prefix_defaults_to_the_id_and_must_keep_names_valid(tmp_path: Path) -> None:
    assert one({"git": {"command": "sh"}}, tmp_path).mcp.prefix == "git_"  # type: ignore[union-attr]
    assert one({"git": {"command": "sh", "toolPrefix": ""}}, tmp_path).mcp.prefix == ""  # type: ignore[union-attr]
    assert one({"git": {"command": "sh", "toolPrefix": "g-"}}, tmp_path).mcp.prefix == "g-"  # type: ignore[union-attr]
    for bad in ("has space", "dot.", "x" * 33):
        with pytest.raises(ConfigError) as e:
            plans({"git": {"command": "sh", "toolPrefix": bad}}, tmp_path)
        assert any("mcpServers.git.toolPrefix" in p for p in e.value.problems), e.value.problems


def test_the_hosts_initialize_deadline_comes_before_the_handshake_timeout(tmp_path: Path) -> None:
    p = one({"t": {"command": "sh"}}, tmp_path, sandbox={"handshakeTimeoutSeconds": 10})
    assert p.mcp is not None and p.mcp.initialize_timeout_s == 7.0
    for handshake_s in (0.5, 2, 3, 10, 600):
        assert 0 < initialize_timeout(handshake_s) < handshake_s


# -- the command's install ---------------------------------------------------------


def test_a_console_script_in_a_venv_shows_the_venv_and_the_base_interpreter(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "tools" / "venv")
    script = console_script(venv, "mcp-server-x", "mcp_server_x")
    # Found on the entry's own PATH, not the supervisor's.
    p = one({"x": {"command": "mcp-server-x", "args": ["--flag"], "env": {"PATH": f"{venv}/bin:/usr/bin:/bin"}}}, tmp_path, environ={"PATH": "/usr/bin:/bin"})
    assert p.mcp is not None
    # Run by its interpreter, through the venv (which the interpreter finds by that path).
    assert (p.mcp.command, p.mcp.args) == (f"{venv}/bin/python", [str(script), "--flag"])
    expected = {str(venv)} | ({BASE_PREFIX} if not BASE_PREFIX.startswith("/usr/") else set())
    assert set(p.visible_paths) == expected, p.visible_paths
    # The supervisor's PATH does not have it.
    [line] = problems({"x": {"command": "mcp-server-x"}}, tmp_path, environ={"PATH": "/usr/bin:/bin"})
    assert line.startswith("mcpServers.x.command: 'mcp-server-x' was not found on this host (searched the supervisor's PATH: /usr/bin:/bin)"), line


def test_a_venv_of_the_system_python_is_still_shown(tmp_path: Path) -> None:
    """Its bin/python links into /usr: the venv is what finds its packages."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system python3")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120)
    script = console_script(venv, "srv", "srv")
    p = one({"x": {"command": str(script)}}, tmp_path)
    assert p.mcp is not None
    assert (p.mcp.command, p.mcp.args, p.visible_paths) == (f"{venv}/bin/python", [str(script)], (str(venv),))
    p = one({"x": {"command": str(venv / "bin" / "python3"), "args": ["-m", "srv"]}}, tmp_path)
    assert p.mcp is not None and (p.mcp.command, p.visible_paths) == (f"{venv}/bin/python3", (str(venv),))


def test_the_venvs_python_itself_and_a_relative_path_from_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    venv = make_venv(tmp_path / "config" / ".venv")
    p = one({"git": {"command": "./.venv/bin/python", "args": ["-m", "mcp_server_git"]}}, tmp_path)
    assert p.mcp is not None
    assert (p.mcp.command, p.mcp.args) == (f"{venv}/bin/python", ["-m", "mcp_server_git"])
    assert str(venv) in p.visible_paths and str(tmp_path / "config") not in p.visible_paths


def test_a_symlink_chain_resolves_to_the_install(tmp_path: Path) -> None:
    """pipx's layout: ~/.local/bin/x -> .../pipx/venvs/x/bin/x; here through two links."""
    venv = make_venv(tmp_path / "pipx" / "venvs" / "x")
    script = console_script(venv, "mcp-x", "mcp_x")
    links = tmp_path / "links"
    links.mkdir()
    (links / "middle").symlink_to(script)
    (links / "mcp-x").symlink_to(links / "middle")
    p = one({"x": {"command": str(links / "mcp-x")}}, tmp_path)
    assert p.mcp is not None
    assert (p.mcp.command, p.mcp.args) == (f"{venv}/bin/python", [str(script)])
    assert str(venv) in p.visible_paths and not any(v.startswith(str(links)) for v in p.visible_paths)


def test_a_venv_reached_through_a_linked_folder_is_shown_at_its_real_path(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "real" / "venv")
    console_script(venv, "srv", "srv")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    p = one({"x": {"command": str(tmp_path / "alias" / "venv" / "bin" / "srv")}}, tmp_path)
    assert p.mcp is not None
    assert (p.mcp.command, p.mcp.args) == (f"{venv}/bin/python", [f"{venv}/bin/srv"])
    assert str(venv) in p.visible_paths


def test_a_script_outside_any_venv_is_shown_alone_with_its_interpreter(tmp_path: Path) -> None:
    script = executable(tmp_path / "bin" / "server.py", "#!/usr/bin/env python3\nprint('hi')\n")
    (tmp_path / "bin" / "neighbour.txt").write_text("not for the sandbox")
    p = one({"s": {"command": str(script), "args": ["a"]}}, tmp_path, environ={"PATH": "/usr/bin:/bin"})
    assert p.mcp is not None
    assert p.visible_paths == (str(script),)
    # Under the system folders the name stays as found (a multi-call binary goes by it).
    assert (p.mcp.command, p.mcp.args) == (shutil.which("python3", path="/usr/bin:/bin"), [str(script), "a"])


def test_an_interpreter_outside_the_system_folders_shows_its_prefix(tmp_path: Path) -> None:
    if BASE_PREFIX.startswith("/usr/"):
        pytest.skip("this interpreter lives under /usr")
    exe = os.path.realpath(sys.executable)
    script = executable(tmp_path / "server.py", f"#!{exe} -u\nprint('hi')\n")
    p = one({"s": {"command": str(script)}}, tmp_path)
    assert p.mcp is not None
    assert (p.mcp.command, p.mcp.args) == (exe, ["-u", str(script)])
    assert set(p.visible_paths) == {str(script), BASE_PREFIX}


def test_a_node_package_shows_its_node_modules(tmp_path: Path) -> None:
    # A `node` of our own: the plan resolves the interpreter, it never runs it, so the
    # test needs no Node installed (and never skips for want of one).
    (tmp_path / "nodebin").mkdir()
    node = shutil.copy("/bin/true", tmp_path / "nodebin" / "node")  # a binary, as node is
    modules = tmp_path / "project" / "node_modules"
    cli = executable(modules / "@scope" / "server-x" / "dist" / "index.js", "#!/usr/bin/env node\nconsole.log('hi')\n")
    (modules / ".bin").mkdir()
    (modules / ".bin" / "mcp-server-x").symlink_to("../@scope/server-x/dist/index.js")
    (tmp_path / "project" / "secret.env").write_text("outside node_modules")
    p = one({"x": {"command": "mcp-server-x", "env": {"PATH": f"{modules}/.bin:{os.path.dirname(node)}"}}}, tmp_path)
    assert p.mcp is not None
    assert p.mcp.args == [str(cli)] and os.path.basename(p.mcp.command).startswith("node")
    assert str(modules) in p.visible_paths and not any(v == str(tmp_path / "project") for v in p.visible_paths)


def test_the_home_folder_is_never_shown(tmp_path: Path) -> None:
    """A file in the home folder, even when the home looks like a venv (pyvenv.cfg
    there): the file alone, never the home."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "pyvenv.cfg").write_text(f"home = {os.path.dirname(os.path.realpath(sys.executable))}\n")
    tool = executable(home / "bin" / "tool", "\x7fELF not really\n")
    p = one({"t": {"command": str(tool)}}, tmp_path)
    assert p.visible_paths == (str(tool),), p.visible_paths
    assert str(home) not in p.visible_paths


@pytest.mark.parametrize("where", ["state", "config"])
def test_a_venv_holding_the_state_or_the_config_folder_is_not_shown(where: str, tmp_path: Path) -> None:
    """A venv that holds the state directory, or is the config's folder: only the
    command's file is shown."""
    venv = make_venv(tmp_path / ("v" if where == "state" else "config"))
    tool = executable(venv / "bin" / "tool", "\x7fELF not really\n")
    p = one({"t": {"command": str(tool)}}, tmp_path, state=venv / "state" if where == "state" else None)
    assert p.visible_paths == (str(tool),), p.visible_paths


def test_a_command_inside_the_state_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    tool = executable(tmp_path / "state" / "tool", "\x7fELF not really\n")
    [line] = problems({"t": {"command": str(tool)}}, tmp_path)
    assert line.startswith("mcpServers.t.command: ") and "state directory" in line


def test_not_found_names_what_was_searched(tmp_path: Path) -> None:
    [line] = problems({"t": {"command": "no-such-mcp-server", "env": {"PATH": "/nowhere:/also/nowhere"}}}, tmp_path)
    assert line.startswith("mcpServers.t.command: 'no-such-mcp-server' was not found on this host (searched mcpServers.t.env.PATH)"), line
    assert "/nowhere" not in line  # the entry's env values are never shown
    [line] = problems({"t": {"command": "./bin/missing"}}, tmp_path)
    assert f"looked for {tmp_path / 'config' / 'bin' / 'missing'}" in line
    script = executable(tmp_path / "s", "#!/usr/bin/env no-such-interpreter\n")
    [line] = problems({"t": {"command": str(script)}}, tmp_path)
    assert line.startswith("mcpServers.t.command: ") and "'no-such-interpreter' (its #! line), which was not found" in line
    (tmp_path / "plain").write_text("x")
    [line] = problems({"t": {"command": str(tmp_path / "plain")}}, tmp_path)
    assert line == f"mcpServers.t.command: {tmp_path / 'plain'} is not an executable file"


def test_docker_passes_what_it_cannot_resolve_to_the_image(tmp_path: Path) -> None:
    docker = {"sandbox": {"backend": "docker"}}
    p = one({"t": {"command": "mcp-server-only-in-the-image", "args": ["x"], **docker}}, tmp_path)
    assert p.mcp is not None and (p.mcp.command, p.mcp.args, p.visible_paths) == ("mcp-server-only-in-the-image", ["x"], ())
    # Under this host's system folders: the image's own, by the name written.
    p = one({"t": {"command": "sh", **docker}}, tmp_path)
    assert p.mcp is not None and (p.mcp.command, p.visible_paths) == ("sh", ())
    # An install elsewhere is bound in, as for bwrap.
    venv = make_venv(tmp_path / "venv")
    console_script(venv, "srv", "srv")
    p = one({"t": {"command": str(venv / "bin" / "srv"), **docker}}, tmp_path)
    assert p.mcp is not None and p.mcp.command == f"{venv}/bin/python" and str(venv) in p.visible_paths


def test_a_pyenv_shim_is_resolved_and_other_shims_are_refused(tmp_path: Path) -> None:
    fake = executable(tmp_path / "asdf" / "shims" / "tool", '#!/usr/bin/env bash\nexec asdf exec "tool" "$@"\n')
    [line] = problems({"t": {"command": str(fake)}}, tmp_path)
    assert "version manager's shim" in line and line.startswith("mcpServers.t.command: ")
    shims = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "shims"
    if not (shims / "python3").exists():
        pytest.skip("no pyenv here")
    p = one({"t": {"command": "python3", "args": ["-m", "x"], "env": {"PATH": str(shims)}}}, tmp_path)
    assert p.mcp is not None and "/shims/" not in p.mcp.command and p.mcp.args == ["-m", "x"]
    assert any(p.mcp.command.startswith(v + "/") for v in p.visible_paths), (p.mcp.command, p.visible_paths)


def test_folders_a_pth_file_names_are_not_shown(tmp_path: Path) -> None:
    """A .pth is package data: what it names outside the venv stays outside (an
    editable install does not work in a sandbox; tests/test_mcp_attacks.py has the
    hostile package)."""
    venv = make_venv(tmp_path / "venv")
    src = tmp_path / "src" / "myserver"
    src.mkdir(parents=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "__editable__.myserver-0.1.pth").write_text(f"{src}\nimport os\n")
    console_script(venv, "srv", "myserver")
    p = one({"t": {"command": str(venv / "bin" / "srv")}}, tmp_path)
    assert str(src) not in p.visible_paths and str(venv) in p.visible_paths


# -- inside the sandbox ------------------------------------------------------------


@pytest.fixture
def short_root() -> Any:
    d = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    (d / "ws").mkdir()
    (d / "run").mkdir(mode=0o700)
    (d / "private").mkdir(mode=0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def run_in(spec: LaunchSpec, backend: str, root: Path, command: str) -> str:
    from clawsup.sandbox.exec_result import ExecResult
    from clawsup.supervisor.sandboxes.host_client import HostClient

    async with launcher_for(backend, root) as (launcher, _):
        child = await launcher.launch(spec)
        try:
            await handshake(child, timeout=60)
            client = HostClient(child.socket_path, "s", "h")
            out = b""
            async for ev in client.exec(command, "", timeout=30, output_cap=65536, call_id="c1", margin=5):
                if not isinstance(ev, ExecResult):
                    out += ev
            await client.channel.close()
            return out.decode()
        finally:
            await child.kill_all()
            await child.aclose()


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_visible_paths_are_bound_read_only_and_nothing_beside_them(backend: str, short_root: Path, tmp_path: Path) -> None:
    require_backend(backend)
    install = Path(tempfile.mkdtemp(prefix="csv-", dir="/tmp"))
    try:
        venv = make_venv(install / "venv")
        (install / "beside.txt").write_text("not for the sandbox")
        lone = executable(install / "lone-tool", "#!/bin/sh\necho lone\n")
        # A path under /usr is the sandbox's already (bwrap) or the image's (docker);
        # one holding the workspace is never bound.
        spec = make_spec(short_root, f"vis-{backend}")
        spec = dataclasses.replace(spec, visible_paths=(str(venv), str(lone), "/usr/share", str(short_root)))
        out = await run_in(
            spec, backend, short_root,
            f"cat {venv}/pyvenv.cfg >/dev/null && echo CFG; {lone}; touch {venv}/planted 2>/dev/null && echo WROTE || echo READONLY; "
            f"cat {install}/beside.txt 2>/dev/null || echo NOBESIDE; test -e {short_root}/private && echo ROOTSEEN || echo NOROOT",
        )  # fmt: skip
        assert out.split() == ["CFG", "lone", "READONLY", "NOBESIDE", "NOROOT"], out
        assert not (venv / "planted").exists()
    finally:
        shutil.rmtree(install, ignore_errors=True)


# -- end to end --------------------------------------------------------------------

PROBE_SERVER = '''
import os

from mcp.server.mcpserver import MCPServer

app = MCPServer("probe")


@app.tool()
def token() -> str:
    """The MCP_TOKEN this server was given."""
    return os.environ.get("MCP_TOKEN", "")


@app.tool()
def peek(path: str) -> str:
    """Whether this server can read `path`."""
    try:
        with open(path) as f:
            return "read: " + f.read(100)
    except OSError as e:
        return type(e).__name__


def main() -> int:
    app.run()
    return 0
'''


def probe_install(where: Path) -> Path:
    """A server installed as pip would: its module in a venv's site-packages, the SDK
    from the base interpreter's (a venv with system site-packages), a console script."""
    venv = make_venv(where / "venv", system_site_packages=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "mcpcfg_probe.py").write_text(PROBE_SERVER)
    return console_script(venv, "mcpcfg-probe", "mcpcfg_probe")


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_a_secret_reaches_its_server_and_nothing_else(backend: str, gateway_factory: Any) -> None:
    """The attacker's side: a hostile plugin beside the MCP server looks for the
    expanded secret in every process it can see; the operator's side: it is in no
    log and no output. The server itself gets it (the control), runs from its venv,
    and sees nothing beside its install."""
    require_backend(backend)
    install = Path(tempfile.mkdtemp(prefix="csp-", dir="/tmp"))
    try:
        script = probe_install(install)
        (install / "beside.txt").write_text("not for the sandbox")
        secret = f"mcp-secret-{secrets.token_hex(12)}"
        cfg = make_config(mcpServers={"probe": {"command": str(script), "env": {"MCP_TOKEN": "Bearer ${MCPCFG_SECRET}"}, "sandbox": {"backend": backend}}})
        cfg["plugins"]["load"]["paths"].append(str(TEST_PLUGINS / "thief"))
        cfg["plugins"]["entries"]["thief"] = {"sandbox": {"backend": backend}}
        gw = gateway_factory(cfg, env={"MCPCFG_SECRET": secret})
        gw.wait("mcp-probe", "ready", timeout=60)
        assert gw.tools().get("probe_token") == "mcp:probe", gw.tools()

        got = gw.call("probe_token")
        assert got["ok"] and secret in json.dumps(got["data"]["result"]), got
        peek = gw.call("probe_peek", {"path": str(install / "beside.txt")})
        assert peek["ok"] and "read:" not in json.dumps(peek["data"]["result"]), peek

        for name in ("MCP_TOKEN", "MCPCFG_SECRET"):
            took = gw.call("thief_loot", {"target": gw.proc.pid, "name": name})
            assert took["ok"], took
            loot = took["data"]["result"]
            assert secret not in json.dumps(loot), loot
            assert loot["own_environment"] is None, loot

        shown = [
            gw.cli("status", "--json").stdout, gw.cli("plugins", "list", "--json").stdout, gw.cli("mcp", "list", "--json").stdout,
            gw.cli("tools", "list", "--json").stdout, json.dumps(gw.request(op="status")), json.dumps(gw.request(op="plugins")),
        ]  # fmt: skip
        for text in shown:
            assert secret not in text
        gw.stop()
        for log in ("supervisor.log", "mcp-probe.log", "thief.log"):
            assert secret not in (gw.state / "logs" / log).read_text(errors="replace"), log
        assert secret not in "".join(gw.output)
    finally:
        shutil.rmtree(install, ignore_errors=True)


def test_a_bad_mcp_entry_stops_the_start_beside_a_bad_plugin(tmp_path: Path) -> None:
    """Both kinds of problem in one refusal, each naming its key path."""
    from tests.test_trust import start_refused

    state = tmp_path / "s"
    state.mkdir()
    cfg = make_config(mcpServers={"docs": {"url": "https://x.invalid/mcp", "headers": {"Authorization": "${MCPCFG_UNSET_VAR}"}}})
    cfg["plugins"]["entries"]["nonexistent"] = {}
    r = start_refused(state, cfg)
    text = r.stdout + r.stderr
    assert "mcpServers.docs.headers.Authorization: ${MCPCFG_UNSET_VAR} is not set" in text, text
    assert "plugins.entries.nonexistent" in text, text
    assert "MCP server 'docs' is untrusted and cannot start" in text, text  # the test config's backend is process
