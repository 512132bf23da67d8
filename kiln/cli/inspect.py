"""`kiln inspect MODEL.onnx`: what a model holds and what Kiln would make of it, before any build.

Prints the model's opset, inputs and outputs, an operator histogram (which ops Kiln imports and
which it does not, with the first nodes of each), and, when the model imports, the tuning tasks
that `kiln tune` would create (template, workload, how many nodes share it); when it does not,
the import error. Nothing is compiled. `--json` prints the same as one JSON object.

Exit status 0 when the model imports, 1 when it does not (the report says why), 2 for a file
that is not an ONNX model.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from kiln.cli import common, table
from kiln.cli.errors import CliError

_NODES_SHOWN = 3  # node names listed per unsupported op


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `inspect` to the `kiln` parser."""
    p = sub.add_parser(
        "inspect",
        help="a model's opset, inputs, operators (supported or not) and tuning tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="an .onnx file")
    common.add_input_shape_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.set_defaults(func=run)


def _type_text(value: Any) -> str:
    import onnx

    t = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        return "(not a tensor)"
    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "?"
    dims = [
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim
    ]
    return f"{dtype}[{', '.join(dims)}]"


def report(path: str, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """The inspection of the model at `path` as plain data.

    Raises:
        CliError: the file is not a readable ONNX model (exit status 2).
    """
    import onnx

    from compiler.frontend.onnx import MIN_OPSET, OnnxImportError, load_onnx, supported_ops
    from compiler.graph.build_model import plan_model
    from compiler.graph.ir import GraphError

    try:
        model = onnx.load(path, load_external_data=False)
    except (OSError, ValueError) as error:
        raise CliError.usage(f"{path}: cannot read an ONNX model: {error}") from None
    except Exception as error:  # protobuf's DecodeError and friends
        raise CliError.usage(f"{path}: not an ONNX model ({type(error).__name__})") from None
    g = model.graph
    initializers = {t.name for t in g.initializer}
    supported = set(supported_ops())
    counts: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    for node in g.node:
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        counts[op] += 1
        where.setdefault(op, []).append(node.name or node.output[0])
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    out: dict[str, Any] = {
        "model": path,
        "opsets": opsets,
        "min_opset": MIN_OPSET,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": [
            {"name": v.name, "type": _type_text(v)} for v in g.input if v.name not in initializers
        ],
        "outputs": [{"name": v.name, "type": _type_text(v)} for v in g.output],
        "nodes": len(g.node),
        "parameters": len(g.initializer),
        "operators": [
            {"op": op, "count": n, "supported": op in supported, "nodes": where[op][:_NODES_SHOWN]}
            for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    }
    try:
        plan = plan_model(load_onnx(model, shapes), None, "host")
    except (OnnxImportError, GraphError, ValueError) as error:
        out["imports"] = False
        out["error"] = str(error)
        out["tasks"] = []
        return out
    out["imports"] = True
    out["tasks"] = [
        {
            "template": t.template or "-",
            "workload": list(t.workload),
            "weight": t.weight,
            "anchor_op": t.anchor_op,
            "note": t.note,
        }
        for t in plan.tasks
    ]
    return out


def run(args: argparse.Namespace) -> int:
    """Print the inspection; 1 when the model does not import."""
    info = report(args.model, dict(args.input_shape) or None)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0 if info["imports"] else 1
    opsets = ", ".join(f"{d} {v}" for d, v in info["opsets"].items())
    print(f"model: {info['model']} (opset {opsets}; producer {info['producer'] or '-'})")
    print(f"{info['nodes']} nodes, {info['parameters']} parameters")
    for kind in ("inputs", "outputs"):
        values = ", ".join(f"{v['name']} {v['type']}" for v in info[kind])
        print(f"{kind}: {values or '-'}")
    print()
    rows = [
        [o["op"], str(o["count"]), "yes" if o["supported"] else "NO", ", ".join(o["nodes"])]
        for o in info["operators"]
    ]
    print(table.render(["op", "nodes", "supported", "first nodes"], rows))
    missing = [o["op"] for o in info["operators"] if not o["supported"]]
    print(f"unsupported ops: {', '.join(missing) if missing else 'none'}")
    print()
    if not info["imports"]:
        print(f"does not import: {info['error']}")
        return 1
    task_rows = [
        [t["template"], str(t["workload"]), str(t["weight"]), t["note"]] for t in info["tasks"]
    ]
    print(table.render(["template", "workload", "nodes", "note"], task_rows))
    tunable = sum(1 for t in info["tasks"] if t["template"] != "-")
    print(f"{len(info['tasks'])} tasks, {tunable} tunable")
    return 0
