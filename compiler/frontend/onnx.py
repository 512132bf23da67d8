"""Import ONNX models (default domain, any opset) into the graph IR.

    graph = load_onnx("model.onnx", input_shapes={"x": (1, 3, 224, 224)})

Models older than opset 13 are first brought to opset 13 by onnx's own version converter (which
rewrites what changed: Softmax's 2-D coercion, Upsample, attributes that became inputs); a model
it cannot convert is refused naming its opset. Shapes are static: a symbolic input dim needs
`input_shapes`. Every value's type comes from the registry's type rules (`compiler.graph.ops_*`); where ONNX's own shape inference (or a declared
output type) has a static answer, the two must agree. Initializers become `graph.constants`
(those some graph node reads), values keep their ONNX names, and the converters in `onnx_ops`
say how each ONNX op maps to graph ops.

Every failure is an `OnnxImportError` (a `GraphError`) naming its cause: the file that does not
parse, the opset, the input and dim that are symbolic, or the node, its op and the opset, e.g.
`node 'conv3' (op 'Foo', opset 17): unsupported op; supported: Add, ...`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from compiler.frontend import (
    onnx_ops_composite,
    onnx_ops_einsum,
    onnx_ops_index,
    onnx_ops_resize,
    onnx_ops_shape,
)
from compiler.frontend.onnx_context import ImportContext, NotConstantInput, OnnxImportError
from compiler.frontend.onnx_ops import CONVERTERS
from compiler.frontend.onnx_ops_resize import pin_legacy_resize
from compiler.graph.ir import Graph, GraphError

MIN_OPSET = 13  # what the converters are written for
OLDEST_OPSET = 1  # older models are upgraded to MIN_OPSET (by onnx's converter) from this one on
_DEFAULT_DOMAINS = ("", "ai.onnx")
# imported for their registrations into CONVERTERS
_FAMILIES = (onnx_ops_shape, onnx_ops_composite, onnx_ops_resize, onnx_ops_einsum, onnx_ops_index)

__all__ = [
    "MIN_OPSET",
    "OLDEST_OPSET",
    "OnnxImportError",
    "from_onnx",
    "load_onnx",
    "supported_ops",
]


def supported_ops() -> tuple[str, ...]:
    return tuple(sorted(CONVERTERS))


def load_onnx(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Graph:
    """Read a model from a path, serialized bytes or a ModelProto and import it."""
    if isinstance(model, onnx.ModelProto):
        return from_onnx(model, input_shapes)
    if isinstance(model, bytes | bytearray):
        what = f"model bytes ({len(model)} bytes)"
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:  # protobuf's DecodeError and friends: any parse failure
            raise OnnxImportError(f"{what}: not a readable ONNX model ({e})") from e
    else:
        what = f"file {os.fspath(model)!r}"
        try:
            proto = onnx.load(os.fspath(model))
        except OSError as e:
            raise OnnxImportError(f"{what}: cannot be read ({e})") from e
        except Exception as e:  # protobuf's DecodeError and friends: any parse failure
            raise OnnxImportError(f"{what}: not a readable ONNX model ({e})") from e
    if not proto.graph.node and not proto.graph.output:
        raise OnnxImportError(f"{what}: no graph (truncated or not an ONNX model)")
    try:
        return from_onnx(proto, input_shapes)
    except OnnxImportError as e:
        raise OnnxImportError(f"{what}: {e}", e.needs_constant) from e


def from_onnx(
    model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """The graph of an in-memory ModelProto; see the module docstring."""
    model = _upgraded(model)
    opset = _opset(model)
    g = model.graph
    graph = Graph(g.name or "onnx")
    inits = {t.name: t for t in g.initializer}
    reserved = {t.name for t in g.initializer} | {v.name for v in g.input}
    reserved |= {o for n in g.node for o in n.output} | {n.name for n in g.node}
    shapes = _input_shapes(model, inits, dict(input_shapes or {}))
    for name, (shape, dtype) in shapes.items():
        graph.add_input(name, shape, dtype)
    ctx = ImportContext(graph, opset, reserved, _onnx_shapes(model, shapes))
    for name, t in inits.items():
        ctx.consts[name] = numpy_helper.to_array(t)
    for node in g.node:
        _convert(ctx, node)
    outputs = []
    for out in g.output:
        try:
            value = ctx.resolve(out.name)
            ctx.materialize(value)
        except GraphError as e:
            raise OnnxImportError(f"graph output {out.name!r}: {e}") from e
        outputs.append(value)
    graph.set_outputs(outputs)
    graph.verify()
    return graph


def _upgraded(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` at opset MIN_OPSET when it is older (from OLDEST_OPSET on), by onnx's converter.

    Raises:
        OnnxImportError: no default-domain opset, one older than OLDEST_OPSET, or one the
            converter cannot bring forward (naming the opset and its reason).
    """
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions or versions[0] >= MIN_OPSET:
        return model  # _opset says what is wrong with no opset
    old = versions[0]
    if old < OLDEST_OPSET:
        raise OnnxImportError(
            f"opset {old} is not supported; Kiln imports opset {OLDEST_OPSET} and later"
        )
    from onnx import version_converter

    try:
        return version_converter.convert_version(pin_legacy_resize(model, old), MIN_OPSET)
    except Exception as e:  # the converter raises RuntimeError, ValueError, its own errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxImportError(
            f"opset {old}: onnx's version converter cannot bring the model to opset "
            f"{MIN_OPSET} ({first[:300]})"
        ) from e


def _opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise OnnxImportError("the model imports no default-domain (ai.onnx) opset")
    if versions[0] < MIN_OPSET:
        raise OnnxImportError(
            f"opset {versions[0]} is not supported; Kiln imports opset {MIN_OPSET} and later "
            "(convert the model with onnx.version_converter)"
        )
    return int(versions[0])


def _input_shapes(
    model: onnx.ModelProto,
    inits: Mapping[str, onnx.TensorProto],
    given: dict[str, Sequence[int]],
) -> dict[str, tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each true graph input; symbolic dims come from `given`."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    names = [v.name for v in model.graph.input if v.name not in inits]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise OnnxImportError(f"input_shapes names {unknown}, not inputs of the model {names}")
    for v in model.graph.input:
        if v.name in inits:
            continue
        tt = v.type.tensor_type
        if not v.type.HasField("tensor_type") or tt.elem_type == 0:
            raise OnnxImportError(
                f"input {v.name!r}: only tensor inputs with a dtype are supported"
            )
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
        dims = list(tt.shape.dim) if tt.HasField("shape") else None
        if v.name in given:
            shape = tuple(int(d) for d in given[v.name])
            if dims is not None and len(dims) != len(shape):
                raise OnnxImportError(
                    f"input {v.name!r}: input_shapes gives rank {len(shape)}, "
                    f"the model rank {len(dims)}"
                )
            for i, d in enumerate(dims or []):
                if d.HasField("dim_value") and d.dim_value != shape[i]:
                    raise OnnxImportError(
                        f"input {v.name!r}: input_shapes dim {i} is {shape[i]}, "
                        f"the model fixes it at {d.dim_value}"
                    )
        else:
            if dims is None:
                raise OnnxImportError(
                    f"input {v.name!r} has no shape; pass input_shapes={{{v.name!r}: (...)}}"
                )
            for i, d in enumerate(dims):
                if not d.HasField("dim_value"):
                    label = f" ({d.dim_param!r})" if d.dim_param else ""
                    raise OnnxImportError(
                        f"input {v.name!r} dim {i}{label} is symbolic; static shapes only: pass "
                        f"input_shapes={{{v.name!r}: (...)}}"
                    )
            shape = tuple(int(d.dim_value) for d in dims)
        out[v.name] = (shape, dtype)
    return out


def _onnx_shapes(
    model: onnx.ModelProto, inputs: Mapping[str, tuple[tuple[int, ...], str]]
) -> dict[str, tuple[int, ...]]:
    """Static shapes ONNX's shape inference (with our input shapes) finds, plus declared outputs."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for v in fixed.graph.input:
        if v.name in inputs:
            shape = v.type.tensor_type.shape
            shape.ClearField("dim")
            for d in inputs[v.name][0]:
                shape.dim.add().dim_value = d
    try:
        inferred = shape_inference.infer_shapes(fixed).graph
    except Exception:  # ONNX's inference is a cross-check only; our type rules report errors
        inferred = fixed.graph
    out: dict[str, tuple[int, ...]] = {}
    for v in [*inferred.value_info, *inferred.output]:
        tt = v.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[v.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    return out


def _convert(ctx: ImportContext, node: onnx.NodeProto) -> None:
    ctx.node = node
    where = f"node {node.name or node.output[0]!r} (op {node.op_type!r}, opset {ctx.opset})"
    if node.domain not in _DEFAULT_DOMAINS:
        raise OnnxImportError(f"{where}: domain {node.domain!r} is not supported")
    converter = CONVERTERS.get(node.op_type)
    if converter is None:
        raise OnnxImportError(f"{where}: unsupported op; supported: {', '.join(supported_ops())}")
    try:
        converter(ctx)
    except OnnxImportError:
        raise
    except NotConstantInput as e:
        raise OnnxImportError(f"{where}: {e}", needs_constant=e.tensor) from e
    except (GraphError, ValueError, TypeError, KeyError, IndexError) as e:
        raise OnnxImportError(f"{where}: {e}") from e
