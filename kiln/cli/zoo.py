"""`kiln models list|export`: the reference models of `compiler.zoo`, written as .onnx files.

    kiln models list                                   # name, input, output, parameters, nodes
    kiln models export -o models/                      # every model, default sizes, seed 0
    kiln models export resnet18 mobilenet_v2 -o m/ --image 128 --batch 4 --seed 3
    kiln models export bert_tiny -o m/ --seq 64

`--batch` and `--image` apply to the CNNs, `--seq` to BERT; each model takes the flags its builder
has and keeps its defaults for the others.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kiln.cli import table
from kiln.cli.errors import CliError

if TYPE_CHECKING:
    import onnx


def _models() -> ModuleType:
    # Imported on use: onnx takes longer to import than the rest of `kiln`, and only these
    # commands need it.
    from compiler import zoo

    return zoo


# size flags, each passed as the builder keyword of the same name to the builders that take it
SIZE_FLAGS = ("batch", "image", "seq")


def builder_kwargs(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments for model `name` from the flags given that its builder takes."""
    takes = _models().options(name)
    kw: dict[str, Any] = {"seed": args.seed}
    for flag in SIZE_FLAGS:
        value = getattr(args, flag)
        if value is not None and flag in takes:
            kw[flag] = value
    return kw


def _shape_text(value: onnx.ValueInfoProto) -> str:
    from onnx.helper import tensor_dtype_to_np_dtype

    dtype = tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    dims = ",".join(str(d.dim_value) for d in value.type.tensor_type.shape.dim)
    return f"{value.name} {dtype}[{dims}]"


def describe(model: onnx.ModelProto) -> list[str]:
    """Inputs, outputs, parameter count (BatchNorm statistics excluded) and node count."""
    params = _models().parameter_count(model, (".running_mean", ".running_var"))
    return [
        "; ".join(_shape_text(v) for v in model.graph.input),
        "; ".join(_shape_text(v) for v in model.graph.output),
        f"{params / 1e6:.2f} M",
        str(len(model.graph.node)),
    ]


def cmd_list(args: argparse.Namespace) -> int:
    zoo = _models()
    rows = [[name, *describe(zoo.build(name))] for name in zoo.MODELS]
    print(table.render(["model", "input", "output", "parameters", "nodes"], rows))
    return 0


def _checked_names(names: Sequence[str]) -> list[str]:
    zoo = _models()
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        raise CliError(f"unknown model {', '.join(unknown)}; known: {', '.join(zoo.MODELS)}")
    return list(dict.fromkeys(names)) or list(zoo.MODELS)


def cmd_export(args: argparse.Namespace) -> int:
    import onnx

    zoo = _models()
    names = _checked_names(args.names)
    out_dir = Path(args.output)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {out_dir}: {exc}") from None
    for name in names:
        kw = builder_kwargs(name, args)
        path = out_dir / f"{name}.onnx"
        try:
            model = zoo.build(name, **kw)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        try:
            onnx.save_model(model, str(path))
        except OSError as exc:
            raise CliError(f"cannot write {path}: {exc}") from None
        _, _, params, nodes = describe(model)
        size_mb = path.stat().st_size / 1e6
        options = " ".join(f"{k}={v}" for k, v in kw.items())
        print(f"wrote {path}: {params} parameters, {nodes} nodes, {size_mb:.1f} MB ({options})")
    return 0


def _int_at_least(low: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`, refused with "want a `what`, got ..." otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"want a {what}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"want a {what}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "positive integer")
_seed = _int_at_least(0, "non-negative integer")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `models list` and `models export` to the `kiln` parser."""
    m = sub.add_parser("models", help="list or export the reference models (ONNX)")
    m.set_defaults(func=run)
    msub = m.add_subparsers(dest="models_command", required=True)
    ls = msub.add_parser("list", help="the models with their inputs, outputs and parameters")
    ls.set_defaults(models_func=cmd_list)
    e = msub.add_parser("export", help="write models as NAME.onnx files into a directory")
    e.add_argument(
        "names", nargs="*", metavar="NAME", help="models to write (default: all of `models list`)"
    )
    e.add_argument("-o", "--output", required=True, help="directory to write into (created)")
    e.add_argument("--seed", type=_seed, default=0, help="weights' random seed (default 0)")
    e.add_argument("--batch", type=_positive_int, help="batch size of the CNNs (default 1)")
    e.add_argument("--image", type=_positive_int, help="image height = width of the CNNs (224)")
    e.add_argument("--seq", type=_positive_int, help="sequence length of BERT (default 128)")
    e.set_defaults(models_func=cmd_export)


def run(args: argparse.Namespace) -> int:
    """Dispatch a parsed `kiln models ...` command."""
    code: int = args.models_func(args)
    return code
