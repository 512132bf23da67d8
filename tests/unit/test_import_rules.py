"""The architecture's import rules: each room imports only the rooms it may (nothing imports the
front door, `kiln`), and the agent stays light."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("protos", "tracker", "device_agent", "compiler", "tuner", "deploy", "kiln")

# Which of our packages each package may import (itself always allowed).
ALLOWED_OURS: dict[str, set[str]] = {
    "protos": set(),
    "tracker": {"protos"},
    "device_agent": {"protos"},
    "compiler": set(),  # but for the modules of ALLOWED_MODULES
    "tuner": {"compiler", "protos"},
    "deploy": {"protos"},
    "kiln": {"protos", "tracker", "device_agent", "compiler", "tuner", "deploy"},
}

# Single modules of ours a package may import although their package is not allowed: the
# accelerator's ISA and artifact container, and the CUDA container, are stdlib-only wire
# contracts shared by the compiler that writes programs and the agent that runs them (one
# encoder, not two).
ALLOWED_MODULES: dict[str, set[str]] = {
    "compiler": {"protos.vta", "protos.vta_program", "protos.cuda_program"},
}

# Third-party modules a package may import; None means anything. The agent runs on small boards.
ALLOWED_THIRD_PARTY: dict[str, set[str] | None] = {
    "protos": {"grpc", "google", "grpc_tools"},  # grpc_tools: only protos/generate.py, a dev tool
    "tracker": {"grpc", "grpc_health", "google", "redis", "prometheus_client"},
    "device_agent": {"grpc", "grpc_health", "google", "numpy"},
    "compiler": {"numpy"},
    "tuner": None,
    "deploy": None,
    "kiln": None,
}

# Files (paths relative to the root, or folders ending in "/") that may import more than their
# package: the ONNX front end and the model builders read and write ONNX; nothing else in the
# compiler needs onnx installed. The agent's metrics module is imported only for --metrics-port.
EXTRA_THIRD_PARTY: dict[str, set[str]] = {
    "compiler/frontend/": {"onnx"},
    "compiler/zoo.py": {"onnx"},
    "device_agent/metrics.py": {"prometheus_client"},
    "protos/metrics_http.py": {"prometheus_client"},  # imported only by the two above
}


def extra_allowed(rel: str) -> set[str]:
    out: set[str] = set()
    for prefix, names in EXTRA_THIRD_PARTY.items():
        if rel == prefix or (prefix.endswith("/") and rel.startswith(prefix)):
            out |= names
    return out


def imported_modules(path: Path, package: str) -> set[str]:
    """Module names a file imports (`from a.b import c`: "a.b"; `import a.b`: "a.b"), relative
    imports resolved to its own package."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(package if node.level else (node.module or ""))
    return names


def imported_roots(path: Path, package: str) -> set[str]:
    """Top-level module names a file imports, relative imports resolved to its own package."""
    return {name.split(".")[0] for name in imported_modules(path, package)}


def find_violations(root: Path) -> list[str]:
    """Every import that breaks the rules under root, as 'file: imports X' lines."""
    found: list[str] = []
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for package in OURS:
        for path in sorted((root / package).rglob("*.py")):
            modules = imported_modules(path, package)
            for name in sorted({m.split(".")[0] for m in modules}):
                rel = path.relative_to(root)
                if name == package:
                    continue
                if name in OURS:
                    own = {m for m in modules if m.split(".")[0] == name}
                    if name not in ALLOWED_OURS[package] and not own <= ALLOWED_MODULES.get(
                        package, set()
                    ):
                        found.append(f"{rel}: imports {name}")
                    continue
                allowed = ALLOWED_THIRD_PARTY[package]
                if name in extra_allowed(rel.as_posix()):
                    continue
                if allowed is not None and name not in stdlib and name not in allowed:
                    found.append(f"{rel}: imports third-party {name}")
    return sorted(found)


def test_repository_follows_import_rules() -> None:
    assert find_violations(ROOT) == []


def test_checker_catches_forbidden_imports(tmp_path: Path) -> None:
    for package in OURS:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "tracker" / "bad.py").write_text("from compiler import build\n")
    (tmp_path / "compiler" / "bad.py").write_text("import tuner.loop\n")
    (tmp_path / "compiler" / "isa.py").write_text("from protos.vta import Gemm\n")  # the exception
    (tmp_path / "compiler" / "wire.py").write_text("from protos import vta, common_pb2\n")
    (tmp_path / "device_agent" / "heavy.py").write_text("import xgboost\nfrom . import serde\n")
    (tmp_path / "tuner" / "ok.py").write_text("import compiler\nfrom protos import common_pb2\n")
    (tmp_path / "compiler" / "frontend").mkdir()
    (tmp_path / "compiler" / "frontend" / "onnx.py").write_text("import onnx\n")  # allowed there
    (tmp_path / "compiler" / "ops.py").write_text("import onnx\n")  # not elsewhere
    assert find_violations(tmp_path) == [
        "compiler/bad.py: imports tuner",
        "compiler/ops.py: imports third-party onnx",
        "compiler/wire.py: imports protos",
        "device_agent/heavy.py: imports third-party xgboost",
        "tracker/bad.py: imports compiler",
    ]
