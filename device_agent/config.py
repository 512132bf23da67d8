"""The agent's configuration record."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from protos.auth import PoolSecrets, TlsFiles

DEFAULT_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "kiln", "agent")


@dataclass(frozen=True)
class AgentConfig:
    """Everything an agent process is configured with.

    `agent_id` empty means a stable id from the host, the key and the cache dir ("<hostname>-<key>"
    with the default cache dir; see `device_agent.agent.default_agent_id`), so an agent restarted
    on the same host re-registers the same device ids and the tracker replaces them. Device ids
    are "<agent_id>/<index>" for index in range(devices). `tracker_address` empty means serve
    standalone without registering; with one, a graceful stop deregisters the devices.

    `secrets` None is dev mode: every call is accepted and leases are not checked. With secrets, the
    agent's RPCs need the `client` (or `admin`) token, Measure and Run need a fencing token signed
    with `lease_key`, and Register/Heartbeat carry the `agent` token.

    `pin_cores` pins device i's executor child to core `pin_cores[i % len(pin_cores)]`; empty means
    no pinning. `core_sets` (one per device, disjoint; instead of `pin_cores`) pins device i's
    child to the cores of `core_sets[i]` and tags it `threads=<their number>`: its kernels run
    on that many OpenMP threads, one bound to each core. Every other device runs on one thread.

    A backend whose devices are hardware of their own (cuda: one device per GPU; see
    `device_agent.agent.PerDeviceBackend`) can serve `all_devices` (one device per GPU it finds;
    `devices` is then ignored) or `device_indices` (those GPUs, by the driver's ordinal, one
    device each, in that order; `devices` is then their number).

    Raises:
        ValueError: `max_job_s` is not a positive number, `core_sets` has not one non-empty
            set per device, `device_indices` repeats one or is negative, or `all_devices` comes
            with `device_indices` or `core_sets`.
    """

    key: str = "local"
    backend: str = "cpu"
    devices: int = 1
    all_devices: bool = False
    device_indices: tuple[int, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)
    agent_id: str = ""
    advertise_host: str = "127.0.0.1"
    tracker_address: str = ""
    cache_dir: str = DEFAULT_CACHE_DIR
    max_artifact_bytes: int = 256 * 1024 * 1024
    # Least recently used artifacts are evicted past this total (artifacts in use never are).
    cache_max_bytes: int = 2 * 1024 * 1024 * 1024
    # Applied with RLIMIT_AS in each executor child, so a runaway allocation fails there.
    executor_address_space_bytes: int = 8 * 1024 * 1024 * 1024
    default_timeout_s: float = 60.0
    # No job runs longer than this, whatever timeout it asks for; its lease may end it sooner.
    max_job_s: float = 600.0
    # A request waits this long (at most until its lease ends) for its device's previous job.
    device_wait_s: float = 600.0
    rpc_timeout_s: float = 5.0
    reregister_backoff_initial_s: float = 0.1
    reregister_backoff_cap_s: float = 5.0
    stop_grace_s: float = 2.0
    # An entry of an artifact that crashed or timed out this many times is refused (0 = never).
    quarantine_after: int = 3
    pin_cores: tuple[int, ...] = ()
    core_sets: tuple[tuple[int, ...], ...] = ()
    secrets: PoolSecrets | None = None
    # Accepted clock difference between the tracker's host and this one for lease expiry.
    lease_leeway_s: float = 2.0
    tls: TlsFiles = field(default_factory=TlsFiles)
    tracker_tls: TlsFiles = field(default_factory=TlsFiles)

    def __post_init__(self) -> None:
        if self.device_indices:
            if len(set(self.device_indices)) != len(self.device_indices):
                raise ValueError(f"device_indices names a device twice: {self.device_indices}")
            if min(self.device_indices) < 0:
                raise ValueError(f"device_indices must be >= 0: {self.device_indices}")
            # `devices` follows the list, so whoever counts devices reads one number.
            object.__setattr__(self, "devices", len(self.device_indices))
        if self.all_devices and (self.device_indices or self.core_sets):
            raise ValueError("all_devices takes neither device_indices nor core_sets")
        if self.core_sets and len(self.core_sets) != self.devices:
            raise ValueError(
                f"core_sets has {len(self.core_sets)} sets for {self.devices} devices: one each"
            )
        if any(not cores for cores in self.core_sets):
            raise ValueError("core_sets: a device's core set is empty")
        if not (math.isfinite(self.max_job_s) and self.max_job_s > 0):
            raise ValueError(
                f"max_job_s must be a positive number of seconds, got {self.max_job_s!r}"
            )
