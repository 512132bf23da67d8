"""`kiln devices` rendering: rows, table, summary and error lines, from wire messages, no sockets."""

from __future__ import annotations

import grpc
import pytest

from kiln import cli
from kiln.cli import devices as devices_view
from protos import common_pb2, tracker_pb2


def _status(
    device_id: str, key: str, state: tracker_pb2.DeviceState, holder: str = "", queue: int = 0
) -> tracker_pb2.DeviceStatus:
    return tracker_pb2.DeviceStatus(
        spec=common_pb2.DeviceSpec(
            device_id=device_id,
            key=key,
            agent_address="10.0.0.7:9191",
            tags={"backend": "cpu", "arch": "x86_64", "features": "avx2,fma", "cpu": "EPYC"},
        ),
        state=state,
        lease_holder=holder,
        heartbeat_age_s=0.4567,
        queue_depth=queue,
    )


RESPONSE = tracker_pb2.ListDevicesResponse(
    devices=[
        _status("b/0", "x86", tracker_pb2.LEASED, "carol", 2),
        _status("a/0", "arm", tracker_pb2.LOST),
        _status("a/1", "x86", tracker_pb2.FREE, "", 2),
    ]
)


def test_rows_are_sorted_and_carry_every_column() -> None:
    rows = devices_view.rows(RESPONSE)
    assert [(r["key"], r["device"]) for r in rows] == [
        ("arm", "a/0"),
        ("x86", "a/1"),
        ("x86", "b/0"),
    ]
    assert rows[2] == {
        "key": "x86",
        "device": "b/0",
        "backend": "cpu",
        "agent": "10.0.0.7:9191",
        "state": "LEASED",
        "holder": "carol",
        "heartbeat_age_s": 0.46,
        "queue": 2,
        "tags": {"arch": "x86_64", "features": "avx2,fma"},  # the CPU's name is left out
    }


def test_table_and_summary() -> None:
    text = devices_view.render(devices_view.rows(RESPONSE))
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(devices_view.COLUMNS)
    assert set(lines[1]) == {"|", "-"}
    assert [c.strip() for c in lines[4].strip("|").split("|")] == [
        "x86", "b/0", "cpu", "10.0.0.7:9191", "LEASED", "carol", "0.46", "2",
        "arch=x86_64 features=avx2,fma",
    ]  # fmt: skip
    assert lines[-1] == "3 devices: 1 FREE, 1 LEASED, 1 LOST; longest queue 2"
    assert devices_view.summary([]) == "0 devices; longest queue 0"


class _Failed(grpc.RpcError):
    """What a failed call raises: an RpcError with code() and details()."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_errors_are_one_line_naming_the_tracker_and_the_cause() -> None:
    unreachable = _Failed(grpc.StatusCode.UNAVAILABLE, "failed to connect\nsecond line")
    assert devices_view.describe_error("h:1", unreachable) == (
        "kiln: tracker h:1 unreachable: UNAVAILABLE: failed to connect"
    )
    denied = _Failed(grpc.StatusCode.PERMISSION_DENIED, "role 'agent' may not call ...")
    assert devices_view.describe_error("h:1", denied).startswith(
        "kiln: tracker h:1 refused this token's role (use the client token): PERMISSION_DENIED"
    )


def test_rows_keep_only_devices_with_every_selected_tag() -> None:
    response = tracker_pb2.ListDevicesResponse(
        devices=[
            _status("a/0", "arm", tracker_pb2.FREE),
            _status("a/1", "arm", tracker_pb2.FREE),
            _status("b/0", "x86", tracker_pb2.FREE),
        ]
    )
    response.devices[1].spec.tags["board"] = "rk3399"
    response.devices[2].spec.tags["board"] = "rk3399"
    select = devices_view.rows
    assert [r["device"] for r in select(response, {})] == ["a/0", "a/1", "b/0"]
    assert [r["device"] for r in select(response, {"board": "rk3399"})] == ["a/1", "b/0"]
    both = {"board": "rk3399", "arch": "x86_64", "backend": "cpu"}  # backend is a tag too
    assert [r["device"] for r in select(response, both)] == ["a/1", "b/0"]
    assert select(response, {"board": "rk3399", "arch": "aarch64"}) == []
    assert select(response, {"board": ""}) == []  # a tag the device lacks never matches


@pytest.mark.parametrize("tag", ["board", "=rk3399"])
def test_a_tag_without_a_name_and_value_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["devices", "--tracker", "127.0.0.1:1", "--tag", tag])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert f"kiln: --tag wants k=v, got {tag!r}" in err
