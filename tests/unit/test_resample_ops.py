"""ConvTranspose (1-D, 2-D, 3-D), Resize / Upsample and Einsum: imported, run with the graph's
numpy references and compiled into a model, against onnx's ReferenceEvaluator, onnxruntime and
numpy; the graph ops' type rules and the converters' refusals name what is wrong."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_runtime import ModelRunner
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler.frontend.onnx import OnnxImportError, from_onnx
from compiler.graph import GraphError, TensorType, get_op, run_reference
from compiler.graph.build_model import build_model
from compiler.graph.registry import Category

pytestmark = pytest.mark.usefixtures("build_cache")

RNG = np.random.default_rng(11)
RTOL = 1e-4


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return np.asarray(RNG.uniform(-2.0, 2.0, shape), dtype=dtype)


def one_node(
    op: str,
    inputs: Mapping[str, np.ndarray | None],
    consts: Mapping[str, np.ndarray] | None = None,
    opset: int = 19,
    **attrs: Any,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of one `op` node: `inputs` in order (None: omitted), those in `consts` as
    initializers, the rest graph inputs fed with their arrays."""
    consts = consts or {}
    names, graph_inputs, inits, feeds = [], [], [], {}
    for name, value in inputs.items():
        if value is None:
            names.append("")
            continue
        names.append(name)
        if name in consts:
            inits.append(numpy_helper.from_array(np.asarray(value), name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
            feeds[name] = value
    node = helper.make_node(op, names, ["y"], **attrs)
    out = helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)
    graph = helper.make_graph([node], op.lower(), graph_inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, feeds


def constants(**arrays: np.ndarray) -> dict[str, np.ndarray]:
    """The initializers of a `one_node` model, by input name."""
    return dict(arrays)


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[Any]:
    typed = onnx.shape_inference.infer_shapes(model)
    session = ort.InferenceSession(typed.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    want: np.ndarray,
    compiled: bool = True,
    rtol: float = RTOL,
) -> None:
    """Our numpy references and (with `compiled`) the built model give `want`."""
    graph = from_onnx(model)
    (ours,) = run_reference(graph, feeds)
    assert ours.shape == want.shape and ours.dtype == want.dtype
    np.testing.assert_allclose(ours, want, rtol=rtol, atol=rtol * max(1.0, np.abs(want).max()))
    if compiled:
        (got,) = ModelRunner(build_model(graph)).run(feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, np.abs(want).max()))


# -- ConvTranspose --------------------------------------------------------------------------------

CONV_TRANSPOSE: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool, dict[str, Any]]] = {
    # name: (data shape, weight shape, bias, attributes)
    "1d-stride-pads-bias": ((2, 3, 7), (3, 4, 3), True, {"strides": [3], "pads": [1, 2]}),
    "1d-dilation-output-padding": (
        (1, 2, 5),
        (2, 3, 2),
        False,
        {"strides": [2], "dilations": [3], "output_padding": [1]},
    ),
    "1d-kernel-below-stride": ((1, 2, 4), (2, 2, 2), True, {"strides": [3], "output_padding": [2]}),
    "2d-groups-dilations-bias": (
        (2, 4, 5, 6),
        (4, 3, 2, 3),
        True,
        {"group": 2, "dilations": [2, 1], "strides": [1, 2], "pads": [1, 0, 0, 2]},
    ),
    "2d-depthwise-stride": ((1, 4, 4, 4), (4, 1, 3, 3), False, {"group": 4, "strides": [2, 2]}),
    "2d-output-shape-beyond-full": (
        (1, 2, 3, 3),
        (2, 2, 3, 3),
        False,
        {"strides": [3, 2], "output_shape": [10, 8]},
    ),
    "2d-same-lower": (
        (1, 3, 5, 4),
        (3, 2, 4, 3),
        True,
        {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    ),
    "2d-valid": ((1, 2, 3, 4), (2, 3, 2, 2), False, {"auto_pad": "VALID", "strides": [2, 1]}),
    "3d-groups-strides": (
        (1, 4, 3, 2, 3),
        (4, 1, 2, 3, 2),
        True,
        {"group": 2, "strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]},
    ),
}


@pytest.mark.parametrize("name", sorted(CONV_TRANSPOSE))
def test_conv_transpose_matches_onnxruntime(name: str) -> None:
    x_shape, w_shape, bias, attrs = CONV_TRANSPOSE[name]
    w = rand(*w_shape)
    inputs: dict[str, np.ndarray | None] = {"x": rand(*x_shape), "w": w}
    if bias:
        inputs["b"] = rand(w_shape[1] * attrs.get("group", 1))
    # the weight a runtime input for some cases, a constant for the others
    consts = {"w": w} if name.startswith(("1d", "3d")) else {}
    model, feeds = one_node("ConvTranspose", inputs, consts, opset=17, **attrs)
    # onnxruntime refuses an output_shape past the full output, onnx's reference grouped ones
    if "output-shape" in name:
        (want,) = ReferenceEvaluator(model).run(None, feeds)
    else:
        (want,) = onnxruntime_outputs(model, feeds)
    check(model, feeds, np.asarray(want))


CONV_TRANSPOSE_AS_CONV: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    # name: (data shape, weight shape, attributes); groups 1, no dilation, constant weights
    "stride-2-kernel-4-pads": ((1, 5, 6, 7), (5, 3, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "stride-3-2-crop": ((2, 3, 4, 5), (3, 4, 3, 2), {"strides": [3, 2], "pads": [2, 0, 1, 1]}),
    "output-padding": (
        (1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "output_padding": [1, 1], "pads": [1] * 4}
    ),
    "output-shape-beyond-full": ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    "stride-1": ((1, 4, 5, 5), (4, 6, 3, 3), {"pads": [0, 1, 2, 1]}),
    "same-upper": ((1, 3, 5, 4), (3, 2, 4, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CONV_TRANSPOSE_AS_CONV))
def test_a_2d_conv_transpose_with_constant_weights_is_a_convolution(name: str) -> None:
    """Zeros inserted between the pixels, padded, then a stride-1 conv with flipped weights: a
    conv template's task (the direct compute ran a U-Net's decoder at 0.62x onnxruntime)."""
    x_shape, w_shape, attrs = CONV_TRANSPOSE_AS_CONV[name]
    w, b = rand(*w_shape), rand(w_shape[1])
    model, feeds = one_node(
        "ConvTranspose", {"x": rand(*x_shape), "w": w, "b": b}, {"w": w, "b": b}, opset=17, **attrs
    )
    graph = from_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert "conv2d" in ops and not any(op.startswith("conv_transpose") for op in ops)
    if "output-shape" in name:  # onnxruntime refuses an output_shape past the full output
        (want,) = ReferenceEvaluator(model).run(None, feeds)
    else:
        (want,) = onnxruntime_outputs(model, feeds)
    check(model, feeds, np.asarray(want))


def test_conv_transpose_is_a_reduction_per_rank() -> None:
    for rank in (1, 2, 3):
        assert get_op(f"conv_transpose{rank}d").category == Category.REDUCTION


@pytest.mark.parametrize(
    ("x", "w", "attrs", "error"),
    [
        ((1, 3, 4, 4), (2, 2, 3, 3), {}, "input channels 3 != weight input channels 2"),
        ((1, 3, 4, 4), (3, 2, 3, 3), {"groups": 2}, "not a multiple of groups 2"),
        ((1, 2, 2, 2), (2, 1, 1, 1), {"pads": (1, 1, 1, 1)}, "leave no output"),
        ((1, 2, 4, 4), (2, 1, 3, 3), {"strides": (1,)}, "must have 2 values"),
        ((1, 2, 4, 4), (2, 1, 3, 3), {"output_padding": (-1, 0)}, "output_padding"),
    ],
)
def test_conv_transpose_type_rule_names_the_problem(
    x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any], error: str
) -> None:
    with pytest.raises(GraphError, match=rf"conv_transpose2d: .*{error}"):
        get_op("conv_transpose2d").infer(
            [TensorType(x, "float32"), TensorType(w, "float32")], attrs
        )


def test_conv_transpose_refusals_name_node_op_and_attribute() -> None:
    model, _ = one_node(
        "ConvTranspose", {"x": rand(1, 1, 2, 2, 2, 2), "w": rand(1, 1, 1, 1, 1, 1)}, opset=17
    )
    with pytest.raises(OnnxImportError, match=r"op 'ConvTranspose'.*1-D, 2-D and 3-D"):
        from_onnx(model)
    model, _ = one_node(
        "ConvTranspose", {"x": rand(1, 1, 3, 3), "w": rand(1, 1, 2, 2)}, opset=17, pads=[1, 1]
    )
    with pytest.raises(OnnxImportError, match=r"op 'ConvTranspose'.*pads \[1, 1\] must be 4"):
        from_onnx(model)


# -- resample (the graph op) ----------------------------------------------------------------------


def test_resample_reference_is_the_weighted_sum_of_its_taps() -> None:
    x = rand(2, 5, 3)
    indices = np.array([[0, 1], [4, 4], [2, 0]], np.int64)
    weights = rand(3, 2)
    (y,) = get_op("resample").reference([x, indices, weights], {"axis": 1})
    want = np.zeros((2, 3, 3))
    for o in range(3):
        for t in range(2):
            want[:, o, :] += weights[o, t] * x[:, indices[o, t], :]
    np.testing.assert_allclose(y, want, rtol=1e-6)
    assert y.dtype == np.float32 and get_op("resample").category == Category.INJECTIVE


@pytest.mark.parametrize(
    ("types", "error"),
    [
        ((((4,), "int32"), ((2, 2), "int64"), ((2, 2), "int32")), "data must be a float"),
        ((((4,), "float32"), ((2, 2), "float32"), ((2, 2), "float32")), "indices must be int"),
        ((((4,), "float32"), ((2, 2), "int64"), ((2, 3), "float32")), "must match"),
        ((((4,), "float32"), ((2, 2), "int64"), ((2, 2), "float64")), "the data's"),
        ((((4,), "float32"), ((2,), "int64"), ((2,), "float32")), "rank 2"),
    ],
)
def test_resample_type_rule_names_the_problem(types: tuple, error: str) -> None:
    with pytest.raises(GraphError, match=rf"resample: .*{error}"):
        get_op("resample").infer([TensorType(s, d) for s, d in types], {"axis": 0})


# -- Resize ---------------------------------------------------------------------------------------

F32 = np.float32
RESIZE: dict[str, tuple[tuple[int, ...], dict[str, np.ndarray | None], dict[str, Any]]] = {
    # name: (data shape, {"roi" / "scales" / "sizes": value}, attributes)
    "nearest-up-floor-half-pixel": (
        (1, 2, 3, 4),
        {"scales": np.array([1, 1, 2.5, 1.5], F32)},
        {"mode": "nearest", "nearest_mode": "floor"},
    ),
    "nearest-down-round-prefer-ceil-asymmetric": (
        (2, 1, 7, 5),
        {"sizes": np.array([2, 1, 3, 4], np.int64)},
        {
            "mode": "nearest",
            "nearest_mode": "round_prefer_ceil",
            "coordinate_transformation_mode": "asymmetric",
        },
    ),
    "nearest-ceil-align-corners-exclude-outside": (
        (1, 1, 4, 6),
        {"scales": np.array([1, 1, 1.75, 0.5], F32)},
        {
            "mode": "nearest",
            "nearest_mode": "ceil",
            "coordinate_transformation_mode": "align_corners",
            "exclude_outside": 1,
        },
    ),
    "linear-half-pixel-symmetric": (
        (1, 3, 5, 4),
        {"scales": np.array([1, 1, 0.7, 2.2], F32)},
        {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
    ),
    "linear-pytorch-half-pixel-to-one": (
        (1, 2, 6, 5),
        {"sizes": np.array([1, 2, 1, 9], np.int64)},
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    ),
    "linear-align-corners-3d": (
        (2, 3, 4, 5),
        {"scales": np.array([1, 1.5, 0.8, 2], F32)},
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    ),
    "cubic-a-half-exclude-outside": (
        (1, 2, 5, 6),
        {"scales": np.array([1, 1, 1.6, 0.7], F32)},
        {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
    ),
    "cubic-asymmetric-sizes": (
        (1, 1, 4, 7),
        {"sizes": np.array([1, 1, 9, 3], np.int64)},
        {"mode": "cubic", "coordinate_transformation_mode": "asymmetric"},
    ),
    "linear-antialias-down": (
        (1, 2, 9, 12),
        {"scales": np.array([1, 1, 0.4, 0.3], F32)},
        {"mode": "linear", "antialias": 1},
    ),
    "cubic-antialias-sizes": (
        (1, 1, 10, 8),
        {"sizes": np.array([1, 1, 3, 11], np.int64)},
        {"mode": "cubic", "antialias": 1},
    ),
    "tf-crop-extrapolate-linear": (
        (1, 2, 5, 6),
        {
            "roi": np.array([0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4], F32),
            "sizes": np.array([1, 2, 4, 5], np.int64),
        },
        {
            "mode": "linear",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 7.5,
        },
    ),
    "tf-crop-extrapolate-nearest-axes": (
        (1, 2, 5, 6),
        {"roi": np.array([0.6, 0.1, 1.3, 0.8], F32), "sizes": np.array([4, 3], np.int64)},
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": -3.0,
            "axes": [3, 2],
        },
    ),
    "keep-aspect-not-larger-axes": (
        (1, 2, 4, 6),
        {"sizes": np.array([7, 7], np.int64)},
        {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
    ),
    "keep-aspect-not-smaller": (
        (1, 1, 4, 6),
        {"sizes": np.array([1, 1, 5, 5], np.int64)},
        {"mode": "nearest", "keep_aspect_ratio_policy": "not_smaller"},
    ),
    "scale-one-axes-unchanged": (
        (2, 3, 4),
        {"scales": np.array([1, 1, 2], F32)},
        {"mode": "cubic"},
    ),
}


def _resize_model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    shape, given, attrs = RESIZE[name]
    inputs = {"x": rand(*shape), **{k: given.get(k) for k in ("roi", "scales", "sizes")}}
    consts = {k: v for k, v in given.items() if v is not None}
    return one_node("Resize", inputs, consts, opset=19, **attrs)


@pytest.mark.parametrize("name", sorted(RESIZE))
def test_resize_matches_the_reference_evaluator(name: str) -> None:
    model, feeds = _resize_model(name)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    check(model, feeds, np.asarray(want))


def test_a_wide_antialias_filter_is_a_matmul_by_the_weight_matrix() -> None:
    scales = np.array([1, 1, 0.1, 0.07], F32)
    model, feeds = one_node(
        "Resize", {"x": rand(1, 2, 40, 60), "roi": None, "scales": scales},
        constants(scales=scales), mode="cubic", antialias=1,
    )  # fmt: skip
    assert [n.op for n in from_onnx(model).nodes] == ["transpose", "matmul", "transpose", "matmul"]
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    check(model, feeds, np.asarray(want))


def test_resize_steps_are_gathers_resamples_and_wheres() -> None:
    graph = from_onnx(_resize_model("tf-crop-extrapolate-linear")[0])
    assert [n.op for n in graph.nodes] == ["resample", "where", "resample", "where"]
    graph = from_onnx(_resize_model("nearest-up-floor-half-pixel")[0])
    assert [n.op for n in graph.nodes] == ["gather", "gather"]


def test_resize_of_an_older_opset_and_float64_data_matches_the_reference() -> None:
    x = rand(1, 2, 3, 5, dtype=np.float64)
    scales = np.array([1, 1, 2, 0.6], F32)
    model, feeds = one_node(
        "Resize", {"x": x, "roi": np.zeros(0, F32), "scales": scales},
        constants(roi=np.zeros(0, F32), scales=scales), opset=11, mode="linear",
        coordinate_transformation_mode="asymmetric",
    )  # fmt: skip
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    check(model, feeds, np.asarray(want))


@pytest.mark.parametrize(
    ("given", "attrs", "error"),
    [
        ({"scales": np.array([1, 1, 2, 2], F32)}, {"mode": "nearest", "antialias": 1}, "antialias"),
        ({"scales": np.array([1, 1, 2, 2], F32)}, {"mode": "area"}, "mode 'area'"),
        (
            {"scales": np.array([1, 1, 2, 2], F32)},
            {"coordinate_transformation_mode": "corners"},
            "coordinate_transformation_mode 'corners'",
        ),
        ({"scales": np.array([1, 1, 2, 2], F32)}, {"nearest_mode": "up"}, "nearest_mode 'up'"),
        ({"scales": np.array([2, 2], F32)}, {}, r"scales \[2.0, 2.0\] must be 4 values"),
        (
            {"sizes": np.array([1, 1, 3, 3], np.int64)},
            {"keep_aspect_ratio_policy": "fit"},
            "keep_aspect_ratio_policy 'fit'",
        ),
        (
            {"scales": np.array([1, 1, 2, 2], F32)},
            {"coordinate_transformation_mode": "tf_crop_and_resize"},
            "needs roi",
        ),
        ({"scales": np.array([1, 1, 2, 2], F32), "sizes": np.array([1, 1, 4, 4])}, {}, "exactly"),
        ({"scales": np.array([1, 1, 0.2, 1], F32)}, {}, "resize 2 to 0"),
        ({"scales": np.array([1, 1, 2, 2], F32)}, {"foo": 1}, "attribute foo is not supported"),
    ],
)
def test_resize_refusals_name_the_attribute(
    given: dict[str, np.ndarray], attrs: dict[str, Any], error: str
) -> None:
    inputs = {"x": rand(1, 1, 2, 2), **{k: given.get(k) for k in ("roi", "scales", "sizes")}}
    model, _ = one_node("Resize", inputs, given, opset=19, **attrs)
    with pytest.raises(OnnxImportError, match=rf"node 'y' \(op 'Resize', opset 19\): .*{error}"):
        from_onnx(model)


def test_resize_refuses_computed_scales_and_linear_int_data() -> None:
    model, _ = one_node("Resize", {"x": rand(1, 1, 2, 2), "roi": None, "scales": rand(4)})
    with pytest.raises(OnnxImportError, match=r"scales.*must be a constant") as caught:
        from_onnx(model)
    assert caught.value.needs_constant == "scales"
    scales = np.array([1, 1, 2, 2], F32)
    x = np.arange(4, dtype=np.int32).reshape(1, 1, 2, 2)
    model, _ = one_node(
        "Resize", {"x": x, "roi": None, "scales": scales}, constants(scales=scales), mode="linear"
    )
    with pytest.raises(OnnxImportError, match="mode 'linear' of int32 data"):
        from_onnx(model)


def test_nearest_resize_of_int_data_is_an_exact_gather() -> None:
    x = RNG.integers(-100, 100, (1, 2, 3, 3)).astype(np.int64)
    sizes = np.array([1, 2, 5, 2], np.int64)
    model, feeds = one_node(
        "Resize", {"x": x, "roi": None, "scales": None, "sizes": sizes}, constants(sizes=sizes)
    )
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    check(model, feeds, np.asarray(want))


# -- Upsample -------------------------------------------------------------------------------------

LEGACY: dict[str, tuple[str, int, list[float], tuple[int, ...]]] = {
    # name: (op, opset, scales, data shape); onnxruntime is the oracle of these old ops
    "upsample-7-attribute": ("Upsample", 7, [1, 1, 2.5, 1.7], (1, 2, 6, 10)),
    "upsample-9": ("Upsample", 9, [1, 1, 1.3, 2.2], (2, 1, 5, 10)),
    "resize-10-up-and-down": ("Resize", 10, [1, 1, 0.35, 2.2], (1, 2, 7, 10)),
    "resize-10-shape-kept": ("Resize", 10, [1, 1, 1.06, 1.02], (1, 2, 6, 8)),
    "resize-10-one-axis-kept": ("Resize", 10, [1, 1, 1.22, 1.03], (1, 1, 8, 2)),
}


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("name", sorted(LEGACY))
def test_old_upsample_and_resize_10_keep_their_meaning_through_the_converter(
    name: str, mode: str
) -> None:
    # onnx's converter makes them Resize-13 with half_pixel coordinates; they are asymmetric,
    # and onnxruntime rounds a nearest source down on growing axes and up on shrinking ones
    op, opset, scales, shape = LEGACY[name]
    s = np.array(scales, F32)
    if opset == 7:
        model, feeds = one_node(op, {"x": rand(*shape)}, opset=7, mode=mode, scales=scales)
    else:
        model, feeds = one_node(op, {"x": rand(*shape), "s": s}, constants(s=s), opset, mode=mode)
    (want,) = onnxruntime_outputs(model, feeds)
    check(model, feeds, np.asarray(want))


def test_upsample_of_integer_scales_matches_onnxruntime() -> None:
    scales = np.array([1, 1, 3, 2], F32)
    model, feeds = one_node(
        "Upsample", {"x": rand(2, 3, 2, 4), "scales": scales}, constants(scales=scales), opset=9
    )
    (want,) = onnxruntime_outputs(model, feeds)
    check(model, feeds, np.asarray(want))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_an_upsample_node_is_resize_with_asymmetric_floor_coordinates(mode: str) -> None:
    x = rand(1, 2, 3, 4)
    scales = np.array([1, 1, 2.5, 1.5], F32)
    upsample, feeds = one_node(
        "Upsample", {"x": x, "scales": scales}, constants(scales=scales), opset=13, mode=mode
    )
    resize, _ = one_node(
        "Resize", {"x": x, "roi": None, "scales": scales}, constants(scales=scales),
        opset=13, mode=mode, coordinate_transformation_mode="asymmetric", nearest_mode="floor",
    )  # fmt: skip
    (want,) = ReferenceEvaluator(resize).run(None, feeds)
    check(upsample, feeds, np.asarray(want))
    if mode == "nearest":  # positions i / scale rounded down
        rows, cols = (np.arange(7) / 2.5).astype(int), (np.arange(6) / 1.5).astype(int)
        np.testing.assert_array_equal(np.asarray(want), x[:, :, rows][:, :, :, cols])


# -- Einsum ---------------------------------------------------------------------------------------

EINSUM: dict[str, list[tuple[int, ...]]] = {
    "ij->ji": [(3, 4)],
    "ij->i": [(3, 4)],
    "...ii ->...i": [(3, 5, 5)],
    "i,i": [(5,), (5,)],
    "bij, bjk -> bik": [(5, 2, 3), (5, 3, 4)],
    "->": [()],
    "ij,jk": [(3, 4), (4, 2)],
    "ii": [(4, 4)],
    "iij->ji": [(3, 3, 2)],
    "i,j->ij": [(3,), (4,)],
    "ij,ij->ij": [(2, 3), (2, 3)],
    "bn,anm,bm->ba": [(2, 3), (4, 3, 5), (2, 5)],
    "...ij,...jk->...ik": [(2, 1, 3, 4), (5, 4, 2)],
    "abc->": [(2, 3, 4)],
    "ab,cd->": [(2, 3), (4, 5)],
}


@pytest.mark.parametrize("equation", sorted(EINSUM))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_einsum_matches_numpy(equation: str, dtype: Any) -> None:
    arrays = [rand(*s, dtype=dtype) for s in EINSUM[equation]]
    model, feeds = one_node(
        "Einsum", {f"x{k}": a for k, a in enumerate(arrays)}, opset=12, equation=equation
    )
    want = np.asarray(np.einsum(equation.replace(" ", ""), *arrays), dtype=dtype)
    # model_runtime's runner feeds a rank-0 input as rank 1 (np.ascontiguousarray): no build
    check(model, feeds, want, compiled=equation != "->", rtol=1e-5)


def test_einsum_lowers_to_existing_graph_ops() -> None:
    model, _ = one_node("Einsum", {"x": rand(3, 5, 5)}, opset=12, equation="...ii->...i")
    assert [n.op for n in from_onnx(model).nodes] == ["transpose", "reshape", "gather"]
    model, _ = one_node(
        "Einsum", {"a": rand(5, 2, 3), "b": rand(5, 3, 4)}, opset=12, equation="bij,bjk->bik"
    )
    assert [n.op for n in from_onnx(model).nodes] == ["matmul"]


@pytest.mark.parametrize(
    ("equation", "shapes", "error"),
    [
        ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j' has sizes 3 and 4"),
        ("ij->k", [(2, 3)], r"output labels \['k'\] are in no operand"),
        ("ij", [(2, 3, 4)], "does not fit rank 3"),
        ("i,j", [(2,)], "has 2 operands, the node 1"),
        ("i1->i", [(2, 3)], "not a letter"),
        ("ij->ii", [(2, 2)], "repeats a label"),
    ],
)
def test_einsum_refusals_name_the_problem(
    equation: str, shapes: list[tuple[int, ...]], error: str
) -> None:
    model, _ = one_node(
        "Einsum", {f"x{k}": rand(*s) for k, s in enumerate(shapes)}, opset=12, equation=equation
    )
    with pytest.raises(OnnxImportError, match=rf"op 'Einsum'.*{error}"):
        from_onnx(model)
