#!/usr/bin/env bash
# Set up a fresh machine for Kiln: the system packages the tests need, then .venv with the project
# and its dev extras. Idempotent and quiet when everything is already there; never reads stdin.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages (Debian). Each entry is "command-or-file-that-proves-it-is-there:package".
need=()
# aarch64-linux-gnu-gcc + qemu-aarch64: cross builds and the agent's qemu backend; clang: the
# second host toolchain; openssl: test certificates for TLS; sshd + ssh-keygen: `kiln deploy`'s
# tests run real OpenSSH servers on 127.0.0.1; systemd(-analyze) checks the generated units and
# python3-yaml reads deploy/compose.yaml in its test; debootstrap makes the root file system of
# the systemd host that test_deploy_systemd boots (cached in /var/cache/kiln-tests).
for pair in redis-server:redis-server gcc:gcc aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu \
            /usr/aarch64-linux-gnu/include/stdio.h:libc6-dev-arm64-cross \
            qemu-aarch64:qemu-user clang:clang openssl:openssl \
            /usr/sbin/sshd:openssh-server ssh-keygen:openssh-client systemd-analyze:systemd \
            /usr/lib/python3/dist-packages/yaml/__init__.py:python3-yaml /usr/sbin/debootstrap:debootstrap; do
  cmd=${pair%%:*} pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || [ -e "$cmd" ] || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  echo "setup: installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq </dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" </dev/null >/dev/null
fi

# Python environment. Reinstall only when pyproject.toml changed since the last install.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.kiln-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing kiln[dev] into .venv (log: .venv/setup.log)"
  if ! { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip &&
         .venv/bin/python -m pip install --disable-pip-version-check -e '.[dev]'; } \
       </dev/null >.venv/setup.log 2>&1; then
    tail -n 40 .venv/setup.log >&2
    echo "setup: pip install failed; full log in .venv/setup.log" >&2
    exit 1
  fi
  touch "$stamp"
fi
