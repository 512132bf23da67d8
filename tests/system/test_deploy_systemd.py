"""`kiln deploy` onto a host whose PID 1 is a real systemd: system and --user units, live.

The host is a Debian bookworm root file system (debootstrap, built once per machine into
/var/cache/kiln-tests) booted with systemd as PID 1 in its own pid and mount namespaces, sharing
this machine's network; its sshd listens on a free port of 127.0.0.1 (deploy.testing.SystemdHost).
Two agents go onto it: one as a system unit run by the dedicated user `kiln-agent` with the
hardening options, one as a `systemctl --user` unit of root. The tracker is a real `kiln-tracker`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kiln_cli import kiln

from deploy.inventory import load_inventory
from deploy.ssh import Connection
from deploy.testing import LocalPool, SystemdHost, build_rootfs, systemd_host_problem

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(systemd_host_problem() is not None, reason=str(systemd_host_problem())),
]

WAIT_S = 60.0
HOST_PYTHON = "/usr/bin/python3"  # the systemd host's own Python


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def rootfs() -> Path:
    try:
        return build_rootfs()
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"no root file system for a systemd host: {error}")


@pytest.fixture
def setup(tmp_path: Path, rootfs: Path) -> Iterator[tuple[LocalPool, SystemdHost, Path]]:
    pool = LocalPool(tmp_path, 0, sys.executable)
    host = SystemdHost(tmp_path / "host", rootfs, pool.client_key.with_suffix(".pub"))
    (tmp_path / "host").mkdir()
    try:
        pool.start()
        host.start()
        pool.known_hosts.write_text(host.known_hosts_line())
        inventory = tmp_path / "hosts.toml"
        inventory.write_text(
            f"""[pool]
tracker = "{pool.tracker_address}"
secrets = "{pool.secrets_path}"

[defaults]
port = {host.port}
user = "root"
key_file = "{pool.client_key}"
known_hosts = "{pool.known_hosts}"
python = "{HOST_PYTHON}"
key = "{pool.key}"
listen = "127.0.0.1:0"
connect_timeout_s = 5

[[host]]
name = "sys"
address = "127.0.0.1"
service = "systemd"
devices = 2

[[host]]
name = "user"
address = "127.0.0.1"
service = "systemd-user"
"""
        )
        yield pool, host, inventory
    finally:
        host.stop()
        pool.stop()


def deploy(*args: str) -> subprocess.CompletedProcess[str]:
    return kiln("deploy", *args, "--wait-s", str(WAIT_S), timeout=400)


def results(output: str) -> dict[str, str]:
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in ("sys", "user"):
            out[cells[0]] = cells[1]
    return out


def on_host(inventory: Path, command: str) -> str:
    host = load_inventory(inventory).hosts[0]
    with Connection(host) as conn:
        return conn.run(command, check=False, timeout_s=30).stdout.strip()


def test_system_and_user_units_up_again_restart_on_failure_down(
    setup: tuple[LocalPool, SystemdHost, Path],
) -> None:
    pool, _, inventory = setup
    up = deploy("up", str(inventory))
    assert up.returncode == 0, up.stdout + up.stderr
    assert results(up.stdout) == {"sys": "installed", "user": "installed"}
    assert pool.devices() == {"sys/0": "FREE", "sys/1": "FREE", "user/0": "FREE"}

    # The system unit runs as the dedicated user, hardened; the user unit under root's manager.
    assert on_host(inventory, "systemctl is-active kiln-agent-sys.service") == "active"
    assert on_host(inventory, "systemctl --user is-active kiln-agent-user.service") == "active"
    pid = on_host(inventory, "systemctl show -p MainPID --value kiln-agent-sys.service")
    assert on_host(inventory, f"ps -o user= -p {pid} || stat -c %U /proc/{pid}") == "kiln-agent"
    assert on_host(inventory, "systemctl show -p ProtectSystem --value kiln-agent-sys") == "strict"
    assert on_host(inventory, "stat -c '%U %a' /var/lib/kiln-agent/sys/pool.secrets") == (
        "kiln-agent 600"
    )

    again = deploy("up", str(inventory))
    assert again.returncode == 0, again.stdout + again.stderr
    assert results(again.stdout) == {"sys": "unchanged", "user": "unchanged"}

    # Killed, the agent is restarted by systemd (Restart=on-failure) and takes its devices back.
    on_host(inventory, f"kill -KILL {pid}")
    wait_until(
        "a new agent process",
        lambda: (
            on_host(inventory, "systemctl show -p MainPID --value kiln-agent-sys") not in (pid, "0")
        ),
    )
    wait_until("sys/0 FREE again", lambda: pool.devices().get("sys/0") == "FREE", timeout_s=WAIT_S)

    restart = deploy("restart", str(inventory))
    assert restart.returncode == 0, restart.stdout + restart.stderr
    assert results(restart.stdout) == {"sys": "restarted", "user": "restarted"}

    down = deploy("down", str(inventory))
    assert down.returncode == 0, down.stdout + down.stderr
    assert results(down.stdout) == {"sys": "removed", "user": "removed"}
    assert pool.devices() == {}
    assert (
        on_host(inventory, "systemctl cat kiln-agent-sys.service >/dev/null 2>&1; echo $?") != "0"
    )
    assert on_host(inventory, "ls /var/lib/kiln-agent/sys 2>&1 >/dev/null; echo $?") != "0"
