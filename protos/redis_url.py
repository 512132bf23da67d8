"""Redis URLs as Kiln's tools take them (tracker `--store`, the tuner's records database).

    redis://[[user]:password@]host[:port][/db][?prefix=P&...]     TCP
    rediss://[[user]:password@]host[:port][/db][?prefix=P&...]    TCP with TLS
    redis+unix://[[user]:password@]/path/redis.sock[?db=N&prefix=P&...]   unix socket

`prefix` is Kiln's: every key the user of the URL writes starts with it; each user has its own
default. The other query parameters (`db`, `ssl_cert_reqs`, `socket_timeout`, ...) are redis-py's
and pass through to it unchanged. A password must percent-encode "/", "?", "#" and "@"; a URL
where one does not is refused, not read with the wrong host. The password never appears in
`RedisUrl.shown`, its repr, or the message of a ValueError, so all three are safe to print and log.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

SCHEMES = ("redis://", "rediss://", "redis+unix://")
DEFAULT_PORT = 6379


@dataclass(frozen=True)
class RedisUrl:
    """A parsed Redis URL.

    Attributes:
        client_url: the URL to give `redis.Redis.from_url`: `redis://`, `rediss://` or `unix://`,
            credentials and redis-py's query parameters kept, `prefix` removed.
        prefix: the key prefix: the URL's `?prefix=`, else the caller's default.
        shown: the URL without credentials or query (the db kept), safe to print:
            `redis://host:6379/0`, `redis+unix:///run/redis.sock?db=2`.
        db: the database number: `?db=N`, else the path (`/N`, TCP only), else 0.
        tls: True for `rediss://`.
    """

    client_url: str = field(repr=False)  # holds the password
    prefix: str
    shown: str
    db: int = 0
    tls: bool = False


def redact(url: str) -> str:
    """`url` with its password replaced by `***`; any string works, even one that does not parse.

    The password runs from the first ":" of the credentials to the last "@" of the URL, so one
    holding a raw "/", "?" or "@" is hidden whole (an "@" in the query is hidden with it).
    """
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    at = rest.rfind("@")
    user, colon, _ = rest[: max(at, 0)].partition(":")
    # A user holds no "/": in "redis+unix:///tmp/a:b@c.sock" the "@" is in a socket path.
    if at < 0 or not colon or "/" in user:
        return url
    return f"{head}{sep}{user}:***@{rest[at + 1 :]}"


def parse_redis_url(url: str, *, default_prefix: str) -> RedisUrl:
    """Parse a Redis URL of the forms in the module docstring.

    Args:
        default_prefix: the key prefix when the URL has no `?prefix=`.

    Raises:
        ValueError: another scheme, no host or socket path, a bad port or db, or a password with a
            raw "/", "?", "#" or "@"; the message names the URL without its password.
    """
    shown_url = redact(url)
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if f"{scheme}://" not in SCHEMES:
        raise ValueError(
            f"redis URL {shown_url!r}: scheme must be redis://, rediss:// or redis+unix://"
        )
    parts = _split(url, shown_url)
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    prefix = query.pop("prefix", [default_prefix])[-1]
    rest = urllib.parse.urlencode({name: values[-1] for name, values in query.items()})
    db_text = query["db"][-1] if "db" in query else ""
    if scheme == "redis+unix":
        if not parts.path:
            raise ValueError(f"redis URL {shown_url!r} names no socket (redis+unix:///path)")
        db = _db(db_text, shown_url)
        client_url = f"unix://{parts.netloc}{parts.path}" + (f"?{rest}" if rest else "")
        shown = f"redis+unix://{parts.path}" + (f"?db={db}" if db else "")
        return RedisUrl(client_url, prefix, shown, db)
    if not parts.hostname:
        raise ValueError(f"redis URL {shown_url!r} names no host (redis://host:port/db)")
    db = _db(db_text or parts.path.strip("/"), shown_url)
    client_url = urllib.parse.urlunsplit((scheme, parts.netloc, parts.path, rest, ""))
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    shown = f"{scheme}://{host}:{parts.port or DEFAULT_PORT}/{db}"
    return RedisUrl(client_url, prefix, shown, db, tls=scheme == "rediss")


def _split(url: str, shown_url: str) -> urllib.parse.SplitResult:
    """`url` split by urllib, refused where urllib would misread it."""
    try:
        parts = urllib.parse.urlsplit(url)
        where = (parts.hostname, parts.port, parts.path)
        # The redacted URL splits the same way unless the password holds a character that ends
        # the credentials early ("/", "?", "#"); then urllib and redis-py see the wrong host.
        if shown_url != url:
            seen = urllib.parse.urlsplit(shown_url)
            if (seen.hostname, seen.port, seen.path) != where:
                raise ValueError("ambiguous")
    except ValueError:  # urllib's own message may quote part of a password: never shown
        hint = " (percent-encode '/', '?', '#' and '@' in the password)" if shown_url != url else ""
        raise ValueError(f"redis URL {shown_url!r}: malformed host or port{hint}") from None
    return parts


def _db(text: str, shown_url: str) -> int:
    if not text:
        return 0
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"redis URL {shown_url!r}: db must be a number >= 0")
    return int(text)
