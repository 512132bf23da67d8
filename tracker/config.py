"""Tracker configuration: one frozen record, units in the field names."""

from __future__ import annotations

import dataclasses

# gRPC's default receive limit. Tracker messages are small; the cap stops a bad client from making
# the server buffer a huge Register.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Fields for which 0 means "off" rather than a bad value.
_MAY_BE_ZERO = frozenset({"startup_grace_s"})


@dataclasses.dataclass(frozen=True)
class TrackerConfig:
    """How the tracker times out agents and leases and how its server is sized."""

    heartbeat_interval_s: float = 2.0
    """Told to agents in RegisterResponse; they heartbeat this often."""
    heartbeat_grace_periods: float = 2.0
    """An agent silent for this many intervals is expired and its devices become LOST."""
    default_lease_ttl_s: float = 30.0
    """TTL of a lease when the client asks for 0."""
    max_lease_ttl_s: float = 600.0
    """Longer requested TTLs are clamped to this, so a dead client frees its device in time."""
    max_acquire_wait_s: float = 3600.0
    """Longer Acquire timeouts are clamped to this: no request waits forever."""
    reap_interval_s: float = 0.5
    """How often the reaper looks for silent agents and expired leases."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    store: str = "memory"
    """Store: "memory" or a Redis URL (redis://, rediss://, redis+unix://; see tracker.store)."""
    lost_device_retention_s: float = 3600.0
    """A device LOST (agent silent) for longer than this is forgotten by the expiry sweep."""
    queued_request_ttl_s: float = 5.0
    """A queued Acquire in the store lives this long unless its tracker refreshes it (every reap),
    so the entries of a dead tracker stop blocking the queue unless a client re-attaches."""
    startup_grace_s: float = 10.0
    """For this long after the tracker starts, an Acquire whose selector no registered device
    matches waits (to its deadline, or to the end of the grace) instead of failing at once: a
    restarted tracker over the memory store knows no device until its agents register again, which
    takes them up to one heartbeat interval plus their re-register backoff (5 s cap). 0 = fail
    fast from the start (tests, or a redis store that kept the registrations)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in _MAY_BE_ZERO:
                if value < 0:
                    raise ValueError(f"TrackerConfig.{field.name} must be >= 0, got {value!r}")
            elif isinstance(value, int | float) and value <= 0:
                raise ValueError(f"TrackerConfig.{field.name} must be > 0, got {value!r}")
        if self.default_lease_ttl_s > self.max_lease_ttl_s:
            raise ValueError(
                f"TrackerConfig.default_lease_ttl_s ({self.default_lease_ttl_s}) must not exceed "
                f"max_lease_ttl_s ({self.max_lease_ttl_s})"
            )
        if self.queued_request_ttl_s <= self.reap_interval_s:
            raise ValueError(
                f"TrackerConfig.queued_request_ttl_s ({self.queued_request_ttl_s}) must exceed "
                f"reap_interval_s ({self.reap_interval_s}), which refreshes queued requests"
            )

    @property
    def agent_timeout_s(self) -> float:
        """Seconds of heartbeat silence after which an agent is expired."""
        return self.heartbeat_interval_s * self.heartbeat_grace_periods
