"""The walls between the two sides, as imports. The supervisor never runs plugin
code: it imports neither plugins/, nor the child's runtime (clawsup.sandbox.host,
clawsup.sandbox.api), nor pluggy. The child's runtime never imports the supervisor
or the launch side: what a sandbox holds is its host and the shared modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("plugins", "clawsup.plugins", "clawsup.sandbox.host", "clawsup.sandbox.api", "pluggy")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_supervisor_source_imports_no_plugin_code() -> None:
    supervisor_side = list((ROOT / "supervisor").rglob("*.py"))
    # The launch backends run in the supervisor too, and the shared modules in both.
    supervisor_side += [p for p in (ROOT / "sandbox").rglob("*.py") if "host" not in p.relative_to(ROOT / "sandbox").parts and p.name != "api.py"]
    assert ROOT / "sandbox" / "launch" / "process.py" in supervisor_side
    bad = {str(p.relative_to(ROOT)): sorted(i for i in _imports(p) if _forbidden(i)) for p in supervisor_side}
    assert {k: v for k, v in bad.items() if v} == {}


def test_running_supervisor_modules_load_no_plugin_code() -> None:
    code = (
        "import sys, clawsup.supervisor.control.cli, clawsup.supervisor.control.gateway, clawsup.supervisor.sandboxes.manager, clawsup.supervisor.control.api;"
        "print(sorted(m for m in sys.modules if m == 'pluggy' or m.startswith(('clawsup.sandbox.host', 'clawsup.sandbox.api', 'plugins', 'clawsup.plugins'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


CHILD_FORBIDDEN = ("clawsup.supervisor", "clawsup.sandbox.launch", "clawsup.sandbox.manifest")
"""The manifest's model is pydantic and read by the supervisor only."""


def test_child_runtime_source_imports_no_supervisor_code() -> None:
    child_side = list((ROOT / "sandbox" / "host").rglob("*.py"))
    child_side += [p for p in (ROOT / "sandbox").glob("*.py") if p.name != "manifest.py"]
    assert ROOT / "sandbox" / "agent_loop.py" in child_side
    bad = {
        str(p.relative_to(ROOT)): sorted(i for i in _imports(p) if any(i == f or i.startswith(f + ".") for f in CHILD_FORBIDDEN))
        for p in child_side
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_a_running_child_runtime_loads_no_supervisor_code() -> None:
    code = (
        "import sys, clawsup.sandbox.host.__main__, clawsup.sandbox.host.server, clawsup.sandbox.host.subagent;"
        "print(sorted(m for m in sys.modules if m.startswith(('clawsup.supervisor', 'clawsup.sandbox.launch', 'clawsup.sandbox.manifest'))))"
    )
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
