"""`kiln deploy`: agents onto the hosts of an inventory over SSH (see deploy/ for the details).

    kiln deploy up INVENTORY [--host NAME ...] [--accept-new-host-keys] [--wait-s 60]
    kiln deploy upgrade|restart|status|down INVENTORY [--host NAME ...]
    kiln deploy tracker-unit [--user] [--run-as kiln-tracker] [--working-dir D] -- TRACKER_ARGS

The inventory operations print one row per host (host, result, devices at the tracker, seconds, what changed or why it
failed) and a summary line. Exit status 0 when every host succeeded, 1 when any failed, 2 for a
bad inventory or flag. `tracker-unit` prints a systemd unit that runs `kiln-tracker TRACKER_ARGS`
with this Python (the arguments are checked by the tracker's own parser first).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from kiln.cli import table
from kiln.cli.errors import CliError

OPERATIONS = ("up", "upgrade", "restart", "status", "down")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `deploy up|upgrade|restart|status|down` to the `kiln` parser."""
    d = sub.add_parser(
        "deploy",
        help="install, run and remove agents on hosts over SSH",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.set_defaults(func=run)
    dsub = d.add_subparsers(dest="operation", required=True, metavar="OPERATION")
    helps = {
        "up": "install and start agents, wait until the tracker lists their devices",
        "upgrade": "like up, replacing agents of another version with this workstation's",
        "restart": "restart the agents' services",
        "status": "service state, installed version and devices at the tracker",
        "down": "stop the agents (they deregister), remove services and files",
    }
    for operation in OPERATIONS:
        p = dsub.add_parser(operation, help=helps[operation])
        p.add_argument("inventory", help="the inventory TOML file")
        p.add_argument(
            "--host", action="append", default=[], help="only this host (repeatable); default all"
        )
        p.add_argument(
            "--accept-new-host-keys",
            action="store_true",
            help="trust hosts not yet in known_hosts and record their keys (a CHANGED key is "
            "always refused)",
        )
        p.add_argument(
            "--wait-s",
            type=float,
            default=60.0,
            help="how long to wait for the tracker to list a host's devices (default 60)",
        )
        p.add_argument("--parallel", type=int, default=16, help="hosts at once (default 16)")
        p.add_argument("--json", action="store_true", help="one JSON object per host")
    t = dsub.add_parser(
        "tracker-unit",
        help="print a systemd unit that runs kiln-tracker with these arguments",
        description="e.g. kiln deploy tracker-unit -- --listen 0.0.0.0:9190 "
        "--token-file /etc/kiln/pool.secrets --store-file /etc/kiln/store-url "
        "> /etc/systemd/system/kiln-tracker.service (then: useradd --system kiln-tracker; "
        "install -d -o kiln-tracker /var/lib/kiln-tracker; systemctl enable --now kiln-tracker)",
    )
    t.add_argument("--user", action="store_true", help="a `systemctl --user` unit")
    t.add_argument(
        "--run-as", default="kiln-tracker", help="system units: the user it runs as (kiln-tracker)"
    )
    t.add_argument(
        "--working-dir",
        default="/var/lib/kiln-tracker",
        help="its working folder, the one place it may write (default /var/lib/kiln-tracker)",
    )
    t.add_argument("--python", default=sys.executable, help="default: the Python running kiln")
    t.add_argument("tracker_args", nargs=argparse.REMAINDER, help="-- then kiln-tracker's flags")
    t.set_defaults(func=tracker_unit)


def tracker_unit(args: argparse.Namespace) -> int:
    """Print the tracker's unit for `args.tracker_args` after the tracker's parser accepts them."""
    from deploy.units import render_unit, tracker_service
    from tracker.__main__ import build_parser

    tracker_args = args.tracker_args[1:] if args.tracker_args[:1] == ["--"] else args.tracker_args
    try:
        build_parser().parse_args(tracker_args)
    except SystemExit:
        raise CliError.usage("kiln-tracker would refuse those arguments (see above)") from None
    try:
        service = tracker_service(
            args.python,
            tracker_args,
            working_dir=args.working_dir,
            user_mode=args.user,
            run_as="" if args.user else args.run_as,
        )
        print(render_unit(service), end="")
    except ValueError as error:
        raise CliError.usage(str(error)) from None
    return 0


def run(args: argparse.Namespace) -> int:
    """Run one deploy operation; exit status 1 when any host failed."""
    # Imported here: paramiko is the `deploy` extra, needed only by this command.
    try:
        from deploy.inventory import InventoryError, load_inventory
        from deploy.operations import Deployer, DeployError
    except ImportError as error:
        raise CliError(
            f"kiln deploy needs paramiko: pip install 'kiln[deploy]' ({error})"
        ) from None
    if args.wait_s <= 0 or args.parallel < 1:
        raise CliError.usage("--wait-s must be positive and --parallel at least 1")
    try:
        inventory = load_inventory(args.inventory)
        hosts = inventory.select(args.host)
        deployer = Deployer(
            inventory,
            accept_new_host_keys=args.accept_new_host_keys,
            wait_s=args.wait_s,
            parallel=args.parallel,
        )
    except (InventoryError, DeployError) as error:
        raise CliError.usage(str(error)) from None
    start = time.monotonic()
    results = deployer.run(args.operation, hosts)
    elapsed = time.monotonic() - start
    failed = [r for r in results if not r.ok]
    if args.json:
        for r in results:
            print(
                json.dumps(
                    {
                        "host": r.host,
                        "ok": r.ok,
                        "action": r.action,
                        "devices": r.devices,
                        "seconds": round(r.seconds, 3),
                        "detail": r.detail,
                    }
                )
            )
    else:
        rows = [[r.host, r.action, r.devices, f"{r.seconds:.1f}", r.detail] for r in results]
        print(table.render(["host", "result", "devices", "s", "detail"], rows))
        changed = sum(1 for r in results if r.ok and r.action not in ("unchanged", "running"))
        print(
            f"deploy {args.operation}: {len(results) - len(failed)}/{len(results)} hosts ok, "
            f"{changed} changed, {len(failed)} failed in {elapsed:.1f} s"
        )
    return 1 if failed else 0
