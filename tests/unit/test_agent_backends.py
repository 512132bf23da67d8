"""Backends found by name, and the qemu backend's clear refusals (no emulator run here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from device_agent.backends import get_backend, qemu
from device_agent.backends.base import JobFailed
from device_agent.domain import Status


def test_backends_are_found_by_file_name() -> None:
    assert get_backend("qemu").name == "qemu" and get_backend("qemu").emulated
    assert not get_backend("cpu").emulated
    for bad in ("base", "../cpu", "nope"):
        with pytest.raises(ValueError, match="unknown backend"):
            get_backend(bad)


def test_qemu_without_a_cross_compiler_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(qemu, "CROSS_CC", "no-such-aarch64-gcc")
    with pytest.raises(RuntimeError, match="no-such-aarch64-gcc") as err:
        qemu.QemuBackend().prepare(str(tmp_path))
    assert "scripts/setup.sh" in str(err.value)


def test_qemu_refuses_what_is_not_an_aarch64_elf(tmp_path: Path) -> None:
    backend = qemu.QemuBackend()
    junk = tmp_path / "junk"
    junk.write_bytes(b"not an ELF at all, certainly")
    x86 = tmp_path / "x86"
    x86.write_bytes(b"\x7fELF" + bytes(14) + (62).to_bytes(2, "little") + bytes(40))
    for path, reason in ((junk, "not an ELF"), (x86, "ELF machine 62 is not aarch64")):
        with pytest.raises(JobFailed) as err:
            backend.load(str(path))
        assert err.value.status is Status.LOAD_ERROR and reason in err.value.message
