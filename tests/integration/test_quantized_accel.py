"""The quantised ResNet-18's accelerator programs on the native simulator (real gcc builds it):
every layer bit-exact with its numpy reference, the signed epilogue costing no cycle, and the
vta_sim backend's measurement carrying where its cycles went, through the executor's frames and
both ends' wire conversions."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from compiler.codegen.vta import GemmTiling, gemm_program
from compiler.ops import get_template
from compiler.ops.vta_dense import VtaOpTemplate
from compiler.quantized.accel import (
    LOWERING,
    ConvLowering,
    DirectConv,
    Im2colDense,
    entry_symbol,
    network_artifact,
    signed_epilogue,
)
from compiler.quantized.resnet import (
    Int8ResNet,
    QConv,
    calibration_image,
    forward,
    int8_resnet18,
    reference,
    reference_conv,
)
from device_agent import serde as agent_serde
from device_agent.backends.vta_sim import VtaSimBackend
from device_agent.domain import (
    ArgRole,
    EntryPoint,
    EvaluatorConfig,
    MeasureResult,
    Status,
    TensorSpec,
)
from device_agent.jobs import MEASURE, Job, result_from_frame, result_to_frame
from device_agent.vta import image
from device_agent.vta.sim import Simulator, build, encode_code
from protos.vta import VtaSpec
from protos.vta_program import decode_programs
from tuner.measure import serde as tuner_serde

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

LOWERINGS: dict[str, ConvLowering] = {"im2col": Im2colDense(), "direct": DirectConv()}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Simulator:
    return Simulator(build(str(tmp_path_factory.mktemp("vta"))))


@pytest.fixture(scope="module")
def net() -> Int8ResNet:
    return int8_resnet18(image=32, width=16, classes=10, seed=0)


def first_config(
    shape: tuple[int, ...], vthreads: int, template: str = "vta_dense"
) -> dict[str, int]:
    """The first config of the template's space with `vthreads` that fits the buffers."""
    tmpl = get_template(template)
    assert isinstance(tmpl, VtaOpTemplate)
    space = tmpl.config_space(shape)
    for i in range(len(space)):
        config = space.get(i)
        if config["vthreads"] == vthreads and tmpl.worth_measuring(shape, config):
            return dict(config)
    raise AssertionError(f"no config with {vthreads} vthreads for {shape}")


@pytest.mark.parametrize("lowering", sorted(LOWERINGS))
@pytest.mark.parametrize("vthreads", [1, 4])
def test_every_layer_on_the_simulator_is_its_reference(
    sim: Simulator, net: Int8ResNet, vthreads: int, lowering: str
) -> None:
    lower = LOWERINGS[lowering]
    configs = {
        c.name: first_config(lower.workload(c), vthreads, lower.template) for c in net.convs()
    }
    programs = decode_programs(network_artifact(net, configs, lowering=lower).data)
    ran = []

    def conv(layer: QConv, x: np.ndarray) -> np.ndarray:
        program = programs[entry_symbol(layer)]
        arg = lower.entry_input(layer, x)
        y = np.zeros(program.args[-1].shape, np.int8)
        dram = image.make_image(program, [arg, y])
        sim.run(program.spec, encode_code(program), dram)
        image.read_back(program, dram, [arg, y])
        expected = reference_conv(layer, x)
        assert np.array_equal(lower.entry_output(layer, y), expected), layer.name
        ran.append(layer.relu)
        return expected

    picture = calibration_image(32, seed=4)
    assert np.array_equal(forward(net, picture, conv), reference(net, picture))
    assert True in ran and False in ran  # both epilogues ran


def test_the_signed_epilogue_costs_no_cycle(sim: Simulator) -> None:
    m, n, k = 70, 48, 96
    program = gemm_program(m, n, k, GemmTiling(32, 2, 3, 2), 6, VtaSpec())
    signed = signed_epilogue(program, 6)
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    bias = rng.integers(-5000, 5000, n, dtype=np.int32)
    cycles = []
    for p in (program, signed):
        y = np.zeros((m, n), np.int8)
        dram = image.make_image(p, [x, w, bias, y])
        cycles.append(sim.run(p.spec, encode_code(p), dram).total_cycles)
        image.read_back(p, dram, [x, w, bias, y])
    acc = x.astype(np.int64) @ w.astype(np.int64).T + bias
    assert np.array_equal(y, np.clip(acc >> 6, -128, 127).astype(np.int8))
    assert (y < 0).any()
    assert cycles[0] == cycles[1]


def test_a_measurement_carries_the_module_cycles(tmp_path: Path, net: Int8ResNet) -> None:
    layer = net.blocks[0].conv1
    configs = {c.name: first_config(LOWERING.workload(c), 2) for c in net.convs()}
    art = network_artifact(net, configs)
    path = tmp_path / "net.kvta"
    path.write_bytes(art.data)
    m, n, k = LOWERING.workload(layer)
    entry = EntryPoint(
        entry_symbol(layer), "",
        (TensorSpec("x", (m, k), "int8", ArgRole.INPUT),
         TensorSpec("y", (m, n), "int8", ArgRole.OUTPUT)),
    )  # fmt: skip
    backend = VtaSimBackend()
    backend.prepare(str(tmp_path))
    result = backend.execute(Job(MEASURE, str(path), entry, timing=EvaluatorConfig(repeat=2)))
    assert result.status is Status.OK, result.error
    accel = result.accel
    assert accel is not None and backend.last_report is not None
    report = backend.last_report
    assert accel.total_cycles == report.total_cycles > 0
    assert accel.gemm_cycles == report.gemm_cycles == m * -(-n // 16) * -(-k // 16)
    assert [c.module for c in accel.modules] == ["load", "compute", "store"]
    assert all(0 < c.busy_cycles <= accel.total_cycles for c in accel.modules)
    assert result.samples_s[0] == pytest.approx(accel.total_cycles / 100e6)

    # through the executor's frame, onto the wire and into the tuner's record
    framed = result_from_frame(result_to_frame(result))
    assert framed.accel == accel
    wire = agent_serde.measure_result_to_pb(
        MeasureResult(Status.OK, framed.samples_s, accel=framed.accel)
    )
    got = tuner_serde.measure_result(wire).accel
    assert got is not None and got.total_cycles == accel.total_cycles
    assert got.busy_cycles == {c.module: c.busy_cycles for c in accel.modules}
    compute = next(c for c in accel.modules if c.module == "compute")
    assert got.utilisation("compute") == compute.busy_cycles / accel.total_cycles
    assert got.gemm_utilisation == accel.gemm_cycles / accel.total_cycles
    # a result without cycles (any other backend's) has none on the wire either
    assert tuner_serde.measure_result(agent_serde.measure_result_to_pb(
        MeasureResult(Status.OK, (1.0,)))).accel is None  # fmt: skip
