"""The inventory: which hosts get an agent, how to reach them, and what each serves.

A TOML file; every `[[host]]` takes its settings from `[defaults]` unless it names its own:

    [pool]
    tracker = "10.0.0.5:9190"        # the tracker as the agents reach it
    secrets = "pool.secrets"         # this workstation's pool secrets (see protos.auth)
    tracker_tls_ca = ""              # agents reach the tracker over TLS trusting this CA (optional)

    [defaults]
    user = "kiln"
    port = 22
    key_file = "~/.ssh/id_ed25519"   # omitted: the keys of a running ssh-agent
    known_hosts = "~/.ssh/known_hosts"
    root = ""                        # install folder; default .kiln-agent/<name> under the login's
                                     # home, /var/lib/kiln-agent/<name> for service = "systemd"
    service = "systemd-user"         # systemd | systemd-user | process
    python = "python3"
    backend = "cpu"
    devices = 1
    listen = "0.0.0.0:9300"
    connect_timeout_s = 10

    [[host]]
    name = "edge1"                   # the agent's id at the tracker; devices are edge1/0, edge1/1
    address = "10.0.0.11"
    key = "arm-a72"
    tags = { board = "rpi4" }
    devices = 2

Relative paths of this machine (`secrets`, `key_file`, `known_hosts`, `tracker_tls_ca`) are taken
from the inventory file's folder. Parsing checks everything it can without a network, so a typo
fails before any host is touched.
"""

from __future__ import annotations

import getpass
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protos.ids import identifier_problem

SERVICES = ("systemd", "systemd-user", "process")

_POOL_KEYS = {"tracker", "secrets", "tracker_tls_ca"}
_HOST_KEYS = {
    "name",
    "address",
    "user",
    "port",
    "key_file",
    "known_hosts",
    "root",
    "service",
    "python",
    "key",
    "tags",
    "backend",
    "devices",
    "listen",
    "advertise_host",
    "agent_args",
    "connect_timeout_s",
}


class InventoryError(ValueError):
    """The inventory cannot be read or says something impossible; the message names where."""


@dataclass(frozen=True)
class Host:
    """One machine that runs one agent.

    `root` is where everything of Kiln's lives on the host (virtualenv, wheels, secrets, artifact
    cache, service files of the `process` manager); relative roots are under the login's home.
    """

    name: str
    address: str
    key: str
    user: str = ""
    port: int = 22
    key_file: str = ""
    known_hosts: str = ""
    root: str = ""
    service: str = "systemd-user"
    python: str = "python3"
    tags: dict[str, str] = field(default_factory=dict)
    backend: str = "cpu"
    devices: int = 1
    listen: str = "0.0.0.0:9300"
    advertise_host: str = ""
    agent_args: tuple[str, ...] = ()
    connect_timeout_s: float = 10.0

    @property
    def unit_name(self) -> str:
        """The service's name on the host (several agents may share one host)."""
        return f"kiln-agent-{self.name}"

    @property
    def device_ids(self) -> tuple[str, ...]:
        """The ids its agent registers: "<name>/<index>"."""
        return tuple(f"{self.name}/{i}" for i in range(self.devices))

    @property
    def where(self) -> str:
        """user@address:port, for messages."""
        return f"{self.user}@{self.address}:{self.port}"


@dataclass(frozen=True)
class Inventory:
    """A parsed inventory file."""

    path: Path
    tracker: str
    secrets: Path
    hosts: tuple[Host, ...]
    tracker_tls_ca: Path | None = None

    def select(self, names: list[str] | None) -> tuple[Host, ...]:
        """The hosts named (all when `names` is empty or None), in inventory order.

        Raises:
            InventoryError: a name that no host has.
        """
        if not names:
            return self.hosts
        known = {host.name for host in self.hosts}
        unknown = [name for name in names if name not in known]
        if unknown:
            raise InventoryError(
                f"{self.path}: no host named {', '.join(unknown)} (hosts: {', '.join(sorted(known))})"
            )
        return tuple(host for host in self.hosts if host.name in names)


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and check an inventory file.

    Raises:
        InventoryError: the file is unreadable, not TOML, or has a missing, unknown or bad setting.
    """
    where = Path(path)
    try:
        data = tomllib.loads(where.read_text())
    except OSError as error:
        raise InventoryError(f"cannot read inventory {where}: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise InventoryError(f"{where}: not valid TOML: {error}") from None
    return parse_inventory(data, where)


def parse_inventory(data: dict[str, Any], where: Path) -> Inventory:
    """An Inventory from parsed TOML; `where` names the file in messages and anchors paths.

    Raises:
        InventoryError: a missing, unknown or bad setting.
    """
    unknown_tables = set(data) - {"pool", "defaults", "host"}
    if unknown_tables:
        raise InventoryError(f"{where}: unknown section(s) {', '.join(sorted(unknown_tables))}")
    pool = _table(data, "pool", where)
    defaults = _table(data, "defaults", where)
    _no_unknown(pool, _POOL_KEYS, f"{where} [pool]")
    _no_unknown(defaults, _HOST_KEYS - {"name", "address"}, f"{where} [defaults]")
    base = where.parent
    tracker = pool.get("tracker")
    if not isinstance(tracker, str) or ":" not in tracker:
        raise InventoryError(f'{where} [pool]: tracker must be "HOST:PORT", got {tracker!r}')
    secrets = pool.get("secrets")
    if not isinstance(secrets, str) or not secrets:
        raise InventoryError(f"{where} [pool]: secrets (the pool secrets file) is required")
    ca = pool.get("tracker_tls_ca") or None
    raw_hosts = data.get("host", [])
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise InventoryError(f"{where}: no [[host]] entries")
    hosts = tuple(
        _host(entry, defaults, base, f"{where} host #{i + 1}") for i, entry in enumerate(raw_hosts)
    )
    seen: set[str] = set()
    for host in hosts:
        if host.name in seen:
            raise InventoryError(f"{where}: two hosts are named {host.name!r}")
        seen.add(host.name)
    return Inventory(
        path=where,
        tracker=tracker,
        secrets=_local_path(secrets, base),
        hosts=hosts,
        tracker_tls_ca=_local_path(ca, base) if isinstance(ca, str) else None,
    )


def _table(data: dict[str, Any], name: str, where: Path) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise InventoryError(f"{where}: [{name}] must be a table")
    return value


def _no_unknown(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(table) - allowed
    if unknown:
        raise InventoryError(
            f"{where}: unknown setting(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(allowed))})"
        )


def _local_path(text: str, base: Path) -> Path:
    path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else base / path


def _default_root(service: str, name: str) -> str:
    return f"/var/lib/kiln-agent/{name}" if service == "systemd" else f".kiln-agent/{name}"


def _host(entry: Any, defaults: dict[str, Any], base: Path, where: str) -> Host:
    if not isinstance(entry, dict):
        raise InventoryError(f"{where}: must be a table")
    _no_unknown(entry, _HOST_KEYS, where)
    merged = {**defaults, **entry}
    name = merged.get("name")
    if isinstance(name, str):
        where = f"{where} ({name})"
    for field_name in ("name", "address", "key"):
        if not isinstance(merged.get(field_name), str) or not merged[field_name]:
            raise InventoryError(f"{where}: {field_name} is required")
    for field_name, label in (("name", "host name (the agent id)"), ("key", "key")):
        problem = identifier_problem(label, merged[field_name])
        if problem:
            raise InventoryError(f"{where}: {problem}")
    strings = ("user", "key_file", "known_hosts", "root", "python", "backend", "listen")
    for field_name in (*strings, "advertise_host"):
        if field_name in merged and not isinstance(merged[field_name], str):
            raise InventoryError(f"{where}: {field_name} must be a string")
    service = merged.get("service", "systemd-user")
    if service not in SERVICES:
        raise InventoryError(
            f"{where}: service must be one of {', '.join(SERVICES)}, got {service!r}"
        )
    port = merged.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InventoryError(f"{where}: port must be 1..65535, got {port!r}")
    devices = merged.get("devices", 1)
    if not isinstance(devices, int) or isinstance(devices, bool) or not 1 <= devices <= 1024:
        raise InventoryError(f"{where}: devices must be 1..1024, got {devices!r}")
    timeout = merged.get("connect_timeout_s", 10.0)
    if not isinstance(timeout, int | float) or not (math.isfinite(timeout) and timeout > 0):
        raise InventoryError(f"{where}: connect_timeout_s must be a positive number")
    tags = merged.get("tags", {})
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise InventoryError(f'{where}: tags must be a table of strings, e.g. {{ board = "rpi4" }}')
    agent_args = merged.get("agent_args", [])
    if not isinstance(agent_args, list) or not all(isinstance(a, str) for a in agent_args):
        raise InventoryError(f"{where}: agent_args must be a list of strings")
    listen = merged.get("listen", "0.0.0.0:9300")
    if ":" not in listen:
        raise InventoryError(f'{where}: listen must be "HOST:PORT", got {listen!r}')
    root = merged.get("root", "")
    if root and os.path.normpath(root) in ("/", ".", "~", ".."):
        raise InventoryError(f"{where}: root must be a folder of Kiln's own, got {root!r}")
    key_file = merged.get("key_file", "")
    known_hosts = merged.get("known_hosts", "~/.ssh/known_hosts")
    return Host(
        name=merged["name"],
        address=merged["address"],
        key=merged["key"],
        user=merged.get("user", "") or getpass.getuser(),
        port=port,
        key_file=str(_local_path(key_file, base)) if key_file else "",
        known_hosts=str(_local_path(known_hosts, base)),
        root=root or _default_root(service, merged["name"]),
        service=service,
        python=merged.get("python", "python3"),
        tags=dict(tags),
        backend=merged.get("backend", "cpu"),
        devices=devices,
        listen=listen,
        advertise_host=merged.get("advertise_host", "") or merged["address"],
        agent_args=tuple(agent_args),
        connect_timeout_s=float(timeout),
    )
