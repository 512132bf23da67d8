"""GPU targets and features: "cuda/sm=N" from a device's tags, refused on other devices and
capabilities, carried by records; GPU candidates' cost-model features (threads, shared memory,
registers, occupancy, vector widths), and CPU candidates' features as they were."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from compiler import ops, te
from compiler.build_cuda import cuda_arch, cuda_sm, cuda_target, is_cuda_target
from compiler.ops.space import Config, ConfigSpace, Knob
from compiler.schedule import create_schedule
from compiler.schedule.schedule import Schedule
from kiln.api import for_target, gpu_template_name, op_task
from tuner import records as rec
from tuner.loop import builder_records_target, compiler_target, target_name
from tuner.measure import MeasureResult, Status
from tuner.measure.device_target import (
    TargetError,
    check_target,
    device_records_target,
    device_target,
)
from tuner.search import make_searcher
from tuner.search.features import knob_features
from tuner.search.gpu_features import (
    GPU_FEATURE_LENGTH,
    config_features,
    gpu_feature_fn,
    occupancy,
    task_gpu_features,
)
from tuner.task import Task

GPU = {"backend": "cuda", "arch": "cuda", "host_arch": "x86_64", "sm": "90", "gpu": "H100"}
CPU = {"backend": "cpu", "arch": "x86_64", "features": "avx2,fma", "cpu": "some other cpu"}


class TinyGemmTemplate:
    """C = A @ B on a GPU (n, n, n): a block of `tile` x `tile` threads, each a `reg` x `reg`
    register tile, A and B tiles of `k_tile` in shared memory (the schedule of
    compiler.ops.cuda_gemm, small)."""

    name = "cuda_tiny_gemm"

    def compute(self, shape: tuple[int, ...]) -> tuple[te.Tensor, ...]:
        (n,) = shape
        a = te.placeholder((n, n), name="A")
        b = te.placeholder((n, n), name="B")
        r = te.reduce_axis((0, n), name="k")
        c = te.compute((n, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
        return a, b, c

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        return inputs[0] @ inputs[1]

    def flop(self, shape: tuple[int, ...]) -> float:
        return 2.0 * shape[0] ** 3

    def config_space(self, shape: tuple[int, ...]) -> ConfigSpace:
        return ConfigSpace(
            [Knob("tile", (4, 8, 16)), Knob("reg", (1, 2, 4)), Knob("k_tile", (4, 8))]
        )

    def instantiate(self, shape: tuple[int, ...], config: Config) -> tuple[Schedule, list]:
        a, b, c = self.compute(shape)
        tile, reg, k_tile = config["tile"], config["reg"], config["k_tile"]
        s = create_schedule(c)
        a_s = s.cache_read(a, "shared", [c])
        b_s = s.cache_read(b, "shared", [c])
        c_l = s.cache_write(c, "local")
        i, j = c.op.axis
        bi, ii = s[c].split(i, tile * reg)
        bj, jj = s[c].split(j, tile * reg)
        ty, ri = s[c].split(ii, reg)
        tx, rj = s[c].split(jj, reg)
        s[c].reorder(bi, bj, ty, tx, ri, rj)
        for ax, tag in ((bi, "blockIdx.y"), (bj, "blockIdx.x"), (ty, "threadIdx.y"),
                        (tx, "threadIdx.x")):  # fmt: skip
            s[c].bind(ax, tag)
        s[c_l].compute_at(s[c], tx)
        li, lj = s[c_l].op.axis
        ko, ki = s[c_l].split(s[c_l].op.reduce_axis[0], k_tile)
        s[c_l].reorder(ko, ki, li, lj)
        s[c_l].unroll(li)
        s[c_l].unroll(lj)
        for t in (a_s, b_s):
            s[t].compute_at(s[c_l], ko)
            fused = s[t].fuse(*s[t].op.axis)
            _, inner = s[t].split(fused, tile * tile)
            y, x = s[t].split(inner, nparts=tile)
            s[t].bind(y, "threadIdx.y")
            s[t].bind(x, "threadIdx.x")
        return s, [a, b, c]


@pytest.fixture
def tiny_gemm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Task]:
    """The tiny GPU template registered (as the GPU templates of compiler.ops.cuda are)."""
    monkeypatch.setitem(ops._TEMPLATES, TinyGemmTemplate.name, TinyGemmTemplate())
    yield Task(rec.Workload(TinyGemmTemplate.name, (64,)))


def index_of(task: Task, **knobs: int) -> int:
    return task.space.index_of(knobs)


# -- targets ----------------------------------------------------------------------------------


def test_a_gpu_device_gets_the_cuda_target_of_its_sm() -> None:
    assert device_target(GPU) == "cuda/sm=90"
    assert device_target({**GPU, "sm": "8.0"}) == "cuda/sm=80"
    assert device_target({**GPU, "sm": "90a"}) == "cuda/sm=90a"
    assert is_cuda_target("cuda/sm=90") and not is_cuda_target("x86_64")
    assert cuda_arch("cuda/sm=90a") == "sm_90a" and cuda_sm("cuda/sm=90a") == 90
    assert cuda_target("sm_86") == "cuda/sm=86"
    with pytest.raises(TargetError, match="sm tag"):
        device_target({k: v for k, v in GPU.items() if k != "sm"})
    with pytest.raises(TargetError, match="sm='ninety'"):
        device_target({**GPU, "sm": "ninety"})


def test_check_target_refuses_gpu_code_on_a_cpu_and_the_reverse_naming_both() -> None:
    assert check_target("cuda/sm=90", GPU) == "cuda/sm=90"
    with pytest.raises(TargetError) as cpu_err:
        check_target("cuda/sm=90", CPU, "device cpu-0")
    assert "cuda/sm=90" in str(cpu_err.value) and "device cpu-0" in str(cpu_err.value)
    assert "arch=x86_64" in str(cpu_err.value)
    with pytest.raises(TargetError) as gpu_err:
        check_target("x86_64", GPU, "device gpu-0")
    assert "x86_64" in str(gpu_err.value) and "device gpu-0" in str(gpu_err.value)
    assert "cuda/sm=90" in str(gpu_err.value)  # what it runs instead
    with pytest.raises(TargetError):
        check_target("host", GPU)


def test_a_cubin_for_one_sm_is_refused_on_a_device_of_another() -> None:
    with pytest.raises(TargetError, match=r"sm_90.*sm=80.*cuda/sm=80"):
        check_target("cuda/sm=90", {**GPU, "sm": "80"}, "device a100")
    with pytest.raises(TargetError, match="sm_80"):  # older code on a newer chip: also refused
        check_target("cuda/sm=80", GPU)
    with pytest.raises(TargetError, match="not a cuda target"):
        check_target("cuda/sm=x", GPU)


def test_records_of_a_gpu_carry_its_sm() -> None:
    assert device_records_target(GPU) == "cuda/sm=90"
    assert device_records_target({**GPU, "sm": "80"}) == "cuda/sm=80"
    assert device_records_target(GPU, "cuda/sm=90") == "cuda/sm=90"

    class Builder:
        target = "cuda/sm=90"

    assert target_name("cuda/sm=90") == builder_records_target(Builder()) == "cuda/sm=90"
    assert compiler_target("cuda/sm=90") == "cuda/sm=90"  # not "host", as an unknown one


def test_records_tuned_on_sm_90_never_serve_sm_80(tmp_path) -> None:
    workload = rec.Workload("cuda_dense", (64, 64, 64))
    result = MeasureResult(Status.OK, samples_s=(1e-5,))
    store = rec.FileRecords(tmp_path / "R.jsonl")
    store.append([rec.Record(workload, device_records_target(GPU), 1, {}, result, 1.0, "t", 4)])
    assert store.best(workload, device_records_target(GPU)) is not None
    assert store.best(workload, device_records_target({**GPU, "sm": "80"})) is None


# -- templates on a GPU target ----------------------------------------------------------------


def test_for_target_maps_ops_onto_gpu_templates(tiny_gemm: Task) -> None:
    assert gpu_template_name("dense") == "cuda_dense"
    assert gpu_template_name("conv2d_nchwc") == "cuda_conv2d"
    assert gpu_template_name("conv2d_1x1_nchwc") == "cuda_conv2d_gemm"
    assert gpu_template_name("cuda_dense") == "cuda_dense"
    # a GPU template's task is itself; the CPU target leaves every task alone
    assert for_target(tiny_gemm, "cuda/sm=90") is tiny_gemm
    dense = op_task("dense", (64, 64, 64))
    assert for_target(dense, "x86_64") is dense


@pytest.mark.parametrize(
    "op, shape, gpu_op",
    [
        ("dense", (64, 48, 32), "cuda_dense"),
        ("conv2d_nchwc", (1, 8, 10, 10, 16, 3, 3, 1, 1, 0), "cuda_conv2d"),
        ("conv2d_winograd_nchwc", (1, 8, 10, 10, 16, 3, 3, 1, 1, 2), "cuda_conv2d"),
        ("conv2d_stem_nchwc", (1, 3, 16, 16, 8, 3, 3, 2, 1, 0), "cuda_conv2d"),
        ("conv2d_1x1_nchwc", (1, 8, 10, 10, 16, 1, 1, 1, 0, 2), "cuda_conv2d_gemm"),
        ("depthwise_conv2d_nchwc", (1, 8, 10, 10, 3, 3, 1, 1, 0), "cuda_depthwise_conv2d"),
        ("max_pool2d_nchwc", (1, 8, 10, 10, 3, 2, 1), "cuda_max_pool2d"),
        ("avg_pool2d_nchwc", (1, 8, 10, 10, 3, 2, 1), "cuda_avg_pool2d"),
        ("global_avg_pool2d_nchwc", (1, 8, 7, 7), "cuda_global_avg_pool2d"),
        ("softmax", (4, 37), "cuda_softmax"),
        ("layer_norm", (4, 37), "cuda_layer_norm"),
        ("add", (4, 37), "cuda_elementwise_add"),
        ("relu", (4, 37), "cuda_elementwise_relu"),
    ],
)
def test_every_cpu_op_with_a_gpu_template_maps_onto_it(
    op: str, shape: tuple[int, ...], gpu_op: str
) -> None:
    task = op_task(op, shape)
    gpu = for_target(task, "cuda/sm=90")
    assert gpu.workload.op == gpu_op
    assert gpu.workload.shape[: len(shape)] == task.workload.shape  # same fields, same order
    assert gpu.workload.dtype == task.workload.dtype
    assert len(gpu.space) > 0


def test_an_op_without_a_gpu_template_is_refused() -> None:
    with pytest.raises(ValueError, match="no GPU template for reduce_sum"):
        for_target(op_task("reduce_sum", (4, 37, 1)), "cuda/sm=90")


# -- features ---------------------------------------------------------------------------------


def test_gpu_features_of_two_configs_differ_where_they_should(tiny_gemm: Task) -> None:
    small = index_of(tiny_gemm, tile=4, reg=1, k_tile=4)  # 16 threads, 1 accumulator each
    big = index_of(tiny_gemm, tile=16, reg=4, k_tile=8)  # 256 threads, 16 accumulators
    f = task_gpu_features(tiny_gemm, np.asarray([small, big]), 90)
    assert f.shape == (2, GPU_FEATURE_LENGTH) and np.isfinite(f).all()
    assert f[0, 0] == pytest.approx(np.log2(16 + 1)) and f[1, 0] == pytest.approx(np.log2(257))
    assert f[0, 1] == pytest.approx(np.log2(16 * 16 + 1))  # 64/4 x 64/4 blocks
    assert f[1, 1] == pytest.approx(np.log2(1 * 1 + 1))
    assert (f[0, 2], f[1, 2]) == (1, 8)  # warps
    assert f[0, 3] == pytest.approx(0.5) and f[1, 3] == 0  # half of a warp idle
    shared_small = 2 * 4 * 4 * 4  # A and B tiles of 4 x 4 floats
    shared_big = 2 * 64 * 8 * 4
    assert f[0, 4] == pytest.approx(np.log2(shared_small + 1))
    assert f[1, 4] == pytest.approx(np.log2(shared_big + 1))
    assert f[0, 5] == pytest.approx(1.0) and f[1, 5] == pytest.approx(np.log2(17))  # locals
    assert f[1, 6] > f[0, 6]  # registers
    # 16 threads a block: at most 32 blocks of 1 warp resident, half the SM's 64 warps
    assert f[0, 7] == pytest.approx(0.5)
    # 256 threads of about 40 registers: 51 warps' registers an SM, 6 blocks of 8 warps
    assert f[1, 7] == pytest.approx(0.75) == f[1, 10] and f[1, 8] == f[1, 9] == 1.0
    # a thread's reg consecutive C elements: one vector store of reg floats
    assert (f[0, 11], f[1, 11]) == (1, 4)
    # neighbouring threads' C stores lie reg floats apart
    assert f[0, 13] == pytest.approx(np.log2(4 + 1)) and f[1, 13] == pytest.approx(np.log2(17))
    # the sm matters: sm_86 holds 48 warps and 16 blocks an SM
    f86 = task_gpu_features(tiny_gemm, np.asarray([small]), 86)
    assert f86[0, 7] == pytest.approx(16 / 48)
    np.testing.assert_array_equal(f86[0, :7], f[0, :7])


def test_occupancy_is_limited_by_threads_shared_memory_and_registers() -> None:
    assert occupancy(256, 0, 32, 90).overall == 1.0
    assert occupancy(256, 40 * 1024, 32, 90).by_shared == pytest.approx(5 * 8 / 64)
    assert occupancy(256, 0, 255, 90).by_registers == pytest.approx(1 * 8 / 64)
    assert occupancy(1024, 0, 32, 86).overall == pytest.approx(32 / 48)
    assert occupancy(2048, 0, 32, 90).overall == 0.0  # cannot launch
    assert occupancy(128, 64 * 1024, 32, 90).overall == 0.0  # over the static shared limit


def test_gpu_candidates_get_gpu_features_and_cpu_candidates_do_not(tiny_gemm: Task) -> None:
    idx = np.arange(6)
    gpu = config_features(tiny_gemm, idx, "cuda/sm=90")
    knobs = knob_features(tiny_gemm.space, idx)
    assert gpu.shape == (6, knobs.shape[1] + GPU_FEATURE_LENGTH)
    np.testing.assert_array_equal(gpu[:, : knobs.shape[1]], knobs)
    # a CPU task's features are its knob features, exactly as before GPU features existed
    dense = op_task("dense", (64, 64, 64))
    didx = np.arange(0, len(dense.space), max(1, len(dense.space) // 7))
    for target in ("host", "x86_64"):
        assert gpu_feature_fn(dense, target) is None
        np.testing.assert_array_equal(
            config_features(dense, didx, target), knob_features(dense.space, didx)
        )


def test_the_xgb_searcher_on_a_gpu_target_models_gpu_features(tiny_gemm: Task) -> None:
    pytest.importorskip("xgboost")
    from tuner.search.xgb import XGBSearcher

    gpu = make_searcher("xgb", tiny_gemm, seed=1, target="cuda/sm=90")
    cpu = make_searcher("xgb", tiny_gemm, seed=1, target="host")
    assert isinstance(gpu, XGBSearcher)
    assert isinstance(cpu, XGBSearcher)
    assert gpu._extra_model is not None and cpu._extra_model is None
    # the searcher asks for the GPU features of what it was told and plans on them
    seen: list[int] = []
    extra = gpu_feature_fn(tiny_gemm, "cuda/sm=90")
    assert extra is not None

    def spy(indices: np.ndarray) -> np.ndarray:
        seen.extend(int(i) for i in indices)
        return extra(indices)

    gpu._config_features = spy
    asked = gpu.ask(8)
    # faster with more threads a block: the model should learn it from the features
    feats = task_gpu_features(tiny_gemm, np.asarray(asked), 90)
    results = [MeasureResult(Status.OK, samples_s=(1.0 / (1.0 + f[0]),)) for f in feats]
    gpu.tell(asked, results)
    nxt = gpu.ask(4)
    assert len(nxt) == 4 and not set(nxt) & set(asked)
    assert set(asked) <= set(seen)  # fitted on the told configs' GPU features
