"""kiln-tracker CLI argument handling, config checks and serde, in process, no sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from protos import common_pb2, tracker_pb2
from protos.auth import Role, load_secrets
from tracker import serde
from tracker.__main__ import is_loopback, main, write_ready_file
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


def test_a_negative_startup_grace_exits_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--listen", "127.0.0.1:0", "--startup-grace-s", "-1"])
    assert "startup_grace_s must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "-inf"])
def test_lost_retention_must_be_a_positive_finite_number(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--listen", "127.0.0.1:0", f"--lost-retention-s={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--lost-retention-s must be a positive finite number of seconds, got " in err


def test_lost_retention_that_is_no_number_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--listen", "127.0.0.1:0", "--lost-retention-s", "an hour"])
    assert exit_info.value.code == 2
    assert "--lost-retention-s: invalid float value: 'an hour'" in capsys.readouterr().err


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


@pytest.mark.parametrize("listen", ["0.0.0.0:9190", "10.1.2.3:0", "[::]:0", "tracker.lan:9190"])
def test_non_loopback_listen_without_token_file_is_refused(
    listen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--listen", listen])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"refusing to listen on non-loopback {listen} without --token-file" in err
    assert "--insecure" in err


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("localhost", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("[::]", False),
        ("", False),
        ("192.168.1.4", False),
        ("example.org", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_init_secrets_writes_a_private_file_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pool.secrets"
    assert main(["init-secrets", str(path)]) == 0
    assert path.stat().st_mode & 0o777 == 0o600
    secrets = load_secrets(path)
    assert set(secrets.tokens) == set(Role)
    assert len({secrets.token(role) for role in Role}) == 3
    assert secrets.lease_key is not None and len(secrets.lease_key) >= 16
    before = path.read_text()
    assert main(["init-secrets", str(path)]) == 1
    assert "cannot create pool secrets" in capsys.readouterr().err
    assert path.read_text() == before


def test_token_file_without_a_client_token_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent-only.secrets"
    path.write_text("agent = " + "a" * 32 + "\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--listen", "127.0.0.1:0", "--token-file", str(path)])
    assert exit_info.value.code == 2
    assert "pool secrets have no 'client' token" in capsys.readouterr().err


def test_tls_key_without_cert_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--listen", "127.0.0.1:0", "--tls-key", "k.pem"])
    assert exit_info.value.code == 2
    assert "TLS needs both --tls-cert and --tls-key" in capsys.readouterr().err


def test_ready_file_takes_extra_lines(tmp_path: Path) -> None:
    path = tmp_path / "ready"
    write_ready_file(str(path), "127.0.0.1:1", "http://127.0.0.1:2/metrics")
    assert path.read_text() == "127.0.0.1:1\nhttp://127.0.0.1:2/metrics\n"


def test_the_store_url_comes_from_a_file_or_the_environment_and_is_never_echoed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A password on the command line is in `ps` for every user of the host: --store-file and
    $KILN_TRACKER_STORE keep it off, and an unusable URL is named without its password."""
    secret = tmp_path / "store.url"
    secret.write_text("bogus://:hunter2@10.0.0.5:6379/0\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--listen", "127.0.0.1:0", "--store-file", str(secret)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "is not available" in err and "hunter2" not in err
    monkeypatch.setenv("KILN_TRACKER_STORE", "bogus://:hunter2@h:1/0")
    with pytest.raises(SystemExit):
        main(["--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert "is not available" in err and "hunter2" not in err
    with pytest.raises(SystemExit):
        main(["--store", "memory", "--store-file", str(secret)])
    assert "not both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--store-file", str(tmp_path / "missing")])
    assert "--store-file" in capsys.readouterr().err


def test_the_store_url_is_read_from_the_file_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracker.__main__ import _store_url, build_parser

    url_file = tmp_path / "store.url"
    url_file.write_text("redis://:pw@10.0.0.5:6379/0\n")
    parser = build_parser()
    monkeypatch.setenv("KILN_TRACKER_STORE", "redis://env:6379/1")
    assert _store_url(parser, parser.parse_args(["--store-file", str(url_file)])) == (
        "redis://:pw@10.0.0.5:6379/0"
    )
    assert _store_url(parser, parser.parse_args([])) == "redis://env:6379/1"
    monkeypatch.delenv("KILN_TRACKER_STORE")
    assert _store_url(parser, parser.parse_args([])) == "memory"
