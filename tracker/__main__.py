"""kiln-tracker: serve the device pool until SIGTERM or SIGINT.

    kiln-tracker --listen 127.0.0.1:9190 [--heartbeat-interval-s 2] [--store memory]
                 [--ready-file PATH] [--log-level info]

With --ready-file, once serving, the file holds "<host>:<port>\\n" (written atomically), so a
caller can pass --listen 127.0.0.1:0 and read the port the tracker got.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from tracker.config import TrackerConfig
from tracker.errors import UnknownStore
from tracker.server import create_server
from tracker.store import AVAILABLE_STORES

_LOG = logging.getLogger(__name__)

# Seconds a stopping server gives in-flight RPCs before cancelling them.
_SHUTDOWN_GRACE_S = 2.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln-tracker", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:9190", help="host:port; port 0 = any free")
    parser.add_argument("--heartbeat-interval-s", type=float, default=2.0)
    parser.add_argument("--lease-ttl-s", type=float, default=30.0, help="default lease TTL")
    parser.add_argument("--store", default="memory", help=f"one of: {', '.join(AVAILABLE_STORES)}")
    parser.add_argument("--ready-file", help="write host:port here once serving")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def write_ready_file(path: str, address: str) -> None:
    """Write "address\\n" so a reader never sees a partial file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as file:
        file.write(f"{address}\n")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tracker; returns the exit status (0 after a signal-initiated shutdown)."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.store not in AVAILABLE_STORES:
        parser.error(f"--store {args.store!r} is not available; choose from {AVAILABLE_STORES}")
    try:
        config = TrackerConfig(
            heartbeat_interval_s=args.heartbeat_interval_s,
            default_lease_ttl_s=args.lease_ttl_s,
            max_lease_ttl_s=max(args.lease_ttl_s, TrackerConfig.max_lease_ttl_s),
            store=args.store,
        )
        tracker = create_server(args.listen, config)
    except (ValueError, UnknownStore) as error:
        parser.error(str(error))
    except OSError as error:
        _LOG.error("%s", error)
        return 1

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _LOG.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.ready_file:
        write_ready_file(args.ready_file, tracker.address)
    _LOG.info("ready at %s", tracker.address)
    # Wait in slices: the signal handler runs between slices even if a wake-up were lost.
    while not stop.wait(0.5):
        pass
    tracker.stop(_SHUTDOWN_GRACE_S)
    _LOG.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
