"""A quantised network's convolutions as accelerator programs: one entry per layer, one artifact.

A conv's *lowering* splits it between the CPU and the accelerator. `Im2colDense` (the default,
`LOWERING`) has the CPU build the im2col matrix (`int8_ops.im2col`) and the accelerator run the
`vta_dense` GEMM (M = output pixels, N = output channels, K = kernel x kernel x cin) with the
layer's bias and shift. `DirectConv` runs the `vta_conv2d` program lowered from its TE schedule:
the accelerator reads the input tiles (and the padding) itself, the CPU only transposes HWC to
CHW. A network takes one or the other with the `lowering` argument.

Each layer's program is the template's generated program for the layer's tuned config, changed
in two ways that leave its instructions' count, order and tokens alone (so the cycles a tuner
measured for the config are the cycles it takes):
- `signed_epilogue`: a layer without ReLU (the second conv of a block, a downsample, the head)
  clips at -128 instead: the generator's ALU steps ADD bias, MAX 0, SHR s, MIN 127 become ADD
  bias, SHR s, MAX -128, MIN 127, i.e. y = clip((acc + bias) >> s, -128, 127).
- `bake`: the weights and bias become the program's DRAM constants, so an entry takes only the
  activations, and the weights cross the network once, with the artifact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from compiler.artifact import ArgSpec, Artifact, Entry
from compiler.codegen.vta import gemm_program
from compiler.ops.vta_conv2d import VtaConv2dTemplate
from compiler.ops.vta_dense import ACCEL_FORMAT, SHIFT, tiling
from compiler.quantized.int8_ops import INT8_MIN, im2col
from compiler.quantized.resnet import Int8ResNet, QConv
from protos.vta import VTA_TARGET, Alu, AluOp, VtaSpec
from protos.vta_program import ArgLayout, Program, encode_programs


class ConvLowering(Protocol):
    """How one conv runs: the accelerator template and workload, and the CPU's part."""

    template: str

    def workload(self, layer: QConv) -> tuple[int, ...]:
        """The template's workload for `layer` (what its configs are tuned for)."""
        ...

    def entry_input(self, layer: QConv, x: np.ndarray) -> np.ndarray:
        """What the layer's entry takes, made on the CPU from its HWC int8 input."""
        ...

    def entry_output(self, layer: QConv, y: np.ndarray) -> np.ndarray:
        """The layer's HWC int8 output from what its entry returns."""
        ...

    def program(self, layer: QConv, config: Mapping[str, Any], spec: VtaSpec) -> Program:
        """The layer's program for `config`: args (input, output), weights baked in."""
        ...


class Im2colDense:
    """im2col on the CPU, the GEMM and its epilogue as a `vta_dense` program."""

    template = "vta_dense"

    def workload(self, layer: QConv) -> tuple[int, ...]:
        return layer.gemm_shape()

    def entry_input(self, layer: QConv, x: np.ndarray) -> np.ndarray:
        return im2col(x, layer.kernel, layer.stride, layer.pad)

    def entry_output(self, layer: QConv, y: np.ndarray) -> np.ndarray:
        return y.reshape(*layer.out_hw, layer.cout)  # GEMM rows are the pixels, row-major

    def program(self, layer: QConv, config: Mapping[str, Any], spec: VtaSpec) -> Program:
        """Raises ValueError: the config's tiling cannot run this layer."""
        program = gemm_program(*layer.gemm_shape(), tiling(config), layer.shift, spec)
        if not layer.relu:
            program = signed_epilogue(program, layer.shift)
        return bake(program, {"w": layer.weight, "bias": layer.bias})


class DirectConv:
    """The conv as a `vta_conv2d` program lowered from its TE schedule: the accelerator DMAs the
    input tiles itself, with the zero ring of the padding; the CPU only moves HWC to CHW and
    back. The template's programs are generated with `vta_dense.SHIFT`: the layer's shift (and
    its signed clip, without ReLU) is set in the epilogue's immediates, which leaves the
    instruction stream, and so the tuned cycles, as they were."""

    template = "vta_conv2d"

    def workload(self, layer: QConv) -> tuple[int, ...]:
        h, w = layer.in_hw
        return (layer.cin, h, w, layer.cout, layer.kernel, layer.stride, layer.pad)

    def entry_input(self, layer: QConv, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(2, 0, 1)[None])  # HWC -> NCHW, batch 1

    def entry_output(self, layer: QConv, y: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(y[0].transpose(1, 2, 0))  # NCHW -> HWC

    def program(self, layer: QConv, config: Mapping[str, Any], spec: VtaSpec) -> Program:
        """Raises ValueError: the config's tiling cannot run this layer."""
        program = VtaConv2dTemplate(spec).program(self.workload(layer), config)
        program = requantize_epilogue(program, SHIFT, layer.shift, layer.relu)
        k, cin = layer.kernel, layer.cin
        oihw = layer.weight.reshape(layer.cout, k, k, cin).transpose(0, 3, 1, 2)  # (kh, kw, c)
        return bake(program, {"w": np.ascontiguousarray(oihw), "bias": layer.bias})


LOWERING: ConvLowering = Im2colDense()


def entry_symbol(layer: QConv) -> str:
    """The layer's entry point: its name as a C identifier."""
    return layer.name.replace(".", "_")


def signed_epilogue(program: Program, shift: int) -> Program:
    """`program` with each ReLU-and-shift (MAX 0 then SHR `shift`, immediates) turned into
    shift-and-clip-at--128 (SHR `shift` then MAX -128), each instruction keeping its flags.

    Raises:
        ValueError: the program has no such pair (it was not generated with a ReLU epilogue).
    """
    return requantize_epilogue(program, shift, shift, relu=False)


def requantize_epilogue(program: Program, generated: int, shift: int, relu: bool) -> Program:
    """`program`, generated with a ReLU-and-shift epilogue (MAX 0 then SHR `generated`,
    immediates, over the same micro-ops), with each such pair made MAX 0, SHR `shift` (`relu`)
    or SHR `shift`, MAX -128 (clip at -128 instead); each instruction keeps its flags, so the
    stream's order, tokens and cycles are unchanged.

    Raises:
        ValueError: the program has no such pair (it was not generated with a ReLU epilogue).
    """
    insns = list(program.insns)
    rewritten = 0
    for i in range(len(insns) - 1):
        a, b = insns[i], insns[i + 1]
        if (
            isinstance(a, Alu) and isinstance(b, Alu) and a.use_imm and b.use_imm
            and a.op is AluOp.MAX and a.imm == 0 and b.op is AluOp.SHR and b.imm == generated
            and (a.uop_bgn, a.uop_end, a.iter_out, a.iter_in) == (b.uop_bgn, b.uop_end, b.iter_out, b.iter_in)
        ):  # fmt: skip
            if relu:
                insns[i + 1] = dataclasses.replace(b, imm=shift)
            else:
                insns[i] = dataclasses.replace(a, op=AluOp.SHR, imm=shift)
                insns[i + 1] = dataclasses.replace(b, op=AluOp.MAX, imm=INT8_MIN)
            rewritten += 1
    if not rewritten:
        raise ValueError("no ReLU-and-shift epilogue to requantise")
    return dataclasses.replace(program, insns=tuple(insns))


def bake(program: Program, values: Mapping[str, np.ndarray]) -> Program:
    """`program` with the args named in `values` laid out as DRAM constants (and no longer args).

    Raises:
        ValueError: a name the program has no arg for, or an array of another shape or dtype.
    """
    by_name = {a.name: a for a in program.args}
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise ValueError(f"the program has no arg {unknown[0]!r} (args: {sorted(by_name)})")
    constants = list(program.constants)
    for name, array in values.items():
        constants.append((by_name[name].offset, _dram_bytes(by_name[name], array)))
    args = tuple(a for a in program.args if a.name not in values)
    return dataclasses.replace(program, args=args, constants=tuple(constants))


def _dram_bytes(layout: ArgLayout, array: np.ndarray) -> bytes:
    """`array` as its layout lays it out in DRAM (protos.vta_program's formula)."""
    if tuple(array.shape) != layout.shape or array.dtype != np.dtype(layout.dtype):
        raise ValueError(f"arg {layout.name!r} is {layout.dtype}{list(layout.shape)}, got "
                         f"{array.dtype}{list(array.shape)}")  # fmt: skip
    padded = layout.padded_shape or layout.shape
    data = np.pad(array, [(0, p - s) for p, s in zip(padded, layout.shape, strict=True)])
    data = data.reshape(layout.view_shape or padded)
    if layout.axes:
        data = data.transpose(layout.axes)
    return np.ascontiguousarray(data, dtype=np.dtype(layout.dtype).newbyteorder("<")).tobytes()


def network_artifact(
    net: Int8ResNet,
    configs: Mapping[str, Mapping[str, Any]],
    spec: VtaSpec | None = None,
    lowering: ConvLowering = LOWERING,
) -> Artifact:
    """One ACCEL_PROGRAM artifact with an entry per conv of `net` (`entry_symbol`), each the
    program of its layer's config (`configs` by layer name) for `spec`.

    Raises:
        KeyError: a layer without a config; ValueError: a config that cannot run its layer.
    """
    spec = spec or VtaSpec()
    programs = {entry_symbol(c): lowering.program(c, configs[c.name], spec) for c in net.convs()}
    data = encode_programs(programs)
    entries = tuple(
        Entry(symbol, "", _arg_specs(p.args), 2.0 * math.prod(c.gemm_shape()))
        for c, (symbol, p) in zip(net.convs(), programs.items(), strict=True)
    )
    return Artifact(data, hashlib.sha256(data).hexdigest(), ACCEL_FORMAT, VTA_TARGET, entries)


def _arg_specs(args: Sequence[ArgLayout]) -> tuple[ArgSpec, ...]:
    """The entry's args: every arg an input, but the last (the layer's output)."""
    last = len(args) - 1
    return tuple(
        ArgSpec(a.name, a.shape, a.dtype, "output" if i == last else "input")
        for i, a in enumerate(args)
    )
