"""The committed generated protobuf code is exactly what the pinned grpcio-tools makes today."""

from __future__ import annotations

from pathlib import Path

from protos import generate

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_files(directory: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.name.endswith(GENERATED_SUFFIXES)
    }


def test_committed_protos_match_a_fresh_generation(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    fresh = generated_files(tmp_path / "protos")
    committed = generated_files(generate.PROTO_DIR)
    assert sorted(fresh) == sorted(committed), "run `make protos` and commit the result"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], f"stale generated files {stale}: run `make protos` and commit the result"


def test_every_proto_file_is_generated() -> None:
    on_disk = sorted(p.name for p in generate.PROTO_DIR.glob("*.proto"))
    assert on_disk == sorted(generate.PROTO_FILES)
