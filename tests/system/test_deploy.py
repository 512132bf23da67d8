"""`kiln deploy` against real OpenSSH servers and a real tracker, all on 127.0.0.1.

Each "host" is an sshd of its own (generated host key, its own port) on this machine; the hosts'
agents are installed under folders of the test's, into virtualenvs made from the wheels that
`kiln deploy` carries over SFTP, and run under the `process` service manager (no systemd runs
here). The tracker is a real `kiln-tracker` process with pool secrets. Every test ends the
agents it started: by `kiln deploy down`, and by their supervisors' pids if a test failed first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kiln_cli import kiln

from deploy.testing import LocalPool, free_port, keygen, sshd_available
from protos.auth import Role, load_secrets

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (scripts/setup.sh)"),
]

REPO = Path(__file__).resolve().parents[2]
HOSTS = 3
WAIT_S = 60.0
DEPLOY_TIMEOUT_S = 400.0
# The Python the hosts build their virtualenvs with: the one this project's .venv came from.
HOST_PYTHON = getattr(sys, "_base_executable", sys.executable)


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[LocalPool]:
    p = LocalPool(tmp_path, HOSTS, HOST_PYTHON)
    try:
        p.start()
        yield p
    finally:
        p.stop()


def deploy(*args: str) -> subprocess.CompletedProcess[str]:
    return kiln("deploy", *args, "--wait-s", str(WAIT_S), timeout=DEPLOY_TIMEOUT_S)


def rows(output: str) -> dict[str, list[str]]:
    """host -> [result, devices, s, detail] from the deploy table."""
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("h") and cells[0][1:].isdigit():
            out[cells[0]] = cells[1:]
    return out


def test_up_again_status_restart_on_failure_and_down(pool: LocalPool) -> None:
    inventory = pool.inventory()
    up = deploy("up", str(inventory))
    assert up.returncode == 0, up.stdout + up.stderr
    table = rows(up.stdout)
    assert {h: r[0] for h, r in table.items()} == {
        "h0": "installed",
        "h1": "installed",
        "h2": "installed",
    }
    assert table["h0"][1] == "2/2 FREE"
    assert pool.devices() == {"h0/0": "FREE", "h0/1": "FREE", "h1/0": "FREE", "h2/0": "FREE"}
    # pip ran from its wheel: the virtualenvs were made without one (no ensurepip needed).
    assert not list(pool.root(0).glob("venv/lib/python3*/site-packages/pip"))
    assert list(pool.root(0).glob("venv/lib/python3*/site-packages/numpy"))

    # The agent got only what it needs, private to it; no secret reached a log or the output.
    secrets_file = pool.root(0) / "pool.secrets"
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    placed = load_secrets(secrets_file)
    assert set(placed.tokens) == {Role.AGENT, Role.CLIENT}
    assert placed.lease_key == pool.secrets.lease_key
    admin = pool.secrets.token(Role.ADMIN)
    for text in (up.stdout, up.stderr, (pool.root(0) / "agent.log").read_text()):
        for token in (*pool.secrets.tokens.values(), pool.secrets.require_lease_key().hex()):
            assert token not in text
    assert admin not in secrets_file.read_text()

    again = deploy("up", str(inventory))
    assert again.returncode == 0, again.stdout + again.stderr
    assert {h: r[0] for h, r in rows(again.stdout).items()} == {
        "h0": "unchanged", "h1": "unchanged", "h2": "unchanged"
    }  # fmt: skip
    assert "0 changed" in again.stdout

    status = deploy("status", str(inventory))
    assert status.returncode == 0, status.stdout + status.stderr
    assert {r[0] for r in rows(status.stdout).values()} == {"running"}

    # An agent that dies is restarted by its service, and registers the same devices again.
    agent_pid = int(
        subprocess.run(
            ["pgrep", "-P", str(pool.supervisor_pid(1)), "-f", "device_agent"],
            capture_output=True, text=True, check=True,
        ).stdout.split()[0]
    )  # fmt: skip
    os.kill(agent_pid, signal.SIGKILL)
    wait_until("h1's device LOST", lambda: pool.devices().get("h1/0") == "LOST", timeout_s=20)
    wait_until("h1's device back", lambda: pool.devices().get("h1/0") == "FREE", timeout_s=30)
    assert sorted(pool.devices()) == ["h0/0", "h0/1", "h1/0", "h2/0"]

    down = deploy("down", str(inventory))
    assert down.returncode == 0, down.stdout + down.stderr
    assert {r[0] for r in rows(down.stdout).values()} == {"removed"}
    # Deregistered, not LOST: the tracker lists nothing of theirs.
    assert pool.devices() == {}
    assert not any(pool.root(i).exists() for i in range(HOSTS))


def test_host_keys_unknown_refused_accepted_on_first_use_changed_always_refused(
    pool: LocalPool,
) -> None:
    # h1 unknown: refused; the others go ahead.
    pool.known_hosts.write_text(
        pool.servers[0].known_hosts_line() + pool.servers[2].known_hosts_line()
    )
    inventory = pool.inventory()
    up = deploy("up", str(inventory))
    assert up.returncode == 1
    table = rows(up.stdout)
    assert table["h1"][0] == "failed" and "unknown host key" in table["h1"][3]
    assert table["h0"][0] == "installed" and table["h2"][0] == "installed"
    assert "h1/0" not in pool.devices()

    # Trust on first use records it.
    first_use = deploy("up", str(inventory), "--host", "h1", "--accept-new-host-keys")
    assert first_use.returncode == 0, first_use.stdout + first_use.stderr
    assert f"[127.0.0.1]:{pool.servers[1].port}" in pool.known_hosts.read_text()
    assert pool.devices()["h1/0"] == "FREE"

    # A changed key is refused, with or without the flag.
    other = keygen(pool.workdir / "other_host_key")
    kind, blob = other.with_suffix(".pub").read_text().split()[:2]
    lines = pool.known_hosts.read_text().splitlines()
    port = pool.servers[2].port
    lines = [line for line in lines if not line.startswith(f"[127.0.0.1]:{port} ")]
    pool.known_hosts.write_text("\n".join([*lines, f"[127.0.0.1]:{port} {kind} {blob}"]) + "\n")
    changed = deploy("status", str(inventory), "--accept-new-host-keys")
    assert changed.returncode == 1
    table = rows(changed.stdout)
    assert table["h2"][0] == "failed" and "CHANGED" in table["h2"][3]
    assert table["h0"][0] == "running"
    down = deploy("down", str(inventory), "--host", "h0", "--host", "h1")
    assert down.returncode == 0, down.stdout + down.stderr


def test_unreachable_host_and_wrong_key_fail_alone(pool: LocalPool) -> None:
    wrong_key = keygen(pool.workdir / "wrong_key")
    inventory = pool.inventory(
        h1={"port": free_port()},  # nothing listens there
        h2={"key_file": str(wrong_key)},
    )
    up = deploy("up", str(inventory))
    assert up.returncode == 1
    table = rows(up.stdout)
    assert table["h0"][0] == "installed"
    assert table["h1"][0] == "failed" and "cannot connect" in table["h1"][3]
    assert table["h2"][0] == "failed" and "refused key" in table["h2"][3]
    assert sorted(pool.devices()) == ["h0/0", "h0/1"]
    assert deploy("down", str(inventory), "--host", "h0").returncode == 0


def test_a_host_that_never_answers_fails_by_its_deadline(pool: LocalPool) -> None:
    # A listener that completes the TCP handshake (the kernel's backlog) and never speaks SSH.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        inventory = pool.inventory(h1={"port": silent.getsockname()[1], "connect_timeout_s": 2})
        status = deploy("status", str(inventory), "--host", "h1")
    assert status.returncode == 1
    result, _, seconds, detail = rows(status.stdout)["h1"]
    assert result == "failed" and ("did not answer" in detail or "cannot connect" in detail), detail
    assert float(seconds) < 30


def test_killed_half_way_then_up_again_finishes(pool: LocalPool) -> None:
    inventory = pool.inventory()
    process = subprocess.Popen(
        [sys.executable, "-m", "kiln", "deploy", "up", str(inventory), "--host", "h0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # Killed once the virtualenv is being made: before anything was recorded as installed.
        wait_until(
            "the install to begin",
            lambda: any(pool.root(0).glob("venv.new-*/bin/python")),
            timeout_s=120,
        )
    finally:
        process.kill()
        process.wait(10)
    assert not (pool.root(0) / "installed-version").exists()
    again = deploy("up", str(inventory), "--host", "h0")
    assert again.returncode == 0, again.stdout + again.stderr
    assert rows(again.stdout)["h0"][0] == "installed"
    assert pool.devices() == {"h0/0": "FREE", "h0/1": "FREE"}

    # An agent of another version keeps running under `up`; `upgrade` replaces it.
    (pool.root(0) / "installed-version").write_text("0.0.1+older\n")
    up = deploy("up", str(inventory), "--host", "h0")
    assert up.returncode == 0 and rows(up.stdout)["h0"][0] == "outdated", up.stdout
    assert "kiln deploy upgrade" in up.stdout
    upgrade = deploy("upgrade", str(inventory), "--host", "h0")
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    assert rows(upgrade.stdout)["h0"][0] == "upgraded"
    # A virtualenv that went missing is made again.
    shutil.rmtree(pool.root(0) / "venv")
    repaired = deploy("up", str(inventory), "--host", "h0")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert rows(repaired.stdout)["h0"][0] == "installed"
    restart = deploy("restart", str(inventory), "--host", "h0")
    assert restart.returncode == 0 and rows(restart.stdout)["h0"][0] == "restarted"
    assert pool.devices() == {"h0/0": "FREE", "h0/1": "FREE"}
    assert deploy("down", str(inventory), "--host", "h0").returncode == 0


def readme_inventory() -> dict[str, Any]:
    """The inventory of the README's "A pool across machines" walkthrough."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## A pool across machines") :]
    block = section[
        section.index("```toml") + len("```toml") : section.index(
            "```", section.index("```toml") + 7
        )
    ]
    return tomllib.loads(textwrap.dedent(block))


def toml_value(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def test_readme_walkthrough_from_inventory_to_kiln_devices(pool: LocalPool) -> None:
    """The README's inventory, with only where things are changed to this machine's sshd hosts."""
    data = readme_inventory()
    hosts = data["host"]
    assert len(hosts) <= HOSTS
    data["pool"].update(tracker=pool.tracker_address, secrets=str(pool.secrets_path))
    data["defaults"].update(
        user="root", key_file=str(pool.client_key), known_hosts=str(pool.known_hosts),
        service="process", listen="127.0.0.1:0", python=HOST_PYTHON,
    )  # fmt: skip
    for i, host in enumerate(hosts):
        host.update(address="127.0.0.1", port=pool.servers[i].port, root=str(pool.root(i)))
    lines = [f"[{table}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in data[table].items())
             for table in ("pool", "defaults")]  # fmt: skip
    for host in hosts:
        lines.append("[[host]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in host.items()))
    inventory = pool.workdir / "readme-hosts.toml"
    inventory.write_text("\n".join(lines))

    up = deploy("up", str(inventory))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        key = data["defaults"]["key"]
        common = ["--tracker", pool.tracker_address, "--token-file", str(pool.secrets_path)]
        listing = kiln("devices", *common, "--key", key, "--json")
        assert listing.returncode == 0, listing.stderr
        want = sorted(
            f"{h['name']}/{n}" for h in hosts if h.get("key", key) == key
            for n in range(h.get("devices", 1))
        )  # fmt: skip
        assert sorted(d["device"] for d in json.loads(listing.stdout)) == want
        tagged = [h for h in hosts if h.get("tags")]
        assert tagged, "the README's inventory shows tags"
        host = tagged[0]
        tag = next(iter(host["tags"].items()))
        by_tag = kiln(
            "devices", *common, "--key", host["key"], "--tag", f"{tag[0]}={tag[1]}", "--json"
        )
        assert by_tag.returncode == 0, by_tag.stderr
        assert [d["device"] for d in json.loads(by_tag.stdout)] == [f"{host['name']}/0"]
    finally:
        down = deploy("down", str(inventory))
    assert down.returncode == 0, down.stdout + down.stderr
