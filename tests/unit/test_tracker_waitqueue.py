"""WaitQueue: grant order, lookup by request id and the per-key count stay one consistent index."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.model import LeaseRequest, QueueTicket
from tracker.waitqueue import Waiter, WaitQueue

KEYS = ("", "cpu", "gpu")

# (push?, request number 0-7, key, priority): a request id pushed again replaces its waiter.
_STEPS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 7), st.sampled_from(KEYS), st.integers(0, 2)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_STEPS)
def test_order_lookup_and_key_counts_follow_every_push_and_remove(
    steps: list[tuple[bool, int, str, int]],
) -> None:
    async def run() -> None:
        queue, model, seq = WaitQueue(), {}, 0
        for push, number, key, priority in steps:
            request_id = f"r{number}"
            if push:
                seq += 1
                ticket = QueueTicket(request_id, priority, seq)
                waiter = Waiter(LeaseRequest(key=key, request_id=request_id), ticket, 0.0)
                queue.push(waiter)
                model[request_id] = waiter
            elif request_id in model:
                queue.remove(model.pop(request_id))
            expected = sorted(model.values(), key=lambda w: w.order)
            assert list(queue) == expected
            assert len(queue) == len(expected)
            for name in (f"r{n}" for n in range(8)):
                assert queue.find(name) is model.get(name)
            for wanted in ("cpu", "gpu", "npu"):
                keys = {w.request.key for w in expected}
                assert queue.may_want(wanted) == bool(keys & {wanted, ""})

    asyncio.run(run())


def test_removing_a_replaced_waiter_leaves_its_successor_queued() -> None:
    async def run() -> None:
        queue = WaitQueue()
        first = Waiter(LeaseRequest(key="cpu", request_id="r"), QueueTicket("r", 0, 1), 0.0)
        second = Waiter(LeaseRequest(key="gpu", request_id="r"), QueueTicket("r", 0, 2), 0.0)
        queue.push(first)
        queue.push(second)
        queue.remove(first)
        assert list(queue) == [second]
        assert queue.may_want("gpu") and not queue.may_want("cpu")

    asyncio.run(run())
