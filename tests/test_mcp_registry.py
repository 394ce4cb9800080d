"""The supervisor's judgement of an MCP server's tools, on the registry itself (a plain
data structure: no sandbox is needed to see what it accepts): a served name must be
the server's under its prefix and picked by its allow/deny rule, then the registry's
usual rules hold (valid name, bounds, core names, other owners, other plugins'
claims); a changed tool list replaces the old one in one step, refusals named as at
a start. The runtime around it (Describe again, the host's exit note, a retryable load
error) is tested with real children in tests/test_mcp_supervision.py and
tests/test_mcp.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawsup.sandbox.launch.launcher import Limits
from clawsup.sandbox.mcp_spec import McpServerSpec
from clawsup.supervisor.sandboxes.child_requests import one_line
from clawsup.supervisor.sandboxes.host_client import UnreadableTool
from clawsup.supervisor.sandboxes.log import SandboxLog
from clawsup.supervisor.sandboxes.plans import SandboxPlan
from clawsup.supervisor.sandboxes.registrations import MAX_NAMED_REFUSALS, ToolAcceptance
from clawsup.supervisor.sandboxes.registry import CORE_OWNER, Kind, Registration, Registry, owner_label
from clawsup.supervisor.sandboxes.restarts import RestartPolicy
from clawsup.supervisor.tools.spec import ToolSpec

OBJ: dict[str, Any] = {"type": "object", "properties": {"tz": {"type": "string"}}}


def mcp_plan(server_id: str = "time", *, prefix: str | None = None, allow: list[str] | None = None, deny: list[str] | None = None) -> SandboxPlan:
    """A plan as supervisor/sandboxes/mcp_plans.py makes one, built by hand."""
    spec = McpServerSpec(server_id=server_id, transport="stdio", command="/bin/true", prefix=f"{server_id}_" if prefix is None else prefix, allow=allow or [], deny=deny or [])
    return SandboxPlan(
        sandbox_id=f"mcp-{server_id.lower()}", plugin_id=f"mcp:{server_id}", plugin_dir=None, plugin_version="mcp", entry="",
        declared_tools=frozenset(), plugin_config={}, limits=Limits(), restart=RestartPolicy(), backend="process", role="mcp", mcp=spec,
    )  # fmt: skip


def spec(name: str, description: str = "d", schema: dict[str, Any] | None = None) -> ToolSpec:
    return ToolSpec(name=name, description=description, input_schema=OBJ if schema is None else schema)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SandboxLog]:
    log = SandboxLog(tmp_path / "mcp-time.log")
    yield log
    log.close()


def held(registry: Registry, owner: str = "mcp:time") -> list[str]:
    return sorted(r.name for r in registry.owned_by(owner) if r.kind is Kind.TOOL)


async def start(acceptance: ToolAcceptance, *tools: ToolSpec | UnreadableTool) -> None:
    acceptance.accept(await acceptance.judge(tools))


async def relist(acceptance: ToolAcceptance, *tools: ToolSpec | UnreadableTool) -> int:
    return acceptance.accept_relist(await acceptance.judge(tools))


async def test_served_names_are_judged_by_the_servers_rule_not_a_manifest(log: SandboxLog) -> None:
    registry = Registry(reserved=frozenset({"exec"}))
    acc = ToolAcceptance(mcp_plan(deny=["convert_*"]), registry, log)
    await start(
        acc,
        spec("time_get_current_time"),  # its own, picked: registered without any manifest
        spec("get_current_time"),  # no prefix
        spec("time_"),  # the prefix alone names no tool
        spec("time_convert_time"),  # denied by mcpServers.time.tools
        spec("exec"),  # a core name, and not under the prefix either
    )
    assert held(registry) == ["time_get_current_time"]
    reg = registry.get(Kind.TOOL, "time_get_current_time")
    assert reg is not None and reg.owner == "mcp:time" and reg.sandbox_id == "mcp-time" and reg.arguments is not None
    assert acc.refusals == {
        "get_current_time": "not a tool of MCP server 'time' under prefix 'time_'",
        "time_": "not a tool of MCP server 'time' under prefix 'time_'",
        "time_convert_time": "not picked by mcpServers.time.tools",
        "exec": "not a tool of MCP server 'time' under prefix 'time_'",
    }
    log.flush()
    text = log.path.read_text()
    assert "refused: MCP server 'time' may not register tool 'time_convert_time': not picked by mcpServers.time.tools" in text


async def test_an_allow_list_and_an_empty_prefix(log: SandboxLog) -> None:
    registry = Registry(reserved=frozenset({"exec"}))
    acc = ToolAcceptance(mcp_plan(prefix="", allow=["get_*"]), registry, log)
    await start(acc, spec("get_current_time"), spec("convert_time"), spec("exec"))
    assert held(registry) == ["get_current_time"]
    assert acc.refusals == {"convert_time": "not picked by mcpServers.time.tools", "exec": "not picked by mcpServers.time.tools"}
    # With no prefix a server may serve a core tool's name: the registry's own rule refuses it.
    acc = ToolAcceptance(mcp_plan("raw", prefix=""), registry, log)
    await start(acc, spec("exec"), spec("read_file"))
    assert held(registry, "mcp:raw") == ["read_file"]
    assert acc.refusals == {"exec": "the name belongs to a core tool"}


async def test_the_registrys_usual_rules_still_hold(log: SandboxLog) -> None:
    registry = Registry()
    registry.register(Registration(kind=Kind.TOOL, name="time_held", owner="basics", sandbox_id="basics"))
    assert registry.claim("clock", Kind.TOOL, frozenset({"time_claimed"})) == {}
    acc = ToolAcceptance(mcp_plan(), registry, log)
    await start(
        acc,
        spec("time_ok"),
        spec("time_bad name"),
        spec("time_fat", description="x" * 5000),
        spec("time_list_schema", schema={"type": "array"}),
        UnreadableTool(name="time_unreadable", problem="its input schema is a JSON list, not an object"),
        spec("time_held"),
        spec("time_claimed"),
    )
    assert held(registry) == ["time_ok"]
    assert acc.refusals["time_bad name"].startswith("not a valid tool name")
    assert acc.refusals["time_fat"] == "its description has 5000 characters; the most is 4096"
    assert acc.refusals["time_list_schema"] == 'its input schema must be a JSON Schema object with "type": "object"'
    assert acc.refusals["time_unreadable"] == "its input schema is a JSON list, not an object"
    assert acc.refusals["time_held"] == "plugin 'basics' already holds it"
    assert acc.refusals["time_claimed"] == "plugin 'clock' already holds it (loaded first)"


async def test_two_servers_never_share_a_name(log: SandboxLog) -> None:
    registry = Registry()
    await start(ToolAcceptance(mcp_plan("a", prefix="x_"), registry, log), spec("x_now"))
    b = ToolAcceptance(mcp_plan("b", prefix="x_"), registry, log)
    await start(b, spec("x_now"), spec("x_then"))
    assert held(registry, "mcp:a") == ["x_now"] and held(registry, "mcp:b") == ["x_then"]
    assert b.refusals == {"x_now": "MCP server 'a' already holds it"}


async def test_a_changed_list_replaces_the_old_one_whole(log: SandboxLog) -> None:
    registry = Registry()
    acc = ToolAcceptance(mcp_plan(deny=["secret"]), registry, log)
    await start(acc, spec("time_a"), spec("time_b"), spec("time_secret"))
    assert held(registry) == ["time_a", "time_b"] and list(acc.refusals) == ["time_secret"]
    old_a = registry.get(Kind.TOOL, "time_a")
    assert await relist(acc, spec("time_a", description="new words"), spec("time_c")) == 2
    assert held(registry) == ["time_a", "time_c"]
    new_a = registry.get(Kind.TOOL, "time_a")
    assert new_a is not None and old_a is not None and new_a.description == "new words" and new_a is not old_a
    # Refusals are those of the last list, named again.
    assert acc.refusals == {}
    assert await relist(acc, spec("time_c"), spec("time_secret"), spec("nope")) == 1
    assert held(registry) == ["time_c"]
    assert acc.refusals == {"time_secret": "not picked by mcpServers.time.tools", "nope": "not a tool of MCP server 'time' under prefix 'time_'"}
    assert await relist(acc) == 0 and held(registry) == []
    log.flush()
    text = log.path.read_text()
    assert "tool list changed: now 2 tool(s); added time_c; withdrew time_b" in text
    assert "tool list changed: now 0 tool(s); added none; withdrew time_c" in text


async def test_a_name_taken_while_the_new_list_compiled_is_refused_at_the_swap(log: SandboxLog) -> None:
    """Judging compiles off the loop; another owner may register meanwhile. The swap
    judges each name again, in the same step as it registers."""
    registry = Registry()
    acc = ToolAcceptance(mcp_plan(), registry, log)
    await start(acc, spec("time_a"))
    judged = await acc.judge((spec("time_a"), spec("time_new")))
    registry.register(Registration(kind=Kind.TOOL, name="time_new", owner="quick", sandbox_id="quick"))
    assert acc.accept_relist(judged) == 1
    taken = registry.get(Kind.TOOL, "time_new")
    assert held(registry) == ["time_a"] and taken is not None and taken.owner == "quick"
    assert acc.refusals == {"time_new": "plugin 'quick' already holds it"}


async def test_a_flood_of_refusals_on_a_relist_is_counted_not_named(log: SandboxLog) -> None:
    registry = Registry()
    acc = ToolAcceptance(mcp_plan(), registry, log)
    await start(acc, spec("time_a"))
    assert await relist(acc, *(spec(f"other_{i}") for i in range(100)), spec("time_a")) == 1
    assert len(acc.refusals) == MAX_NAMED_REFUSALS + 1
    assert acc.refusals["…"] == f"and {100 - MAX_NAMED_REFUSALS} more tool(s) it described were refused (not named one by one)"


def test_replace_owned_touches_only_that_owner_and_kind() -> None:
    registry = Registry(reserved=frozenset({"exec"}))
    core = Registration(kind=Kind.TOOL, name="exec", owner=CORE_OWNER, sandbox_id=None)
    registry.register(core)
    registry.register(Registration(kind=Kind.TOOL, name="echo", owner="basics", sandbox_id="basics"))
    registry.register(Registration(kind=Kind.TOOL, name="t_old", owner="mcp:t", sandbox_id="mcp-t"))
    registry.register(Registration(kind=Kind.SERVICE, name="t_svc", owner="mcp:t", sandbox_id="mcp-t"))
    new = [Registration(kind=Kind.TOOL, name=n, owner="mcp:t", sandbox_id="mcp-t", input_schema={"type": "object"}) for n in ("t_new", "echo", "exec")]
    refused = registry.replace_owned("mcp:t", Kind.TOOL, new).refused
    assert refused == {"echo": "plugin 'basics' already holds it", "exec": "the name belongs to a core tool"}
    assert [r.name for r in registry.tools()] == ["echo", "exec", "t_new"]
    assert registry.get(Kind.SERVICE, "t_svc", owner="mcp:t") is not None
    t_new = registry.get(Kind.TOOL, "t_new")
    assert t_new is not None and t_new.arguments is not None  # compiled, as `register` does
    with pytest.raises(ValueError, match="another owner's or kind's registration"):
        registry.replace_owned("mcp:t", Kind.TOOL, [Registration(kind=Kind.TOOL, name="x", owner="basics", sandbox_id="basics")])
    assert [r.name for r in registry.tools()] == ["echo", "exec", "t_new"]


def test_owner_labels_and_the_hosts_exit_note() -> None:
    assert owner_label("mcp:time") == "MCP server 'time'" and owner_label("basics") == "plugin 'basics'"
    assert one_line("MCP server 'time'\x1b[2J was\r\nkilled\u2028by\u202eSIGKILL\t") == "MCP server 'time' [2J was killed by SIGKILL"
    long = one_line("x" * 10_000)
    assert len(long) == 500 and long.endswith("…")
