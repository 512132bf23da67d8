"""`kiln deploy` operations on the hosts of an inventory, all hosts in parallel.

    up       install what is missing (wheels, virtualenv, secrets, service), start the agent, wait
             until the tracker lists its devices; a second `up` changes nothing and says so. An
             agent of another version keeps running: `upgrade` replaces it.
    upgrade  `up`, and install this workstation's agent where the host runs another version.
    restart  restart the service, wait until its devices are back.
    status   service state, installed version, and the devices' states at the tracker.
    down     stop the agent (it deregisters its devices), remove its service and its files.

Each host gets one `HostResult`; a host that fails (unreachable, refused, a step that errs) never
stops the others. Every step has a deadline (deploy.ssh), so no host hangs the run.
"""

from __future__ import annotations

import logging
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from deploy.bundle import (
    DEFAULT_CACHE,
    PROBE,
    BundleError,
    Platform,
    agent_version,
    agent_wheel,
    dependency_wheels,
    installer_wheel,
    parse_probe,
)
from deploy.inventory import Host, Inventory
from deploy.services import Layout, ServiceManager, manager_for
from deploy.ssh import Connection, SshError
from protos import tracker_pb2, tracker_pb2_grpc
from protos.auth import (
    PoolSecrets,
    Role,
    SecretsError,
    TlsFiles,
    call_metadata,
    load_secrets,
    open_channel,
)

_LOG = logging.getLogger(__name__)
_LIST_TIMEOUT_S = 5.0
_POLL_S = 0.2
_PIP_TIMEOUT_S = 600.0


class DeployError(RuntimeError):
    """An operation could not start at all (secrets unreadable, no wheels); the message says why."""


@dataclass
class HostResult:
    """What one operation did on one host."""

    host: str
    ok: bool
    action: str  # installed | upgraded | started | restarted | unchanged | outdated | stopped | removed | running | failed
    detail: str = ""
    seconds: float = 0.0
    devices: str = ""  # e.g. "2/2 FREE" as the tracker lists them
    changes: list[str] = field(default_factory=list)


def agent_secrets_text(secrets: PoolSecrets) -> str:
    """The secrets an agent needs (its own token, the clients' token, the lease key), not the
    admin token.

    Raises:
        SecretsError: the pool secrets lack one of them.
    """
    lines = [
        "# Kiln pool secrets for an agent (written by kiln deploy)",
        f"agent = {secrets.token(Role.AGENT)}",
        f"client = {secrets.token(Role.CLIENT)}",
        f"lease_key = {secrets.require_lease_key().hex()}",
    ]
    return "\n".join(lines) + "\n"


def agent_argv(inventory: Inventory, host: Host, layout: Layout) -> list[str]:
    """The agent's command line on `host`."""
    argv = [
        layout.python, "-m", "device_agent",
        "--tracker", inventory.tracker,
        "--key", host.key,
        "--agent-id", host.name,
        "--backend", host.backend,
        "--devices", str(host.devices),
        "--listen", host.listen,
        "--advertise-host", host.advertise_host,
        "--token-file", layout.secrets,
        "--cache-dir", layout.cache,
    ]  # fmt: skip
    for name, value in sorted(host.tags.items()):
        argv += ["--tag", f"{name}={value}"]
    if inventory.tracker_tls_ca is not None:
        argv += ["--tracker-tls-ca", layout.tracker_ca]
    return [*argv, *host.agent_args]


class Deployer:
    """Runs operations over an inventory's hosts.

    Args:
        inventory: the parsed inventory.
        accept_new_host_keys: trust hosts not yet in known_hosts (a changed key is always refused).
        wait_s: how long `up`/`restart` wait for the tracker to list a host's devices.
        parallel: hosts worked on at once.
        cache: where agent and dependency wheels are kept on this machine.

    Raises:
        DeployError: the pool secrets cannot be read or lack what an agent needs.
    """

    def __init__(
        self,
        inventory: Inventory,
        accept_new_host_keys: bool = False,
        wait_s: float = 60.0,
        parallel: int = 16,
        cache: Path = DEFAULT_CACHE,
    ) -> None:
        self.inventory = inventory
        self.accept_new = accept_new_host_keys
        self.wait_s = wait_s
        self.parallel = max(1, parallel)
        self.cache = cache
        self._version = agent_version()  # hashes the agent's sources: once per run
        try:
            secrets = load_secrets(inventory.secrets)
            self._agent_secrets = agent_secrets_text(secrets).encode()
            self._client_token = secrets.token(Role.CLIENT)
        except SecretsError as error:
            raise DeployError(f"{inventory.path}: {error}") from None
        ca = inventory.tracker_tls_ca
        self._tls = TlsFiles(ca=str(ca)) if ca is not None else None
        self._wheel_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        try:
            self._tracker_ca = ca.read_bytes() if ca is not None else None
        except OSError as error:
            raise DeployError(
                f"{inventory.path}: cannot read tracker_tls_ca {ca}: {error.strerror}"
            ) from None

    # -- operations over many hosts -------------------------------------------------------------

    def run(self, operation: str, hosts: tuple[Host, ...]) -> list[HostResult]:
        """Run `operation` (up, upgrade, restart, status, down) on `hosts` in parallel; results
        in the hosts' order."""
        step: Callable[[Host], HostResult] = {
            "up": lambda h: self._up(h, upgrade=False),
            "upgrade": lambda h: self._up(h, upgrade=True),
            "restart": self._restart,
            "status": self._status,
            "down": self._down,
        }[operation]
        with ThreadPoolExecutor(max_workers=min(self.parallel, len(hosts)) or 1) as pool:
            return list(pool.map(lambda host: self._guarded(host, step), hosts))

    def _guarded(self, host: Host, step: Callable[[Host], HostResult]) -> HostResult:
        start = time.monotonic()
        try:
            result = step(host)
        except (SshError, BundleError, DeployError) as error:
            result = HostResult(host.name, False, "failed", str(error))
        except Exception as error:  # one host's surprise must not end the others' run
            _LOG.exception("%s: unexpected error", host.name)
            result = HostResult(host.name, False, "failed", f"{type(error).__name__}: {error}")
        result.seconds = time.monotonic() - start
        return result

    # -- one host -------------------------------------------------------------------------------

    def _connect(self, host: Host) -> Connection:
        return Connection(host, accept_new=self.accept_new)

    def _layout(self, conn: Connection, host: Host) -> Layout:
        root = shlex.quote(host.root)
        text = conn.run(
            f"mkdir -p {root} && chmod 700 {root} && cd {root} && pwd -P",
            step="make install folder",
            timeout_s=30,
        ).stdout.strip()
        return Layout(text)

    def _existing_layout(self, conn: Connection, host: Host) -> Layout | None:
        root = shlex.quote(host.root)
        result = conn.run(f"cd {root} 2>/dev/null && pwd -P", check=False, timeout_s=30)
        return Layout(result.stdout.strip()) if result.exit_status == 0 else None

    def _up(self, host: Host, upgrade: bool) -> HostResult:
        with self._connect(host) as conn:
            layout = self._layout(conn, host)
            platform = parse_probe(
                conn.run(
                    f"{shlex.quote(host.python)} -c {shlex.quote(PROBE)}", step="probe python"
                ).stdout
            )
            changes: list[str] = []
            want = self._version
            installed = (conn.read_file(layout.installed) or b"").decode().strip()
            venv_ok = conn.run(f"test -x {shlex.quote(layout.python)}", check=False, timeout_s=30)
            if venv_ok.exit_status != 0:
                installed = ""  # the virtualenv went missing: install afresh
            outdated = ""
            if not installed or (upgrade and installed != want):
                copied, installer = self._sync_wheels(conn, layout, platform)
                if copied:
                    changes.append("wheels")
                self._install(conn, host, layout, want, installer, fresh=not installed)
                changes.append(
                    f"upgraded {installed} -> {want}" if installed else f"installed {want}"
                )
            elif installed != want:
                outdated = f"runs {installed}, this workstation has {want}: kiln deploy upgrade"
            if self._put_if_changed(conn, layout.secrets, self._agent_secrets, 0o600):
                changes.append("secrets")
            if self._tracker_ca is not None and self._put_if_changed(
                conn, layout.tracker_ca, self._tracker_ca, 0o644
            ):
                changes.append("tracker CA")
            manager = manager_for(host, layout)
            if manager.install(conn, agent_argv(self.inventory, host, layout)):
                changes.append("service")
            action = self._converge(conn, manager, changes)
            if action == "unchanged" and outdated:
                action = "outdated"
        devices = self._wait_registered(host)
        detail = "; ".join(changes) if changes else "nothing to change"
        if outdated:
            detail = f"{detail}; {outdated}"
        for change in changes:
            if change.startswith(("installed", "upgraded")):
                action = change.split()[0]
        return HostResult(host.name, True, action, detail, devices=devices, changes=changes)

    def _converge(self, conn: Connection, manager: ServiceManager, changes: list[str]) -> str:
        """Start the service if it is down, restart it if anything it uses changed."""
        if not manager.is_active(conn):
            manager.start(conn)
            return "started"
        if changes:
            manager.restart(conn)
            return "restarted"
        return "unchanged"

    def _wheel_lock(self, label: str) -> threading.Lock:
        with self._locks_lock:
            return self._wheel_locks.setdefault(label, threading.Lock())

    def _sync_wheels(
        self, conn: Connection, layout: Layout, platform: Platform
    ) -> tuple[bool, str]:
        """Copy the wheels the host lacks: whether any was copied, and the host's path of the
        pip wheel that installs them."""
        with self._wheel_lock(platform.label):
            wheels = [agent_wheel(self.cache), *dependency_wheels(platform, self.cache)]
        installer = f"{layout.wheels}/{installer_wheel(wheels).name}"
        wanted = {path.name: path for path in wheels}
        conn.run(
            f"mkdir -p {shlex.quote(layout.wheels)} && rm -f {shlex.quote(layout.wheels)}/*.tmp-*",
            step="wheel folder",
            timeout_s=30,
        )
        have = conn.listdir_sizes(layout.wheels)
        copied = False
        for name, path in wanted.items():
            if have.get(name) != path.stat().st_size:
                conn.upload(path, f"{layout.wheels}/{name}")
                copied = True
        stale = [name for name in have if name.endswith(".whl") and name not in wanted]
        if stale:
            names = " ".join(shlex.quote(f"{layout.wheels}/{name}") for name in stale)
            conn.run(f"rm -f {names}", step="remove old wheels", timeout_s=30)
        return copied, installer

    def _install(
        self,
        conn: Connection,
        host: Host,
        layout: Layout,
        version: str,
        installer: str,
        fresh: bool,
    ) -> None:
        """The agent's virtualenv with `version` installed from the host's wheels by the pip of
        the `installer` wheel (the virtualenv has no pip of its own: see deploy.bundle).

        A fresh install (nothing recorded as installed: a first `up`, or one killed half-way)
        builds a new virtualenv under a name of its own and renames it into place only once it
        works: a killed earlier try's remote processes may still be writing into theirs.
        """
        python = layout.python
        if fresh:
            building = f"{layout.venv}.new-{uuid.uuid4().hex[:8]}"
            stale = f"{shlex.quote(layout.venv)}.new-*"
            conn.run(
                f"rm -rf {stale} 2>/dev/null; {shlex.quote(host.python)} -m venv --without-pip {shlex.quote(building)}",
                step="create virtualenv",
                timeout_s=300,
            )
            python = f"{building}/bin/python"
        pip = (
            f"{shlex.quote(python)} {shlex.quote(installer + '/pip')} install "
            "--disable-pip-version-check --quiet "
            f"--no-index --find-links {shlex.quote(layout.wheels)} "
            f"{shlex.quote(f'kiln-agent=={version}')}"
        )
        conn.run(pip, step="pip install", timeout_s=_PIP_TIMEOUT_S)
        check = f"{shlex.quote(python)} -c 'import device_agent.agent, grpc, numpy'"
        conn.run(check, step="check install", timeout_s=120)
        if fresh:
            venv = shlex.quote(layout.venv)
            conn.run(
                f"rm -rf {venv} && mv {shlex.quote(building)} {venv}",
                step="move virtualenv into place",
                timeout_s=120,
            )
        conn.write_file(layout.installed, f"{version}\n".encode(), mode=0o644)

    def _put_if_changed(self, conn: Connection, path: str, data: bytes, mode: int) -> bool:
        if conn.read_file(path) == data:
            return False
        conn.write_file(path, data, mode=mode)
        return True

    def _restart(self, host: Host) -> HostResult:
        with self._connect(host) as conn:
            layout = self._existing_layout(conn, host)
            if layout is None:
                return HostResult(host.name, False, "failed", f"not installed under {host.root}")
            manager_for(host, layout).restart(conn)
        devices = self._wait_registered(host)
        return HostResult(host.name, True, "restarted", devices=devices)

    def _status(self, host: Host) -> HostResult:
        with self._connect(host) as conn:
            layout = self._existing_layout(conn, host)
            if layout is None:
                return HostResult(host.name, False, "absent", f"nothing under {host.root}")
            installed = (conn.read_file(layout.installed) or b"").decode().strip()
            active = manager_for(host, layout).is_active(conn)
        states = self._device_states(host)
        devices = _summary(host, states)
        up = sum(1 for s in states.values() if s in ("FREE", "LEASED"))
        ok = active and up == host.devices
        detail = f"agent {installed or 'not installed'}"
        if installed and installed != self._version:
            detail += f" (this workstation has {self._version})"
        return HostResult(
            host.name, ok, "running" if active else "stopped", detail, devices=devices
        )

    def _down(self, host: Host) -> HostResult:
        with self._connect(host) as conn:
            layout = self._existing_layout(conn, host)
            if layout is None:
                return HostResult(host.name, True, "absent", f"nothing under {host.root}")
            manager_for(host, layout).remove(conn)
            # Guard against removing something that is not ours: the folder must hold our files.
            conn.run(
                f"cd {shlex.quote(layout.root)} && "
                f'{{ [ -e installed-version ] || [ -e venv ] || [ -e wheels ] || [ -z "$(ls -A)" ]; }} '
                f"&& cd / && rm -rf {shlex.quote(layout.root)}",
                step="remove files",
                timeout_s=120,
            )
        states = self._wait_gone(host)
        if states:
            left = ", ".join(f"{d} {s}" for d, s in sorted(states.items()))
            return HostResult(host.name, False, "removed", f"still listed by the tracker: {left}")
        return HostResult(
            host.name, True, "removed", "service and files removed; devices deregistered"
        )

    # -- the tracker's view -----------------------------------------------------------------------

    def _device_states(self, host: Host) -> dict[str, str]:
        """device id -> state name at the tracker for this host's devices ({} if unreachable).

        Raises:
            DeployError: the tracker refused the client token.
        """
        channel = open_channel(self.inventory.tracker, self._tls)
        try:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            wanted = set(host.device_ids)
            states: dict[str, str] = {}
            token = ""
            for _ in range(1000):
                reply = stub.ListDevices(
                    tracker_pb2.ListDevicesRequest(key=host.key, page_token=token),
                    timeout=_LIST_TIMEOUT_S,
                    metadata=call_metadata(self._client_token),
                )
                for device in reply.devices:
                    if device.spec.device_id in wanted:
                        states[device.spec.device_id] = tracker_pb2.DeviceState.Name(device.state)
                token = reply.next_page_token
                if not token:
                    break
            return states
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else None
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise DeployError(
                    f"tracker {self.inventory.tracker} refused the pool's client token: {code.name}"
                ) from None
            return {}
        finally:
            channel.close()

    def _wait_registered(self, host: Host) -> str:
        """Wait until every device of the host is FREE or LEASED at the tracker.

        Raises:
            DeployError: not within wait_s; the message has what the tracker listed.
        """
        deadline = time.monotonic() + self.wait_s
        while True:
            states = self._device_states(host)
            if len(states) == host.devices and all(
                s in ("FREE", "LEASED") for s in states.values()
            ):
                return _summary(host, states)
            if time.monotonic() > deadline:
                raise DeployError(
                    f"{host.name}: the agent runs, but after {self.wait_s:g} s the tracker "
                    f"{self.inventory.tracker} lists {_summary(host, states) or 'none of its devices'}"
                    f" (see {host.root}/agent.log on the host)"
                )
            time.sleep(_POLL_S)

    def _wait_gone(self, host: Host) -> dict[str, str]:
        deadline = time.monotonic() + min(self.wait_s, 10.0)
        while True:
            states = self._device_states(host)
            if not states or time.monotonic() > deadline:
                return states
            time.sleep(_POLL_S)


def _summary(host: Host, states: dict[str, str]) -> str:
    if not states:
        return f"0/{host.devices}"
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n}/{host.devices} {state}" for state, n in sorted(counts.items()))
