"""Real OpenSSH servers on 127.0.0.1 for the deploy tests and benchmark: each `SshdServer` is one
"host", with its own generated host key, port and authorized keys, in a temporary folder.

Needs Debian's openssh-server (/usr/sbin/sshd) and ssh-keygen; `sshd_available()` says whether they
are here. sshd runs in the foreground (-D) as a child of the test, which ends it by its pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Self

import grpc

from protos import tracker_pb2, tracker_pb2_grpc
from protos.auth import PoolSecrets, Role, call_metadata, write_secrets

SSHD = "/usr/sbin/sshd"
_REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 10.0


def sshd_available() -> bool:
    """Whether sshd and ssh-keygen are installed."""
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """A new passphrase-less key pair at `path` (and `path`.pub); returns `path`."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "kiln-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _SshHost:
    """What both kinds of test host share: a child process serving SSH on `port`, ended by pid."""

    port: int
    process: subprocess.Popen[bytes] | None
    log: Path
    _stop_wait_s = 5.0
    _stop_signal = signal.SIGTERM

    def _wait_for_ssh(self, what: str, timeout_s: float) -> None:
        """Wait until the port answers with an SSH banner.

        Raises:
            RuntimeError: the process exited or no banner came within `timeout_s`.
        """
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{what} exited: {self.log.read_text(errors='replace')[-800:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock,
            ):
                sock.settimeout(2)
                if sock.recv(4).startswith(b"SSH-"):
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{what} did not answer SSH on port {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        """End the process (its pid only; see the subclass) and wait for it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(self._stop_signal)
            try:
                self.process.wait(self._stop_wait_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(self._stop_wait_s)
        self.process = None

    def start(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SshdServer(_SshHost):
    """One sshd on 127.0.0.1 accepting `authorized_key` for the current user (key auth only).

    Args:
        workdir: a folder of its own (host key, config, log).
        authorized_key: the public key file of the client.
    """

    def __init__(self, workdir: Path, authorized_key: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.host_key = workdir / "ssh_host_ed25519_key"
        if not self.host_key.exists():
            keygen(self.host_key)
        self.authorized_keys = workdir / "authorized_keys"
        self.authorized_keys.write_text(authorized_key.read_text())
        self.authorized_keys.chmod(0o600)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log = workdir / "sshd.log"

    def known_hosts_line(self) -> str:
        """This server's line for a known_hosts file."""
        kind, blob = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {blob}\n"

    def _config(self) -> Path:
        config = self.workdir / "sshd_config"
        config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.workdir / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "MaxStartups 100:30:200\n"
            "MaxSessions 50\n"
            "Subsystem sftp internal-sftp\n"
            "LogLevel ERROR\n"
        )
        return config

    def start(self) -> None:
        """Start sshd on a free port and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within START_TIMEOUT_S.
        """
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # its privilege-separation folder
        self.port = free_port()
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self._config())],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self._wait_for_ssh("sshd", START_TIMEOUT_S)


class LocalPool:
    """A real `kiln-tracker` process with pool secrets, `hosts` sshd "hosts" on this machine, and
    inventories naming them (agents under `process` service, installed under `workdir`/hosts).

    Args:
        workdir: a folder of its own.
        hosts: how many sshd hosts.
        host_python: the Python the hosts make their virtualenvs with.
    """

    def __init__(self, workdir: Path, hosts: int, host_python: str) -> None:
        self.count = hosts
        self.host_python = host_python
        self.workdir = workdir
        self.key = f"deploy-{uuid.uuid4().hex[:8]}"
        self.secrets_path = workdir / "pool.secrets"
        self.secrets: PoolSecrets = write_secrets(self.secrets_path)
        self.client_key = keygen(workdir / "id_ed25519")
        self.known_hosts = workdir / "known_hosts"
        self.servers = [
            SshdServer(workdir / f"sshd{i}", self.client_key.with_suffix(".pub"))
            for i in range(hosts)
        ]
        self.tracker: subprocess.Popen[bytes] | None = None
        self.tracker_address = ""

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self.known_hosts.write_text("".join(s.known_hosts_line() for s in self.servers))
        ready = self.workdir / "tracker.ready"
        with open(self.workdir / "tracker.log", "wb") as log:
            self.tracker = subprocess.Popen(
                [sys.executable, "-m", "tracker", "--listen", "127.0.0.1:0",
                 "--token-file", str(self.secrets_path), "--heartbeat-interval-s", "0.5",
                 "--startup-grace-s", "0", "--ready-file", str(ready)],
                cwd=_REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S * 2
        while not ready.exists():
            if self.tracker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the tracker did not start: see " + str(self.workdir / "tracker.log")
                )
            time.sleep(0.02)
        self.tracker_address = ready.read_text().splitlines()[0]

    def root(self, i: int) -> Path:
        return self.workdir / "hosts" / f"h{i}"

    def inventory(self, name: str = "hosts.toml", **overrides: dict[str, object]) -> Path:
        """An inventory of all hosts; `overrides[hN]` replaces settings of host hN."""
        lines = [
            "[pool]",
            f'tracker = "{self.tracker_address}"',
            f'secrets = "{self.secrets_path}"',
            "",
            "[defaults]",
            'user = "root"',
            f'key_file = "{self.client_key}"',
            f'known_hosts = "{self.known_hosts}"',
            'service = "process"',
            f'python = "{self.host_python}"',
            f'key = "{self.key}"',
            'backend = "cpu"',
            'listen = "127.0.0.1:0"',
            "connect_timeout_s = 5",
        ]
        for i, server in enumerate(self.servers):
            settings: dict[str, object] = {
                "name": f"h{i}",
                "address": "127.0.0.1",
                "port": server.port,
                "root": str(self.root(i)),
                "devices": 2 if i == 0 else 1,
                "tags": {"rack": f"r{i}"},
            }
            settings.update(overrides.get(f"h{i}", {}))
            lines += ["", "[[host]]"]
            for k, v in settings.items():
                if isinstance(v, dict):
                    inner = ", ".join(f'{a} = "{b}"' for a, b in v.items())
                    lines.append(f"{k} = {{ {inner} }}")
                elif isinstance(v, str):
                    lines.append(f'{k} = "{v}"')
                else:
                    lines.append(f"{k} = {v}")
        path = self.workdir / name
        path.write_text("\n".join(lines) + "\n")
        return path

    def devices(self) -> dict[str, str]:
        """device id -> state name, of this pool's key."""
        with grpc.insecure_channel(self.tracker_address) as channel:
            reply = tracker_pb2_grpc.TrackerStub(channel).ListDevices(
                tracker_pb2.ListDevicesRequest(key=self.key),
                timeout=10,
                metadata=call_metadata(self.secrets.token(Role.CLIENT)),
            )
        return {d.spec.device_id: tracker_pb2.DeviceState.Name(d.state) for d in reply.devices}

    def supervisor_pid(self, i: int) -> int | None:
        try:
            return int((self.root(i) / "supervisor.pid").read_text())
        except (OSError, ValueError):
            return None

    def kill_agents(self) -> None:
        """End the agents this test's deploys started, by their supervisors' process groups."""
        for i in range(self.count):
            pid = self.supervisor_pid(i)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def stop(self) -> None:
        self.kill_agents()
        if self.tracker is not None:
            self.tracker.terminate()
            self.tracker.wait(10)
        for server in self.servers:
            server.stop()


# -- a real systemd host ----------------------------------------------------------------------------

ROOTFS_PACKAGES = (
    "systemd,systemd-sysv,dbus,libpam-systemd,openssh-server,python3,python3-venv,passwd"
)
DEFAULT_ROOTFS = Path("/var/cache/kiln-tests/rootfs-bookworm")
BOOT_TIMEOUT_S = 60.0


def systemd_host_problem() -> str | None:
    """Why a SystemdHost cannot run here (None when it can): it needs root (namespaces, mounts),
    unshare, overlayfs, and debootstrap for its root file system."""
    if os.geteuid() != 0:
        return "needs root (mount and pid namespaces)"
    for tool in ("unshare", "debootstrap", "chroot"):
        if shutil.which(tool) is None:
            return f"needs {tool} (scripts/setup.sh installs it)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "needs overlayfs"
    return None


def build_rootfs(path: Path = DEFAULT_ROOTFS, timeout_s: float = 900.0) -> Path:
    """A Debian bookworm root file system with systemd, sshd and python3-venv at `path`, made
    once with debootstrap (about a minute and 330 MB) and reused; a `.complete` file marks it done.

    Raises:
        RuntimeError: debootstrap failed (no route to the Debian mirror, say); its log tail says why.
    """
    stamp = path / ".complete"
    if stamp.exists():
        return path
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={ROOTFS_PACKAGES}", "bookworm",
         str(partial)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout_s,
    )  # fmt: skip
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"debootstrap failed: {(result.stdout + result.stderr)[-800:]}")
    (partial / ".complete").write_text("bookworm\n")
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)
    return path


class SystemdHost(_SshHost):
    """A host running systemd as its PID 1, with sshd on a port of 127.0.0.1: the `rootfs` booted
    in new pid, mount, uts and ipc namespaces (sharing this machine's network) over an overlay, so
    what a test writes stays in `workdir`. Stopping it kills its PID 1, which ends the namespace.

    Args:
        workdir: a folder of its own (overlay layers, boot log).
        rootfs: a root file system from build_rootfs.
        authorized_key: the public key root logs in with.
    """

    def __init__(self, workdir: Path, rootfs: Path, authorized_key: Path) -> None:
        self.workdir = workdir
        self.rootfs = rootfs
        self.authorized_key = authorized_key
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log = workdir / "boot.log"
        self._stop_wait_s = 10.0  # unshare --kill-child: its PID 1, and so the namespace, ends too
        # unshare hands a SIGTERM on to systemd, which as PID 1 ignores it: the wait ran out (10 s)
        # before every stop. A throwaway host on an overlay has nothing to shut down cleanly.
        self._stop_signal = signal.SIGKILL

    def known_hosts_line(self) -> str:
        """This host's line for a known_hosts file."""
        key = (self.rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {key[0]} {key[1]}\n"

    def _boot_script(self) -> Path:
        upper, work, merged = (self.workdir / n for n in ("upper", "work", "merged"))
        for d in (upper, work, merged):
            d.mkdir(parents=True, exist_ok=True)
        key = self.authorized_key.read_text().strip()
        sshd = (
            f"Port {self.port}\\nListenAddress 127.0.0.1\\nPermitRootLogin prohibit-password\\n"
            "PasswordAuthentication no\\nKbdInteractiveAuthentication no\\n"
        )
        script = self.workdir / "boot.sh"
        script.write_text(
            f"""set -e
mount -t overlay overlay -o lowerdir={self.rootfs},upperdir={upper},workdir={work} {merged}
mkdir -p -m 700 {merged}/root/.ssh
printf '%s\\n' '{key}' > {merged}/root/.ssh/authorized_keys
printf '{sshd}' > {merged}/etc/ssh/sshd_config.d/kiln-test.conf
echo kiln-systemd-host > {merged}/etc/hostname
mount -t proc proc {merged}/proc
mount --rbind /sys {merged}/sys
mount --rbind /dev {merged}/dev
mount -t tmpfs tmpfs {merged}/run
mount -t tmpfs tmpfs {merged}/tmp
exec chroot {merged} /usr/bin/env container=kiln-test /lib/systemd/systemd
"""
        )
        return script

    def start(self) -> None:
        """Boot it and wait until its sshd accepts connections.

        Raises:
            RuntimeError: it exited or sshd did not listen within BOOT_TIMEOUT_S.
        """
        self.port = free_port()
        script = self._boot_script()
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                ["unshare", "--pid", "--mount", "--uts", "--ipc", "--fork", "--kill-child",
                 "sh", str(script)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._wait_for_ssh("systemd host", BOOT_TIMEOUT_S)
