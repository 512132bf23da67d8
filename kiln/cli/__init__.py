"""The `kiln` command line: one module per command group, all on the Python API.

    tune_op   kiln tune-op OP --shape ...           tune one operator
    network   kiln tune / build / run MODEL         tune, compile and run a whole network
    demo      kiln demo                             the whole story on a local pool
    devices   kiln devices --tracker HOST:PORT      a pool's devices, backend and tags
    deploy    kiln deploy up|status|down INVENTORY  agents onto hosts over SSH
    records   kiln records summary|plot SOURCE      read tuning records
    zoo       kiln models list|export               the reference models as .onnx files
    inspect   kiln inspect MODEL.onnx               opset, operators (supported or not), tasks

Errors are one type (`errors.CliError`), printed as `kiln: <message>`: exit status 2 for bad
usage, 1 when the work failed, 130 on Ctrl-C, 143 on SIGTERM.
"""

from __future__ import annotations

import os

# numpy's BLAS on one thread unless the user says otherwise, set before numpy loads: the demo
# times its builds beside onnxruntime on one core as benchmarks/models.py does, and that sets the
# same; an idle BLAS pool's threads spin after each call (constant folding makes a few), beside
# whatever is timed. No command uses numpy's BLAS for anything large. (Not OMP_NUM_THREADS: a local
# pool's agents inherit this environment, and parallel kernels use OpenMP.)
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from kiln.cli import (  # noqa: E402
    common,
    demo,
    deploy,
    devices,
    inspect,
    network,
    records,
    tune_op,
    zoo,
)
from kiln.cli.errors import CliError  # noqa: E402

DESCRIPTION = """Tune deep-learning tensor programs on a pool of devices.

examples:
  kiln demo                                             # tune, build and time ResNet-18 locally
  kiln tune-op dense --shape 512,512,512 --trials 64 --records r.jsonl
  kiln devices --tracker HOST:PORT --token-file pool.secrets
  kiln deploy up hosts.toml                             # agents onto the inventory's hosts
  kiln tune net.onnx --tracker HOST:PORT --key x86 --trials 512 --records r.jsonl
  kiln build net.onnx --records r.jsonl -o net.kiln
  kiln run net.kiln --input x.npy --check net.onnx
  kiln inspect net.onnx                                 # operators Kiln lacks, tasks it would tune
  kiln records plot r.jsonl -o curve.png
"""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that a killed run stops its local pool and keeps its records."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiln", description=DESCRIPTION, formatter_class=common.ExamplesFormatter
    )
    parser.add_argument(
        "--log-level", default="warning", help="debug, info, warning (default) or error"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (tune_op, network, inspect, devices, deploy, records, zoo, demo):
        group.add_parser(sub)
    return parser


def _library_error(exc: BaseException) -> CliError | None:
    """The CliError of a library error a user can act on (imported only if loaded)."""
    for module, names, code in (
        ("tuner.loop", ("TuningError",), 1),
        ("tuner.records.base", ("RecordStoreError",), 1),
        ("tuner.measure.pool_runner", ("NoDeviceError",), 1),
        ("tuner.measure.device_target", ("TargetError",), 2),
        ("tuner.network.run", ("ModelRunError",), 1),
        ("protos.auth", ("SecretsError",), 2),
    ):
        loaded = sys.modules.get(module)
        for name in names:
            cls = getattr(loaded, name, None) if loaded is not None else None
            if cls is not None and isinstance(exc, cls):
                return CliError(str(exc), code)
    return None


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        code = args.func(args)
    except CliError as exc:
        print(f"kiln: {exc}", file=sys.stderr)
        code = exc.exit_code
    except Terminated:
        print("kiln: terminated", file=sys.stderr)
        code = 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        code = 130
    except Exception as exc:
        error = _library_error(exc)
        if error is None:
            raise
        print(f"kiln: {error}", file=sys.stderr)
        code = error.exit_code
    finally:
        signal.signal(signal.SIGTERM, previous)  # main() may run inside another program
    sys.exit(code)
