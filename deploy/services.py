"""How an agent runs as a service on its host: systemd (system or --user), or a supervised process.

- `systemd`: a system unit in /etc/systemd/system, run as the dedicated user `kiln-agent` (created
  when missing), with systemd's hardening options (deploy.units). Needs root or passwordless sudo.
- `systemd-user`: a unit in ~/.config/systemd/user run by the login's own systemd; lingering is
  enabled so it runs without a session.
- `process`: for hosts with no systemd (containers, minimal boards): a shell supervisor started
  with setsid that restarts the agent when it fails, as Restart=on-failure would, and stops it
  with SIGTERM (the agent then deregisters its devices) on `stop`.

Each manager writes its definition only when it differs from what the host has, and says whether
it changed, so a second `kiln deploy up` changes nothing.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol

from deploy.inventory import Host
from deploy.ssh import Connection, SshError

SERVICE_USER = "kiln-agent"
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Layout:
    """Where an agent's files live on its host (all absolute)."""

    root: str

    @property
    def venv(self) -> str:
        return f"{self.root}/venv"

    @property
    def python(self) -> str:
        return f"{self.root}/venv/bin/python"

    @property
    def wheels(self) -> str:
        return f"{self.root}/wheels"

    @property
    def secrets(self) -> str:
        return f"{self.root}/pool.secrets"

    @property
    def tracker_ca(self) -> str:
        return f"{self.root}/tracker-ca.pem"

    @property
    def cache(self) -> str:
        return f"{self.root}/cache"

    @property
    def installed(self) -> str:
        """The version of the agent installed in the venv (written after pip succeeds)."""
        return f"{self.root}/installed-version"

    @property
    def log(self) -> str:
        return f"{self.root}/agent.log"


class ServiceManager(Protocol):
    """Installs, starts, stops and removes one host's agent service."""

    def install(self, conn: Connection, argv: list[str]) -> bool:
        """Write the service definition for `argv`; True when it changed."""

    def is_active(self, conn: Connection) -> bool:
        """Whether the agent's service is running."""

    def start(self, conn: Connection) -> None:
        """Start the service (and enable it at boot where the manager can)."""

    def restart(self, conn: Connection) -> None:
        """Stop the service if it runs, then start it."""

    def stop(self, conn: Connection) -> None:
        """Stop the service gracefully (SIGTERM: the agent deregisters), waiting for it to end."""

    def remove(self, conn: Connection) -> None:
        """Stop it and delete its definition."""


def manager_for(host: Host, layout: Layout) -> ServiceManager:
    """The manager the host's `service` setting names."""
    if host.service == "process":
        return ProcessService(host, layout)
    return SystemdService(host, layout, user_mode=host.service == "systemd-user")


def _same(conn: Connection, path: str, text: str) -> bool:
    current = conn.read_file(path)
    return current is not None and current == text.encode()


class ProcessService:
    """A supervisor shell script run with setsid; its pid file says whether it runs."""

    def __init__(self, host: Host, layout: Layout) -> None:
        self.host = host
        self.layout = layout
        self.script = f"{layout.root}/run-agent.sh"
        self.pid_file = f"{layout.root}/supervisor.pid"

    def render(self, argv: list[str]) -> str:
        """The supervisor script for `argv`."""
        command = " ".join(shlex.quote(arg) for arg in argv)
        log = shlex.quote(self.layout.log)
        return f"""#!/bin/sh
# Written by `kiln deploy` for agent {self.host.name}: runs it, restarting it when it fails.
# SIGTERM stops the agent gracefully (it deregisters its devices) and then this script.
cd {shlex.quote(self.layout.root)} || exit 1
echo $$ > {shlex.quote(self.pid_file)}
child=
stop() {{
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null && wait "$child"
  rm -f {shlex.quote(self.pid_file)}
  exit 0
}}
trap stop TERM INT
while :; do
  if [ -f {log} ] && [ "$(wc -c < {log})" -gt 10485760 ]; then mv -f {log} {log}.1; fi
  {command} >>{log} 2>&1 </dev/null &
  child=$!
  wait "$child"
  status=$?
  [ "$status" -eq 0 ] && break
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) kiln-agent exited with status $status; restart in 2 s" >>{log}
  sleep 2
done
rm -f {shlex.quote(self.pid_file)}
"""

    def install(self, conn: Connection, argv: list[str]) -> bool:
        text = self.render(argv)
        if _same(conn, self.script, text):
            return False
        conn.write_file(self.script, text.encode(), mode=0o700)
        return True

    def _pid(self, conn: Connection) -> int | None:
        text = conn.read_file(self.pid_file)
        if not text:
            return None
        try:
            pid = int(text.strip())
        except ValueError:
            return None
        # Alive and still our script (a pid can be reused after a reboot).
        check = f"tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null"
        cmdline = conn.run(check, check=False, step="check supervisor", timeout_s=15).stdout
        return pid if self.script in cmdline else None

    def is_active(self, conn: Connection) -> bool:
        return self._pid(conn) is not None

    def start(self, conn: Connection) -> None:
        if self.is_active(conn):
            return
        script = shlex.quote(self.script)
        conn.run(
            f"setsid nohup sh {script} >/dev/null 2>&1 </dev/null &",
            step="start agent",
            timeout_s=15,
        )
        wait = (
            f"i=0; while [ ! -s {shlex.quote(self.pid_file)} ] && [ $i -lt 100 ]; "
            "do sleep 0.05; i=$((i+1)); done"
        )
        conn.run(wait, step="wait for supervisor", timeout_s=15)
        if not self.is_active(conn):
            raise SshError(f"{self.host.name}: the agent's supervisor did not start")

    def stop(self, conn: Connection) -> None:
        pid = self._pid(conn)
        if pid is None:
            return
        limit = int(STOP_TIMEOUT_S / 0.1)
        conn.run(
            f"kill -TERM {pid}; i=0; while kill -0 {pid} 2>/dev/null && [ $i -lt {limit} ]; "
            f"do sleep 0.1; i=$((i+1)); done; "
            f"if kill -0 {pid} 2>/dev/null; then kill -KILL -- -{pid}; fi",
            step="stop agent",
            timeout_s=STOP_TIMEOUT_S + 10,
        )

    def restart(self, conn: Connection) -> None:
        self.stop(conn)
        self.start(conn)

    def remove(self, conn: Connection) -> None:
        self.stop(conn)
        conn.run(f"rm -f {shlex.quote(self.script)}", step="remove supervisor", timeout_s=15)


class SystemdService:
    """A systemd unit: system (as the dedicated user, via sudo when not root) or --user."""

    def __init__(self, host: Host, layout: Layout, user_mode: bool) -> None:
        self.host = host
        self.layout = layout
        self.user_mode = user_mode
        self.unit = f"{host.unit_name}.service"
        self._sudo = "" if user_mode or host.user == "root" else "sudo -n "
        self._systemctl = "systemctl --user" if user_mode else f"{self._sudo}systemctl"

    def unit_path(self, conn: Connection) -> str:
        if self.user_mode:
            home = conn.run('printf %s "$HOME"', step="find home", timeout_s=15).stdout
            return f"{home}/.config/systemd/user/{self.unit}"
        return f"/etc/systemd/system/{self.unit}"

    def render(self, argv: list[str]) -> str:
        """The unit for `argv`."""
        from deploy.units import Service, render_unit

        return render_unit(
            Service(
                name=self.host.unit_name,
                description=f"Kiln device agent {self.host.name} ({self.host.key})",
                exec_start=tuple(argv),
                working_dir=self.layout.root,
                user_mode=self.user_mode,
                run_as="" if self.user_mode else SERVICE_USER,
                state_dirs=(self.layout.root,),
            )
        )

    def install(self, conn: Connection, argv: list[str]) -> bool:
        text = self.render(argv)
        path = self.unit_path(conn)
        if not self.user_mode:
            # Every time: files written since (secrets, wheels) must belong to the service's user.
            user = SERVICE_USER
            conn.run(
                f"id -u {user} >/dev/null 2>&1 || {self._sudo}useradd --system --no-create-home "
                f"--home-dir {shlex.quote(self.layout.root)} --shell /usr/sbin/nologin {user}",
                step="create service user",
            )
            conn.run(
                f"{self._sudo}chown -R {user}: {shlex.quote(self.layout.root)}", step="chown root"
            )
        if _same(conn, path, text):
            return False
        if self.user_mode:
            conn.run(f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}", step="unit folder")
            conn.write_file(path, text.encode(), mode=0o644)
            # Run without a login session; refused on some hosts, which then need a session.
            conn.run("loginctl enable-linger", step="enable linger", check=False, timeout_s=30)
        else:
            staged = f"{self.layout.root}/{self.unit}"
            conn.write_file(staged, text.encode(), mode=0o644)
            conn.run(
                f"{self._sudo}install -m 0644 -o root -g root {shlex.quote(staged)} {path} && "
                f"rm -f {shlex.quote(staged)}",
                step="install unit",
            )
        conn.run(f"{self._systemctl} daemon-reload", step="daemon-reload", timeout_s=60)
        return True

    def is_active(self, conn: Connection) -> bool:
        result = conn.run(f"{self._systemctl} is-active {self.unit}", check=False, timeout_s=30)
        return result.stdout.strip() == "active"

    def start(self, conn: Connection) -> None:
        conn.run(f"{self._systemctl} enable --now {self.unit}", step="start unit", timeout_s=60)

    def restart(self, conn: Connection) -> None:
        conn.run(f"{self._systemctl} restart {self.unit}", step="restart unit", timeout_s=60)

    def stop(self, conn: Connection) -> None:
        conn.run(
            f"{self._systemctl} stop {self.unit}",
            step="stop unit",
            check=False,
            timeout_s=STOP_TIMEOUT_S + 30,
        )

    def remove(self, conn: Connection) -> None:
        conn.run(f"{self._systemctl} disable --now {self.unit}", step="disable unit", check=False)
        path = self.unit_path(conn)
        conn.run(f"{self._sudo}rm -f {shlex.quote(path)}", step="remove unit")
        conn.run(f"{self._systemctl} daemon-reload", step="daemon-reload", timeout_s=60)
