"""Domain errors of the tracker; the servicer maps each to a gRPC status or a proto Status.

TrackerError
├── InvalidArgument   a request field is malformed         -> grpc INVALID_ARGUMENT
├── LeaseLost         a lease is not (or no longer) active -> Status DEVICE_LOST / released=false
├── UnknownStore      --store names no implementation      -> CLI usage error
└── StoreUnavailable  the store cannot be reached (redis down) -> grpc UNAVAILABLE with the reason
"""

from __future__ import annotations


class TrackerError(Exception):
    """Base of every error the tracker raises on purpose."""


class InvalidArgument(TrackerError):
    """A request field is malformed; the message names the field."""


class LeaseLost(TrackerError):
    """The lease is unknown or has ended; the message is the reason given to the client."""

    @property
    def reason(self) -> str:
        return str(self)


class UnknownStore(TrackerError):
    """No store implementation has the requested name."""


class StoreUnavailable(TrackerError):
    """The store cannot be reached right now; the message says why. Clients retry."""
