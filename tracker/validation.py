"""Checks on incoming requests; each failure names the offending field."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from protos.ids import identifier_problem
from tracker.errors import InvalidArgument
from tracker.model import DeviceSpec, LeaseRequest, Registration

# Tags live in the store and in every ListDevices answer, and selectors in the queue, so they are
# bounded far below the message limit. An agent's own tags are a few dozen characters; the longest
# (features: a CPU's code-generation ISA flags) a few hundred.
MAX_TAGS = 64
MAX_TAG_NAME_CHARS = 64
MAX_TAG_VALUE_CHARS = 1024
# Devices one agent may register: every ListDevices answer holds them all.
MAX_DEVICES_PER_AGENT = 256


def identifier(field: str, value: str) -> None:
    """Raise InvalidArgument (naming `field`) unless `value` may be an id or key (`protos.ids`)."""
    problem = identifier_problem(field, value)
    if problem is not None:
        raise InvalidArgument(problem)


def agent_id(value: str) -> None:
    """Raise InvalidArgument for an empty or malformed agent_id (see `identifier`)."""
    if not value:
        raise InvalidArgument("agent_id must not be empty")
    identifier("agent_id", value)


def registration(agent_id: str, agent_address: str, devices: Sequence[DeviceSpec]) -> Registration:
    """Validate a Register call and fill defaults.

    An empty device_id becomes "<agent_id>/<index>"; an empty agent_address on a device becomes
    the request's.

    Raises:
        InvalidArgument: an empty or malformed agent_id, key or device_id (see `identifier`),
            more than MAX_DEVICES_PER_AGENT devices, a duplicated device_id, or tags past the
            bounds (see `tags`).
    """
    if not agent_id:
        raise InvalidArgument("agent_id must not be empty")
    identifier("agent_id", agent_id)
    if len(devices) > MAX_DEVICES_PER_AGENT:
        raise InvalidArgument(
            f"an agent may register at most {MAX_DEVICES_PER_AGENT} devices, got {len(devices)}"
        )
    filled: list[DeviceSpec] = []
    seen: dict[str, int] = {}
    for index, spec in enumerate(devices):
        if not spec.key:
            raise InvalidArgument(f"devices[{index}].key must not be empty")
        identifier(f"devices[{index}].key", spec.key)
        tags(f"devices[{index}].tags", spec.tags)
        device_id = spec.device_id or f"{agent_id}/{index}"
        identifier(f"devices[{index}].device_id", device_id)
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


def tags(field: str, values: Mapping[str, str]) -> None:
    """Raise InvalidArgument (naming `field`) for more than MAX_TAGS tags, an empty or overlong
    name, or an overlong value."""
    if len(values) > MAX_TAGS:
        raise InvalidArgument(f"{field} must have at most {MAX_TAGS} tags, got {len(values)}")
    for name, value in values.items():
        if not name or len(name) > MAX_TAG_NAME_CHARS:
            raise InvalidArgument(
                f"{field} names must be 1 to {MAX_TAG_NAME_CHARS} characters, got {name[:80]!r}"
            )
        if len(value) > MAX_TAG_VALUE_CHARS:
            raise InvalidArgument(
                f"{field}[{name!r}] must be at most {MAX_TAG_VALUE_CHARS} characters, "
                f"got {len(value)}"
            )


def non_negative_seconds(name: str, value: float) -> None:
    """Raise InvalidArgument unless `value` is a finite number >= 0."""
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{name} must be a finite number >= 0, got {value!r}")


def lease_request(request: LeaseRequest) -> None:
    """Raise InvalidArgument for a negative or non-finite timeout_s or lease_ttl_s, or a
    tag_selector past the bounds of `tags`."""
    non_negative_seconds("timeout_s", request.timeout_s)
    non_negative_seconds("lease_ttl_s", request.lease_ttl_s)
    tags("tag_selector", request.tag_selector)


def lease_id(value: str) -> None:
    """Raise InvalidArgument for an empty lease_id."""
    if not value:
        raise InvalidArgument("lease_id must not be empty")
