"""Store pieces that need no server: tokens, fences, store names and URLs, the memory store alone.

The contract every store must keep runs against memory and a real redis-server in
tests/integration/test_tracker_redis_contract.py.
"""

from __future__ import annotations

import asyncio

import pytest

from protos import fencing
from tracker import validation
from tracker.errors import UnknownStore
from tracker.model import DeviceSpec, LeaseRequest
from tracker.store import base, is_store_name, open_store
from tracker.store.memory import MemoryStore
from tracker.store.redis import DEFAULT_PREFIX, RedisStore, parse_url
from tracker.tokens import ephemeral_issuer, hmac_issuer

T0 = 1_000_000.0


def test_hmac_issuer_signs_what_an_agent_verifies() -> None:
    token = hmac_issuer(b"secret")("L1", "a/0", 42, T0 + 1.2345)
    claims = fencing.verify(b"secret", token, "L1", "a/0", now_unix=T0)
    assert claims == fencing.LeaseClaims("L1", "a/0", 42, round((T0 + 1.2345) * 1000))
    with pytest.raises(fencing.TokenError, match="signature"):
        fencing.verify(b"other", token, "L1", "a/0", now_unix=T0)
    with pytest.raises(ValueError, match="empty"):
        hmac_issuer(b"")


def test_ephemeral_tokens_have_the_shape_but_no_known_key() -> None:
    token = ephemeral_issuer()("L1", "a/0", 7, T0)
    assert token.startswith("k1.7.")
    with pytest.raises(fencing.TokenError):
        fencing.verify(b"secret", token, "L1", "a/0", now_unix=T0)


def test_next_fence_is_time_based_and_strictly_increasing() -> None:
    assert base.next_fence(T0, 0) == int(T0 * 1_000_000)
    assert base.next_fence(T0, int(T0 * 1_000_000)) == int(T0 * 1_000_000) + 1
    assert base.next_fence(T0 - 5, 10**18) == 10**18 + 1


def test_a_restarted_memory_store_still_issues_higher_fences() -> None:
    registration = validation.registration("a", "h:1", [DeviceSpec("", "k")])

    async def fence_at(now: float) -> int:
        store = MemoryStore()
        await store.register(registration, now)
        lease = await store.grant(LeaseRequest(), "L", now, 30.0, ephemeral_issuer())
        assert lease is not None
        return lease.fence

    # two "processes", the second started a millisecond later
    assert asyncio.run(fence_at(T0 + 0.001)) > asyncio.run(fence_at(T0))


@pytest.mark.parametrize(
    ("url", "client_url", "prefix"),
    [
        ("redis://127.0.0.1:6379/2", "redis://127.0.0.1:6379/2", DEFAULT_PREFIX),
        ("redis://h:1/0?prefix=pool-a:", "redis://h:1/0", "pool-a:"),
        ("redis+unix:///run/redis.sock?db=3&prefix=p:", "unix:///run/redis.sock?db=3", "p:"),
        ("rediss://:pw@h:1/0", "rediss://:pw@h:1/0", DEFAULT_PREFIX),
    ],
)
def test_store_urls(url: str, client_url: str, prefix: str) -> None:
    assert is_store_name(url)
    parsed = parse_url(url)
    assert (parsed.client_url, parsed.prefix) == (client_url, prefix)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("postgres://h/db", "unknown store 'postgres://h/db'"),
        ("redis:///0", "names no host"),
        ("redis+unix://", "names no socket"),
        ("redis://:hunter2@h:1/x", r"'redis://:\*\*\*@h:1/x': db must be a number"),
    ],
)
def test_bad_store_names_are_refused(name: str, message: str) -> None:
    with pytest.raises(UnknownStore, match=message):
        open_store(name)


def test_redis_store_connects_lazily() -> None:
    store = open_store("redis://127.0.0.1:1/0?prefix=x:")  # nothing listens there; no I/O yet
    assert isinstance(store, RedisStore) and store.prefix == "x:"
    asyncio.run(store.close())


def test_redis_store_names_itself_without_the_password() -> None:
    store = open_store("redis://:hunter2@127.0.0.1:1/0")
    assert isinstance(store, RedisStore) and store.url == "redis://127.0.0.1:1/0"
    asyncio.run(store.close())
