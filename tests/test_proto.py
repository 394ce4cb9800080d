"""The committed stubs match the .proto: a fresh clone works without protoc, and an
edited .proto without regenerated stubs fails here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("host_pb2.py", "host_pb2.pyi", "host_pb2_grpc.py")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.generate(tmp_path)
    for name in GENERATED:
        fresh = (tmp_path / "clawsup" / "v1" / name).read_text()
        committed = (ROOT / "proto" / "clawsup" / "v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `python scripts/gen_proto.py` and commit the result"


def test_stubs_import_from_an_installed_package() -> None:
    from clawsup.v1 import host_pb2, host_pb2_grpc

    assert host_pb2.DESCRIPTOR.package == "clawsup.v1"
    assert hasattr(host_pb2_grpc, "HostStub") and "clawsup" in sys.modules
