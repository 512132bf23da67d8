"""SSH to a host with paramiko: checked host keys, key authentication, a deadline on every step.

Host keys are read from the inventory's known_hosts file. An unknown host is refused unless
`accept_new` is set (trust on first use: the key is then written to that file); a host whose key
changed is always refused, whatever the flag. Authentication is by key file or a running ssh-agent,
never by password. Commands run with a deadline; what they print is returned, never logged, so
nothing secret that a command prints ends up in a log (and no secret is ever put on a command line:
files are written over SFTP).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

from deploy.inventory import Host

_LOG = logging.getLogger(__name__)
# One writer at a time to a known_hosts file (hosts connect in parallel).
_KNOWN_HOSTS_LOCK = threading.Lock()
_POLL_MIN_S = 0.002
_POLL_MAX_S = 0.1


class SshError(RuntimeError):
    """A step over SSH failed; the message names the host, the step and the cause."""


@dataclass(frozen=True)
class Completed:
    """What a remote command did."""

    command: str
    exit_status: int
    stdout: str
    stderr: str


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Trust on first use: record an unknown host's key in the known_hosts file."""

    def __init__(self, known_hosts: str) -> None:
        self._known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        with _KNOWN_HOSTS_LOCK:
            path = Path(self._known_hosts)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as handle:
                handle.write(line)
        _LOG.warning(
            "accepted new host key of %s (%s %s)",
            hostname,
            key.get_name(),
            key.fingerprint if hasattr(key, "fingerprint") else "",
        )


class _RefusePolicy(paramiko.MissingHostKeyPolicy):
    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise SshError(
            f"unknown host key for {hostname} ({key.get_name()}): not in the known_hosts file; "
            "add it (ssh-keyscan, or ssh once) or pass --accept-new-host-keys to trust it on first use"
        )


class Connection:
    """An open SSH connection to one host; use as a context manager.

    Args:
        host: the inventory's host (address, port, user, key file, known_hosts, timeouts).
        accept_new: record the key of a host not yet in known_hosts instead of refusing it.
        command_timeout_s: the default deadline of each remote command.

    Raises:
        SshError: the host is unreachable, its key is unknown (without accept_new) or changed, or
            authentication failed.
    """

    def __init__(self, host: Host, accept_new: bool = False, command_timeout_s: float = 120.0):
        self.host = host
        self.command_timeout_s = command_timeout_s
        self._client = paramiko.SSHClient()
        known = host.known_hosts
        if known and os.path.exists(known):
            try:
                self._client.load_host_keys(known)
            except (OSError, paramiko.SSHException) as error:
                raise SshError(f"{host.name}: cannot read known_hosts {known}: {error}") from None
        self._client.set_missing_host_key_policy(
            _AcceptNewPolicy(known) if accept_new and known else _RefusePolicy()
        )
        self._sftp: paramiko.SFTPClient | None = None
        self._connect()

    def _connect(self) -> None:
        host = self.host
        timeout = host.connect_timeout_s
        try:
            self._client.connect(
                host.address,
                port=host.port,
                username=host.user,
                key_filename=host.key_file or None,
                allow_agent=not host.key_file,
                look_for_keys=False,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
            )
        except SshError as error:
            self._client.close()
            raise SshError(f"{host.name}: {error}") from None
        except paramiko.BadHostKeyException as error:
            self._client.close()
            raise SshError(
                f"{host.name}: the host key of {host.address}:{host.port} CHANGED "
                f"(got {error.key.get_name()} {error.key.get_base64()[:16]}..., known_hosts has "
                f"{error.expected_key.get_base64()[:16]}...); refusing to connect. If the host was "
                f"reinstalled, remove its line from {host.known_hosts}"
            ) from None
        except paramiko.AuthenticationException as error:
            self._client.close()
            how = f"key {host.key_file}" if host.key_file else "the ssh-agent's keys"
            raise SshError(f"{host.name}: {host.where} refused {how}: {error}") from None
        except TimeoutError:
            self._client.close()
            raise SshError(
                f"{host.name}: {host.where} did not answer within {timeout:g} s"
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as error:
            self._client.close()
            detail = error.strerror if isinstance(error, OSError) and error.strerror else error
            raise SshError(f"{host.name}: cannot connect to {host.where}: {detail}") from None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close SFTP and the connection."""
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        self._client.close()

    def run(
        self, command: str, timeout_s: float | None = None, check: bool = True, step: str = ""
    ) -> Completed:
        """Run `command` under the login shell's `sh -c`, wait at most `timeout_s`.

        Raises:
            SshError: the command did not finish in time, the connection broke, or (with `check`)
                it exited non-zero; the message has the tail of what it printed to stderr.
        """
        deadline_s = self.command_timeout_s if timeout_s is None else timeout_s
        label = step or command.split()[0]
        try:
            transport = self._client.get_transport()
            if transport is None or not transport.is_active():
                raise SshError(f"{self.host.name}: {label}: the connection is closed")
            channel = transport.open_session(timeout=deadline_s)
            channel.settimeout(deadline_s)
            channel.exec_command(f"sh -c {shlex.quote(command)}")
            channel.shutdown_write()
            out, err = io.BytesIO(), io.BytesIO()
            end = time.monotonic() + deadline_s
            idle_s = _POLL_MIN_S
            while True:
                if channel.recv_ready():
                    out.write(channel.recv(65536))
                    idle_s = _POLL_MIN_S
                elif channel.recv_stderr_ready():
                    err.write(channel.recv_stderr(65536))
                    idle_s = _POLL_MIN_S
                elif channel.exit_status_ready():
                    # Drain what arrived with the exit status.
                    while channel.recv_ready():
                        out.write(channel.recv(65536))
                    while channel.recv_stderr_ready():
                        err.write(channel.recv_stderr(65536))
                    break
                elif time.monotonic() > end:
                    channel.close()
                    raise SshError(
                        f"{self.host.name}: {label} did not finish within {deadline_s:g} s"
                    )
                else:
                    # Quick commands answer in a few ms; a long one (pip) is polled ever less often.
                    time.sleep(idle_s)
                    idle_s = min(idle_s * 2, _POLL_MAX_S)
            status = channel.recv_exit_status()
            channel.close()
        except (OSError, paramiko.SSHException, EOFError) as error:
            raise SshError(f"{self.host.name}: {label}: connection failed: {error}") from None
        result = Completed(
            command,
            status,
            out.getvalue().decode(errors="replace"),
            err.getvalue().decode(errors="replace"),
        )
        if check and status != 0:
            tail = (result.stderr.strip() or result.stdout.strip())[-600:]
            raise SshError(f"{self.host.name}: {label} failed (exit {status}): {tail}")
        return result

    @property
    def sftp(self) -> paramiko.SFTPClient:
        """The connection's SFTP session (opened on first use)."""
        if self._sftp is None:
            try:
                self._sftp = self._client.open_sftp()
                self._sftp.get_channel().settimeout(self.command_timeout_s)
            except (OSError, paramiko.SSHException) as error:
                raise SshError(f"{self.host.name}: cannot open SFTP: {error}") from None
        return self._sftp

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write `data` to the absolute `path` atomically (a temporary name, then rename), with
        `mode` set before any byte is written.

        Raises:
            SshError: the write failed.
        """
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            with self.sftp.open(tmp, "wb") as handle:
                self.sftp.chmod(tmp, mode)
                handle.write(data)
            self.sftp.posix_rename(tmp, path)
        except (OSError, paramiko.SSHException) as error:
            with contextlib.suppress(OSError, paramiko.SSHException):
                self.sftp.remove(tmp)
            raise SshError(f"{self.host.name}: cannot write {path}: {error}") from None

    def upload(self, local: Path, path: str, mode: int = 0o644) -> None:
        """Copy the local file to the absolute remote `path` (atomically, as write_file).

        Raises:
            SshError: the copy failed.
        """
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            self.sftp.put(str(local), tmp)
            self.sftp.chmod(tmp, mode)
            self.sftp.posix_rename(tmp, path)
        except (OSError, paramiko.SSHException) as error:
            raise SshError(f"{self.host.name}: cannot upload {local.name}: {error}") from None

    def read_file(self, path: str) -> bytes | None:
        """The remote file's bytes, or None when it does not exist.

        Raises:
            SshError: it exists but cannot be read.
        """
        try:
            with self.sftp.open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException) as error:
            raise SshError(f"{self.host.name}: cannot read {path}: {error}") from None

    def listdir_sizes(self, path: str) -> dict[str, int]:
        """Regular files in the remote folder with their sizes ({} when it does not exist)."""
        try:
            return {
                entry.filename: entry.st_size or 0
                for entry in self.sftp.listdir_attr(path)
                if entry.st_mode is not None and stat.S_ISREG(entry.st_mode)
            }
        except FileNotFoundError:
            return {}
        except (OSError, paramiko.SSHException) as error:
            raise SshError(f"{self.host.name}: cannot list {path}: {error}") from None
