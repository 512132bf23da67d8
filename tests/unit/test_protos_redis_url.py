"""protos.redis_url: the one Redis URL parser of the tracker store and the tuner's records store."""

from __future__ import annotations

import pytest

from protos.redis_url import RedisUrl, parse_redis_url, redact

PASSWORD = "s3cret-P4ss"


def parse(url: str) -> RedisUrl:
    return parse_redis_url(url, default_prefix="kiln:records:")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "redis://127.0.0.1:6379/2",
            RedisUrl("redis://127.0.0.1:6379/2", "kiln:records:", "redis://127.0.0.1:6379/2", 2),
        ),
        ("redis://h", RedisUrl("redis://h", "kiln:records:", "redis://h:6379/0", 0)),
        (
            "redis://h:1/0?prefix=pool-a:&socket_timeout=3",
            RedisUrl("redis://h:1/0?socket_timeout=3", "pool-a:", "redis://h:1/0", 0),
        ),
        (
            "rediss://user:pw@cache.example:6380/1?ssl_cert_reqs=required",
            RedisUrl(
                "rediss://user:pw@cache.example:6380/1?ssl_cert_reqs=required",
                "kiln:records:",
                "rediss://cache.example:6380/1",
                1,
                tls=True,
            ),
        ),
        ("redis://h/0?db=5", RedisUrl("redis://h/0?db=5", "kiln:records:", "redis://h:6379/5", 5)),
        (
            "redis://[::1]:7000/3",
            RedisUrl("redis://[::1]:7000/3", "kiln:records:", "redis://[::1]:7000/3", 3),
        ),
        ("redis://h/0?prefix=", RedisUrl("redis://h/0", "", "redis://h:6379/0", 0)),
    ],
)
def test_tcp_urls(url: str, expected: RedisUrl) -> None:
    assert parse(url) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "redis+unix:///run/redis.sock",
            RedisUrl("unix:///run/redis.sock", "kiln:records:", "redis+unix:///run/redis.sock", 0),
        ),
        (
            "redis+unix:///run/redis.sock?db=3&prefix=p:",
            RedisUrl("unix:///run/redis.sock?db=3", "p:", "redis+unix:///run/redis.sock?db=3", 3),
        ),
        (
            "redis+unix://:pw@/run/redis.sock",
            RedisUrl("unix://:pw@/run/redis.sock", "kiln:records:", "redis+unix:///run/redis.sock"),
        ),
        (  # an "@" in a socket path is not a password's end
            "redis+unix:///tmp/a:b@c.sock",
            RedisUrl("unix:///tmp/a:b@c.sock", "kiln:records:", "redis+unix:///tmp/a:b@c.sock"),
        ),
    ],
)
def test_unix_socket_urls(url: str, expected: RedisUrl) -> None:
    assert parse(url) == expected


def test_each_user_keeps_its_own_default_prefix() -> None:
    assert parse_redis_url("redis://h/0", default_prefix="kiln:").prefix == "kiln:"
    assert parse_redis_url("redis://h/0?prefix=x:", default_prefix="kiln:").prefix == "x:"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{PASSWORD}@h:1/0",
        f"redis://admin:{PASSWORD}@h:1/0?prefix=p:",
        f"rediss://admin:{PASSWORD}@h/4",
        f"redis+unix://:{PASSWORD}@/run/redis.sock?db=2",
        f"redis://:{PASSWORD}@w@h:1/0",  # a raw "@" in the password: urllib reads it whole
    ],
)
def test_the_password_is_never_shown(url: str) -> None:
    parsed = parse(url)
    assert PASSWORD in parsed.client_url  # redis-py needs it
    assert PASSWORD not in parsed.shown
    assert PASSWORD not in repr(parsed)
    assert "admin" not in parsed.shown


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:6379/0", r"scheme must be redis://, rediss:// or redis\+unix://"),
        ("unix:///run/redis.sock", "scheme must be"),
        ("127.0.0.1:6379", "scheme must be"),
        ("redis:///0", "names no host"),
        ("rediss://:pw@/0", "names no host"),
        ("redis+unix://", "names no socket"),
        ("redis://h:port/0", "malformed host or port"),
        ("redis://h:1/zero", "db must be a number"),
        ("redis+unix:///s.sock?db=-1", "db must be a number"),
    ],
)
def test_bad_urls_are_value_errors(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(url)


@pytest.mark.parametrize(
    "url",
    [
        f"http://u:{PASSWORD}@h/0",
        f"redis://:{PASSWORD}@/0",
        f"redis+unix://:{PASSWORD}@",
        f"redis://:{PASSWORD}@h:99999/0",
        f"redis://:{PASSWORD}@h/x",
        f"u:{PASSWORD}@h",  # no scheme
        # A password with a raw "/", "?" or "#" ends the credentials early for urllib (and
        # redis-py), which would then read part of it as the port or path: refused, hidden whole.
        f"redis://:ab/{PASSWORD}@h:6379/0",
        f"redis://u:12/{PASSWORD}@h:6379/0",
        f"redis://:ab?{PASSWORD}@h/0",
        f"redis://:ab#{PASSWORD}@h/0",
        f"redis+unix://:ab/{PASSWORD}@/run/redis.sock",
    ],
)
def test_errors_name_the_url_without_its_password(url: str) -> None:
    with pytest.raises(ValueError, match="redis URL") as caught:
        parse(url)
    assert PASSWORD not in str(caught.value)
    assert "***" in str(caught.value)


def test_redact() -> None:
    assert redact("redis://u:pw@h:1/0?prefix=p") == "redis://u:***@h:1/0?prefix=p"
    assert redact("redis://:pw@h") == "redis://:***@h"
    assert redact("redis://h:1/0") == "redis://h:1/0"
    assert redact("redis://user@h") == "redis://user@h"  # a user name alone is no secret
    assert redact("redis+unix:///tmp/a:b@c.sock") == "redis+unix:///tmp/a:b@c.sock"
    assert redact("not a url: at all@") == "not a url:***@"
