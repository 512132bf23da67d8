"""kiln-agent: serve this machine's devices to a Kiln pool.

    kiln-agent --tracker HOST:PORT --key KEY [--tag k=v ...] [--backend cpu|qemu|cuda|vta_sim|null]
               [--devices N|all] [--gpus 0,2]
               [--token-file F] [--insecure] [--tls-cert C --tls-key K [--tls-client-ca CA]]
               [--tracker-tls-ca CA [--tracker-tls-cert C --tracker-tls-key K]]
               [--listen 127.0.0.1:0] [--advertise-host 127.0.0.1] [--cache-dir D]
               [--cache-max-bytes N] [--pin-cores 0,1|auto] [--cores 0-3 [--cores 4-7]]
               [--quarantine-after 3]
               [--max-job-s 600] [--metrics-port P] [--ready-file PATH] [--agent-id ID]
               [--log-level info]

`--cores SET` (repeatable, one per device; --devices follows) pins a device's executor to a set
of cores ("0-3", "0,2,4-5"; sets disjoint) and tags the device `threads=<cores in the set>`: its
kernels run on that many OpenMP threads, one bound to each core, and its records carry the
count. Several devices of one host take disjoint sets.

`--backend cuda` serves GPUs, one device each: `--devices all` serves every GPU the driver sees,
`--gpus 0,2` those ordinals, `--devices N` the first N; each device's executor child sees only its
GPU ($CUDA_VISIBLE_DEVICES), and its tags say which (gpu, sm, memory_mib, sm_clock_mhz, ...).
$KILN_CUDA_DRIVER=fake runs it on a fake driver instead (a test seam: `driver=fake`, emulated).

Without --tracker the agent serves standalone. Without --token-file it runs open (dev mode: any
caller may upload and run code) and so refuses a non-loopback --listen unless --insecure is given.
Exit status 2 means a bad command line (or an insecure listen address), 1 that the agent could not
start. SIGTERM or SIGINT stops it gracefully (exit 0), deregistering its devices from the tracker
(a killed agent's devices show LOST instead, until it comes back).

The agent id defaults to "<hostname>-<key>" (with "-<hash of the cache dir>" after it when
--cache-dir is not the default): the same after a restart, so a restarted agent's devices replace
its old ones at the tracker instead of adding rows. Two agents of one key on one host need their
own --cache-dir (they would share one cache otherwise) or --agent-id.

With --ready-file, once serving, the file's first line is "<advertise-host>:<port>" (written
atomically); with --metrics-port a second line "http://<host>:<port>/metrics" names the Prometheus
endpoint (prometheus_client must be installed: `pip install prometheus-client`).
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import logging
import math
import os
import sys
import tempfile

from device_agent.config import DEFAULT_CACHE_DIR, AgentConfig
from device_agent.server import create_server
from protos.auth import SecretsError, TlsFiles, load_secrets
from protos.daemon import StopSignals

_LOG = logging.getLogger("device_agent")


def _tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"tag must look like key=value, got {text!r}")
    return key, value


def _devices(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--devices wants a number or 'all', got {text!r}"
        ) from None


def parse_indices(text: str) -> tuple[int, ...]:
    """A list of device indices like "0,2" (distinct, >= 0).

    Raises:
        ValueError: a malformed list, a negative or a repeated index.
    """
    try:
        indices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--gpus wants a list like 0,2; got {text!r}") from None
    if min(indices) < 0 or len(set(indices)) != len(indices):
        raise ValueError(f"--gpus {text}: indices must be distinct and >= 0")
    return indices


def parse_core_set(text: str) -> tuple[int, ...]:
    """A set of cores like "0-3" or "0,2,4-5", sorted, each a core this process may use.

    Raises:
        ValueError: a malformed set, an empty or repeated one, or a core not usable here.
    """
    cores: list[int] = []
    try:
        for part in text.split(","):
            first, dash, last = part.partition("-")
            lo, hi = int(first), int(last) if dash else int(first)
            if hi < lo:
                raise ValueError
            cores.extend(range(lo, hi + 1))
    except ValueError:
        raise ValueError(f"--cores wants a set like 0-3 or 0,2,4-5; got {text!r}") from None
    if len(set(cores)) != len(cores):
        raise ValueError(f"--cores {text}: a core is named twice")
    allowed = sorted(os.sched_getaffinity(0))
    bad = [c for c in cores if c not in allowed]
    if bad:
        raise ValueError(f"--cores {text}: core(s) {bad} not usable here (allowed: {allowed})")
    return tuple(sorted(cores))


def parse_core_sets(texts: list[str]) -> tuple[tuple[int, ...], ...]:
    """One core set per --cores flag; the sets must be disjoint.

    Raises:
        ValueError: as `parse_core_set`, or two sets sharing a core.
    """
    sets = tuple(parse_core_set(t) for t in texts)
    seen: set[int] = set()
    for cores in sets:
        shared = seen & set(cores)
        if shared:
            raise ValueError(f"--cores: core(s) {sorted(shared)} are in two sets")
        seen |= set(cores)
    return sets


def parse_pin_cores(text: str, devices: int) -> tuple[int, ...]:
    """`auto` (devices spread over the cores this process may use) or a comma list of cores.

    Raises:
        ValueError: a malformed list, or a core this process may not use.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if text == "auto":
        return tuple(allowed[i % len(allowed)] for i in range(devices))
    try:
        cores = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--pin-cores wants 'auto' or a list like 0,1; got {text!r}") from None
    bad = [c for c in cores if c not in allowed]
    if bad:
        raise ValueError(f"--pin-cores {text}: core(s) {bad} not usable here (allowed: {allowed})")
    return cores


def is_loopback(listen: str) -> bool:
    """Whether the host part of `listen` (HOST:PORT, [V6]:PORT) is a loopback address."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (exits 2 with a message on bad flags)."""
    defaults = AgentConfig()
    p = argparse.ArgumentParser(prog="kiln-agent", description="Serve devices to a Kiln pool.")
    p.add_argument("--tracker", default="", help="tracker HOST:PORT; omit to serve standalone")
    p.add_argument("--key", required=True, help='what clients ask for, e.g. "x86-avx512"')
    p.add_argument("--tag", type=_tag, action="append", default=[], help="extra device tag k=v")
    p.add_argument("--backend", default=defaults.backend, help="cpu, qemu, null, ...")
    p.add_argument(
        "--devices",
        type=_devices,
        default=defaults.devices,
        help="how many devices to serve; 'all': one per GPU (backends with devices of their own)",
    )
    p.add_argument("--gpus", default="", help="serve these GPUs (ordinals, e.g. 0,2), one each")
    p.add_argument("--listen", default="127.0.0.1:0", help="address to bind; port 0 picks one")
    p.add_argument("--advertise-host", default=defaults.advertise_host)
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    p.add_argument("--max-artifact-bytes", type=int, default=defaults.max_artifact_bytes)
    p.add_argument(
        "--cache-max-bytes",
        type=int,
        default=defaults.cache_max_bytes,
        help="bound on the artifact cache; least recently used artifacts go first",
    )
    p.add_argument(
        "--executor-address-space-bytes",
        type=int,
        default=defaults.executor_address_space_bytes,
        help="RLIMIT_AS of each executor child; 0 = unlimited",
    )
    p.add_argument(
        "--quarantine-after",
        type=int,
        default=defaults.quarantine_after,
        help="refuse an entry after this many CRASH/TIMEOUT results (0 = never); reset by restart",
    )
    p.add_argument(
        "--max-job-s",
        type=float,
        default=defaults.max_job_s,
        help="no job runs longer than this, whatever its timeout; its lease may end it sooner",
    )
    p.add_argument("--pin-cores", default="", help="'auto' or cores for devices 0,1,... e.g. 0,1")
    p.add_argument(
        "--cores",
        action="append",
        default=[],
        metavar="SET",
        help="a device on this core set (e.g. 0-3), tagged threads=N for its N cores; "
        "repeat for one device per set (disjoint sets)",
    )
    p.add_argument("--token-file", help="pool secrets (agent, client, lease_key); see protos.auth")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --listen without --token-file (anyone may run code here)",
    )
    p.add_argument("--lease-leeway-s", type=float, default=defaults.lease_leeway_s)
    p.add_argument("--tls-cert", help="PEM certificate of this agent's server")
    p.add_argument("--tls-key", help="PEM private key of this agent's server")
    p.add_argument("--tls-client-ca", help="require client certificates signed by this CA (mTLS)")
    p.add_argument("--tracker-tls-ca", help="reach the tracker over TLS, trusting this CA")
    p.add_argument("--tracker-tls-cert", help="client certificate for the tracker (mTLS)")
    p.add_argument("--tracker-tls-key", help="client key for the tracker (mTLS)")
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus /metrics on the listen host (0 = pick a free port)",
    )
    p.add_argument(
        "--ready-file",
        help='write "<advertise-host>:<port>" here once serving (then the metrics URL, if any)',
    )
    p.add_argument(
        "--agent-id",
        default="",
        help="default: <hostname>-<key>, stable across restarts (plus a hash of --cache-dir when "
        "that is not the default)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    all_devices = args.devices == "all"
    if not all_devices and args.devices < 1:
        p.error("--devices must be at least 1 (or all)")
    try:
        args.gpus = parse_indices(args.gpus) if args.gpus else ()
    except ValueError as e:
        p.error(str(e))
    if args.gpus and (all_devices or args.devices != defaults.devices):
        p.error("--gpus names the devices: give it without --devices")
    if args.cache_max_bytes < 1:
        p.error("--cache-max-bytes must be positive")
    if not (math.isfinite(args.max_job_s) and args.max_job_s > 0):
        p.error("--max-job-s must be a positive number of seconds")
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        p.error("--tls-client-ca needs --tls-cert and --tls-key")
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            p.error(f"--metrics-port must be 0..65535, got {args.metrics_port}")
        if importlib.util.find_spec("prometheus_client") is None:
            p.error("--metrics-port needs prometheus_client: pip install prometheus-client")
    if not args.token_file and not args.insecure and not is_loopback(args.listen):
        p.error(
            f"refusing to listen on {args.listen} without --token-file: anyone who can reach it "
            "could run native code here (pass --insecure on a network you trust)"
        )
    try:
        # Pins go round-robin, so 'auto' for an unknown count pins one device per usable core.
        pin_count = len(os.sched_getaffinity(0)) if all_devices else len(args.gpus) or args.devices
        args.pin_cores = parse_pin_cores(args.pin_cores, pin_count) if args.pin_cores else ()
        args.cores = parse_core_sets(args.cores)
    except ValueError as e:
        p.error(str(e))
    if args.cores:
        if args.pin_cores:
            p.error("--cores and --pin-cores both pin devices: give one")
        if all_devices or args.gpus:
            p.error("--cores sets one device per set: give it without --devices all or --gpus")
        if args.devices != defaults.devices and args.devices != len(args.cores):
            p.error(f"--devices {args.devices} but {len(args.cores)} --cores sets: one per device")
        args.devices = len(args.cores)
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


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """The agent's config from parsed flags (reads the token file).

    Raises:
        SecretsError: the token file is unreadable or malformed.
    """
    return AgentConfig(
        key=args.key,
        backend=args.backend,
        devices=1 if args.devices == "all" else args.devices,
        all_devices=args.devices == "all",
        device_indices=args.gpus,
        tags=dict(args.tag),
        agent_id=args.agent_id,
        advertise_host=args.advertise_host,
        tracker_address=args.tracker,
        cache_dir=args.cache_dir,
        max_artifact_bytes=args.max_artifact_bytes,
        cache_max_bytes=args.cache_max_bytes,
        executor_address_space_bytes=args.executor_address_space_bytes,
        quarantine_after=args.quarantine_after,
        max_job_s=args.max_job_s,
        pin_cores=args.pin_cores,
        core_sets=args.cores,
        secrets=load_secrets(args.token_file) if args.token_file else None,
        lease_leeway_s=args.lease_leeway_s,
        tls=TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca),
        tracker_tls=TlsFiles(args.tracker_tls_cert, args.tracker_tls_key, args.tracker_tls_ca),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the agent until SIGTERM or SIGINT."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_args(args)
    except SecretsError as e:
        _LOG.error("cannot start the agent: %s", e)
        return 2
    if config.secrets is None:
        _LOG.warning("no --token-file: running open (dev mode), leases are not checked")
    # Installed before starting: a signal while the agent starts stops it as soon as it serves.
    with StopSignals(_LOG, "stopping") as signals:
        try:
            server, port, _ = create_server(args.listen, config, metrics_port=args.metrics_port)
        except (ValueError, RuntimeError, OSError, SecretsError) as e:
            _LOG.error("cannot start the agent: %s", e)
            return 1
        try:
            if args.ready_file:
                lines = [f"{args.advertise_host}:{port}"]
                if server.metrics_url:
                    lines.append(server.metrics_url)
                _write_atomic(args.ready_file, "".join(f"{line}\n" for line in lines))
            signals.wait()
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
