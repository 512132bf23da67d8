"""How one entry is timed on a device: the one `EvaluatorConfig` of the tuner and the agent.

It mirrors the wire message `protos.common.EvaluatorConfig` field for field, without importing the
generated code, so the agent's and the tuner's core stay free of `*_pb2`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EvaluatorConfig:
    """How to time one entry (mirrors protos.common.EvaluatorConfig).

    The defaults are what a client asks for when it chooses nothing: a warm-up call, three samples,
    each a repeat of at least 20 ms so that timer resolution and call overhead are small against
    it, and 30 s for the whole measurement. The tuner sends them, and uses `timeout_s` for its own
    RPC deadline too, so that value must be a real time.

    The agent never relies on these defaults: it builds every config from a wire message, where an
    unset field reads as zero, and reads a zero as "not asked for": `number` and `repeat` 0 mean 1,
    `min_repeat_ms`, `cooldown_ms` and `flush_cache_bytes` 0 disable what they control, and
    `timeout_s` 0 means the agent's own default. So a bare `EvaluatorConfig()` in a client and an
    empty message on the wire are different requests, on purpose.

    Attributes:
        warmup: untimed calls before the first repeat.
        number: calls per repeat; the starting point when `min_repeat_ms` > 0.
        repeat: samples returned, each the mean seconds per call over one repeat.
        min_repeat_ms: grow `number` until one repeat lasts at least this many milliseconds;
            0 keeps `number` as given.
        cooldown_ms: milliseconds of sleep between repeats; 0 for none.
        flush_cache_bytes: bytes of a buffer swept between repeats to evict the caches; 0 for none.
        timeout_s: wall-clock seconds for the whole measurement on the device; 0 means the agent's
            default.
    """

    warmup: int = 1
    number: int = 1
    repeat: int = 3
    min_repeat_ms: float = 20.0
    cooldown_ms: float = 0.0
    flush_cache_bytes: int = 0
    timeout_s: float = 30.0
