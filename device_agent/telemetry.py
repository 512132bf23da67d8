"""Host readings for Info and each MeasureResult: load, CPU frequency, temperature.

Each value is read where this machine exposes it and left None (omitted on the wire) where it
does not; reading never raises. Readings are cached for `_TTL_S`, so a burst of measurements does
not re-read /proc and /sys for each one.
"""

from __future__ import annotations

import glob
import os
import threading
import time

from device_agent.domain import Telemetry

_TTL_S = 0.5
_FREQ_GLOB = "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"
_THERMAL_GLOB = "/sys/class/thermal/thermal_zone[0-9]*/temp"
_CPUINFO = "/proc/cpuinfo"


def _read_numbers(paths: list[str]) -> list[float]:
    values = []
    for path in paths:
        try:
            with open(path, encoding="ascii") as f:
                values.append(float(f.read().strip()))
        except (OSError, ValueError):
            continue
    return values


def load_1m() -> float | None:
    """The 1-minute load average, or None."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_mhz(freq_glob: str = _FREQ_GLOB, cpuinfo: str = _CPUINFO) -> float | None:
    """Mean current frequency over CPUs: cpufreq (kHz) if present, else /proc/cpuinfo "cpu MHz"."""
    khz = _read_numbers(sorted(glob.glob(freq_glob)))
    if khz:
        return sum(khz) / len(khz) / 1000.0
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            mhz = []
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() == "cpu MHz":
                    try:
                        mhz.append(float(value))
                    except ValueError:
                        continue
    except OSError:
        return None
    return sum(mhz) / len(mhz) if mhz else None


def temperature_c(thermal_glob: str = _THERMAL_GLOB) -> float | None:
    """The hottest thermal zone in degrees Celsius (sysfs gives millidegrees), or None."""
    milli = _read_numbers(sorted(glob.glob(thermal_glob)))
    return max(milli) / 1000.0 if milli else None


def read() -> Telemetry:
    """Fresh readings."""
    return Telemetry(load_1m=load_1m(), cpu_mhz=cpu_mhz(), temperature_c=temperature_c())


class TelemetryReader:
    """`read()` cached for a short while; safe from many threads."""

    def __init__(self, ttl_s: float = _TTL_S) -> None:
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._last = Telemetry()

    def __call__(self) -> Telemetry:
        """The readings, at most `ttl_s` old."""
        now = time.monotonic()
        with self._lock:
            if now - self._at > self._ttl_s:
                self._last = read()
                self._at = now
            return self._last
