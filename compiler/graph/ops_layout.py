"""Graph ops on NCHW[x]c data, for the layout pass (`passes.layout.to_nchwc`).

A layout is a string: "NCHW", or "NCHW{x}c" for x channels innermost (`[N][C/x][H][W][x]`).

- `layout_transform(x; src_layout, dst_layout)`: INJECTIVE; between NCHW and NCHW[x]c, or between
  two block sizes.
- `conv2d_nchwc(x, w[, b]; strides, pads, dilations, groups, ic_block, oc_block, template)`:
  COMPLEX_OUT_FUSABLE. Data `[N][IC/icb][H][W][icb]` (not pre-padded: `pads` as in conv2d),
  weights pre-packed by `compiler.ops.layout`: `[OC/ocb][IC/icb][KH][KW][icb][ocb]` when
  groups == 1, `[OC/ocb][IC/groups/icb][KH][KW][icb][ocb]` when grouped (the blocks divide a
  group's channels), `[C/cb][KH][KW][cb]` when depthwise (groups == C, icb == ocb == cb); bias
  `[OC/ocb][ocb]`. Output `[N][OC/ocb][OH][OW][ocb]`. `template` names the `compiler.ops`
  template ("conv2d_nchwc", "conv2d_1x1_nchwc", "conv2d_stem_nchwc", "depthwise_conv2d_nchwc",
  "grouped_conv2d_1x1_nchwc").
- `max_pool2d_nchwc`, `avg_pool2d_nchwc`, `global_avg_pool2d_nchwc`: REDUCTION; the NCHW pools'
  attributes and semantics on NCHW[x]c data (the block is the data's last dimension).
- `gather_channels_nchwc(x, blocks, lanes)`: INJECTIVE; a gather of channels (ONNX Gather on
  axis 1 by constant indices, e.g. a channel shuffle) on NCHW[x]c data: output channel block
  `cb`, lane `l` is input block `blocks[cb][l]`, lane `lanes[cb][l]` (`channel_tables`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compiler.graph.ir import GraphError, TensorType
from compiler.graph.ops_util import window_out
from compiler.graph.registry import Category, OpDef, get_op, register
from compiler.ops.layout import pack_nchwc, unpack_nchwc

Attrs = Mapping[str, Any]
NCHW = "NCHW"
_BLOCKED = re.compile(r"NCHW([1-9][0-9]*)c")


def layout_block(layout: str) -> int:
    """The channel block of `layout`: 0 for "NCHW", x for "NCHW{x}c"; GraphError otherwise."""
    if layout == NCHW:
        return 0
    m = _BLOCKED.fullmatch(layout)
    if m is None:
        raise GraphError(f"unknown layout {layout!r}: expected 'NCHW' or 'NCHW<x>c'")
    return int(m.group(1))


def blocked(block: int) -> str:
    """The layout name of NCHW data with `block` channels innermost."""
    return f"NCHW{block}c"


def nchwc_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    """The NCHW[block]c shape of NCHW `shape`; GraphError when block does not divide C."""
    n, c, h, w = shape
    if block < 1 or c % block:
        raise GraphError(f"channel block {block} does not divide {c} channels of {list(shape)}")
    return (n, c // block, h, w, block)


def nchw_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The NCHW shape of NCHW[x]c `shape`."""
    n, cb, h, w, b = shape
    return (n, cb * b, h, w)


def convert(x: np.ndarray, src_layout: str, dst_layout: str) -> np.ndarray:
    """`x` from `src_layout` to `dst_layout`."""
    src, dst = layout_block(src_layout), layout_block(dst_layout)
    if src:
        if x.ndim != 5 or x.shape[4] != src:
            raise GraphError(f"layout_transform: data {list(x.shape)} is not {src_layout}")
        x = unpack_nchwc(x)
    return pack_nchwc(x, dst) if dst else np.ascontiguousarray(x)


# -- layout_transform -----------------------------------------------------------------------------


def _transform_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    if len(inputs) != 1:
        raise GraphError(f"layout_transform: takes 1 input, got {len(inputs)}")
    (x,) = inputs
    src = layout_block(str(attrs.get("src_layout")))
    dst = layout_block(str(attrs.get("dst_layout")))
    if len(x.shape) != (5 if src else 4) or (src and x.shape[4] != src):
        raise GraphError(f"layout_transform: data {x} is not in {attrs.get('src_layout')}")
    shape = nchw_shape(x.shape) if src else x.shape
    return [TensorType(nchwc_shape(shape, dst) if dst else shape, x.dtype)]


def _transform_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return [convert(inputs[0], str(attrs["src_layout"]), str(attrs["dst_layout"]))]


register(
    OpDef(
        "layout_transform",
        Category.INJECTIVE,
        _transform_infer,
        _transform_reference,
        doc="Data from src_layout to dst_layout (NCHW or NCHW<x>c).",
    )
)

# -- conv2d_nchwc ---------------------------------------------------------------------------------


def _conv_attrs(attrs: Attrs) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    strides = tuple(int(v) for v in attrs.get("strides", (1, 1)))
    pads = tuple(int(v) for v in attrs.get("pads", (0, 0, 0, 0)))
    dilations = tuple(int(v) for v in attrs.get("dilations", (1, 1)))
    return strides, pads, dilations, int(attrs.get("groups", 1))


def _conv_nchwc_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "conv2d_nchwc"
    if len(inputs) not in (2, 3):
        raise GraphError(f"{op}: takes 2 or 3 inputs, got {len(inputs)}")
    x, w = inputs[0], inputs[1]
    strides, pads, dilations, groups = _conv_attrs(attrs)
    icb, ocb = int(attrs.get("ic_block", 0)), int(attrs.get("oc_block", 0))
    if len(x.shape) != 5 or x.shape[4] != icb:
        raise GraphError(f"{op}: data {x} is not NCHW{icb}c (ic_block={icb})")
    n, icc, h, wd, _ = x.shape
    if groups == 1 or len(w.shape) == 6:  # a grouped one reads IC/groups channels per output
        per_group = icc * icb // groups
        if (
            len(w.shape) != 6
            or per_group % icb
            or w.shape[1] != per_group // icb
            or w.shape[4:] != (icb, ocb)
            or (w.shape[0] * ocb) % groups
            or (w.shape[0] * ocb // groups) % ocb
        ):
            raise GraphError(
                f"{op}: weight {w} is not packed [OC/{ocb}][{icc * icb}/{groups}/{icb}][KH][KW]"
                f"[{icb}][{ocb}] (blocks must divide a group's channels)"
            )
        occ, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    else:
        if groups != icc * icb or icb != ocb or len(w.shape) != 4 or w.shape[0] != icc:
            raise GraphError(
                f"{op}: groups={groups} supports only depthwise weights [C/cb][KH][KW][cb] with "
                f"ic_block == oc_block; got weight {w}, data {x}, blocks {icb}/{ocb}"
            )
        occ, kh, kw = icc, w.shape[1], w.shape[2]
    if len(inputs) == 3 and inputs[2].shape != (occ, ocb):
        raise GraphError(f"{op}: bias {inputs[2]} must be [{occ}][{ocb}]")
    oh = window_out(op, h, kh, strides[0], dilations[0], pads[0], pads[2])
    ow = window_out(op, wd, kw, strides[1], dilations[1], pads[1], pads[3])
    return [TensorType((n, occ, oh, ow, ocb), x.dtype)]


def _conv_nchwc_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    """The convolution computed directly on blocked data, one kernel tap at a time (float64)."""
    x, w = inputs[0], inputs[1]
    strides, pads, dilations, groups = _conv_attrs(attrs)
    (out_type,) = _conv_nchwc_infer([TensorType(a.shape, str(a.dtype)) for a in inputs], attrs)
    _, _, oh, ow, _ = out_type.shape
    xp = np.pad(
        x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0))
    )
    kh, kw = (w.shape[2], w.shape[3]) if w.ndim == 6 else (w.shape[1], w.shape[2])
    out = np.zeros(out_type.shape, np.float64)
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dilations[0], kx * dilations[1]
            window = xp[
                :,
                :,
                y0 : y0 + strides[0] * (oh - 1) + 1 : strides[0],
                x0 : x0 + strides[1] * (ow - 1) + 1 : strides[1],
                :,
            ]
            if groups == 1:
                tap = w[:, :, ky, kx].astype(np.float64)  # [OCo][ICo][icb][ocb]
                out += np.einsum("nihwc,oicd->nohwd", window, tap)
            elif w.ndim == 6:  # grouped: output block o reads its group's input blocks
                tap = w[:, :, ky, kx].astype(np.float64)
                per_in, per_out = w.shape[1], w.shape[0] // groups
                for g in range(groups):
                    part = window[:, g * per_in : (g + 1) * per_in]
                    rows = slice(g * per_out, (g + 1) * per_out)
                    out[:, rows] += np.einsum("nihwc,oicd->nohwd", part, tap[rows])
            else:
                out += window * w[:, ky, kx, :].astype(np.float64)[None, :, None, None, :]
    if len(inputs) > 2:
        out += inputs[2].astype(np.float64)[None, :, None, None, :]
    return [out.astype(x.dtype)]


register(
    OpDef(
        "conv2d_nchwc",
        Category.COMPLEX_OUT_FUSABLE,
        _conv_nchwc_infer,
        _conv_nchwc_reference,
        template="conv2d_nchwc",
        doc="conv2d on NCHW[x]c data with pre-packed weights; the node's `template` attr picks "
        "the compiler.ops template.",
    )
)

# -- gather_channels_nchwc ------------------------------------------------------------------------


def channel_tables(indices: np.ndarray, in_block: int, out_block: int) -> tuple[np.ndarray, ...]:
    """(source block, source lane) of every output channel of a gather of channels `indices`
    (non-negative) from NCHW[in_block]c data, each shaped [C_out/out_block][out_block], int32."""
    idx = np.asarray(indices, np.int64)
    if idx.size % out_block:
        raise GraphError(f"channel block {out_block} does not divide {idx.size} gathered channels")
    shape = (idx.size // out_block, out_block)
    return (idx // in_block).astype(np.int32).reshape(shape), (idx % in_block).astype(
        np.int32
    ).reshape(shape)


def _gather_channels_infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    op = "gather_channels_nchwc"
    if len(inputs) != 3 or len(inputs[0].shape) != 5:
        raise GraphError(f"{op}: takes NCHW[x]c data and two index tables, got {len(inputs)}")
    x, blocks, lanes = inputs
    if blocks.shape != lanes.shape or len(blocks.shape) != 2:
        raise GraphError(f"{op}: tables {blocks} and {lanes} must be one [C/b][b] shape")
    if blocks.dtype not in ("int32", "int64") or lanes.dtype not in ("int32", "int64"):
        raise GraphError(f"{op}: tables must be int32 or int64, got {blocks.dtype}")
    n, _, h, w, _ = x.shape
    return [TensorType((n, blocks.shape[0], h, w, blocks.shape[1]), x.dtype)]


def _gather_channels_reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, blocks, lanes = inputs
    out = x[:, blocks, :, :, lanes]  # [CB][B][N][H][W]: advanced indices come first
    return [np.ascontiguousarray(out.transpose(2, 0, 3, 4, 1))]


register(
    OpDef(
        "gather_channels_nchwc",
        Category.INJECTIVE,
        _gather_channels_infer,
        _gather_channels_reference,
        doc="channels of NCHW[x]c data gathered by constant tables: output channel (cb, l) is "
        "input block blocks[cb][l], lane lanes[cb][l] (a channel shuffle, kept blocked).",
    )
)

# -- pools ----------------------------------------------------------------------------------------


def _pool_infer(base: str) -> Any:
    def infer(inputs: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        if len(inputs) != 1 or len(inputs[0].shape) != 5:
            raise GraphError(
                f"{base}_nchwc: takes one NCHW[x]c input, got {list(map(str, inputs))}"
            )
        x = inputs[0]
        block = x.shape[4]
        (y,) = get_op(base).infer([TensorType(nchw_shape(x.shape), x.dtype)], attrs)
        return [TensorType(nchwc_shape(y.shape, block), y.dtype)]

    return infer


def _pool_reference(base: str) -> Any:
    def reference(inputs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x = inputs[0]
        (y,) = get_op(base).reference([unpack_nchwc(x)], attrs)
        return [pack_nchwc(y, x.shape[4])]

    return reference


POOLS = ("max_pool2d", "avg_pool2d", "global_avg_pool2d")

for _base in POOLS:
    register(
        OpDef(
            f"{_base}_nchwc",
            Category.REDUCTION,
            _pool_infer(_base),
            _pool_reference(_base),
            template=f"{_base}_nchwc",
            doc=f"{_base} on NCHW[x]c data (same attributes), block kept.",
        )
    )
