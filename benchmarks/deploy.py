"""Deploy benchmark: `kiln deploy up` of N local hosts from nothing, then again, then `down`.

    .venv/bin/python benchmarks/deploy.py [--hosts 8] [--parallel 16]

Each host is a real OpenSSH server on 127.0.0.1 (deploy.testing), with its own host key and port;
the tracker is a real `kiln-tracker` process with pool secrets. The agents install under a
temporary folder, each into its own virtualenv from the wheels `kiln deploy` copies over SFTP, and
run under the `process` service manager. "From nothing" means no host has anything of Kiln's; this
workstation's wheel cache (~/.cache/kiln/deploy) is warmed first, as a second deploy of a pool
would find it. Every phase runs the real CLI (`python -m kiln deploy ...`) as a child process.

Targets (issue 22): all hosts registered; `up` under 60 s; `again` (nothing to change) under 10 s.
Prints a table and ends with one line:
    deploy: hosts=<n> up_s=<s> again_s=<s> down_s=<s> registered=<n>
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy.bundle import agent_wheel, dependency_wheels, parse_probe  # noqa: E402
from deploy.testing import LocalPool  # noqa: E402

HOST_PYTHON = getattr(sys, "_base_executable", sys.executable)


def run_phase(name: str, inventory: Path, parallel: int) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "deploy", name, str(inventory), "--wait-s", "120",
         "--parallel", str(parallel)],
        cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(
            f"deploy {name} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return seconds, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=16)
    args = parser.parse_args()

    # The workstation's cache, as a second deploy finds it.
    probe = subprocess.run(
        [HOST_PYTHON, "-c", "import platform, sys; print(sys.version_info[0], "
         "sys.version_info[1], platform.machine(), *platform.libc_ver())"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    agent_wheel()
    dependency_wheels(parse_probe(probe))

    with tempfile.TemporaryDirectory(prefix="kiln-deploy-bench-") as tmp:
        pool = LocalPool(Path(tmp), args.hosts, HOST_PYTHON)
        try:
            pool.start()
            inventory = pool.inventory()
            up_s, up_out = run_phase("up", inventory, args.parallel)
            states = pool.devices()
            registered = sum(  # hosts all of whose devices the tracker lists FREE
                1
                for i in range(args.hosts)
                if (n := sum(1 for d in states if d.startswith(f"h{i}/")))
                and all(states[d] == "FREE" for d in states if d.startswith(f"h{i}/"))
                and n == (2 if i == 0 else 1)
            )
            again_s, again_out = run_phase("up", inventory, args.parallel)
            down_s, down_out = run_phase("down", inventory, args.parallel)
            left = len(pool.devices())
        finally:
            pool.stop()
    print(up_out)
    print(again_out.splitlines()[-1])
    print(down_out.splitlines()[-1])
    print()
    rows = [
        ("up (from nothing)", up_s, "< 60"),
        ("up again (no change)", again_s, "< 10"),
        ("down", down_s, ""),
    ]
    print(f"| {'phase':<22} | {'seconds':>8} | {'target':>7} |")
    print(f"|{'-' * 24}|{'-' * 10}|{'-' * 9}|")
    for phase, seconds, target in rows:
        print(f"| {phase:<22} | {seconds:>8.1f} | {target:>7} |")
    print(
        f"hosts registered after up: {registered}/{args.hosts}; devices listed after down: {left}"
    )
    print(
        f"deploy: hosts={args.hosts} up_s={up_s:.1f} again_s={again_s:.1f} down_s={down_s:.1f} "
        f"registered={registered}"
    )


if __name__ == "__main__":
    main()
