"""`kiln devices` against a real tracker server on 127.0.0.1: once, watched, and losing it."""

from __future__ import annotations

import io
import json

import pytest

from kiln import cli
from kiln.cli import devices as devices_view
from tracker.model import DeviceSpec
from tracker.server import create_server


def test_watch_reports_a_lost_tracker_and_keeps_going_until_count() -> None:
    serving = create_server("127.0.0.1:0")
    serving.run(serving.pool.register("a", "h:1", [DeviceSpec("", "x86")]))
    out, err = io.StringIO(), io.StringIO()
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 1:
            serving.stop(grace_s=0.2)  # the tracker goes away after the first listing

    try:
        status = devices_view.run(
            serving.address, as_json=True, watch_s=0.05, count=3, out=out, err=err, sleep=sleep
        )
    finally:
        serving.stop(grace_s=0.2)
    assert status == 0
    [snapshot] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["device"], d["state"]) for d in snapshot] == [("a/0", "FREE")]
    errors = err.getvalue().splitlines()
    assert len(errors) == 2
    assert all(f"kiln: tracker {serving.address} unreachable: UNAVAILABLE" in e for e in errors)
    assert naps == [0.05, 0.05]


def test_unreachable_tracker_on_the_first_listing_is_exit_1_even_when_watching() -> None:
    out, err = io.StringIO(), io.StringIO()
    status = devices_view.run("127.0.0.1:1", watch_s=0.05, count=5, out=out, err=err)
    assert status == 1 and out.getvalue() == ""
    assert len(err.getvalue().splitlines()) == 1


def test_key_goes_to_the_tracker_and_every_tag_must_match(
    capsys: pytest.CaptureFixture[str],
) -> None:
    serving = create_server("127.0.0.1:0")
    serving.run(
        serving.pool.register(
            "a",
            "h:1",
            [
                DeviceSpec("", "arm", {"board": "rk3399", "mem": "4g"}),
                DeviceSpec("", "arm", {"board": "rpi4", "mem": "4g"}),
                DeviceSpec("", "x86", {"board": "rk3399", "mem": "4g"}),
            ],
        )
    )

    def listed(*flags: str) -> list[str]:
        with pytest.raises(SystemExit) as info:
            cli.main(["devices", "--tracker", serving.address, "--json", *flags])
        output = capsys.readouterr()
        assert info.value.code == 0, output.err
        return [device["device"] for device in json.loads(output.out)]

    try:
        assert listed() == ["a/0", "a/1", "a/2"]
        assert listed("--key", "arm") == ["a/0", "a/1"]
        assert listed("--tag", "board=rk3399") == ["a/0", "a/2"]
        assert listed("--key", "arm", "--tag", "board=rk3399", "--tag", "mem=4g") == ["a/0"]
        assert listed("--tag", "board=rk3399", "--tag", "mem=8g") == []
    finally:
        serving.stop(grace_s=0.2)
