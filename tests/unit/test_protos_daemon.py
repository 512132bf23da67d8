"""protos.daemon.StopSignals: the daemons' SIGTERM/SIGINT handling, on this (main) thread."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from protos.daemon import StopSignals

LOG = logging.getLogger("test.daemon")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_wait_and_is_logged(
    signum: signal.Signals, caplog: pytest.LogCaptureFixture
) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    caplog.set_level(logging.INFO, logger=LOG.name)
    with StopSignals(LOG, "shutting down") as signals:
        os.kill(os.getpid(), signum)
        signals.wait(slice_s=0.05)
        assert signals.received is signum
    assert caplog.messages == [f"received {signum.name}; shutting down"]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_before_the_wait_is_remembered() -> None:
    with StopSignals(LOG) as signals:
        os.kill(os.getpid(), signal.SIGTERM)  # e.g. while the daemon was still starting
        signals.wait(slice_s=0.05)  # returns at once
        assert signals.received is signal.SIGTERM


def test_handlers_are_restored_when_the_block_raises() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError), StopSignals(LOG):
        assert signal.getsignal(signal.SIGTERM) is not before
        raise RuntimeError("start failed")
    assert signal.getsignal(signal.SIGTERM) is before
