"""GPU candidates built with nvcc for sm_90 (no GPU needed; skipped without nvcc): one unit per
batch into CUDA containers whose programs launch the kernels, a broken candidate failing alone,
and the host reference each candidate's answer is checked against."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from compiler import ops
from compiler.build import Kernel
from compiler.build_cuda import build_cuda
from compiler.errors import BuildError, CompilerError
from compiler.ops.space import ConfigSpace, Knob
from compiler.schedule import create_schedule
from compiler.toolchain import CACHE_ENV, find_nvcc
from protos.cuda_program import LaunchArg, decode_module
from tuner import records as rec
from tuner.measure import builder as builder_mod
from tuner.measure.builder import LocalBuilder, build_unit, reference_target
from tuner.measure.serde import artifact_meta
from tuner.task import Task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_cuda_target import TinyGemmTemplate  # the tiny GPU template of the unit tests

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")

TARGET = "cuda/sm=90"
N = 128


class WideKTemplate(TinyGemmTemplate):
    """The tiny GEMM with k tiles of 128 too: with 16 x 4 rows a block, 64 KiB of static shared
    memory, over the 48 KiB ptxas allows."""

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        return ConfigSpace(
            [Knob("tile", (4, 8, 16)), Knob("reg", (1, 2, 4)), Knob("k_tile", (4, 8, 128))]
        )


@pytest.fixture
def tiny_gemm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Task]:
    """The tiny GPU template registered, and a fresh compile cache (nvcc really runs)."""
    monkeypatch.setitem(ops._TEMPLATES, TinyGemmTemplate.name, WideKTemplate())
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(builder_mod, "_REFERENCES", {})
    yield Task(rec.Workload(TinyGemmTemplate.name, (N,)))


def index_of(task: Task, tile: int, reg: int, k_tile: int) -> int:
    return task.space.index_of({"tile": tile, "reg": reg, "k_tile": k_tile})


def test_a_batch_builds_into_one_container_whose_programs_launch_its_kernels(
    tiny_gemm: Task,
) -> None:
    picks = [
        index_of(tiny_gemm, 4, 1, 4),
        index_of(tiny_gemm, 8, 2, 8),
        index_of(tiny_gemm, 16, 4, 8),
    ]
    out = build_unit(tiny_gemm.workload, picks, TARGET)
    assert [r.config_index for r in out] == picks and all(r.artifact for r in out), out
    arts = [r.artifact for r in out if r.artifact is not None]
    assert len({a.sha256 for a in arts}) == 1  # one nvcc unit: one image, viewed per candidate
    module = decode_module(arts[0].data)
    assert (module.arch, module.image_kind) == ("sm_90", "cubin")
    assert module.image[:4] == b"\x7fELF"  # a cubin is an ELF image
    symbols = [a.entries[0].symbol for a in arts]
    assert sorted(module.programs) == sorted(symbols) and len(set(symbols)) == 3
    for art, (tile, reg) in zip(arts, ((4, 1), (8, 2), (16, 4)), strict=True):
        entry = art.entries[0]
        assert (art.format, art.target, entry.timing_symbol) == ("cubin", TARGET, entry.symbol)
        assert [a.role for a in entry.args] == ["input", "input", "output"]
        assert [a.shape for a in entry.args] == [(N, N)] * 3
        (launch,) = module.programs[entry.symbol].launches
        assert launch.kernel == entry.symbol
        assert launch.block == (tile, tile, 1)
        assert launch.grid == (N // (tile * reg), N // (tile * reg), 1)
        assert launch.args == tuple(LaunchArg.entry(i) for i in range(3))
        assert artifact_meta(art).format == 2  # CUBIN on the wire


def test_a_candidate_nvcc_rejects_fails_alone_and_names_its_kernel(tiny_gemm: Task) -> None:
    bad = index_of(tiny_gemm, 16, 4, 128)
    good = [index_of(tiny_gemm, 4, 1, 4), index_of(tiny_gemm, 8, 1, 8)]
    out = build_unit(tiny_gemm.workload, [good[0], bad, good[1]], TARGET)
    assert out[0].artifact is not None and out[2].artifact is not None
    assert out[1].artifact is None and "BuildError" in out[1].error
    assert f"c{bad}" in out[1].error  # the message names the kernel
    assert out[0].artifact.sha256 != out[2].artifact.sha256  # rebuilt one by one


def test_build_cuda_names_the_kernel_that_broke_the_unit(tiny_gemm: Task) -> None:
    t = tiny_gemm
    kernels = []
    for name, idx in (("k_ok", index_of(t, 4, 1, 4)), ("k_big", index_of(t, 16, 4, 128))):
        sch, args = t.template.instantiate(t.workload.shape, t.space.get(idx))
        kernels.append(Kernel(sch, args, name, t.flop))
    with pytest.raises(BuildError, match=r"^kernel k_big: nvcc failed") as err:
        build_cuda(kernels, TARGET)
    assert "k_ok:" not in str(err.value).split("\n")[0]
    with pytest.raises(ValueError, match="not a cuda target"):
        build_cuda(kernels[:1], "x86_64")
    args = list(t.template.compute(t.workload.shape))
    sch = create_schedule(args[-1])
    sch[args[-1]].parallel(args[-1].op.axis[0])  # a CPU notion: no CUDA rendering
    with pytest.raises(CompilerError, match=r"^kernel k_par: loop i is parallel"):
        build_cuda([Kernel(sch, args, "k_par")], TARGET)


def test_each_candidate_carries_its_host_reference(tiny_gemm: Task) -> None:
    picks = [index_of(tiny_gemm, 4, 2, 4), index_of(tiny_gemm, 8, 4, 8)]
    builder = LocalBuilder(TARGET, per_unit=2)
    try:
        out = builder.build(tiny_gemm.workload, picks, check=True)
    finally:
        builder.close()
    refs = [r.reference for r in out]
    assert all(r.artifact is not None for r in out) and all(refs)
    ref = refs[0]
    assert ref is not None and refs[1] is ref  # one layout: one reference
    assert ref.artifact.format == "shared_object"
    assert ref.artifact.target == reference_target(TARGET)
    assert reference_target(TARGET) in ("x86_64", "aarch64-neon")  # the base ISA: any host
    cand = out[0].artifact
    assert cand is not None
    entry = ref.artifact.entry(ref.symbol)
    assert [(a.shape, a.dtype, a.role) for a in entry.args] == [
        (a.shape, a.dtype, a.role) for a in cand.entries[0].args
    ]
    assert ref.atol > 0 and ref.rtol > 0


def test_ptx_images_for_drivers_that_load_ptx(tiny_gemm: Task) -> None:
    t = tiny_gemm
    sch, args = t.template.instantiate(t.workload.shape, t.space.get(0))
    kernel = Kernel(sch, args, "k_ptx", t.flop)
    art = build_cuda([kernel], TARGET, image="ptx")
    module = decode_module(art.data)
    assert (art.format, module.image_kind, module.arch) == ("ptx", "ptx", "sm_90")
    assert b".entry k_ptx" in module.image and b".version" in module.image
    assert artifact_meta(art).format == 3  # PTX on the wire
    assert build_cuda([kernel], TARGET, image="cubin").format == "cubin"
    with pytest.raises(ValueError, match="cubin or ptx"):
        build_cuda([kernel], TARGET, image="sass")
