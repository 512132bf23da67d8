"""No package of ours imports itself in a circle: a walk of every import (AST), lazy ones included.

An import inside a function still ties the two modules together (the CLI that a library module
imports lazily is still a circle); only imports under `if TYPE_CHECKING:` are left out, since they
never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protos", "tracker", "device_agent", "compiler", "tuner", "deploy", "kiln")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import node except those under `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (the most specific module each import names)."""
    files = {
        module_name(root, p): p
        for package in PACKAGES
        if (root / package).is_dir()
        for p in (root / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {m: set() for m in files}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
                # `from pkg import name`: the submodule if `name` is one, else pkg itself
                targets = [t for t in targets[:-1] if t in files] or [targets[-1]]
            for target in targets:
                found = known(target)
                if found is not None and found != mod:
                    graph[mod].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_package_imports_itself_in_a_circle() -> None:
    assert cycles(import_graph(ROOT)) == []


def test_the_walk_finds_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    pkg = tmp_path / "tuner"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("from tuner.sub import work\n")
    # the library module reaches back to the CLI inside a function: still a circle
    (pkg / "sub" / "work.py").write_text("def f():\n    from tuner import cli\n")
    (pkg / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tuner import cli\n"
    )
    (pkg / "rel.py").write_text("from . import typed\n")
    (pkg / "leaf.py").write_text("from .sub.work import f\n")
    graph = import_graph(tmp_path)
    assert graph["tuner.typed"] == set()  # TYPE_CHECKING imports never run
    assert graph["tuner.rel"] == {"tuner.typed"}
    assert graph["tuner.leaf"] == {"tuner.sub.work"}
    assert cycles(graph) == [["tuner.cli", "tuner.sub.work"]]
