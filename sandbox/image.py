"""The docker backend's image: its tag, derived from the sandbox runtime it holds.

Any change to the runtime (sandbox/, the generated stubs, Dockerfile.sandbox, the build
script and its package list, the dependencies' versions) changes the tag, so a stale image is rebuilt by
scripts/build-sandbox-image, never silently used.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO = "clawsup-sandbox"
RUNTIME_DISTRIBUTIONS = ("grpcio", "grpcio-health-checking", "protobuf", "pluggy")


def runtime_requirements() -> list[str]:
    """Exactly the versions this host runs: the image's host speaks to this supervisor
    with the same grpc and protobuf (the stubs need a runtime as new as their
    generator)."""
    from importlib.metadata import version

    return [f"{d}=={version(d)}" for d in RUNTIME_DISTRIBUTIONS]


def runtime_hash() -> str:
    h = hashlib.sha256()
    files = sorted(p for p in (ROOT / "sandbox").rglob("*.py")) + sorted((ROOT / "proto" / "clawsup").rglob("*.py"))
    for p in [*files, ROOT / "Dockerfile.sandbox", ROOT / "scripts" / "build-sandbox-image"]:
        h.update(str(p.relative_to(ROOT)).encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    h.update(" ".join(runtime_requirements()).encode())
    return h.hexdigest()[:16]


def image_tag() -> str:
    return f"{REPO}:{runtime_hash()}"
