"""What an agent id, a device id and a device key may be: one rule for the agent (which checks its
own at start) and the tracker (which refuses others at Register).

Ids and keys go into stores, lease tokens ('|' separates a token's fields) and logs, so they are
short and drawn from characters that need no quoting anywhere: hostnames, "agent/0",
"x86-avx512".
"""

from __future__ import annotations

MAX_ID_CHARS = 128
ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/@+-")


def identifier_problem(field: str, value: str) -> str | None:
    """Why `value` cannot be `field` (an id or key), or None when it can."""
    if not value or len(value) > MAX_ID_CHARS or not set(value) <= ID_CHARS:
        return (
            f"{field} must be 1 to {MAX_ID_CHARS} characters of letters, digits and ._:/@+-, "
            f"got {value[:80]!r}"
        )
    return None
