"""A backend that runs nothing and reports a fixed timing, for tests of everything above the agent."""

from __future__ import annotations

import numpy as np

from device_agent.backends.base import Backend
from device_agent.domain import ArgRole, Status
from device_agent.jobs import RUN, Job, JobResult

# Every call "takes" one millisecond.
NULL_SAMPLE_S = 1e-3


class NullBackend(Backend):
    """Accepts any format, never loads it: `repeat` samples of NULL_SAMPLE_S, zeroed outputs."""

    name = "null"
    formats = frozenset({"SHARED_OBJECT", "CUBIN", "PTX", "ACCEL_PROGRAM"})
    # Nothing foreign runs, so there is nothing to sandbox and no child to spawn.
    sandboxed = False

    def execute(self, job: Job) -> JobResult:
        """A fixed result; a correctness check always passes."""
        if job.kind == RUN:
            outputs = tuple(
                np.zeros(tuple(a.shape), dtype=np.dtype(a.dtype))
                for a in job.entry.args
                if a.role is ArgRole.OUTPUT
            )
            return JobResult(Status.OK, outputs=outputs)
        repeat = max(job.timing.repeat, 1)
        return JobResult(
            Status.OK,
            samples_s=(NULL_SAMPLE_S,) * repeat,
            number_used=max(job.timing.number, 1),
        )


def create() -> NullBackend:
    """A new null backend."""
    return NullBackend()
