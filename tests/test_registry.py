from __future__ import annotations

import pytest

from clawsup.supervisor.errors import RegistrationRefused
from clawsup.supervisor.sandboxes.registry import CORE_OWNER, Kind, Registration, Registry


def tool(name: str, owner: str) -> Registration:
    return Registration(kind=Kind.TOOL, name=name, owner=owner, sandbox_id=owner)


def test_undeclared_name_is_refused() -> None:
    r = Registry()
    with pytest.raises(RegistrationRefused, match="does not declare it in contracts.tools"):
        r.register(tool("sneaky", "weather"), declared=frozenset({"forecast"}))
    assert r.tools() == []


def test_collision_with_another_plugin_is_refused_and_first_keeps_it() -> None:
    r = Registry()
    r.register(tool("echo", "basics"), declared=frozenset({"echo"}))
    with pytest.raises(RegistrationRefused, match="plugin 'basics' already holds it"):
        r.register(tool("echo", "twin"), declared=frozenset({"echo"}))
    assert r.get(Kind.TOOL, "echo").owner == "basics"


def test_collision_with_core_tool_is_refused() -> None:
    r = Registry(reserved=frozenset({"exec"}))
    with pytest.raises(RegistrationRefused, match="core tool"):
        r.register(tool("exec", "evil"), declared=frozenset({"exec"}))
    r.register(Registration(kind=Kind.TOOL, name="exec", owner=CORE_OWNER, sandbox_id=None))
    assert r.get(Kind.TOOL, "exec").owner == CORE_OWNER


def test_claims_decide_by_load_order_not_by_timing() -> None:
    r = Registry()
    assert r.claim("basics", Kind.TOOL, frozenset({"echo", "now"})) == {}
    assert r.claim("twin", Kind.TOOL, frozenset({"echo", "twin_hello"})) == {"echo": "basics"}
    # twin starts first, or basics is down: twin still may not take echo.
    with pytest.raises(RegistrationRefused, match="loaded first"):
        r.register(tool("echo", "twin"), declared=frozenset({"echo", "twin_hello"}))
    r.register(tool("twin_hello", "twin"), declared=frozenset({"echo", "twin_hello"}))
    r.register(tool("echo", "basics"), declared=frozenset({"echo", "now"}))
    assert r.get(Kind.TOOL, "echo").owner == "basics"


def test_reclaim_removes_everything_of_one_owner_only() -> None:
    r = Registry()
    for name in ("a", "b", "c"):
        r.register(tool(name, "p1"), declared=frozenset({"a", "b", "c"}))
    r.register(tool("d", "p2"), declared=frozenset({"d"}))
    gone = r.reclaim("p1")
    assert sorted(g.name for g in gone) == ["a", "b", "c"]
    assert [t.name for t in r.tools()] == ["d"]
    assert r.owned_by("p1") == []
    # Reclaimed names can be registered again by their owner (a restart).
    r.register(tool("a", "p1"), declared=frozenset({"a"}))
