"""The test kit's kernels (device_agent.testing) as tuner artifacts, for tests of runners."""

from __future__ import annotations

import hashlib

from compiler.artifact import ArgSpec, Artifact, Entry
from device_agent.testing import kernel_entry


def kit_artifact(
    data: bytes, first: str, others: tuple[str, ...] = ("add_one", "hang")
) -> Artifact:
    """The kit's shared object `data` as a tuner artifact whose first entry (the one a runner
    measures) is `first`, followed by `others`."""
    entries = []
    for symbol in (first, *(s for s in others if s != first)):
        e = kernel_entry(symbol)
        args = tuple(ArgSpec(a.name, a.shape, a.dtype, a.role.value.lower()) for a in e.args)
        entries.append(Entry(e.symbol, e.timing_symbol, args, e.flop))
    return Artifact(data, hashlib.sha256(data).hexdigest(), "shared_object", "host", tuple(entries))
