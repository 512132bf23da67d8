"""Telemetry readers: what this machine exposes is read, what it lacks is None, never an error."""

from __future__ import annotations

import os
from pathlib import Path

from device_agent import telemetry


def test_this_machine_has_a_load_average_and_absent_files_are_none(tmp_path: Path) -> None:
    reading = telemetry.read()
    assert reading.load_1m is not None and reading.load_1m >= 0
    missing = str(tmp_path / "nothing*")
    assert telemetry.cpu_mhz(missing, str(tmp_path / "no-cpuinfo")) is None
    assert telemetry.temperature_c(missing) is None


def test_cpu_mhz_prefers_cpufreq_then_cpuinfo(tmp_path: Path) -> None:
    for i, khz in enumerate(["1800000", "2200000", "junk"]):
        d = tmp_path / f"cpu{i}"
        d.mkdir()
        (d / "scaling_cur_freq").write_text(khz + "\n")
    assert telemetry.cpu_mhz(str(tmp_path / "cpu*" / "scaling_cur_freq")) == 2000.0
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu MHz\t\t: 1000.5\nprocessor\t: 1\ncpu MHz\t\t: 3000.5\n")
    assert telemetry.cpu_mhz(str(tmp_path / "none*"), str(cpuinfo)) == 2000.5


def test_cpu_mhz_of_this_machine_matches_proc_cpuinfo() -> None:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        has_mhz = any(line.startswith("cpu MHz") for line in f)
    has_cpufreq = os.path.exists("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq")
    mhz = telemetry.cpu_mhz()
    assert (mhz is not None) == (has_mhz or has_cpufreq)
    if mhz is not None:
        assert mhz > 0


def test_temperature_is_the_hottest_zone(tmp_path: Path) -> None:
    for i, milli in enumerate(["41000", "55500", "oops"]):
        d = tmp_path / f"thermal_zone{i}"
        d.mkdir()
        (d / "temp").write_text(milli)
    assert telemetry.temperature_c(str(tmp_path / "thermal_zone*" / "temp")) == 55.5


def test_reader_caches_within_its_ttl() -> None:
    reader = telemetry.TelemetryReader(ttl_s=3600.0)
    assert reader() is reader()
