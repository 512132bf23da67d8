"""What the `kiln` commands share: flag groups (defined once), argument parsers, and the path
from flags to a pool, a builder and tuning options.

Nothing heavy is imported at module level: `kiln --help` must answer in well under a second.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.cli.errors import CliError
from protos.evaluator import EvaluatorConfig as _EvaluatorDefaults  # stdlib only: cheap at start

if TYPE_CHECKING:
    from kiln.pool import Pool
    from protos.auth import TlsFiles
    from tuner.measure.builder import Builder
    from tuner.measure.result import EvaluatorConfig
    from tuner.options import TuneOptions
    from tuner.records import RecordStore

TUNERS = ("xgb", "random")  # tuner.search.TUNERS, named here without importing the tuner
CONFIRM_TOP = 4  # tuner.options.CONFIRM_TOP
BUILD_TIMEOUT_S = 300.0  # tuner.measure.builder.BUILD_TIMEOUT_S


class ExamplesFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the usage examples of a command's description laid out as written."""


def shape(text: str) -> tuple[int, ...]:
    """A comma-separated shape: "512,512,512"."""
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be comma-separated integers, got {text!r}"
        ) from None
    if not dims or any(d < 0 for d in dims):
        # 0 passes here: a conv's pad may be 0; the template says which fields must be positive.
        raise argparse.ArgumentTypeError(f"no dimension may be negative, got {text!r}")
    return dims


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME=D,D,...: the static shape of a model input."""
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"want NAME=D,D,..., got {text!r}")
    return name, shape(dims)


def add_input_shape_arg(p: argparse.ArgumentParser) -> None:
    """--input-shape NAME=D,D,... (repeatable): static shapes for symbolic model inputs."""
    p.add_argument(
        "--input-shape",
        type=input_shape,
        action="append",
        default=[],
        metavar="NAME=D,D,...",
        help="static shape of a model input with symbolic dims, e.g. x=1,3,224,224 (repeatable)",
    )


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"want a positive number of seconds, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"want a whole number >= 1, got {text!r}")
    return value


def builder_spec(text: str) -> str:
    """`local` or `dask://HOST:PORT`."""
    if text == "local":
        return text
    from tuner.measure.dask_builder import scheduler_address

    try:
        scheduler_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"want local or dask://HOST:PORT: {exc}") from None
    return text


def tags(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CliError.usage(f"--tag wants k=v, got {item!r}")
        out[k] = v
    return out


# -- flag groups ----------------------------------------------------------------------------
def add_security_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security")
    g.add_argument("--token-file", help="pool secrets file; its client token goes with every call")
    g.add_argument("--tls-ca", help="PEM CA that signed the tracker's and agents' certificates")
    g.add_argument("--tls-cert", help="PEM client certificate (mutual TLS)")
    g.add_argument("--tls-key", help="PEM key of --tls-cert")


def add_pool_args(p: argparse.ArgumentParser, local_devices: bool = True) -> None:
    g = p.add_argument_group("pool")
    g.add_argument("--tracker", default="", help="HOST:PORT; omitted: start a local pool")
    g.add_argument("--key", default="", help="device key to lease (required with --tracker)")
    g.add_argument(
        "--tag", action="append", default=[], metavar="K=V", help="a tag the device must carry"
    )
    if local_devices:
        g.add_argument(
            "--devices",
            type=int,
            default=1,
            help="measure on up to N leased devices at once (a local pool starts N devices)",
        )
    add_cores_arg(g)
    add_security_args(p)


def add_cores_arg(p: argparse._ActionsContainer) -> None:
    """--cores SET (repeatable): a local pool's devices on core sets, as `kiln-agent --cores`."""
    p.add_argument(
        "--cores",
        action="append",
        default=[],
        metavar="SET",
        help="without --tracker: a local device on this core set (e.g. 0-1 or 0,2) that runs "
        "kernels on one thread per core, so what is tuned or run there is for that many "
        "threads (repeatable, one set per device; --devices follows)",
    )


def add_target_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default=None,
        help="what to compile for; default: what the leased device runs (its tags), e.g. "
        "host (this machine, -march=native), x86_64-avx2, aarch64-neon",
    )


def add_tuning_args(
    p: argparse.ArgumentParser, early_stop_default: int | None = None, caches: bool = False
) -> None:
    """Search, budget, records, build and measurement flags of `tune-op`, `tune` and `demo`
    (`caches`: with `--caches auto|cold|warm`, the model commands')."""
    s = p.add_argument_group("search")
    s.add_argument("--trials", type=int, default=64, help="trial budget (resumed ones count)")
    s.add_argument("--batch", type=int, default=8, help="candidates built and measured together")
    s.add_argument("--seed", type=int, default=0, help="seeds the searcher")
    s.add_argument(
        "--tuner",
        choices=TUNERS,
        default="xgb",
        help="xgb: cost-model-guided simulated annealing (default); random: random search",
    )
    s.add_argument(
        "--early-stop",
        type=int,
        default=early_stop_default,
        metavar="N",
        help="stop after N trials without a better candidate"
        + (f" (per task; default {early_stop_default})" if early_stop_default else ""),
    )
    s.add_argument(
        "--confirm",
        type=int,
        default=CONFIRM_TOP,
        metavar="K",
        help=f"measure the K fastest configs again at the end and keep the one that holds its "
        f"speed (default {CONFIRM_TOP}; 0: off)",
    )
    s.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compare every candidate's outputs with a reference kernel on the device; a wrong "
        "answer never becomes the best (default: on)",
    )
    r = p.add_argument_group("records")
    r.add_argument(
        "--records",
        default=None,
        metavar="PATH|URL",
        help="append records to this JSON-lines file or redis://host:port/db[?prefix=P]",
    )
    r.add_argument(
        "--transfer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --tuner xgb and --records: let a model trained on the records of other "
        "workloads of this target pick the first candidates (default: on)",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue from the --records of this workload and target: never re-measure them",
    )
    b = p.add_argument_group("build")
    add_target_arg(b)  # type: ignore[arg-type]
    b.add_argument(
        "--builder",
        type=builder_spec,
        default="local",
        metavar="local|dask://HOST:PORT",
        help="local: build processes on this machine (default); dask://HOST:PORT: tasks on the "
        "workers of that Dask scheduler (`dask scheduler`, `dask worker`)",
    )
    b.add_argument(
        "--build-workers", type=int, default=2, help="build processes (with --builder local)"
    )
    b.add_argument(
        "--build-timeout-s",
        type=positive_seconds,
        default=BUILD_TIMEOUT_S,
        help=f"a unit of candidates not built this long after a worker took it is a build "
        f"error (default {BUILD_TIMEOUT_S:.0f})",
    )
    b.add_argument(
        "--per-unit", type=int, default=4, help="candidates compiled together in one gcc call"
    )
    b.add_argument(
        "--pipeline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="build the next batch while this one is measured (default: on; a local pool's "
        "devices then get cores of their own and the builds the others, and the devices' "
        "cores too at idle priority; off where --cores sets hold every core)",
    )
    add_measure_args(p, caches=caches)


# Warm timing: repeats of calls on warm caches. Cold (what a kernel inside a model meets when the
# model's weights do not fit the caches: its weights come from memory): every repeat is one call
# after a sweep that evicts the caches, twice this machine class's 32 MiB last-level cache.
# ResNet-18 (46 MB of weights): its kernels summed 8.4 ms warm against 12.1 ms called in the
# model's order; records timed cold ran it 4% faster on one thread and 10% on two (400 trials
# each, 1.43 / 1.41x onnxruntime against 1.37 / 1.27), and estimated it at 11 ms where warm
# timing said 7.7. MobileNetV2 (14 MB, cache-resident in the model): records timed cold ran it
# 8-18% slower on two threads. So `--caches auto` (the default) times cold only a model whose
# parameters exceed AUTO_COLD_PARAM_BYTES.
WARM_REPEAT, WARM_MIN_REPEAT_MS = _EvaluatorDefaults.repeat, _EvaluatorDefaults.min_repeat_ms
COLD_REPEAT, COLD_FLUSH_BYTES = 10, 64 * 2**20
AUTO_COLD_PARAM_BYTES = 32 * 2**20


def add_measure_args(p: argparse.ArgumentParser, caches: bool = False) -> None:
    m = p.add_argument_group("measurement")
    cold = " when timing warm" if caches else ""
    m.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"timed repeats (default {WARM_REPEAT}{cold}"
        + (f", {COLD_REPEAT} cold)" if caches else ")"),
    )
    m.add_argument(
        "--min-repeat-ms",
        type=float,
        default=None,
        help=f"grow a repeat's calls to this long (default {WARM_MIN_REPEAT_MS:g}{cold}"
        + (", 0 cold)" if caches else ")"),
    )
    m.add_argument(
        "--timeout-s", type=float, default=30.0, help="per-measurement limit on the device"
    )
    m.add_argument(
        "--flush-cache-bytes",
        type=int,
        default=None,
        metavar="N",
        help="sweep N bytes between repeats to evict the caches (default 0: off"
        + (f"; {COLD_FLUSH_BYTES >> 20} MiB with --caches cold" if caches else "")
        + "); with --min-repeat-ms 0 each repeat is one call on cold caches, as a kernel inside "
        "a model finds its weights",
    )
    if caches:
        m.add_argument(
            "--caches",
            choices=("auto", "cold", "warm"),
            default="auto",
            help="cold: each repeat is one call after a sweep that evicts the caches, as each "
            "kernel of a model too big for them runs; warm: repeats of many calls on warm "
            f"caches; auto (default): cold where the model's parameters exceed "
            f"{AUTO_COLD_PARAM_BYTES >> 20} MiB, else warm (GPUs, accelerators and emulated "
            "devices always time warm)",
        )


# -- from flags to objects ------------------------------------------------------------------
def credentials(args: argparse.Namespace) -> TlsFiles | None:
    """The TLS files of the security flags (checked to exist; the token file is read, and
    named when unreadable, where it is used)."""
    from protos.auth import TlsFiles

    if bool(args.tls_cert) != bool(args.tls_key):
        raise CliError.usage("a TLS client certificate needs both --tls-cert and --tls-key")
    for flag, path in (
        ("--tls-ca", args.tls_ca),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
    ):
        if path and not Path(path).is_file():
            raise CliError.usage(f"{flag} {path}: no such file")
    tls = TlsFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
    return tls if tls.enabled else None


def tune_options(args: argparse.Namespace) -> TuneOptions:
    """The TuneOptions of the search flags; a bad value is a usage error."""
    from tuner.options import TuneOptions

    for flag in ("trials", "batch", "devices", "per_unit", "build_workers"):
        if getattr(args, flag, 1) < 1:
            raise CliError.usage(
                f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}"
            )
    if args.confirm < 0:
        raise CliError.usage(f"--confirm must be >= 0, got {args.confirm}")
    if args.early_stop is not None and args.early_stop < 1:
        raise CliError.usage(f"--early-stop must be >= 1, got {args.early_stop}")
    if args.resume and not args.records:
        raise CliError.usage("--resume needs --records (the file or database to resume from)")
    check_target_name(getattr(args, "target", None))
    return TuneOptions(
        trials=args.trials,
        batch_size=args.batch,
        tuner=args.tuner,
        seed=args.seed,
        transfer=args.transfer,
        early_stop=args.early_stop,
        confirm=args.confirm,
        resume=args.resume,
        pipeline=args.pipeline,
        check=args.check,
    )


def fit_pipeline(args: argparse.Namespace, options: TuneOptions) -> TuneOptions:
    """`options` without `pipeline` where the --cores sets hold every core here
    (`kiln.pool.pipeline_fitted`), saying so on stderr when --pipeline was asked for."""
    from kiln.pool import pipeline_fitted

    fitted = pipeline_fitted(options, local_core_sets(args))
    if fitted is not options:
        print(
            "not pipelining: the --cores sets hold every core here, and builds beside a "
            "measurement would share its cores",
            file=sys.stderr,
        )
    return fitted


def check_target_name(target: str | None) -> None:
    """A usage error for a target the compiler does not know (before any pool is started)."""
    from compiler.build_cuda import cuda_arch, is_cuda_target
    from compiler.toolchain import BuildError, get_target

    if target is not None and is_cuda_target(target):
        try:
            cuda_arch(target)
        except ValueError as exc:
            raise CliError.usage(f"--target: {exc}") from None
    elif target is not None:
        try:
            get_target(target)
        except BuildError as exc:
            raise CliError.usage(f"--target: {exc}") from None


def times_cold(args: argparse.Namespace, cpu: bool, param_bytes: int) -> bool:
    """Whether `--caches` asks for cold timing on these devices (`cpu`: timed natively on a
    CPU) for a model of `param_bytes` of parameters."""
    caches = getattr(args, "caches", "warm")
    return cpu and (caches == "cold" or (caches == "auto" and param_bytes > AUTO_COLD_PARAM_BYTES))


def evaluator(args: argparse.Namespace, cold: bool = False) -> EvaluatorConfig:
    """The timing of the measurement flags a command has (EvaluatorConfig's defaults for the
    rest): cold (`times_cold`) or warm; a flag given explicitly wins over either mode's
    default."""
    from tuner.measure.result import EvaluatorConfig

    repeat = args.repeat if args.repeat is not None else COLD_REPEAT if cold else WARM_REPEAT
    if repeat < 1:
        raise CliError.usage(f"--repeat must be >= 1, got {repeat}")
    given: dict[str, Any] = {}
    if hasattr(args, "min_repeat_ms"):
        min_repeat_ms = args.min_repeat_ms
        given["min_repeat_ms"] = (
            min_repeat_ms if min_repeat_ms is not None else 0.0 if cold else WARM_MIN_REPEAT_MS
        )
    if hasattr(args, "flush_cache_bytes"):
        flush = args.flush_cache_bytes
        flush = flush if flush is not None else COLD_FLUSH_BYTES if cold else 0
        if flush < 0:
            raise CliError.usage(f"--flush-cache-bytes must be >= 0, got {flush}")
        given["flush_cache_bytes"] = flush
    if hasattr(args, "timeout_s"):
        given["timeout_s"] = args.timeout_s
    return EvaluatorConfig(repeat=repeat, **given)


def open_records(spec: str | None, must_exist: bool = False) -> RecordStore | None:
    from tuner.records import is_redis_url, open_store

    if spec is None:
        return None
    if not is_redis_url(spec):
        if must_exist and not Path(spec).is_file():
            raise CliError.usage(f"--records {spec}: no such file")
        if not Path(spec).resolve().parent.is_dir():
            raise CliError.usage(f"--records {spec}: directory {Path(spec).parent} does not exist")
    try:
        return open_store(spec)
    except ValueError as exc:
        raise CliError.usage(str(exc)) from None


def open_pool(args: argparse.Namespace, stack: ExitStack, pin: bool = False) -> Pool:
    """The pool of `--tracker`/`--key`/`--tag` (a local one without --tracker), entered on `stack`.

    With `pin` (pipelined tuning on a local pool) and more cores than devices, each local
    device gets a core of its own (the last ones) and `builder` the others, so builds running
    beside a measurement do not disturb it. With --cores, the local devices take those sets
    instead (`local_core_sets`) and the builds the other cores, if any.
    """
    from kiln.pool import Pool

    tls = credentials(args)
    if args.tracker and not args.key:
        raise CliError.usage("--key is required with --tracker")
    devices = getattr(args, "devices", 1)
    core_sets = local_core_sets(args)
    if core_sets:
        devices = len(core_sets)
    pins: tuple[int, ...] = ()
    if not args.tracker and pin and not core_sets:
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) > devices:
            pins = tuple(allowed[-devices:])
    pool = Pool(
        args.tracker or None,
        key=args.key,
        tags=tags(args.tag),
        token_file=args.token_file,
        tls=tls,
        devices=devices,
        pin_cores=pins,
        target=getattr(args, "target", None),
        core_sets=core_sets,
    )
    stack.enter_context(pool)
    print(f"pool: {pool.describe()}", file=sys.stderr)
    return pool


def local_core_sets(args: argparse.Namespace) -> tuple[tuple[int, ...], ...]:
    """The --cores sets (checked: well formed, usable here, disjoint; one per device), or ().

    A usage error: --cores with --tracker (a tracker's agents pin themselves), a bad set, or
    --devices other than the number of sets.
    """
    texts = getattr(args, "cores", None) or []
    if not texts:
        return ()
    if args.tracker:
        raise CliError.usage(
            "--cores pins a local pool's devices; a tracker's agents take it themselves "
            "(kiln-agent --cores)"
        )
    from device_agent.__main__ import parse_core_sets

    try:
        sets = parse_core_sets(texts)
    except ValueError as exc:
        raise CliError.usage(str(exc)) from None
    devices = getattr(args, "devices", 1)
    if devices != 1 and devices != len(sets):
        raise CliError.usage(f"--devices {devices} but {len(sets)} --cores sets: one per device")
    return sets


def builder(args: argparse.Namespace, pool: Pool) -> Builder:
    """The builder of the build flags, for the pool's target (close it); a Dask scheduler that
    cannot be reached is an error (exit status 1)."""
    spec = getattr(args, "builder", "local")
    try:
        built = pool.builder(
            workers=args.build_workers,
            per_unit=args.per_unit,
            spec=spec,
            timeout_s=getattr(args, "build_timeout_s", BUILD_TIMEOUT_S),
        )
    except OSError as exc:
        raise CliError(f"--builder {spec}: {exc}") from None
    if spec != "local":
        workers = getattr(built, "workers", None)
        threads = f", {workers()} worker threads" if callable(workers) else ""
        print(f"builder: Dask scheduler {spec}{threads}", file=sys.stderr)
    return built
