"""`kiln-agent --backend cuda`'s device selection: `--devices all`, `--gpus`, and the agent's
refusals (no processes: every case here fails before an executor child would start; the fake
driver stands in for the GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from device_agent.__main__ import config_from_args, parse_args
from device_agent.agent import Agent, PerDeviceBackend
from device_agent.backends import get_backend
from device_agent.backends.cuda_driver import DRIVER_ENV
from device_agent.config import AgentConfig


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        parse_args(["--key", "k", "--backend", "cuda", *argv])
    assert info.value.code == 2
    return capsys.readouterr().err


def test_devices_all_and_a_gpu_list_reach_the_config() -> None:
    config = config_from_args(parse_args(["--key", "k", "--backend", "cuda", "--devices", "all"]))
    assert config.all_devices and config.device_indices == ()
    config = config_from_args(parse_args(["--key", "k", "--backend", "cuda", "--gpus", "2,0"]))
    assert not config.all_devices and config.device_indices == (2, 0) and config.devices == 2
    config = config_from_args(parse_args(["--key", "k", "--devices", "3"]))
    assert (config.devices, config.all_devices, config.device_indices) == (3, False, ())


def test_bad_device_selections_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert "number or 'all'" in usage_error(["--devices", "lots"], capsys)
    assert "distinct" in usage_error(["--gpus", "1,1"], capsys)
    assert "list like 0,2" in usage_error(["--gpus", "a"], capsys)
    assert "without --devices" in usage_error(["--gpus", "1", "--devices", "2"], capsys)
    assert "without --devices all" in usage_error(["--devices", "all", "--cores", "0"], capsys)


def test_the_config_refuses_repeated_or_conflicting_indices() -> None:
    with pytest.raises(ValueError, match="twice"):
        AgentConfig(device_indices=(1, 1))
    with pytest.raises(ValueError, match="neither"):
        AgentConfig(all_devices=True, device_indices=(0,))


def test_only_a_backend_with_devices_of_its_own_serves_all(tmp_path: Path) -> None:
    assert not isinstance(get_backend("cpu"), PerDeviceBackend)
    config = AgentConfig(backend="null", all_devices=True, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="no devices of its own"):
        Agent(config, "127.0.0.1:1")


def test_a_gpu_the_machine_lacks_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DRIVER_ENV, "fake")
    monkeypatch.setenv("KILN_CUDA_FAKE_GPUS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert isinstance(get_backend("cuda"), PerDeviceBackend)
    config = AgentConfig(backend="cuda", device_indices=(1, 2), cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"no device \[2\] on this machine: backend cuda has 2"):
        Agent(config, "127.0.0.1:1")
