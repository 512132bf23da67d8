"""Generate protos/*_pb2.py, *_pb2_grpc.py and *_pb2.pyi from the .proto files.

Run as `python -m protos.generate [OUT_DIR]` from the repository root (`make protos`). With OUT_DIR
the code goes there instead, which is how the drift test compares a fresh generation with the
committed files. Needs the pinned grpcio-tools of the dev extras.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent
PROTO_FILES = ("common.proto", "tracker.proto", "agent.proto")


def generate(out_dir: Path) -> None:
    """Run protoc on every .proto file, writing under out_dir/protos/."""
    import grpc_tools
    from grpc_tools import protoc

    (out_dir / "protos").mkdir(parents=True, exist_ok=True)
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(f"protos/{name}" for name in PROTO_FILES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    generate(out)


if __name__ == "__main__":
    main()
