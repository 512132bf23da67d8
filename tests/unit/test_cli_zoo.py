"""`kiln models list` and `kiln models export`, run in-process into a temporary directory."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from compiler import zoo
from kiln import cli


def run_kiln(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def input_shape(model: onnx.ModelProto) -> list[int]:
    return [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


def test_export_writes_every_model_with_the_sizes_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "new" / "models"  # created
    argv = ["models", "export", "-o", str(out_dir), "--image", "32", "--batch", "2"]
    code, out, err = run_kiln([*argv, "--seq", "16", "--seed", "3"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "bert_tiny.onnx",
        "mobilenet_v2.onnx",
        "resnet18.onnx",
    ]
    assert out.count("wrote ") == 3 and "11.69 M parameters" in out
    for name in zoo.MODELS:
        loaded = onnx.load(str(out_dir / f"{name}.onnx"))
        onnx.checker.check_model(loaded, full_check=True)
        want = {"bert_tiny": [1, 16]}.get(name, [2, 3, 32, 32])
        assert input_shape(loaded) == want, name
    again = zoo.mobilenet_v2(batch=2, image=32, seed=3)
    written = (out_dir / "mobilenet_v2.onnx").read_bytes()
    assert written == again.SerializeToString()


def test_export_names_only_the_models_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_kiln(["models", "export", "bert_tiny", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["bert_tiny.onnx"]
    assert input_shape(onnx.load(str(tmp_path / "bert_tiny.onnx"))) == [1, 128]
    assert "seed=0" in out


def test_list_shows_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_kiln(["models", "list"], capsys)
    assert code == 0, err
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()[2:]}
    assert list(rows) == list(zoo.MODELS)
    assert "input float32[1,3,224,224]" in rows["resnet18"] and "11.69 M" in rows["resnet18"]
    assert "3.50 M" in rows["mobilenet_v2"]
    assert "input_ids int64[1,128]" in rows["bert_tiny"]


def test_bad_input_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_kiln(["models", "export", "vgg16", "-o", str(tmp_path)], capsys)
    assert code == 1
    assert "kiln: unknown model vgg16; known: resnet18, mobilenet_v2, bert_tiny" in err
    argv = ["models", "export", "resnet18", "-o", str(tmp_path), "--image", "16"]
    code, _, err = run_kiln(argv, capsys)
    assert code == 1 and "resnet18: image must be >= 32" in err
    code, _, err = run_kiln(["models", "export", "-o", str(tmp_path), "--batch", "0"], capsys)
    assert code == 2 and "want a positive integer, got '0'" in err
    assert list(tmp_path.iterdir()) == []
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_kiln(["models", "export", "-o", str(blocker / "sub")], capsys)
    assert code == 1 and "cannot create" in err
