"""kiln-tracker: serve the device pool until SIGTERM or SIGINT.

    kiln-tracker --listen 127.0.0.1:9190 [--heartbeat-interval-s 2] [--store memory|redis://...]
                 [--store-file URL_FILE]     # or $KILN_TRACKER_STORE: a password stays out of ps
                 [--token-file SECRETS] [--tls-cert C --tls-key K [--tls-client-ca CA]]
                 [--metrics-port P] [--insecure] [--ready-file PATH] [--log-level info]
                 [--lost-retention-s 3600]   # forget devices LOST (agent silent) this long
    kiln-tracker init-secrets SECRETS     # write a new pool secrets file (mode 0600) and exit

With --ready-file, once serving, the file's first line is "<host>:<port>" (written atomically), so a
caller can pass --listen 127.0.0.1:0 and read the port the tracker got; with --metrics-port a
second line "http://<host>:<port>/metrics" names the metrics endpoint.

Without --token-file every call is accepted, so the tracker refuses (exit 2) to listen on anything
but a loopback address unless --insecure is given. SIGTERM or SIGINT stops it gracefully: health
turns NOT_SERVING, waiting Acquires are answered, in-flight calls get a grace period, exit 0.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import os
import sys
from collections.abc import Sequence

from protos.auth import PoolSecrets, Role, SecretsError, TlsFiles, load_secrets, write_secrets
from protos.daemon import StopSignals
from protos.redis_url import redact
from tracker.config import TrackerConfig
from tracker.errors import UnknownStore
from tracker.server import create_server
from tracker.store import AVAILABLE_STORES, is_store_name

_LOG = logging.getLogger(__name__)

# The store URL when neither --store nor --store-file gives it (keeps a password out of `ps`).
STORE_ENV = "KILN_TRACKER_STORE"
# Seconds a stopping server gives in-flight RPCs before cancelling them.
_SHUTDOWN_GRACE_S = 2.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln-tracker", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:9190", help="host:port; port 0 = any free")
    parser.add_argument("--heartbeat-interval-s", type=float, default=2.0)
    parser.add_argument("--lease-ttl-s", type=float, default=30.0, help="default lease TTL")
    parser.add_argument(
        "--startup-grace-s",
        type=float,
        default=TrackerConfig.startup_grace_s,
        help="for this long after start, a request no registered device matches waits for its "
        "agents to register again instead of failing at once (default %(default)s; 0: fail fast)",
    )
    parser.add_argument(
        "--lost-retention-s",
        type=float,
        default=TrackerConfig.lost_device_retention_s,
        metavar="S",
        help="a device whose agent went silent shows LOST for this many seconds, then the tracker "
        "forgets it (default %(default)s)",
    )
    parser.add_argument(
        "--store",
        default=None,
        help=f"memory (default) or a redis URL; schemes: {', '.join(AVAILABLE_STORES)}. A URL "
        f"with a password belongs in ${STORE_ENV} or --store-file, not on a command line "
        "anyone can read with ps",
    )
    parser.add_argument(
        "--store-file",
        help="a file holding the --store URL (keep it mode 0600, like the secrets file)",
    )
    parser.add_argument(
        "--token-file",
        help="pool secrets file (agent, client, admin tokens, lease_key); enables token auth",
    )
    parser.add_argument("--tls-cert", help="PEM server certificate (enables TLS)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-client-ca", help="PEM CA that client certificates must chain to")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --listen without --token-file (anyone may register and lease)",
    )
    parser.add_argument(
        "--metrics-port", type=int, help="serve Prometheus /metrics on the listen host (0 = pick)"
    )
    parser.add_argument("--ready-file", help="write host:port here once serving")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def _store_url(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The store: --store, else --store-file's contents, else $KILN_TRACKER_STORE, else memory."""
    if args.store is not None and args.store_file:
        parser.error("give --store or --store-file, not both")
    if args.store is not None:
        return str(args.store)
    if args.store_file:
        try:
            with open(args.store_file, encoding="utf-8") as f:
                url = f.read().strip()
        except OSError as error:
            parser.error(f"--store-file {args.store_file}: {error.strerror}")
        if not url:
            parser.error(f"--store-file {args.store_file} is empty")
        return url
    return os.environ.get(STORE_ENV, "") or "memory"


def write_ready_file(path: str, address: str, *extra_lines: str) -> None:
    """Write "address\\n" (then each extra line) so a reader never sees a partial file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as file:
        file.write("".join(f"{line}\n" for line in (address, *extra_lines)))
    os.replace(tmp, path)


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1; False for wildcards, other IPs and names."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _load_tracker_secrets(path: str) -> PoolSecrets:
    """The secrets a tracker needs: agent and client tokens at least.

    Raises:
        SecretsError: unreadable, malformed, or missing a token the tracker needs.
    """
    secrets = load_secrets(path)
    for role in (Role.AGENT, Role.CLIENT):
        secrets.token(role)  # raises naming the missing entry
    if secrets.lease_key is None:
        _LOG.warning("%s has no lease_key: agents cannot verify lease tokens", path)
    return secrets


def init_secrets(argv: Sequence[str]) -> int:
    """`kiln-tracker init-secrets FILE`: write a new pool secrets file; exit 0, or 1 on error."""
    parser = argparse.ArgumentParser(
        prog="kiln-tracker init-secrets",
        description="Write a new pool secrets file (agent, client, admin tokens and a lease key) "
        "with mode 0600; refuses to overwrite an existing file.",
    )
    parser.add_argument("path")
    args = parser.parse_args(argv)
    try:
        write_secrets(args.path)
    except SecretsError as error:
        print(f"kiln-tracker: {error}", file=sys.stderr)
        return 1
    print(f"wrote pool secrets to {args.path}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tracker; returns the exit status (0 after a signal-initiated shutdown)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["init-secrets"]:
        return init_secrets(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args.store = _store_url(parser, args)
    if not is_store_name(args.store):
        parser.error(
            f"--store {redact(args.store)!r} is not available; use memory, "
            "redis[s]://host:port/db or redis+unix:///path"
        )
    host = args.listen.rsplit(":", 1)[0]
    if not args.token_file and not args.insecure and not is_loopback(host):
        parser.error(
            f"refusing to listen on non-loopback {args.listen} without --token-file "
            "(anyone could register devices and run code on them); pass --insecure to override"
        )
    if not (math.isfinite(args.lost_retention_s) and args.lost_retention_s > 0):
        parser.error(
            f"--lost-retention-s must be a positive finite number of seconds, "
            f"got {args.lost_retention_s!r}"
        )
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port must be 0..65535, got {args.metrics_port}")
    tls = TlsFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_client_ca)
    if tls.enabled and not (tls.cert and tls.key):
        parser.error("TLS needs both --tls-cert and --tls-key")
    try:
        secrets = _load_tracker_secrets(args.token_file) if args.token_file else None
        config = TrackerConfig(
            heartbeat_interval_s=args.heartbeat_interval_s,
            default_lease_ttl_s=args.lease_ttl_s,
            max_lease_ttl_s=max(args.lease_ttl_s, TrackerConfig.max_lease_ttl_s),
            store=args.store,
            startup_grace_s=args.startup_grace_s,
            lost_device_retention_s=args.lost_retention_s,
        )
        tracker = create_server(
            args.listen, config, secrets=secrets, tls=tls, metrics_port=args.metrics_port
        )
    except (ValueError, UnknownStore) as error:  # SecretsError is a ValueError
        parser.error(str(error))
    except OSError as error:
        _LOG.error("%s", error)
        return 1
    if secrets is not None and not tls.enabled and not is_loopback(host):
        _LOG.warning("tokens travel in plaintext to %s: pass --tls-cert/--tls-key", args.listen)

    with StopSignals(_LOG, "shutting down") as signals:
        if args.ready_file:
            extra = [tracker.metrics_url] if tracker.metrics_url else []
            write_ready_file(args.ready_file, tracker.address, *extra)
        _LOG.info("ready at %s", tracker.address)
        signals.wait()
        tracker.stop(_SHUTDOWN_GRACE_S)
    _LOG.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
