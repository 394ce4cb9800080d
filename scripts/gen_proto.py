"""Regenerate the committed gRPC stubs from proto/clawsup/v1/*.proto.

Run after editing a .proto: `python scripts/gen_proto.py`. The stubs are committed so
that a fresh clone works with `pip install -e .` alone; tests/test_proto.py fails if
they drift from the .proto files.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # only needed by developers and the drift test

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "clawsup" / "v1").glob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see its message above")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT)
