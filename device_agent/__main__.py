"""kiln-agent: serve this machine's devices to a Kiln pool.

    kiln-agent --tracker HOST:PORT --key KEY [--tag k=v ...] [--backend cpu|null] [--devices N]
               [--listen 127.0.0.1:0] [--advertise-host 127.0.0.1] [--cache-dir D]
               [--ready-file PATH] [--agent-id ID] [--log-level info]

Without --tracker the agent serves standalone. SIGTERM or SIGINT stops it gracefully (exit 0).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from types import FrameType

from device_agent.config import DEFAULT_CACHE_DIR, AgentConfig
from device_agent.server import create_server

_LOG = logging.getLogger("device_agent")


def _tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"tag must look like key=value, got {text!r}")
    return key, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (exits 2 with a message on bad flags)."""
    defaults = AgentConfig()
    p = argparse.ArgumentParser(prog="kiln-agent", description="Serve devices to a Kiln pool.")
    p.add_argument("--tracker", default="", help="tracker HOST:PORT; omit to serve standalone")
    p.add_argument("--key", required=True, help='what clients ask for, e.g. "x86-avx512"')
    p.add_argument("--tag", type=_tag, action="append", default=[], help="extra device tag k=v")
    p.add_argument("--backend", default=defaults.backend, help="cpu, null, ...")
    p.add_argument("--devices", type=int, default=defaults.devices)
    p.add_argument("--listen", default="127.0.0.1:0", help="address to bind; port 0 picks one")
    p.add_argument("--advertise-host", default=defaults.advertise_host)
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    p.add_argument("--max-artifact-bytes", type=int, default=defaults.max_artifact_bytes)
    p.add_argument(
        "--executor-address-space-bytes",
        type=int,
        default=defaults.executor_address_space_bytes,
        help="RLIMIT_AS of each executor child; 0 = unlimited",
    )
    p.add_argument("--ready-file", help='write "<advertise-host>:<port>" here once serving')
    p.add_argument("--agent-id", default="", help="default: <hostname>-<pid>-<random>")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    if args.devices < 1:
        p.error("--devices must be at least 1")
    return args


def _write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ready-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    """Run the agent until SIGTERM or SIGINT."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = AgentConfig(
        key=args.key,
        backend=args.backend,
        devices=args.devices,
        tags=dict(args.tag),
        agent_id=args.agent_id,
        advertise_host=args.advertise_host,
        tracker_address=args.tracker,
        cache_dir=args.cache_dir,
        max_artifact_bytes=args.max_artifact_bytes,
        executor_address_space_bytes=args.executor_address_space_bytes,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _LOG.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server, port, _ = create_server(args.listen, config)
    except (ValueError, RuntimeError, OSError) as e:
        _LOG.error("cannot start the agent: %s", e)
        return 1
    try:
        if args.ready_file:
            _write_atomic(args.ready_file, f"{args.advertise_host}:{port}\n")
        # Wake up now and then: a signal handler runs only between bytecodes of the main thread.
        while not stop.wait(timeout=1.0):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
