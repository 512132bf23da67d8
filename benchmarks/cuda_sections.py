"""The four sections of `benchmarks/cuda.py` (see its docstring): FP32 GEMM, FP16 tensor-core
GEMM, ResNet-18's convolutions, whole models. Each takes (options, budget, builder), prints its
table and returns its figures ({"error": ...} when it could not produce them)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import itertools
import json
import math
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cuda_search import (
    FP16_TOL,
    FP32_TOL,
    Bench,
    Budget,
    Builder,
    Built,
    CandidateFault,
    Group,
    SearchOptions,
    Workload,
    conv_layers,
    interleave,
    load_rows,
    relative_error,
    report,
    sample_indices,
    save_row,
    search,
)
from compiler import te
from compiler.build import Kernel
from compiler.build_cuda import build_cuda, cuda_target
from compiler.ir import expr as E
from compiler.ops import get_template
from compiler.ops.base import OpTemplate
from compiler.ops.conv2d import conv2d_reference
from compiler.ops.cuda.conv2d import conv_workload, padded_read
from compiler.ops.cuda.gemm import MAX_ACCUMULATORS, AxisTile
from compiler.ops.cuda.injective import bind_flat
from compiler.ops.space import Config
from compiler.schedule.schedule import create_schedule
from protos.cuda_program import decode_module

CHECK_ROWS = 64  # rows of a GEMM the peer is checked on against numpy (float64)
PEER_TOL = 1e-4
# cuDNN's FMA algorithms include Winograd and FFT, whose transforms cost some precision
CUDNN_TOL = 2e-3


def _short(config: Config) -> str:
    return ",".join(str(v) for v in config.values())


def _gflops(flop: float, ms: float) -> float:
    return flop / ms / 1e6


def big_gemm_plausible(config: Config) -> bool:
    """A tile that could keep up with cuBLAS on a large GEMM: a block of 64x64 outputs or more,
    64 to 256 threads, 16 to 64 accumulators a thread (the sample's first pick)."""
    tm, tn = AxisTile.parse(config["tile_m"]), AxisTile.parse(config["tile_n"])
    threads = tm.threads * tn.threads
    acc = tm.vthread * tm.reg * tn.vthread * tn.reg
    return tm.block * tn.block >= 64 * 64 and 64 <= threads <= 256 and 16 <= acc <= MAX_ACCUMULATORS


def _survivable(e: Exception, label: str, errors: list[str], faulted: list[str]) -> bool:
    """Note a workload's failure; False when the GPU context is lost (nothing more can run),
    and then the candidate that lost it (if one did) in `faulted`."""
    from device_agent.backends.cuda_driver import CudaError

    traceback.print_exc()
    sticky = isinstance(e, CandidateFault) or (isinstance(e, CudaError) and e.sticky)
    errors.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if isinstance(e, CandidateFault):
        faulted.append(e.candidate)
    if sticky:
        print(f"  {label}: the GPU context is lost; the section stops here", flush=True)
    return not sticky


def _finish(out: dict[str, object], errors: list[str], faulted: list[str]) -> dict[str, object]:
    if errors:
        out["note"] = "; ".join(errors)
    if faulted:
        out["faulted"] = faulted[0]
    return out


def _dry_line(label: str, res: Any, t0: float, dry_run: bool) -> None:
    print(report(label, res, dry_run) + f" ({time.monotonic() - t0:.1f} s)", flush=True)


# -- GEMMs ------------------------------------------------------------------------------------


def _gemm_like(
    opts: SearchOptions,
    budget: Budget,
    builder: Builder | None,
    template: str,
    sizes: Sequence[int],
    fp16: bool,
    first: Callable[[OpTemplate, tuple[int, ...]], list[int]] | None = None,
) -> dict[str, object]:
    assert builder is not None
    tpl = get_template(template)
    assert isinstance(tpl, OpTemplate)
    rng = np.random.default_rng(opts.seed)
    bench = None if opts.dry_run else Bench(opts.repeat_ms)
    peer_name = "cuBLAS GemmEx fp16" if fp16 else "cuBLAS sgemm"
    rows: list[tuple[int, str, float, float, float]] = []
    errors: list[str] = []
    faulted: list[str] = []
    done = load_rows(opts.state_file, template)  # sizes an earlier run of this section finished
    groups: dict[int, Group] = {}
    for n in sizes:  # every size's builds start now, and run while the earlier are measured
        if str(n) in done:
            continue
        shape = (n, n, n)
        preferred = list(first(tpl, shape)) if first is not None else []
        prefer = None if fp16 else big_gemm_plausible
        indices = sample_indices(tpl, shape, opts.trials, rng, builder.arch, preferred, prefer)
        groups[n] = Group(tpl, shape, opts.allowed(template, indices)).start(builder)
    try:
        for i, n in enumerate(sizes):
            if str(n) in done:
                n0, cfg_text, ours_g, peer_g, ratio = done[str(n)]
                rows.append((int(n0), str(cfg_text), ours_g, peer_g, ratio))
                print(f"  {n}: measured before the restart: ratio {ratio:.2f}", flush=True)
                continue
            t0 = time.monotonic()
            deadline = budget.slice_for(len(sizes) - i)
            shape = (n, n, n)
            try:
                wl = _gemm_workload(bench, n, fp16, rng, errors) if bench is not None else None
                if bench is not None and wl is None:
                    continue
                res = search(bench, builder, wl, [groups[n]], opts, deadline, rng)
                _dry_line(f"{template} {n}", res, t0, opts.dry_run)
                if bench is None or wl is None:
                    continue
                for m in res.best_by_template.values():
                    save_best(opts.best_file, m.built.template, (*shape, 0), m.built.index)
                if res.best is None:
                    errors.append(f"{n}: no config measured")
                else:
                    ours, peer, _ = interleave(bench, wl, res.best, opts.rounds)
                    cfg = tpl.config_space(shape).get(res.best.built.index)
                    flop = wl.flop
                    rows.append(
                        (n, _short(cfg), _gflops(flop, ours), _gflops(flop, peer), peer / ours)
                    )
                    save_row(opts.state_file, template, str(n), rows[-1])
                    print(f"  {n}: ours {ours:.3f} ms, {peer_name} {peer:.3f} ms", flush=True)
                for buf in (*wl.inputs, wl.out, *wl.scratch):
                    bench.gpu.free(buf)
            except Exception as e:
                if not _survivable(e, f"{n}", errors, faulted):
                    break
    finally:
        if bench is not None:
            bench.close()
    if opts.dry_run:
        return {"note": "dry run"}
    knobs = ",".join(k.name for k in tpl.config_space((sizes[0],) * 3).knobs)
    print(f"\nconfig = {knobs}")
    print(
        f"{'size':>6} {'config':>44} {'ours GFLOP/s':>13} {peer_name + ' GFLOP/s':>26} {'ratio':>6}"
    )
    for n, cfg_text, ours_g, peer_g, ratio in rows:
        print(f"{n:>6} {cfg_text:>44} {ours_g:>13,.0f} {peer_g:>26,.0f} {ratio:>6.2f}")
    if len(rows) < len(sizes):
        missing = [n for n in sizes if n not in {r[0] for r in rows}]
        print(f"  no figure for {missing}: the ratio below is over the others", flush=True)
    if not rows:
        return _finish({"error": "; ".join(errors) or "nothing measured"}, [], faulted)
    out: dict[str, object] = {"min_ratio": min(r[4] for r in rows), "sizes": [r[0] for r in rows]}
    return _finish(out, errors, faulted)


def _gemm_workload(
    bench: Bench, n: int, fp16: bool, rng: np.random.Generator, errors: list[str]
) -> Workload | None:
    """X [n][n], W [n][n] (Y = X . W^T), the peer's Y, checked on CHECK_ROWS rows vs numpy."""
    gpu = bench.gpu
    dtype = np.float16 if fp16 else np.float32
    x = rng.uniform(-1.0, 1.0, (n, n)).astype(dtype)
    w = rng.uniform(-1.0, 1.0, (n, n)).astype(dtype)
    bx, bw = gpu.upload(x), gpu.upload(w)
    out, ref = gpu.alloc(n * n * 4), gpu.alloc(n * n * 4)
    call = bench.blas.hgemm_nt if fp16 else bench.blas.sgemm_nt
    peer = functools.partial(call, n, n, n, bx, bw, ref)
    peer()
    gpu.synchronize()
    want = gpu.download(ref, (n * n,))
    rows = x[:CHECK_ROWS].astype(np.float64) @ w.astype(np.float64).T
    err = relative_error(want.reshape(n, n)[:CHECK_ROWS], rows)
    if err > (FP16_TOL if fp16 else PEER_TOL):
        errors.append(f"{n}: the peer disagrees with numpy ({err:.1e})")
        print(f"  {n}: the peer disagrees with numpy (error {err:.1e}); size skipped", flush=True)
        for buf in (bx, bw, out, ref):
            gpu.free(buf)
        return None
    tol = FP16_TOL if fp16 else FP32_TOL
    return Workload(f"{n}", 2.0 * n**3, [bx, bw], out, want, peer, tol, [ref])


# Register tilings of 128x128, 64x128 and 128x64 blocks (256 and 128 threads, 32 to 64
# accumulators): the shapes of the fastest SIMT GEMMs (CUTLASS's, and compiler/ops/cuda_gemm.py's
# best on an H100), tried before the random draws; the last was 1024³'s best on an H100
# (2026-11-27, 200 configs, staged).
DENSE_PRESET_TILES = (
    ("2x16x4", "2x16x4"),
    ("1x16x8", "1x16x8"),
    ("2x8x4", "2x16x4"),
    ("2x16x4", "2x8x4"),
    ("2x8x8", "2x16x2"),
)
DENSE_PRESET_LAYOUTS = (("km", "kn", "float4"), ("mk", "nk", "async"))
# then the k-major tiles (the transposing copies cp.async cannot make) staged through
# registers, with and without a cap of two blocks a multiprocessor
DENSE_STAGED_LAYOUTS = (("km", "kn", "float4"), ("km", "kn", "scalar"))


def _dense_presets(tpl: OpTemplate, shape: tuple[int, ...]) -> list[int]:
    """DENSE_PRESET_TILES x k_tile 8, 16 x DENSE_PRESET_LAYOUTS, double-buffered, then
    DENSE_PRESET_TILES x k_tile 16 x DENSE_STAGED_LAYOUTS x min_blocks 1, 2, staged, as indices
    of the space (those that exist there and are worth measuring)."""
    space = tpl.config_space(shape)
    target = cuda_target("sm_90")
    out = []
    plain = itertools.product(DENSE_PRESET_TILES, (8, 16), DENSE_PRESET_LAYOUTS, [(True, 1)])
    staged = itertools.product(
        DENSE_PRESET_TILES, (16,), DENSE_STAGED_LAYOUTS, [("staged", 1), ("staged", 2)]
    )
    for (tm, tn), k_tile, (a, b, copy), (double, blocks) in itertools.chain(plain, staged):
        values = {
            "tile_m": tm,
            "tile_n": tn,
            "k_tile": k_tile,
            "a_shared": a,
            "b_shared": b,
            "shared_pad": 4,
            "copy": copy,
            "double_buffer": double,
            "unroll_k": True,
            "min_blocks": blocks,
        }
        try:
            index = space.index_of(values)
        except (ValueError, KeyError):
            continue
        if tpl.worth_measuring(shape, space.get(index), target):
            out.append(index)
    return out


def gemm_section(opts: SearchOptions, budget: Budget, builder: Builder | None) -> dict[str, object]:
    return _gemm_like(
        opts, budget, builder, "cuda_dense", opts.gemm_sizes, fp16=False, first=_dense_presets
    )


def _tensorcore_presets(tpl: OpTemplate, shape: tuple[int, ...]) -> list[int]:
    """The tensor-core template's BENCHMARK_CONFIGS as indices of its space (those that fit)."""
    from compiler.ops.cuda.tensorcore import BENCHMARK_CONFIGS

    space = tpl.config_space(shape)
    out = []
    for c in BENCHMARK_CONFIGS:
        values = {
            "tile_m": f"{c.warps_m}x{c.frags_m}",
            "tile_n": f"{c.warps_n}x{c.frags_n}",
            "k_tile": c.k_tile,
            "pad": c.pad,
            "copy": c.copy,
            "double_buffer": c.double_buffer,
        }
        try:
            out.append(space.index_of(values))
        except (ValueError, KeyError):
            continue
    return out


def fp16_section(opts: SearchOptions, budget: Budget, builder: Builder | None) -> dict[str, object]:
    return _gemm_like(
        opts,
        budget,
        builder,
        "cuda_dense_fp16_tc",
        opts.fp16_sizes,
        fp16=True,
        first=_tensorcore_presets,
    )


# -- convolutions -----------------------------------------------------------------------------

CONV_TEMPLATES = ("cuda_conv2d", "cuda_conv2d_gemm")
IM2COL_PEER = "im2col+sgemm"


def im2col_kernel(shape: tuple[int, ...], symbol: str) -> Kernel:
    """col[C*KH*KW][OH*OW] of batch 1's image (zeros in the padding), one element a thread:
    the peer's first launch."""
    _, c, h, w, _, kh, kw, stride, pad, _, oh, ow = conv_workload("cuda_conv2d", shape)
    x = te.placeholder((1, c, h, w), name="X")

    def body(k: Any, p: Any) -> Any:
        ch, tap = k // (kh * kw), k % (kh * kw)
        ih = (p // ow) * stride + tap // kw - pad
        iw = (p % ow) * stride + tap % kw - pad
        return padded_read(x, E.IntImm(0), ch, ih, iw, pad)

    col = te.compute((c * kh * kw, oh * ow), body, name="col")
    sch = create_schedule(col)
    size = c * kh * kw * oh * ow
    threads = next(t for t in (256, 128, 64, 32, 1) if size % t == 0)
    bind_flat(sch[col], list(sch[col].axis), threads)
    return Kernel(sch, [x, col], symbol)


def _im2col_unit(shapes: Sequence[tuple[int, ...]], arch: str) -> tuple[bytes, list[Built]]:
    """Every layer's im2col kernel in one nvcc unit (runs in a build worker)."""
    kernels = [im2col_kernel(s, f"im2col_{i}") for i, s in enumerate(shapes)]
    module = decode_module(build_cuda(kernels, cuda_target(arch)).data)
    built = []
    for i in range(len(shapes)):
        launch = module.programs[f"im2col_{i}"].launches[0]
        built.append(Built("im2col", i, f"im2col_{i}", module.image, launch.grid, launch.block))
    return module.image, built


def conv_section(opts: SearchOptions, budget: Budget, builder: Builder | None) -> dict[str, object]:
    assert builder is not None
    layers = conv_layers()[: opts.layers]
    rng = np.random.default_rng(opts.seed)
    t0 = time.monotonic()
    im2col = builder.pool.submit(_im2col_unit, [s for _, s in layers], builder.arch)
    layer_groups = []  # every layer's builds start now, in order
    per_template = max(4, opts.trials // (2 * len(CONV_TEMPLATES)))
    done = load_rows(opts.state_file, "conv")  # layers an earlier run of this section finished
    for label, shape in layers:
        groups = []
        for name in CONV_TEMPLATES:
            if label in done:
                continue
            tpl = get_template(name)
            assert isinstance(tpl, OpTemplate)
            indices = sample_indices(tpl, shape, per_template, rng, builder.arch)
            groups.append(Group(tpl, shape, opts.allowed(name, indices)).start(builder))
        layer_groups.append(groups)
    bench = None if opts.dry_run else Bench(opts.repeat_ms)
    cudnn = None
    if bench is not None and opts.conv_peer == "cudnn":
        from benchmarks.cuda_cudnn import Cudnn

        cudnn = Cudnn(bench.gpu)
        print(f"  peer: cuDNN {cudnn.version} (FP32, FMA math: no TF32), im2col+sgemm beside it")
    peer_name = "cuDNN" if cudnn is not None else IM2COL_PEER
    rows: list[tuple[str, str, float, float, float, float, float]] = []
    errors: list[str] = []
    faulted: list[str] = []
    try:
        _, peers = im2col.result(timeout=max(1.0, budget.left()))
        print(f"  im2col: {len(peers)} kernels built ({time.monotonic() - t0:.1f} s)", flush=True)
        for i, (label, shape) in enumerate(layers):
            if label in done:
                lab, name, ours, peer, second, ours_g, ratio = done[label]
                rows.append((str(lab), str(name), ours, peer, second, ours_g, ratio))
                print(f"  {label}: measured before the restart: ratio {ratio:.2f}", flush=True)
                continue
            t0 = time.monotonic()
            deadline = budget.slice_for(len(layers) - i)
            groups = layer_groups[i]
            try:
                wl = _conv_workload(bench, shape, peers[i], errors, label, cudnn) if bench else None
                if bench is not None and wl is None:
                    continue
                res = search(bench, builder, wl, groups, opts, deadline, rng)
                _dry_line(label, res, t0, opts.dry_run)
                if bench is None or wl is None:
                    continue
                for m in res.best_by_template.values():
                    save_best(opts.best_file, m.built.template, shape, m.built.index)
                if res.best is None:
                    errors.append(f"{label}: no config measured")
                else:
                    ours, peer, others = interleave(bench, wl, res.best, opts.rounds)
                    name, flop = res.best.built.template, wl.flop
                    second = others.get(IM2COL_PEER, math.nan)
                    rows.append((label, name, ours, peer, second, _gflops(flop, ours), peer / ours))
                    save_row(opts.state_file, "conv", label, rows[-1])
                    also = f", {IM2COL_PEER} {second:.4f} ms" if others else ""
                    print(f"  {label}: ours {ours:.4f} ms, {peer_name} {peer:.4f} ms{also}")
                for buf in (*wl.inputs, wl.out, *wl.scratch):
                    bench.gpu.free(buf)
            except Exception as e:
                if not _survivable(e, label, errors, faulted):
                    break
    finally:
        if cudnn is not None:
            with contextlib.suppress(Exception):
                cudnn.close()
        if bench is not None:
            bench.close()
    if opts.dry_run:
        return {"note": "dry run"}
    if cudnn is not None:
        print(f"\npeer: cuDNN {cudnn.version}, FP32 with FMA math (cuDNN's pick by measurement)")
    else:
        print(f"\npeer: {IM2COL_PEER} (im2col by a generated kernel, then cuBLAS sgemm; cuDNN")
        print("  was not available or failed its check: see the cudnn section above)")
    second_head = f"{IM2COL_PEER + ' ms':>16} " if cudnn is not None else ""
    print(
        f"{'layer':>20} {'template':>17} {'ours ms':>9} {peer_name + ' ms':>16} "
        f"{second_head}{'ours GFLOP/s':>13} {'ratio':>6}"
    )
    for label, name, ours, peer, second, ours_g, ratio in rows:
        second_cell = f"{second:>16.4f} " if cudnn is not None else ""
        print(
            f"{label:>20} {name:>17} {ours:>9.4f} {peer:>16.4f} {second_cell}"
            f"{ours_g:>13,.0f} {ratio:>6.2f}"
        )
    if not rows:
        return _finish({"error": "; ".join(errors) or "nothing measured"}, [], faulted)
    geomean = math.exp(sum(math.log(r[-1]) for r in rows) / len(rows))
    out: dict[str, object] = {"geomean_ratio": geomean, "layers": len(rows), "peer": peer_name}
    if cudnn is not None:
        # against the faster peer of each layer: cuDNN's FP32 pick is not always the faster
        out["best_peer_geomean_ratio"] = best_peer_geomean([(r[2], r[3], r[4]) for r in rows])
        print(
            f"against the faster of {peer_name} and {IM2COL_PEER} per layer: geomean "
            f"{out['best_peer_geomean_ratio']:.2f}"
        )
    if len(rows) < len(layers):
        out["missing_layers"] = len(layers) - len(rows)
    return _finish(out, errors, faulted)


def best_peer_geomean(times: Sequence[tuple[float, float, float]]) -> float:
    """Geomean over layers of (the faster peer's ms) / ours, from (ours, peer, second peer)
    per layer; a second peer that was not measured (nan) does not count."""
    return statistics.geometric_mean(
        min(p for p in (peer, second) if not math.isnan(p)) / ours for ours, peer, second in times
    )


def _conv_workload(
    bench: Bench,
    shape: tuple[int, ...],
    im2col: Built,
    errors: list[str],
    label: str,
    cudnn: Any = None,
) -> Workload | None:
    """X, W (OIHW) and the peers, each checked against numpy: im2col into a [C*KH*KW][OH*OW]
    buffer then sgemm W . col, and (given `cudnn`) cuDNN's convolution, which is then the
    peer the ratio is of."""
    gpu = bench.gpu
    _, c, h, w, o, kh, kw, stride, pad, _, oh, ow = conv_workload("cuda_conv2d", shape)
    rng = np.random.default_rng(c * 1000 + o)
    x = rng.uniform(-1.0, 1.0, (1, c, h, w)).astype(np.float32)
    wt = rng.uniform(-1.0, 1.0, (o, c, kh, kw)).astype(np.float32)
    bx, bw = gpu.upload(x), gpu.upload(wt)
    k, p = c * kh * kw, oh * ow
    col, ref, out = gpu.alloc(k * p * 4), gpu.alloc(o * p * 4), gpu.alloc(o * p * 4)
    scratch = [col, ref]
    fn = bench.function(im2col)

    def im2col_sgemm() -> None:
        gpu.launch(fn, im2col.grid, im2col.block, [bx, col])
        bench.blas.sgemm(o, p, k, bw, col, ref)

    peers: dict[str, tuple[Callable[[], None], Any]] = {IM2COL_PEER: (im2col_sgemm, ref)}
    if cudnn is not None:
        conv = cudnn.conv(shape)
        cudnn_out = gpu.alloc(o * p * 4)
        scratch.append(cudnn_out)
        peers = {"cuDNN": (functools.partial(conv, bx, bw, cudnn_out), cudnn_out), **peers}
        print(f"  {label}: cuDNN algo {conv.algo} ({conv.find_ms:.4f} ms in its search)")
    expected = conv2d_reference(x, wt, None, stride, pad, relu=False).reshape(-1)
    outputs = {}
    for name, (run, buf) in peers.items():
        run()
        gpu.synchronize()
        outputs[name] = gpu.download(buf, (o * p,))
        err = relative_error(outputs[name], expected)
        if err > (CUDNN_TOL if name == "cuDNN" else PEER_TOL):
            errors.append(f"{label}: {name} disagrees with numpy ({err:.1e})")
            print(f"  {label}: {name} disagrees with numpy (error {err:.1e}); skipped", flush=True)
            for b in (bx, bw, out, *scratch):
                gpu.free(b)
            return None
    first, *rest = peers
    others = {name: peers[name][0] for name in rest}
    flop = 2.0 * o * p * k
    # ours are checked against im2col+sgemm's output: plain FP32 sums, as ours are
    want = outputs[IM2COL_PEER]
    return Workload(label, flop, [bx, bw], out, want, peers[first][0], FP32_TOL, scratch, others)


def cudnn_section(
    opts: SearchOptions, budget: Budget, builder: Builder | None
) -> dict[str, object]:
    """cuDNN's check, run before the conv section in a process of its own (a wrong ctypes
    call may crash it): every layer's convolution once against numpy."""
    if opts.dry_run:
        return {"note": "dry run"}
    from benchmarks.cuda_cudnn import Cudnn

    bench = Bench(opts.repeat_ms)
    try:
        cudnn = Cudnn(bench.gpu)
        print(f"  cuDNN {cudnn.version} loaded")
        checked = 0
        for label, shape in conv_layers()[: opts.layers]:
            if budget.left() < 3:  # the binding works: the conv section checks the rest
                break
            _, c, h, w, o, kh, kw, stride, pad, _, oh, ow = conv_workload("cuda_conv2d", shape)
            rng = np.random.default_rng(checked)
            x = rng.uniform(-1.0, 1.0, (1, c, h, w)).astype(np.float32)
            wt = rng.uniform(-1.0, 1.0, (o, c, kh, kw)).astype(np.float32)
            gpu = bench.gpu
            bx, bw, by = gpu.upload(x), gpu.upload(wt), gpu.alloc(o * oh * ow * 4)
            conv = cudnn.conv(shape)
            conv(bx, bw, by)
            gpu.synchronize()
            got = gpu.download(by, (o * oh * ow,))
            want = conv2d_reference(x, wt, None, stride, pad, relu=False).reshape(-1)
            err = relative_error(got, want)
            print(f"  {label}: algo {conv.algo}, {conv.find_ms:.4f} ms, error {err:.1e}")
            if conv.out_shape != (1, o, oh, ow) or err > CUDNN_TOL:
                return {"error": f"{label}: shape {conv.out_shape}, error {err:.1e}"}
            conv.close()
            for buf in (bx, bw, by):
                gpu.free(buf)
            checked += 1
        cudnn.close()
        if not checked:
            return {"error": "out of time before the first layer"}
        return {"ok": True, "version": cudnn.version, "checked": checked}
    finally:
        bench.close()


# -- whole models -----------------------------------------------------------------------------

MODEL_BUILDER = "compiler.graph.build_model_cuda"
MODELS = ("resnet18", "bert_tiny")
MODEL_RTOL = 1e-3  # of max |reference|: fp32 sums in other orders through the whole network


class BestConfigs(Mapping[tuple[str, tuple[int, ...]], Config]):
    """The conv section's best configs for a model build: a task's config is the one measured
    for its template at the same geometry (the workload without its epilogue field)."""

    def __init__(self, path: Path | None) -> None:
        self.found: dict[tuple[str, tuple[int, ...]], int] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                self.found[(rec["template"], tuple(rec["workload"][:-1]))] = int(rec["index"])
        self.used = 0

    def __getitem__(self, key: tuple[str, tuple[int, ...]]) -> Config:
        name, workload = key
        index = self.found.get((name, tuple(workload[:-1])))
        if index is None:
            raise KeyError(key)
        self.used += 1
        return get_template(name).config_space(workload).get(index)

    def __iter__(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        return iter(())

    def __len__(self) -> int:
        return len(self.found)


def save_best(path: Path | None, template: str, workload: tuple[int, ...], index: int) -> None:
    """Append a measured best config to the file the models section reads."""
    if path is not None:
        with path.open("a") as f:
            f.write(json.dumps({"template": template, "workload": list(workload), "index": index}))
            f.write("\n")


def model_feeds(graph_inputs: Sequence[Any], seed: int) -> list[np.ndarray]:
    """Seeded inputs, as benchmarks/models.py makes them: N(0, 1) floats, ids below BERT's
    vocabulary for integers."""
    from compiler.zoo import BERT_VOCAB

    rng = np.random.default_rng(seed)
    out = []
    for spec in graph_inputs:
        if np.dtype(spec.dtype).kind in "iu":
            out.append(rng.integers(0, BERT_VOCAB, spec.shape).astype(spec.dtype))
        else:
            out.append(rng.standard_normal(spec.shape).astype(np.float32))
    return out


def models_section(
    opts: SearchOptions, budget: Budget, builder: Builder | None
) -> dict[str, object]:
    """ResNet-18 and BERT-tiny end to end through the cuda backend (the agent's own code, run
    in-process): built with the conv section's best configs where they apply, the first
    config worth measuring elsewhere; outputs checked against the numpy reference of the graph."""
    if importlib.util.find_spec(MODEL_BUILDER) is None:
        print(f"  {MODEL_BUILDER}: not built yet; resnet18_ms and bert_tiny_ms are nan")
        return {"note": "not built yet"}
    module = importlib.import_module(MODEL_BUILDER)
    if not hasattr(module, "build_model_cuda"):
        print(f"  {MODEL_BUILDER} has no build_model_cuda: not built yet")
        return {"note": "not built yet"}
    out: dict[str, object] = {}
    notes = []
    for name in MODELS:
        if budget.left() < 5:
            notes.append(f"{name}: out of time")
            break
        try:
            ms = _one_model(module, name, opts, budget)
        except Exception as e:
            traceback.print_exc()
            notes.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        if ms is not None:
            out[f"{name}_ms"] = ms
    if notes:
        out["note"] = "; ".join(notes)
    if opts.dry_run:
        out.setdefault("note", "dry run")
    elif not any(k.endswith("_ms") for k in out):
        out["error"] = out.pop("note", "nothing measured")
    return out


def _one_model(module: Any, name: str, opts: SearchOptions, budget: Budget) -> float | None:
    from compiler import zoo
    from compiler.frontend.onnx import from_onnx
    from compiler.graph.execute import run_reference

    t0 = time.monotonic()
    graph = from_onnx(zoo.build(name))
    configs = BestConfigs(opts.best_file)
    target = cuda_target(opts.arch or "sm_90")
    try:
        built = module.build_model_cuda(graph, target, configs)
    except Exception as e:  # a config measured without an epilogue may not build with one
        if not configs.used:
            raise
        print(f"  {name}: with the conv section's configs: {type(e).__name__}: {e}; untuned")
        configs = BestConfigs(None)
        built = module.build_model_cuda(graph, target, configs)
    print(f"  {name}: {built.summary}; {configs.used} template configs from the conv section")
    print(f"  {name}: built in {time.monotonic() - t0:.1f} s", flush=True)
    if opts.dry_run:
        return None
    from device_agent.backends.cuda import CudaBackend, open_driver
    from device_agent.domain import ArgRole, EntryPoint, EvaluatorConfig, Status, TensorSpec
    from device_agent.jobs import MEASURE, RUN, Job

    entry_spec = built.artifact.entries[0]
    entry = EntryPoint(
        entry_spec.symbol,
        entry_spec.timing_symbol,
        tuple(
            TensorSpec(a.name, tuple(a.shape), a.dtype, ArgRole(a.role.upper()))
            for a in entry_spec.args
        ),
        entry_spec.flop,
    )
    inputs = model_feeds(built.inputs, opts.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.kcud"
        path.write_bytes(built.artifact.data)
        driver = open_driver()  # $KILN_CUDA_DRIVER=fake rehearses this path without a GPU
        backend = CudaBackend(driver)
        backend.prepare("")
        run = backend.execute(Job(RUN, str(path), entry, opts.seed, inputs=tuple(inputs)))
        if run.status is not Status.OK:
            raise RuntimeError(f"run: {run.status.name}: {run.error}")
        timing = EvaluatorConfig(warmup=3, repeat=opts.rounds, min_repeat_ms=20.0)
        measured = backend.execute(
            Job(MEASURE, str(path), entry, opts.seed, timing, inputs=tuple(inputs))
        )
        if measured.status is not Status.OK:
            raise RuntimeError(f"measure: {measured.status.name}: {measured.error}")
    ms = statistics.median(measured.samples_s) * 1e3
    print(f"  {name}: {ms:.3f} ms (median of {len(measured.samples_s)} repeats)", flush=True)
    if driver.kind == "fake":
        print(f"  {name}: fake driver: nothing computed, times emulated, output not checked")
        return ms
    feeds = {s.name: x for s, x in zip(built.inputs, inputs, strict=True)}
    want = run_reference(graph, feeds)[0]
    err = relative_error(np.asarray(run.outputs[0]).reshape(-1), want.reshape(-1))
    verdict = "ok" if err <= MODEL_RTOL else "WRONG: its time is not reported"
    print(f"  {name}: output vs the numpy reference: max error {err:.1e} of max |ref| ({verdict})")
    if err > MODEL_RTOL:
        raise RuntimeError(f"wrong output (error {err:.1e}), {ms:.3f} ms")
    return ms


SECTIONS: dict[str, Callable[[SearchOptions, Budget, Builder | None], dict[str, object]]] = {
    "gemm": gemm_section,
    "fp16": fp16_section,
    "cudnn": cudnn_section,
    "conv": conv_section,
    "models": models_section,
}
