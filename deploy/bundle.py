"""What an agent host installs: a wheel of the agent alone and the wheels of its dependencies.

The agent's wheel (`kiln-agent`) holds `protos` and `device_agent` only: no compiler, no tuner, no
tracker. Its version carries a hash of those sources, so a host knows whether it runs this
workstation's agent. The dependency wheels are fetched here, once per (Python version, machine,
glibc) of the hosts, with `pip download` for the host's platform, and copied to each host, which
then installs with `pip install --no-index`: a host needs no route to PyPI and no compiler.
pip itself comes as one of those wheels (`INSTALLER`) and runs from it: the host's virtualenv is
made `--without-pip`, so a host needs neither ensurepip (Debian's python3-venv) nor the 5 s it
takes to seed pip into every new virtualenv.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT_PACKAGES = ("protos", "device_agent")
AGENT_DIST = "kiln-agent"
BASE_VERSION = "0.1.0"
# The agent's runtime needs: pyproject's core dependencies (a test keeps them equal), and
# prometheus-client for its --metrics-port.
AGENT_REQUIREMENTS = (
    "grpcio>=1.85.1",
    "grpcio-health-checking>=1.85.1",
    "protobuf>=7.36",
    "numpy>=1.26",
    "prometheus-client>=0.20",
)
# The pip that installs them on the host, run from its wheel (`python pip-X.whl/pip install`).
INSTALLER = "pip>=23.1"
DEFAULT_CACHE = Path(os.path.expanduser("~")) / ".cache" / "kiln" / "deploy"
_SOURCE_SUFFIXES = (".py", ".proto", ".pyi", ".c")


class BundleError(RuntimeError):
    """The wheels for a host could not be made; the message says which and why."""


@dataclass(frozen=True)
class Platform:
    """What a host's Python runs on, as its probe reported it."""

    python: tuple[int, int]  # (3, 11)
    machine: str  # x86_64, aarch64
    glibc: tuple[int, int]  # (2, 36); (0, 0) when not glibc

    @property
    def label(self) -> str:
        """e.g. "cp311-x86_64-glibc2.36": the wheelhouse's folder name."""
        major, minor = self.python
        return f"cp{major}{minor}-{self.machine}-glibc{self.glibc[0]}.{self.glibc[1]}"

    def pip_platforms(self) -> list[str]:
        """The manylinux platform tags this host accepts, for `pip download --platform`.

        Raises:
            BundleError: not a glibc Linux (musl and others have no manylinux wheels).
        """
        if self.glibc[0] != 2 or self.glibc[1] < 17:
            raise BundleError(
                f"host runs {self.machine} without glibc >= 2.17; only manylinux hosts are supported"
            )
        tags = [f"manylinux_2_{minor}_{self.machine}" for minor in range(17, self.glibc[1] + 1)]
        return [f"manylinux2014_{self.machine}", *tags]


def parse_probe(text: str) -> Platform:
    """A Platform from the probe's output line "3 11 x86_64 glibc 2.36".

    Raises:
        BundleError: the output is not what the probe prints.
    """
    parts = text.split()
    try:
        major, minor, machine = int(parts[0]), int(parts[1]), parts[2]
        glibc = (0, 0)
        if len(parts) >= 5 and parts[3] == "glibc":
            g_major, g_minor = parts[4].split(".")[:2]
            glibc = (int(g_major), int(g_minor))
    except (IndexError, ValueError):
        raise BundleError(f"cannot read the host's Python probe: {text.strip()[:200]!r}") from None
    if (major, minor) < (3, 11):
        raise BundleError(f"the host's Python is {major}.{minor}; the agent needs 3.11 or newer")
    return Platform((major, minor), machine, glibc)


# Printed by the host's Python: version, machine, libc. One line, nothing secret.
PROBE = (
    "import platform, sys; "
    "print(sys.version_info[0], sys.version_info[1], platform.machine(), *platform.libc_ver())"
)


def _sources() -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for package in AGENT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if (
                path.is_file()
                and path.suffix in _SOURCE_SUFFIXES
                and "__pycache__" not in path.parts
            ):
                files.append((path.relative_to(ROOT).as_posix(), path))
    return files


def agent_version() -> str:
    """BASE_VERSION plus a local label of the hash of the agent's sources: "0.1.0+3f2a9c0d1e2b"."""
    digest = hashlib.sha256()
    for name, path in _sources():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{BASE_VERSION}+{digest.hexdigest()[:12]}"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def agent_wheel(cache: Path = DEFAULT_CACHE) -> Path:
    """The agent's wheel for this source tree, built into `cache` unless already there (PEP 427:
    a zip of the packages with a .dist-info holding METADATA, WHEEL, entry points and RECORD)."""
    version = agent_version()
    name = f"kiln_agent-{version}-py3-none-any.whl"
    out = cache / "agent" / name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    dist_info = f"kiln_agent-{version}.dist-info"
    requires = "".join(f"Requires-Dist: {req}\n" for req in AGENT_REQUIREMENTS)
    meta = {
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {AGENT_DIST}\nVersion: {version}\n"
            f"Summary: Kiln's device agent (protos + device_agent only)\n"
            f"Requires-Python: >=3.11\n{requires}"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: kiln-deploy\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist_info}/entry_points.txt": (
            b"[console_scripts]\nkiln-agent = device_agent.__main__:main\n"
        ),
    }
    records: list[str] = []
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".whl.tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for arcname, path in _sources():
                data = path.read_bytes()
                archive.writestr(_zip_info(arcname), data)
                records.append(f"{arcname},{_record_hash(data)},{len(data)}")
            for arcname, data in meta.items():
                archive.writestr(_zip_info(arcname), data)
                records.append(f"{arcname},{_record_hash(data)},{len(data)}")
            records.append(f"{dist_info}/RECORD,,")
            archive.writestr(_zip_info(f"{dist_info}/RECORD"), "\n".join(records) + "\n")
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    return out


def _zip_info(name: str) -> zipfile.ZipInfo:
    # A fixed date: the same sources give the same bytes.
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def dependency_wheels(platform: Platform, cache: Path = DEFAULT_CACHE) -> list[Path]:
    """The dependency wheels for hosts of `platform`, downloaded into the cache once.

    Raises:
        BundleError: pip could not download them (no route to an index, no wheel for the platform).
    """
    folder = cache / "wheels" / platform.label
    stamp = folder / "requirements.json"
    wanted = sorted((*AGENT_REQUIREMENTS, INSTALLER))
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return sorted(folder.glob("*.whl"))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):  # another requirement set's wheels: never mix the two
        old.unlink()
    major, minor = platform.python
    command = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
        "--only-binary=:all:", "--dest", str(folder),
        "--python-version", f"{major}.{minor}", "--implementation", "cp", "--abi", f"cp{major}{minor}",
    ]  # fmt: skip
    for tag in platform.pip_platforms():
        command += ["--platform", tag]
    result = subprocess.run(
        [*command, *AGENT_REQUIREMENTS, INSTALLER],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    if result.returncode != 0:
        raise BundleError(
            f"pip could not download the agent's dependencies for {platform.label}: "
            f"{result.stderr.strip()[-800:]}"
        )
    stamp.write_text(json.dumps(wanted))
    return sorted(folder.glob("*.whl"))


def installer_wheel(wheels: list[Path]) -> Path:
    """The pip wheel among `wheels` (what `dependency_wheels` returns).

    Raises:
        BundleError: there is none (a wheelhouse filled by hand without it).
    """
    found = [w for w in wheels if w.name.startswith("pip-") and w.name.endswith(".whl")]
    if len(found) != 1:
        raise BundleError(
            f"expected one pip wheel among the host's wheels, found {len(found)}: "
            f"{', '.join(sorted(w.name for w in wheels))}"
        )
    return found[0]
