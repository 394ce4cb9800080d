"""The docker backend's image: its tag, derived from the sandbox runtime it holds.

Any change to the runtime (sandbox/, the generated stubs, Dockerfile.sandbox, the build
script and its package list, the dependencies' versions) changes the tag, so a stale image is rebuilt by
scripts/build-sandbox-image, never silently used.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPO = "clawsup-sandbox"
RUNTIME_DISTRIBUTIONS = ("grpcio", "grpcio-health-checking", "protobuf", "pluggy", "mcp")
"""What the sandbox host imports besides the standard library (`mcp`: an MCP server's
sandbox host is its client, sandbox/host/mcp_bridge.py). `pip wheel` adds their
dependencies."""


def runtime_requirements() -> list[str]:
    """Exactly the versions this host runs: the image's host speaks to this supervisor
    with the same grpc and protobuf (the stubs need a runtime as new as their
    generator)."""
    from importlib.metadata import version

    return [f"{d}=={version(d)}" for d in RUNTIME_DISTRIBUTIONS]


def _build_file(name: str) -> Path:
    """A file of the image's recipe: in a checkout at its place, in an installed
    package under `<prefix>/share/clawsup/` (pyproject's data-files)."""
    here = ROOT / name
    return here if here.exists() else Path(sys.prefix) / "share" / "clawsup" / Path(name).name


def runtime_hash() -> str:
    """Over the runtime's files by their names in the source tree, so that a checkout
    and an installed package of the same code want the same image."""
    import clawsup.v1
    import clawsup.sandbox as sandbox

    h = hashlib.sha256()
    sandbox_dir = Path(sandbox.__file__).resolve().parent
    proto_dir = Path(clawsup.v1.__file__).resolve().parent.parent
    named = [(f"sandbox/{p.relative_to(sandbox_dir)}", p) for p in sandbox_dir.rglob("*.py")]
    named += [(f"proto/clawsup/{p.relative_to(proto_dir)}", p) for p in [proto_dir / "__init__.py", *(proto_dir / "v1").rglob("*.py")]]
    named.sort()
    named += [(n, _build_file(n)) for n in ("Dockerfile.sandbox", "scripts/build-sandbox-image")]
    for name, p in named:
        h.update(name.encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    h.update(" ".join(runtime_requirements()).encode())
    return h.hexdigest()[:16]


def image_tag() -> str:
    return f"{REPO}:{runtime_hash()}"
