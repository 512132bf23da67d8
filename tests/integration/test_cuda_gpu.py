"""Generated CUDA kernels run on a real GPU through the driver API and match numpy, and the `cuda`
backend runs nvcc-built containers: checked, timed, a faulting kernel's child replaced, the GPU
registered with its tags.

Skipped where there is no GPU or no nvcc (CI has neither GPU): these run on a lent GPU machine,
`python3 -m pytest tests/integration/test_cuda_gpu.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from compiler.codegen.cuda import render_cuda
from compiler.ops.cuda_gemm import GEMM_CONFIGS, GemmConfig, cuda_gemm
from compiler.toolchain import compile_cuda, find_nvcc
from device_agent.arrays import make_args
from device_agent.backends.cuda import CudaBackend
from device_agent.backends.cuda_driver import CudaError, Gpu, RealDriver
from device_agent.config import AgentConfig
from device_agent.domain import ArgRole, EntryPoint, EvaluatorConfig, Status, TensorSpec
from device_agent.executor import Executor, TimeLimit
from device_agent.jobs import MEASURE, RUN, Job
from device_agent.server import create_server
from protos import agent_pb2, agent_pb2_grpc
from protos.cuda_program import CudaModule, CudaProgram, Launch, LaunchArg, encode_module

M = N = K = 256
GEMM_ARGS = (
    TensorSpec("A", (M, K), "float32", ArgRole.INPUT),
    TensorSpec("B", (K, N), "float32", ArgRole.INPUT),
    TensorSpec("C", (M, N), "float32", ArgRole.OUTPUT),
)
ENTRY_ARGS = (LaunchArg.entry(0), LaunchArg.entry(1), LaunchArg.entry(2))
# Writes through a null pointer: CUDA_ERROR_ILLEGAL_ADDRESS, sticky.
FAULT_CU = r"""
extern "C" __global__ void fault(float *a, float *b, float *c) { *(volatile float *)16 = a[0]; }
"""


@pytest.fixture(scope="module")
def gpu() -> Iterator[Gpu]:
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    try:
        dev = Gpu.open()
    except CudaError as e:
        pytest.skip(f"no GPU: {e}")
    yield dev
    dev.close()


def _arch(gpu: Gpu) -> str:
    major, minor = gpu.compute_capability()
    return f"sm_{major}{minor}"


def _run_gemm(gpu: Gpu, m: int, n: int, k: int, cfg: GemmConfig, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    kernel = render_cuda(cuda_gemm(m, n, k, cfg), "gemm")
    fn = gpu.load_function(compile_cuda(kernel.source, _arch(gpu)), "gemm")
    bufs = [gpu.upload(a), gpu.upload(b), gpu.upload(np.full((m, n), np.nan, np.float32))]
    gpu.launch(fn, kernel.grid, kernel.block, bufs)
    gpu.synchronize()
    got = gpu.download(bufs[2], (m, n))
    for buf in bufs:
        gpu.free(buf)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize(
    "cfg", GEMM_CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_n}r{c.reg_m}x{c.reg_n}k{c.k_tile}"
)
def test_register_tiled_gemm_matches_numpy_on_the_gpu(gpu: Gpu, cfg: GemmConfig) -> None:
    # not square, several blocks each way and several k tiles
    _run_gemm(gpu, 2 * cfg.block_m, 3 * cfg.block_n, 5 * cfg.k_tile * 4, cfg, seed=cfg.block_m)


def test_a_corrupt_module_is_a_cuda_error_naming_the_call(gpu: Gpu) -> None:
    with pytest.raises(CudaError, match="cuModuleLoadData failed"):
        gpu.load_function(b"\x7fELF not a cubin", "gemm")


def test_a_missing_symbol_is_a_cuda_error_naming_it(gpu: Gpu) -> None:
    kernel = render_cuda(cuda_gemm(64, 64, 64), "gemm")
    with pytest.raises(CudaError, match=r"cuModuleGetFunction\(nope\)"):
        gpu.load_function(compile_cuda(kernel.source, _arch(gpu)), "nope")


def gemm_container(tmp: Path, arch: str, kind: str = "cubin") -> str:
    """A container of `gemm` (the generated kernel) and `fault`, built by nvcc; its path."""
    kernel = render_cuda(cuda_gemm(M, N, K), "gemm")
    image = compile_cuda(kernel.source, arch, kind)
    fault = compile_cuda(FAULT_CU, arch, kind)
    path = tmp / f"gemm.{kind}"
    path.write_bytes(
        encode_module(
            CudaModule(
                arch,
                kind,
                image,
                {"gemm": CudaProgram((Launch("gemm", kernel.grid, kernel.block, ENTRY_ARGS),))},
            )
        )
    )
    fault_path = tmp / f"fault.{kind}"
    fault_path.write_bytes(
        encode_module(
            CudaModule(
                arch,
                kind,
                fault,
                {"fault": CudaProgram((Launch("fault", (1, 1, 1), (1, 1, 1), ENTRY_ARGS),))},
            )
        )
    )
    return str(path)


def gemm_entry(symbol: str = "gemm") -> EntryPoint:
    return EntryPoint(symbol, symbol, GEMM_ARGS, flop=2.0 * M * N * K)


@pytest.mark.parametrize("kind", ["cubin", "ptx"])
def test_the_backend_runs_and_times_an_nvcc_built_container(
    gpu: Gpu, tmp_path: Path, kind: str
) -> None:
    path = gemm_container(tmp_path, _arch(gpu), kind)
    backend = CudaBackend(RealDriver())
    backend.prepare("")
    run = backend.execute(Job(RUN, path, gemm_entry(), seed=2))
    assert run.status is Status.OK, run.error
    a, b, _ = make_args(GEMM_ARGS, 2)
    np.testing.assert_allclose(run.outputs[0], a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(K))
    timing = EvaluatorConfig(warmup=2, repeat=5, min_repeat_ms=5.0, flush_cache_bytes=1)
    measured = backend.execute(Job(MEASURE, path, gemm_entry(), 2, timing))
    assert measured.status is Status.OK, measured.error
    assert len(measured.samples_s) == 5 and all(s > 0 for s in measured.samples_s)
    assert min(measured.samples_s) * measured.number_used >= 4e-3  # a repeat lasted ~5 ms
    tags = backend.device_tags()
    assert tags["sm"] == _arch(gpu)[3:] and tags["driver"] == "real" and "emulated" not in tags


def test_a_cubin_for_another_arch_is_refused(gpu: Gpu, tmp_path: Path) -> None:
    other = "sm_80" if _arch(gpu) != "sm_80" else "sm_90"
    path = gemm_container(tmp_path, other)
    backend = CudaBackend(RealDriver())
    result = backend.execute(Job(RUN, path, gemm_entry(), seed=2))
    assert result.status is Status.LOAD_ERROR and other in result.error


def test_a_faulting_kernel_replaces_the_child_and_the_next_job_runs(
    gpu: Gpu, tmp_path: Path
) -> None:
    path = gemm_container(tmp_path, _arch(gpu))
    restarts: list[str] = []
    executor = Executor("gpu/0", CudaBackend(), 8 << 30, on_restart=restarts.append)
    try:
        limit = TimeLimit.requested(60.0)
        first = executor.child_pid
        fault = executor.submit(Job(RUN, str(tmp_path / "fault.cubin"), gemm_entry("fault")), limit)
        assert fault.status is Status.RUNTIME_ERROR and "ILLEGAL_ADDRESS" in fault.error, fault
        assert restarts == ["retired"] and executor.child_pid != first
        again = executor.submit(Job(RUN, path, gemm_entry(), seed=1), limit)
        assert again.status is Status.OK, again.error
    finally:
        executor.close()


def test_a_gpu_registers_with_its_tags(gpu: Gpu, tmp_path: Path) -> None:
    config = AgentConfig(key="gpu", backend="cuda", all_devices=True, cache_dir=str(tmp_path))
    server, port, _ = create_server("127.0.0.1:0", config)
    with server, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        info = agent_pb2_grpc.AgentStub(channel).Info(agent_pb2.InfoRequest(), timeout=30.0)
    assert len(info.devices) == gpu_count()
    tags = info.devices[0].tags
    assert tags["arch"] == "cuda" and tags["sm"] == _arch(gpu)[3:] and tags["gpu"] == gpu.name()
    assert int(tags["memory_mib"]) > 0 and tags["driver"] == "real"


def gpu_count() -> int:
    """How many GPUs the driver sees."""
    driver = RealDriver()
    driver.init()
    return driver.device_count()
