"""`kiln devices`: a tracker's devices as a table or JSON, once or refreshed live with --watch.

Columns: key, device, backend, agent address, state, lease holder, heartbeat age, queue depth
(requests waiting for that device's key), and the device's other tags (arch, features, ...). A
summary line follows the table. --key asks the tracker for one key's devices; each --tag k=v keeps
only the devices with that tag (all of them must match). With --watch the table is redrawn every
SECONDS (the screen is cleared when stdout is a terminal) until Ctrl-C or --count refreshes; with
--json each refresh is one JSON document (one line each under --watch).

A tracker that cannot be reached or refuses the token is one line on stderr and exit status 1.
Under --watch only the first listing must succeed; a later failure is reported and retried.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import grpc

from kiln.cli import common, table
from kiln.cli.errors import CliError
from protos import tracker_pb2
from protos.auth import TlsFiles
from protos.rpc_errors import tls_hint
from tuner.measure.tracker_client import TrackerClient

COLUMNS = (
    "key",
    "device",
    "backend",
    "agent",
    "state",
    "holder",
    "heartbeat_age_s",
    "queue",
    "tags",
)
# Tags shown in their own columns, or too long for the table (the CPU's model name).
_NOT_IN_TAGS = ("backend", "cpu")
_CLEAR_SCREEN = "\x1b[H\x1b[2J"

_HINTS = {
    grpc.StatusCode.UNAVAILABLE: "unreachable",
    grpc.StatusCode.UNAUTHENTICATED: "rejected the token (check --token-file)",
    grpc.StatusCode.PERMISSION_DENIED: "refused this token's role (use the client token)",
    grpc.StatusCode.DEADLINE_EXCEEDED: "did not answer in time",
}


def rows(
    response: tracker_pb2.ListDevicesResponse, tag_selector: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """One dict per device, keys in COLUMNS order, sorted by key then device id; with
    `tag_selector`, only the devices that carry every one of its tags (backend and cpu included)."""
    selected = [
        d
        for d in response.devices
        if all(d.spec.tags.get(name) == value for name, value in (tag_selector or {}).items())
    ]
    out = [
        {
            "key": d.spec.key,
            "device": d.spec.device_id,
            "backend": d.spec.tags.get("backend", ""),
            "agent": d.spec.agent_address,
            "state": tracker_pb2.DeviceState.Name(d.state),
            "holder": d.lease_holder,
            "heartbeat_age_s": round(d.heartbeat_age_s, 2),
            "queue": d.queue_depth,
            "tags": {k: v for k, v in sorted(d.spec.tags.items()) if k not in _NOT_IN_TAGS},
        }
        for d in selected
    ]
    return sorted(out, key=lambda r: (r["key"], r["device"]))


def summary(device_rows: list[dict[str, Any]]) -> str:
    """E.g. "3 devices: 1 FREE, 1 LEASED, 1 LOST; longest queue 2"."""
    states: dict[str, int] = {}
    for row in device_rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    waiting = max((row["queue"] for row in device_rows), default=0)
    text = f"{len(device_rows)} devices" + (f": {counts}" if counts else "")
    return f"{text}; longest queue {waiting}"


def render(device_rows: list[dict[str, Any]]) -> str:
    """The table and its summary line."""
    cells = [[_cell(row[c]) for c in COLUMNS] for row in device_rows]
    return table.render(COLUMNS, cells) + "\n" + summary(device_rows)


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def describe_error(tracker: str, error: grpc.RpcError, tls_enabled: bool = False) -> str:
    """One line naming the tracker, what went wrong, the status code and the server's words,
    and TLS as the likely cause when the failure looks like a TLS mismatch."""
    code = error.code()
    what = _HINTS.get(code, "failed")
    details = (error.details() or "").splitlines()
    line = f"kiln: tracker {tracker} {what}: {code.name}: {details[0] if details else ''}".rstrip()
    hint = tls_hint(error.details() or "", tracker, tls_enabled)
    return f"{line}; {hint}" if hint else line


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("devices", help="list the devices of a tracker (live with --watch)")
    d.add_argument("--tracker", required=True, help="HOST:PORT")
    d.add_argument("--key", default="", help="only devices with this key (the tracker filters)")
    d.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="K=V",
        help="only devices carrying this tag; repeat it and every tag must match",
    )
    d.add_argument("--json", action="store_true", help="print JSON instead of a table")
    d.add_argument(
        "--watch",
        type=common.positive_seconds,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )
    d.add_argument(
        "--count", type=int, default=0, help="with --watch: stop after this many refreshes"
    )
    common.add_security_args(d)
    d.set_defaults(func=cmd_devices)


def cmd_devices(args: argparse.Namespace) -> int:
    from tuner.measure.tracker_client import read_client_token

    tag_selector = common.tags(args.tag)
    tls = common.credentials(args)
    token = read_client_token(args.token_file) if args.token_file else None
    if args.count < 0:
        raise CliError.usage(f"--count must be >= 0, got {args.count}")
    return run(
        args.tracker,
        key=args.key,
        tag_selector=tag_selector,
        as_json=args.json,
        watch_s=args.watch,
        count=args.count,
        token=token,
        tls=tls,
    )


def run(
    tracker: str,
    key: str = "",
    tag_selector: Mapping[str, str] | None = None,
    as_json: bool = False,
    watch_s: float | None = None,
    count: int = 0,
    token: str | None = None,
    tls: TlsFiles | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """List once, or every `watch_s` seconds `count` times (0 = until Ctrl-C); the exit status.

    `key` is passed to the tracker's ListDevices; `tag_selector` filters its answer here (every
    tag must match), since ListDevices takes no tags.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    client = TrackerClient(tracker, token, tls)
    shown = 0
    try:
        while True:
            try:
                device_rows = rows(client.list_devices(key), tag_selector)
            except grpc.RpcError as error:
                print(describe_error(tracker, error, tls is not None), file=err, flush=True)
                if watch_s is None or shown == 0:
                    return 1
            else:
                _show(device_rows, as_json, watch_s is not None, out)
            shown += 1
            if watch_s is None or (count and shown >= count):
                return 0
            sleep(watch_s)
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how a watch ends
    finally:
        client.close()


def _show(device_rows: list[dict[str, Any]], as_json: bool, watching: bool, out: TextIO) -> None:
    if as_json:
        text = json.dumps(device_rows) if watching else json.dumps(device_rows, indent=2)
    elif watching:
        clear = _CLEAR_SCREEN if out.isatty() else ""
        text = f"{clear}{time.strftime('%H:%M:%S')}\n{render(device_rows)}"
    else:
        text = render(device_rows)
    print(text, file=out, flush=True)
