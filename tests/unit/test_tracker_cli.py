"""kiln-tracker CLI argument handling, config checks and serde, in process, no sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from protos import common_pb2, tracker_pb2
from tracker import serde
from tracker.__main__ import main, write_ready_file
from tracker.config import TrackerConfig
from tracker.model import AcquireResult, DeviceSpec, DeviceState, DeviceStatus, Lease


def test_unknown_store_exits_naming_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--listen", "127.0.0.1:0", "--store", "redis"])
    assert exit_info.value.code == 2
    assert "--store 'redis' is not available" in capsys.readouterr().err


def test_bad_heartbeat_interval_exits(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--heartbeat-interval-s", "0"])
    assert "heartbeat_interval_s must be > 0" in capsys.readouterr().err


def test_config_rejects_default_ttl_above_max() -> None:
    with pytest.raises(ValueError, match="default_lease_ttl_s"):
        TrackerConfig(default_lease_ttl_s=100, max_lease_ttl_s=10)


def test_ready_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "ready"
    path.write_text("stale")
    write_ready_file(str(path), "127.0.0.1:4242")
    assert path.read_text() == "127.0.0.1:4242\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ready"]


def test_serde_round_trips_device_and_lease() -> None:
    message = common_pb2.DeviceSpec(
        device_id="a/0", key="arm", tags={"board": "rk3399"}, agent_address="h:1", backend="cpu"
    )
    spec = serde.device_spec_from_proto(message)
    assert spec == DeviceSpec("a/0", "arm", {"board": "rk3399"}, "h:1", "cpu")
    assert serde.device_spec_to_proto(spec) == message
    lease = Lease("L", spec, 12.5, "tok", "alice")
    response = serde.acquire_response(AcquireResult(lease))
    assert response.status == common_pb2.OK
    assert (response.lease.lease_id, response.lease.token, response.lease.device) == (
        "L",
        "tok",
        message,
    )
    no_device = serde.acquire_response(AcquireResult(None, "why"))
    assert (no_device.status, no_device.reason, no_device.HasField("lease")) == (
        common_pb2.NO_DEVICE,
        "why",
        False,
    )


@pytest.mark.parametrize(
    ("state", "wire"),
    [
        (DeviceState.FREE, tracker_pb2.FREE),
        (DeviceState.LEASED, tracker_pb2.LEASED),
        (DeviceState.LOST, tracker_pb2.LOST),
    ],
)
def test_serde_device_states(state: DeviceState, wire: int) -> None:
    status = DeviceStatus(DeviceSpec("a/0", "k"), state, "bob", 1.5, 3)
    message = serde.device_status_to_proto(status)
    assert (message.state, message.lease_holder, message.heartbeat_age_s, message.queue_depth) == (
        wire,
        "bob",
        1.5,
        3,
    )
