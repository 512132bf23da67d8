"""`kiln inspect`: a model's opset, inputs, operators and tuning tasks, with no build."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from kiln_cli import kiln

from compiler.zoo import resnet18


def test_inspect_lists_operators_and_tasks(tmp_path: Path) -> None:
    path = tmp_path / "r18.onnx"
    onnx.save(resnet18(), path)
    result = kiln("inspect", str(path))
    assert result.returncode == 0, result.stderr
    assert "input float32[1, 3, 224, 224]" in result.stdout
    assert "| Conv " in result.stdout and "unsupported ops: none" in result.stdout
    assert "16 tasks, 16 tunable" in result.stdout

    info = json.loads(kiln("inspect", str(path), "--json").stdout)
    ops = {o["op"]: o for o in info["operators"]}
    assert ops["Conv"]["count"] == 20 and ops["Conv"]["supported"]
    assert info["imports"] and sum(t["weight"] for t in info["tasks"]) == 21  # 20 convs + fc
    assert {t["template"] for t in info["tasks"]} >= {"conv2d_winograd_nchwc", "dense"}


def test_inspect_names_unsupported_ops_and_where(tmp_path: Path) -> None:
    model = resnet18()
    node = next(n for n in model.graph.node if n.op_type == "MaxPool")
    node.op_type, node.domain = "Unique", ""
    del node.attribute[:]
    path = tmp_path / "unique.onnx"
    onnx.save(model, path)
    result = kiln("inspect", str(path))
    assert result.returncode == 1
    assert "unsupported ops: Unique" in result.stdout
    assert "| Unique " in result.stdout and node.name in result.stdout
    assert "does not import:" in result.stdout and "'Unique'" in result.stdout


def test_inspect_refuses_what_is_not_a_model(tmp_path: Path) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\xff\x00not a model")
    result = kiln("inspect", str(path))
    assert result.returncode == 2
    assert "junk.onnx" in result.stderr and result.stdout == ""
