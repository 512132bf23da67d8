"""The deploy inventory's parsing and the agent's wheel: everything checked before a host is touched."""

from __future__ import annotations

import base64
import getpass
import hashlib
import tomllib
import zipfile
from pathlib import Path

import pytest

from deploy import bundle
from deploy.bundle import (
    AGENT_REQUIREMENTS,
    BundleError,
    Platform,
    agent_wheel,
    installer_wheel,
    parse_probe,
)
from deploy.inventory import InventoryError, load_inventory, parse_inventory
from deploy.operations import agent_argv, agent_secrets_text
from deploy.services import Layout, ProcessService
from protos.auth import Role, parse_secrets, write_secrets

GOOD = """
[pool]
tracker = "10.0.0.5:9190"
secrets = "pool.secrets"

[defaults]
user = "kiln"
key_file = "keys/id_ed25519"
service = "process"
devices = 1

[[host]]
name = "edge1"
address = "10.0.0.11"
key = "arm-a72"
tags = { board = "rpi4" }
devices = 2

[[host]]
name = "big"
address = "10.0.0.12"
key = "x86"
user = "ops"
port = 2222
service = "systemd"
agent_args = ["--pin-cores", "auto"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def test_defaults_apply_and_hosts_override(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, GOOD))
    edge, big = inventory.hosts
    assert inventory.tracker == "10.0.0.5:9190"
    assert inventory.secrets == tmp_path / "pool.secrets"
    assert (edge.user, edge.port, edge.devices, edge.tags) == ("kiln", 22, 2, {"board": "rpi4"})
    assert edge.key_file == str(tmp_path / "keys" / "id_ed25519")
    assert edge.root == ".kiln-agent/edge1" and edge.service == "process"
    assert edge.device_ids == ("edge1/0", "edge1/1")
    assert (big.user, big.port, big.service) == ("ops", 2222, "systemd")
    assert big.root == "/var/lib/kiln-agent/big"
    assert big.agent_args == ("--pin-cores", "auto")
    assert big.advertise_host == "10.0.0.12"
    assert inventory.select(["big"]) == (big,)


def test_user_defaults_to_the_local_login(tmp_path: Path) -> None:
    text = GOOD.replace('user = "kiln"\n', "")
    assert load_inventory(write(tmp_path, text)).hosts[0].user == getpass.getuser()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('name = "edge1"', 'name = "edge 1"'), "host name (the agent id) must be"),
        (('name = "big"', 'name = "edge1"'), "two hosts are named 'edge1'"),
        (("port = 2222", "port = 70000"), "port must be 1..65535"),
        (("port = 2222", 'port = 2222\nroot = "/"'), "root must be a folder of Kiln's own"),
        (('service = "systemd"', 'service = "upstart"'), "service must be one of"),
        (("devices = 2", "devices = 0"), "devices must be 1..1024"),
        (('key = "x86"', 'kee = "x86"'), "unknown setting(s) kee"),
        (('tracker = "10.0.0.5:9190"', 'tracker = "nowhere"'), 'tracker must be "HOST:PORT"'),
        (('tags = { board = "rpi4" }', "tags = { board = 4 }"), "tags must be a table of strings"),
        (('agent_args = ["--pin-cores", "auto"]', 'agent_args = "--pin-cores"'), "agent_args must"),
    ],
)
def test_bad_settings_name_the_host_and_the_setting(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    with pytest.raises(InventoryError, match=None) as error:
        load_inventory(write(tmp_path, GOOD.replace(*change)))
    assert message in str(error.value)
    assert str(tmp_path / "hosts.toml") in str(error.value)


def test_unreadable_and_not_toml(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read inventory"):
        load_inventory(tmp_path / "missing.toml")
    with pytest.raises(InventoryError, match="not valid TOML"):
        load_inventory(write(tmp_path, "[pool\n"))
    with pytest.raises(InventoryError, match="no \\[\\[host\\]\\] entries"):
        parse_inventory({"pool": {"tracker": "a:1", "secrets": "s"}}, tmp_path / "x.toml")
    with pytest.raises(InventoryError, match="no host named nope"):
        load_inventory(write(tmp_path, GOOD)).select(["nope"])


def test_agent_gets_its_secrets_without_the_admin_token(tmp_path: Path) -> None:
    secrets = write_secrets(tmp_path / "pool.secrets")
    placed = parse_secrets(agent_secrets_text(secrets))
    assert placed.tokens == {
        Role.AGENT: secrets.tokens[Role.AGENT],
        Role.CLIENT: secrets.tokens[Role.CLIENT],
    }
    assert placed.lease_key == secrets.lease_key


def test_agent_command_line_is_one_the_agent_accepts(tmp_path: Path) -> None:
    from device_agent.__main__ import parse_args

    write_secrets(tmp_path / "pool.secrets")
    inventory = load_inventory(write(tmp_path, GOOD))
    argv = agent_argv(inventory, inventory.hosts[0], Layout("/srv/kiln/edge1"))
    assert argv[:3] == ["/srv/kiln/edge1/venv/bin/python", "-m", "device_agent"]
    args = parse_args(argv[3:])
    assert (args.agent_id, args.key, args.devices, args.tracker) == (
        "edge1", "arm-a72", 2, "10.0.0.5:9190"
    )  # fmt: skip
    assert args.token_file == "/srv/kiln/edge1/pool.secrets"
    assert dict(args.tag) == {"board": "rpi4"}
    # The process supervisor runs exactly that command, quoted for sh.
    script = ProcessService(inventory.hosts[0], Layout("/srv/kiln/edge1")).render(argv)
    assert "'/srv/kiln/edge1/venv/bin/python' -m device_agent" in script or (
        "/srv/kiln/edge1/venv/bin/python -m device_agent" in script
    )


def test_probe_output_and_platform_tags() -> None:
    platform = parse_probe("3 11 x86_64 glibc 2.36\n")
    assert platform == Platform((3, 11), "x86_64", (2, 36))
    tags = platform.pip_platforms()
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_36_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags
    with pytest.raises(BundleError, match=r"needs 3\.11"):
        parse_probe("3 9 aarch64 glibc 2.31")
    with pytest.raises(BundleError, match="cannot read"):
        parse_probe("Traceback (most recent call last):")
    with pytest.raises(BundleError, match="manylinux"):
        parse_probe("3 12 aarch64").pip_platforms()  # musl: no libc_ver


def test_agent_requirements_cover_the_projects_core_dependencies() -> None:
    pyproject = tomllib.loads((bundle.ROOT / "pyproject.toml").read_text())
    assert set(pyproject["project"]["dependencies"]) <= set(AGENT_REQUIREMENTS)


def test_the_installer_is_the_one_pip_wheel_of_the_wheelhouse() -> None:
    wheels = [Path(n) for n in ("numpy-2.4.6-cp311.whl", "pip-26.3-py3-none-any.whl")]
    assert installer_wheel(wheels).name == "pip-26.3-py3-none-any.whl"
    with pytest.raises(BundleError, match=r"found 0: numpy-2\.4\.6-cp311\.whl"):
        installer_wheel(wheels[:1])
    with pytest.raises(BundleError, match="found 2"):
        installer_wheel([*wheels, Path("pip-25.0-py3-none-any.whl")])


def test_agent_wheel_holds_the_agent_alone_with_a_valid_record(tmp_path: Path) -> None:
    wheel = agent_wheel(tmp_path)
    assert wheel.name == f"kiln_agent-{bundle.agent_version()}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert {name.split("/")[0] for name in names} == {
            "protos", "device_agent", f"kiln_agent-{bundle.agent_version()}.dist-info"
        }  # fmt: skip
        assert "device_agent/__main__.py" in names and "protos/tracker_pb2.py" in names
        assert not any("compiler" in n or "tuner" in n or "tracker/" in n for n in names)
        record = archive.read(f"kiln_agent-{bundle.agent_version()}.dist-info/RECORD").decode()
        for line in record.splitlines():
            name, digest, size = line.rsplit(",", 2)
            if not digest:
                continue
            data = archive.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data), name
    # Built once per source version: the same file again.
    assert agent_wheel(tmp_path) == wheel


def test_agent_version_follows_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for package in ("protos", "device_agent"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("x = 1\n")
    monkeypatch.setattr(bundle, "ROOT", tmp_path)
    before = bundle.agent_version()
    (tmp_path / "device_agent" / "__init__.py").write_text("x = 2\n")
    assert bundle.agent_version() != before
