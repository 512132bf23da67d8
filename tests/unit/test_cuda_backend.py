"""The cuda backend's control flow against the fake driver (`cuda_fake.FakeDriver`, which stands
in for the GPU): container loading, arch checks, launches over args, workspace and constants,
event timing, the L2 flush, checks against a host reference, sticky and non-sticky errors."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from device_agent.arrays import make_args
from device_agent.backends import cuda, get_backend
from device_agent.backends.cuda import CudaBackend
from device_agent.backends.cuda_driver import DRIVER_ENV, CudaError, RealDriver
from device_agent.backends.cuda_fake import FAKE_POWER_W, FakeDriver, fake_image
from device_agent.domain import ArgRole, EntryPoint, EvaluatorConfig, Status, Telemetry, TensorSpec
from device_agent.jobs import MEASURE, RUN, Job, JobResult, ReferenceCheck
from device_agent.testing import build_kernels, kernel_entry
from protos.cuda_program import CudaModule, CudaProgram, Launch, LaunchArg, encode_module

N = 1024
FLOAT_BYTES = 4 * N
ARGS = (
    TensorSpec("x", (N,), "float32", ArgRole.INPUT),
    TensorSpec("y", (N,), "float32", ArgRole.OUTPUT),
)
KERNELS = ("fake_add_one", "fake_copy", "fake_add", "big_shared", "fault_here", "bad_launch")
PTX = fake_image(KERNELS)
GRID, BLOCK = (4, 1, 1), (256, 1, 1)  # one thread per element
X, Y = LaunchArg.entry(0), LaunchArg.entry(1)
ONES = np.ones(N, np.float32).tobytes()


def one(kernel: str, shared_bytes: int = 0) -> CudaProgram:
    return CudaProgram((Launch(kernel, GRID, BLOCK, (X, Y), shared_bytes),))


# y = x + 1 in two launches through the workspace: x -> ws[0:4N], ws[0:4N] + ws[4N:8N] (ones,
# a constant) -> y.
VIA_WORKSPACE = CudaProgram(
    launches=(
        Launch("fake_copy", GRID, BLOCK, (X, LaunchArg.workspace(0, FLOAT_BYTES))),
        Launch(
            "fake_add",
            GRID,
            BLOCK,
            (LaunchArg.workspace(0, FLOAT_BYTES), LaunchArg.workspace(FLOAT_BYTES, FLOAT_BYTES), Y),
        ),
    ),
    workspace_bytes=2 * FLOAT_BYTES,
    constants=((FLOAT_BYTES, ONES),),
)
PROGRAMS = {
    "add_one_k": one("fake_add_one"),
    "copy_k": one("fake_copy"),
    "via_ws": VIA_WORKSPACE,
    "shared_k": one("big_shared", shared_bytes=100 * 1024),
    "fault_k": one("fault_here"),
    "refused_k": one("bad_launch"),
    "missing_k": one("not_in_the_image"),
}


def entry(symbol: str) -> EntryPoint:
    return EntryPoint(symbol, symbol, ARGS)


@dataclass
class Env:
    backend: CudaBackend
    driver: FakeDriver
    tmp: Path
    path: str  # the container of PROGRAMS but missing_k, for sm_90 PTX

    def write(self, name: str, module: CudaModule) -> str:
        path = self.tmp / name
        path.write_bytes(encode_module(module))
        return str(path)

    def run(self, symbol: str, path: str = "", seed: int = 3) -> JobResult:
        return self.backend.execute(Job(RUN, path or self.path, entry(symbol), seed))

    def measure(
        self, symbol: str, timing: EvaluatorConfig, check: ReferenceCheck | None = None
    ) -> JobResult:
        return self.backend.execute(Job(MEASURE, self.path, entry(symbol), 3, timing, check))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    driver = FakeDriver(launch_s=1e-4)
    backend = CudaBackend(driver)
    backend.prepare(str(tmp_path))
    e = Env(backend, driver, tmp_path, "")
    programs = {k: v for k, v in PROGRAMS.items() if k != "missing_k"}
    e.path = e.write("all", CudaModule("sm_90", "ptx", PTX, programs))
    yield e


def expected_y(seed: int = 3) -> np.ndarray:
    x, _ = make_args(ARGS, seed)
    return x + np.float32(1)


# -- loading -----------------------------------------------------------------------------------


def test_what_is_not_a_container_is_a_load_error(env: Env) -> None:
    junk = env.tmp / "junk"
    junk.write_bytes(b"no magic here")
    corrupt = env.tmp / "corrupt"
    corrupt.write_bytes(encode_module(CudaModule("sm_90", "ptx", PTX, PROGRAMS))[:40])
    for path, reason in ((junk, "not a CUDA container"), (corrupt, "cannot load CUDA container")):
        result = env.run("add_one_k", str(path))
        assert result.status is Status.LOAD_ERROR and reason in result.error


def test_a_cubin_for_another_sm_is_refused_naming_both(env: Env) -> None:
    cubin = fake_image(KERNELS, "cubin")
    other = env.write(
        "sm80", CudaModule("sm_80", "cubin", cubin, {"add_one_k": PROGRAMS["add_one_k"]})
    )
    result = env.run("add_one_k", other)
    assert result.status is Status.LOAD_ERROR
    assert "sm_80" in result.error and "sm_90" in result.error and "Kiln Fake GPU 0" in result.error
    own = env.write(
        "sm90", CudaModule("sm_90", "cubin", cubin, {"add_one_k": PROGRAMS["add_one_k"]})
    )
    assert env.run("add_one_k", own).status is Status.OK
    assert ("load", "cubin") in env.driver.calls


def test_ptx_of_an_older_arch_loads_and_of_a_newer_one_is_refused(env: Env) -> None:
    older = env.write(
        "ptx80", CudaModule("sm_80", "ptx", PTX, {"add_one_k": PROGRAMS["add_one_k"]})
    )
    assert env.run("add_one_k", older).status is Status.OK
    newer = env.write(
        "ptx100", CudaModule("sm_100", "ptx", PTX, {"add_one_k": PROGRAMS["add_one_k"]})
    )
    result = env.run("add_one_k", newer)
    assert result.status is Status.LOAD_ERROR and "sm_100" in result.error


def test_a_kernel_missing_from_the_image_is_a_load_error_naming_it(env: Env) -> None:
    path = env.write("missing", CudaModule("sm_90", "ptx", PTX, PROGRAMS))
    result = env.run("add_one_k", path)
    assert result.status is Status.LOAD_ERROR
    assert "not_in_the_image" in result.error and "CUDA_ERROR_NOT_FOUND" in result.error
    assert ("unload", 0x1000) in env.driver.calls  # the half-loaded module is not kept


def test_an_entry_without_a_program_or_with_too_few_args_is_a_load_error(env: Env) -> None:
    assert env.run("nope", env.path).status is Status.LOAD_ERROR
    short = EntryPoint("add_one_k", "add_one_k", ARGS[:1])
    result = env.backend.execute(Job(RUN, env.path, short, 3))
    assert result.status is Status.LOAD_ERROR and "argument 1 does not exist" in result.error


def test_a_module_is_loaded_once_and_large_shared_memory_is_allowed_first(env: Env) -> None:
    assert env.run("shared_k").status is Status.OK
    assert env.run("add_one_k").status is Status.OK
    assert [c for c in env.driver.calls if c[0] == "load"] == [("load", "ptx")]
    assert ("shared", "big_shared", 100 * 1024) in env.driver.calls
    [launch] = [x for x in env.driver.launches() if x[0] == "big_shared"]
    assert launch[3] == 100 * 1024


# -- running -----------------------------------------------------------------------------------


def test_run_returns_the_outputs_of_the_emulated_kernel(env: Env) -> None:
    result = env.run("add_one_k")
    assert result.status is Status.OK, result.error
    np.testing.assert_array_equal(result.outputs[0], expected_y())
    assert env.driver.context == 0  # the child's own GPU is its ordinal 0


def test_launches_run_in_order_over_args_and_workspace_slices_with_constants_once(
    env: Env,
) -> None:
    for _ in range(2):
        result = env.run("via_ws")
        assert result.status is Status.OK, result.error
        np.testing.assert_array_equal(result.outputs[0], expected_y())
    allocs = {c[1]: c[2] for c in env.driver.calls if c[0] == "alloc"}
    [workspace] = [p for p, n in allocs.items() if n == 2 * FLOAT_BYTES]
    copy, add = env.driver.launches()[:2]
    x_ptr, ws_ptr = copy[4]
    assert copy[:3] == ("fake_copy", GRID, BLOCK) and ws_ptr == workspace
    assert add[0] == "fake_add" and add[4][:2] == (workspace, workspace + FLOAT_BYTES)
    assert add[4][2] not in (x_ptr, workspace) and allocs[x_ptr] == FLOAT_BYTES
    # The constants reached the workspace once, on the first run; the args each run.
    constant_copies = [
        c for c in env.driver.calls if c[0] == "htod" and c[1] == workspace + FLOAT_BYTES
    ]
    assert len(constant_copies) == 1
    # Each run's arg buffers were freed; the workspace stays with the module.
    freed = {c[1] for c in env.driver.calls if c[0] == "free"}
    assert x_ptr in freed and workspace not in freed


# -- timing ------------------------------------------------------------------------------------


def test_number_grows_until_a_repeat_lasts_min_repeat_ms(env: Env) -> None:
    timing = EvaluatorConfig(warmup=2, number=1, repeat=4, min_repeat_ms=5.0)
    result = env.measure("via_ws", timing)
    assert result.status is Status.OK, result.error
    assert len(result.samples_s) == 4
    # Two launches of 0.1 ms each on the fake's event clock: a sample is the sequence's time.
    assert result.samples_s == pytest.approx([2e-4] * 4)
    assert result.number_used * 2e-4 >= 5e-3 > (result.number_used / 100) * 2e-4
    launches = len(env.driver.launches())
    assert launches >= 2 * (2 + 4 * result.number_used)


def test_without_min_repeat_ms_number_is_kept(env: Env) -> None:
    timing = EvaluatorConfig(warmup=0, number=7, repeat=3, min_repeat_ms=0.0)
    result = env.measure("add_one_k", timing)
    assert result.status is Status.OK and result.number_used == 7
    assert len(env.driver.launches()) == 3 * 7


def test_the_l2_is_flushed_before_each_repeat_outside_the_timed_region(env: Env) -> None:
    timing = EvaluatorConfig(warmup=0, number=3, repeat=5, min_repeat_ms=0.0, flush_cache_bytes=1)
    assert env.measure("add_one_k", timing).status is Status.OK
    calls = [c for c in env.driver.calls if c[0] in ("memset", "record", "launch")]
    kinds = [c[0] for c in calls]
    assert kinds == ["memset", "record", "launch", "launch", "launch", "record"] * 5
    memsets = [c for c in calls if c[0] == "memset"]
    assert all(c[3] >= 2 * (50 << 20) for c in memsets) and len({c[1] for c in memsets}) == 1
    env.driver.calls.clear()
    assert env.measure("add_one_k", EvaluatorConfig(min_repeat_ms=0.0)).status is Status.OK
    assert not [c for c in env.driver.calls if c[0] == "memset"]


def test_a_cooldown_waits_for_the_gpu_before_each_repeat(env: Env) -> None:
    timing = EvaluatorConfig(warmup=0, number=2, repeat=3, min_repeat_ms=0.0, cooldown_ms=1.0)
    assert env.measure("add_one_k", timing).status is Status.OK
    kinds = [c[0] for c in env.driver.calls if c[0] in ("sync", "record", "launch")]
    assert kinds == ["sync", "record", "launch", "launch", "record"] * 3


# -- checks ------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_check_against_a_host_shared_object_passes_or_is_a_wrong_answer(env: Env) -> None:
    so, _ = build_kernels(str(env.tmp))
    ref = env.tmp / "ref.so"
    ref.write_bytes(so)

    def check(symbol: str) -> ReferenceCheck:
        return ReferenceCheck(str(ref), kernel_entry(symbol), rtol=1e-6, atol=1e-6)

    timing = EvaluatorConfig(warmup=1, number=2, repeat=2, min_repeat_ms=0.0)
    good = env.measure("add_one_k", timing, check("add_one"))
    assert good.status is Status.OK, good.error
    assert len(good.samples_s) == 2
    wrong = env.measure("add_one_k", timing, check("add_two"))
    assert wrong.status is Status.WRONG_ANSWER and "differs from the reference" in wrong.error
    also_wrong = env.measure("copy_k", timing, check("add_one"))
    assert also_wrong.status is Status.WRONG_ANSWER
    # A shared object is a reference, never a timing.
    timed = env.backend.execute(Job(MEASURE, str(ref), kernel_entry("add_one"), 3, timing))
    assert timed.status is Status.LOAD_ERROR and "check reference" in timed.error


def test_another_program_of_a_container_is_a_reference_too(env: Env) -> None:
    timing = EvaluatorConfig(warmup=0, repeat=1, min_repeat_ms=0.0)
    check = ReferenceCheck(env.path, entry("via_ws"), rtol=0.0, atol=0.0)
    assert env.measure("add_one_k", timing, check).status is Status.OK
    assert env.measure("copy_k", timing, check).status is Status.WRONG_ANSWER


# -- errors ------------------------------------------------------------------------------------


def test_a_fault_is_a_sticky_runtime_error_that_poisons_the_backend(env: Env) -> None:
    result = env.measure("fault_k", EvaluatorConfig(min_repeat_ms=0.0))
    assert result.status is Status.RUNTIME_ERROR
    assert (
        "CUDA_ERROR_ILLEGAL_ADDRESS (700)" in result.error
        and "executor is replaced" in result.error
    )
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in env.backend.poisoned
    # Every later job of this process is refused: only a fresh child can serve the GPU again.
    later = env.run("add_one_k")
    assert later.status is Status.RUNTIME_ERROR and "context is lost" in later.error


def test_a_refused_launch_is_a_runtime_error_that_keeps_the_backend(env: Env) -> None:
    result = env.run("refused_k")
    assert result.status is Status.RUNTIME_ERROR and "CUDA_ERROR_INVALID_VALUE" in result.error
    assert env.backend.poisoned == ""
    assert env.run("add_one_k").status is Status.OK


# -- the agent's view --------------------------------------------------------------------------


def test_tags_telemetry_and_the_child_environment(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.driver.gpus = 3
    tags = env.backend.tags_of(2)
    assert tags["arch"] == "cuda" and tags["sm"] == "90" and tags["gpu"] == "Kiln Fake GPU 2"
    assert tags["memory_mib"] == str(80 << 10) and tags["sm_clock_mhz"] == "1980"
    assert tags["driver"] == "fake" and tags["emulated"] == "cuda-fake" and tags["host_arch"]
    host = Telemetry(load_1m=0.5)
    assert env.backend.telemetry_of(1, host) == Telemetry(0.5, 1980.0, 41.0, FAKE_POWER_W)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert env.backend.child_env(2) == {"CUDA_VISIBLE_DEVICES": "2"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5,7")
    assert env.backend.child_env(1) == {"CUDA_VISIBLE_DEVICES": "5"}


def test_the_fake_honours_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CUDA_FAKE_GPUS", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    driver = FakeDriver.from_env()
    assert driver.device_count() == 1 and driver.device_info(0).name == "Kiln Fake GPU 2"


def test_the_fake_never_reuses_a_handle_of_an_unloaded_module() -> None:
    driver = FakeDriver()
    driver.open_context(0)
    a = driver.load_module(fake_image(["fake_copy"]))
    driver.load_module(fake_image(["fake_add"]))
    driver.unload_module(a)
    c = driver.load_module(fake_image(["fake_add_one", "fake_copy"]))
    driver.get_function(c, "fake_add_one")
    driver.get_function(c, "fake_copy")  # a handle handed out before must not shadow c's


def test_the_driver_is_chosen_by_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DRIVER_ENV, "fake")
    monkeypatch.setenv("KILN_CUDA_FAKE_GPUS", "2")
    backend = get_backend("cuda")
    assert backend.emulated and isinstance(backend, CudaBackend)
    assert backend.count_devices() == 2 and backend.device_tags()["driver"] == "fake"
    monkeypatch.setenv("KILN_CUDA_FAKE_GPUS", "0")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        cuda.create().prepare("")
    monkeypatch.setenv(DRIVER_ENV, "bogus")
    with pytest.raises(RuntimeError, match="'real' or 'fake'"):
        cuda.create().prepare("")
    monkeypatch.delenv(DRIVER_ENV)
    assert not cuda.create().emulated


def test_without_a_driver_the_real_backend_says_so() -> None:
    try:
        RealDriver().init()
    except CudaError as e:
        assert "libcuda" in str(e)
    else:
        pytest.skip("a CUDA driver is installed here")
    with pytest.raises(RuntimeError, match="cannot start the CUDA driver"):
        CudaBackend(RealDriver()).prepare("")
