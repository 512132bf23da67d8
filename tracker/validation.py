"""Checks on incoming requests; each failure names the offending field."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tracker.errors import InvalidArgument
from tracker.model import DeviceSpec, LeaseRequest, Registration


def registration(agent_id: str, agent_address: str, devices: Sequence[DeviceSpec]) -> Registration:
    """Validate a Register call and fill defaults.

    An empty device_id becomes "<agent_id>/<index>"; an empty agent_address on a device becomes
    the request's.

    Raises:
        InvalidArgument: empty agent_id, a device without key, or a duplicated device_id.
    """
    if not agent_id:
        raise InvalidArgument("agent_id must not be empty")
    filled: list[DeviceSpec] = []
    seen: dict[str, int] = {}
    for index, spec in enumerate(devices):
        if not spec.key:
            raise InvalidArgument(f"devices[{index}].key must not be empty")
        device_id = spec.device_id or f"{agent_id}/{index}"
        if device_id in seen:
            raise InvalidArgument(
                f"devices[{index}].device_id {device_id!r} duplicates devices[{seen[device_id]}]"
            )
        seen[device_id] = index
        filled.append(
            dataclasses.replace(
                spec, device_id=device_id, agent_address=spec.agent_address or agent_address
            )
        )
    return Registration(agent_id, agent_address, tuple(filled))


def non_negative_seconds(name: str, value: float) -> None:
    """Raise InvalidArgument unless `value` is a finite number >= 0."""
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{name} must be a finite number >= 0, got {value!r}")


def lease_request(request: LeaseRequest) -> None:
    """Raise InvalidArgument for a negative or non-finite timeout_s or lease_ttl_s."""
    non_negative_seconds("timeout_s", request.timeout_s)
    non_negative_seconds("lease_ttl_s", request.lease_ttl_s)


def lease_id(value: str) -> None:
    """Raise InvalidArgument for an empty lease_id."""
    if not value:
        raise InvalidArgument("lease_id must not be empty")
