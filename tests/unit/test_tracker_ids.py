"""Ids, keys and device counts a Register may carry: refused at the door, naming the field.

A device id with '|' used to pass registration, then fail every grant for its key with INTERNAL
(the lease-token signer refuses '|') and leave the request queued; 40,000 devices from one agent
made every ListDevices answer overflow the message limit.
"""

from __future__ import annotations

import re

import pytest

from protos.ids import MAX_ID_CHARS
from tracker.errors import InvalidArgument
from tracker.model import DeviceSpec
from tracker.validation import MAX_DEVICES_PER_AGENT, registration


def test_well_formed_ids_pass_and_empty_device_ids_are_filled() -> None:
    reg = registration(
        "vm-12.lab:a@b+c", "h:1", [DeviceSpec("", "x86-avx512"), DeviceSpec("d/1", "k")]
    )
    assert [d.device_id for d in reg.devices] == ["vm-12.lab:a@b+c/0", "d/1"]


@pytest.mark.parametrize(
    ("agent_id", "spec", "field"),
    [
        ("a|b", DeviceSpec("", "k"), "agent_id"),
        ("agent", DeviceSpec("dev|0", "k"), "devices[0].device_id"),
        ("agent", DeviceSpec("", "key with spaces"), "devices[0].key"),
        ("agent", DeviceSpec("", "k\n"), "devices[0].key"),
        ("x" * (MAX_ID_CHARS + 1), DeviceSpec("", "k"), "agent_id"),
        ("agent", DeviceSpec("d" * (MAX_ID_CHARS + 1), "k"), "devices[0].device_id"),
    ],
)
def test_a_malformed_id_or_key_is_refused_naming_it(
    agent_id: str, spec: DeviceSpec, field: str
) -> None:
    with pytest.raises(InvalidArgument, match=rf"^{re.escape(field)} must be 1 to"):
        registration(agent_id, "h:1", [spec])


def test_too_many_devices_from_one_agent_are_refused() -> None:
    specs = [DeviceSpec("", "k")] * (MAX_DEVICES_PER_AGENT + 1)
    with pytest.raises(InvalidArgument, match=f"at most {MAX_DEVICES_PER_AGENT} devices"):
        registration("agent", "h:1", specs)
    assert len(registration("agent", "h:1", specs[:-1]).devices) == MAX_DEVICES_PER_AGENT
