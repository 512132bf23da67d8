"""systemd units for Kiln's daemons: a pure renderer (standard library only, nothing is run).

    service = tracker_service("/opt/kiln/venv/bin/python", ["--listen", "0.0.0.0:9190",
                              "--token-file", "/etc/kiln/pool.secrets", "--store-file",
                              "/etc/kiln/store-url"], working_dir="/var/lib/kiln-tracker",
                              user_mode=False, run_as="kiln-tracker")
    text = render_unit(service)          # the contents of kiln-tracker.service

The agent's unit is a `Service` built by `deploy.services.SystemdService` from the agent's argv.

What a unit says, and why:
- `Restart=on-failure` every `restart_sec`, forever (`StartLimitIntervalSec=0`: a host's agent or
  a tracker waiting for its Redis must not give up after five tries), except after exit status 2,
  which both daemons use for a bad command line only (`RestartPreventExitStatus=2`): restarting
  cannot fix that, and the failed unit says why in `systemctl status`.
- `KillSignal=SIGTERM` with `KillMode=mixed`: SIGTERM goes to the daemon alone, which stops
  gracefully (the agent deregisters its devices, then kills its own executor children); whatever
  is left gets SIGKILL when it exits or after `TimeoutStopSec=` (`stop_timeout_s`, 20 s by default:
  the agent needs up to rpc_timeout_s 5 + stop grace 2 + slack 5 s). With the default
  control-group mode an executor child would get SIGTERM too and a job in flight would end as a
  CRASH instead of being answered by the agent.
- System units (`user_mode=False`) run as `run_as` (`User=`; no `Group=`, so systemd takes the
  user's primary group, whatever the host's useradd made). A system unit without `run_as` is
  refused rather than run as root by accident: pass "root" to mean it. `DynamicUser=` is not
  offered: a transient uid cannot own the working dir, cache and secrets that deploy installs.
  Hardening: `NoNewPrivileges`, `ProtectSystem=strict` with `ReadWritePaths=` the working dir and
  `state_dirs` (everything else read-only; /dev, /proc and /sys stay visible for GPUs and
  telemetry), `ProtectHome=read-only` (homes stay readable, since a venv or a secrets file may
  live there; a writable path under /home works because ReadWritePaths= nests inside it),
  `PrivateTmp`, `ProtectKernelTunables`, `ProtectKernelModules`, `ProtectControlGroups`,
  `RestrictSUIDSGID`, `LockPersonality`, `UMask=0077`.
- User units (`user_mode=True`, for `systemctl --user`) take only the options a user manager
  applies without privileges: `NoNewPrivileges`, `RestrictSUIDSGID`, `LockPersonality` (seccomp
  filters, allowed once no_new_privs is set) and `UMask=0077`. The mount-namespace options
  (ProtectSystem=, ProtectHome=, PrivateTmp=, ReadWritePaths=, ProtectKernel*=) need
  PrivateUsers=, that is unprivileged user namespaces, in a user manager (systemd.exec(5));
  hosts that disable those (a sysctl, AppArmor's userns restriction) would fail to start the
  unit, so they are left out and `state_dirs` is unused. Nor is there network-online.target for
  a user manager to wait on, so a user unit has no After=/Wants=; the agent retries its tracker
  with backoff anyway. `run_as` must be empty: a user manager runs everything as its user.
- Never `MemoryDenyWriteExecute=`, `SystemCallFilter=`, `PrivateDevices=`, `ProtectClock=` or
  `DevicePolicy=`: the agent forks executor children that dlopen native code from its cache dir
  (the cache must stay writable and executable) and the cuda backend opens /dev/nvidia*.

Quoting: `ExecStart=` words are unquoted and C-unescaped, then `%` specifiers are expanded, then
(when the process starts) `$VAR` / `${VAR}` are substituted. `quote_exec_arg` writes a word that
comes back unchanged from all three: plain words bare, others in double quotes with `\\` and `\"`
escaped, every `%` as `%%` and every `$` as `$$`. Control characters (newline, NUL, tab, ...) are
refused with a ValueError naming the argument: a unit file line cannot hold them as they are, and
argv never needs them. The same care goes into every other value written (paths, environment,
the description).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

# Words that need no quotes in ExecStart= (no whitespace, quotes, backslash, `$` or `;`).
_BARE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.-]+")
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_MAX = 4096
_NAME_MAX = 255


@dataclass(frozen=True)
class Service:
    """One daemon as a systemd service; `render_unit` turns it into the unit file's text.

    Attributes:
        name: the unit's name without ".service", e.g. "kiln-agent-edge1".
        description: Description= (one line).
        exec_start: the argv; the first element is an absolute path (the venv's python).
        working_dir: absolute; in a system unit also writable, like `state_dirs`.
        user_mode: True for a `systemctl --user` unit, False for a system unit.
        run_as: a system unit's dedicated user (User=; "root" only deliberately); "" in user mode.
        state_dirs: absolute paths a system unit may write besides `working_dir` (ReadWritePaths=).
        environment: (name, value) pairs (Environment=); no secrets: unit files are world-readable.
        restart_sec: the pause before a restart after a failure (RestartSec=).
        stop_timeout_s: how long a stop waits after SIGTERM before SIGKILL (TimeoutStopSec=).
    """

    name: str
    description: str
    exec_start: tuple[str, ...]
    working_dir: str
    user_mode: bool
    run_as: str = ""
    state_dirs: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    restart_sec: float = 2.0
    stop_timeout_s: float = 20.0

    @property
    def unit_file(self) -> str:
        """The unit's file name, e.g. "kiln-agent-edge1.service"."""
        return f"{self.name}.service"


def tracker_service(
    python: str,
    args: Sequence[str],
    *,
    working_dir: str,
    user_mode: bool,
    run_as: str = "",
    name: str = "kiln-tracker",
) -> Service:
    """The tracker daemon (`python -m tracker ARGS`) as a service.

    Give the store URL with --store-file, not in `args` or the environment: a unit file and
    `systemctl show` are readable by every user of the host.
    """
    return Service(
        name=name,
        description="Kiln tracker (device pool registry)",
        exec_start=(python, "-m", "tracker", *args),
        working_dir=working_dir,
        user_mode=user_mode,
        run_as=run_as,
    )


def _check_text(value: str, what: str) -> None:
    """Refuse what no unit file line can hold: control characters and text that is not UTF-8."""
    for char in value:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            raise ValueError(
                f"{what} {value!r} contains the control character {char!r}; Kiln writes none "
                "into a systemd unit (a unit line cannot hold it unescaped)"
            )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {value!r} is not valid UTF-8 (a lone surrogate)") from None


def _quoted(value: str) -> str:
    """`value` in double quotes, for settings that unquote (and possibly C-unescape) words."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_exec_arg(arg: str) -> str:
    """`arg` written as one ExecStart= word that systemd reads back as exactly `arg`.

    Raises:
        ValueError: `arg` holds a control character (newline, NUL, tab, ...) or a lone
            surrogate; the message names the argument.
    """
    _check_text(arg, "argument")
    text = arg if _BARE.fullmatch(arg) else _quoted(arg)
    return text.replace("%", "%%").replace("$", "$$")


def _check_path(path: str, what: str) -> None:
    _check_text(path, what)
    if not path.startswith("/"):
        raise ValueError(f"{what} {path!r} must be an absolute path")
    if len(path.encode()) >= _PATH_MAX or any(
        len(part.encode()) > _NAME_MAX for part in path.split("/")
    ):
        raise ValueError(f"{what} {path!r} is too long for a path")
    if path != path.strip() or path.endswith("\\"):
        raise ValueError(f"{what} {path!r} must not end in whitespace or a backslash")


def _check_executable(path: str) -> None:
    """systemd's rules for the program itself: an absolute file path with no quotes,
    backslashes or control characters, and not a variable."""
    _check_path(path, "executable")
    bad = sorted(set(path) & set("\"'\\$"))
    if bad:
        raise ValueError(
            f"executable {path!r} contains {''.join(bad)!r}, which systemd does not accept in "
            "the program's path"
        )
    if path.endswith("/"):
        raise ValueError(f"executable {path!r} names a directory")


def exec_line(argv: Sequence[str]) -> str:
    """The value of ExecStart= for `argv` (whose first element is an absolute path).

    Raises:
        ValueError: an empty argv, a program path systemd refuses, or an argument it cannot carry.
    """
    if not argv:
        raise ValueError("ExecStart needs at least the program")
    _check_executable(argv[0])
    return " ".join(quote_exec_arg(arg) for arg in argv)


def _path_value(path: str, what: str) -> str:
    """A path for a setting that takes the whole value (WorkingDirectory=): specifiers only."""
    _check_path(path, what)
    return path.replace("%", "%%")


def _path_word(path: str, what: str) -> str:
    """A path as one word of a space-separated list (ReadWritePaths=)."""
    _check_path(path, what)
    text = path if _BARE.fullmatch(path) else _quoted(path)
    return text.replace("%", "%%")


def _seconds(value: float, what: str) -> str:
    """A time span systemd parses: "2s", "1500ms"."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    ms = round(value * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _check_service(service: Service) -> None:
    if not _UNIT_NAME.fullmatch(service.name) or service.name.endswith(".service"):
        raise ValueError(
            f'unit name {service.name!r} must be letters, digits and :_.- only, without ".service"'
        )
    if len(service.unit_file) > _NAME_MAX:
        raise ValueError(f"unit name {service.name!r} is too long")
    _check_text(service.description, "description")
    if service.description.endswith("\\"):
        raise ValueError(f"description {service.description!r} must not end in a backslash")
    if service.user_mode:
        if service.run_as:
            raise ValueError(
                f"a user unit runs as its manager's user; run_as must be empty, got "
                f"{service.run_as!r}"
            )
    elif not service.run_as:
        raise ValueError(
            f"system unit {service.name!r} needs run_as: its dedicated user ('root' only if meant)"
        )
    elif not _USER_NAME.fullmatch(service.run_as):
        raise ValueError(f"run_as {service.run_as!r} is not a valid user name")
    if service.stop_timeout_s <= 0:
        raise ValueError(f"stop_timeout_s must be positive, got {service.stop_timeout_s!r}")


def render_unit(service: Service) -> str:
    """The text of `service`'s unit file (see the module docstring for what it says and why).

    Raises:
        ValueError: a field systemd would refuse or read differently; the message names it.
    """
    _check_service(service)
    exec_start = exec_line(service.exec_start)
    working_dir = _path_value(service.working_dir, "working_dir")
    writable = [_path_word(service.working_dir, "working_dir")]
    for path in service.state_dirs:
        word = _path_word(path, "state dir")
        if word not in writable:
            writable.append(word)
    environment = []
    for name, value in service.environment:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"environment variable name {name!r} is not valid")
        _check_text(value, f"environment variable {name}'s value")
        environment.append(f"Environment={_quoted(f'{name}={value}').replace('%', '%%')}")

    unit = [
        "# Written by Kiln (deploy/units.py).",
        "[Unit]",
        f"Description={service.description.replace('%', '%%')}",
    ]
    if not service.user_mode:
        unit += ["After=network-online.target", "Wants=network-online.target"]
    unit.append("StartLimitIntervalSec=0")

    lines = [
        *unit,
        "",
        "[Service]",
        "Type=simple",
    ]
    if not service.user_mode:
        lines.append(f"User={service.run_as}")
    lines += [
        f"ExecStart={exec_start}",
        f"WorkingDirectory={working_dir}",
        *environment,
        f"SyslogIdentifier={service.name}",
        "Restart=on-failure",
        f"RestartSec={_seconds(service.restart_sec, 'restart_sec')}",
        "RestartPreventExitStatus=2",
        "KillSignal=SIGTERM",
        "KillMode=mixed",
        f"TimeoutStopSec={_seconds(service.stop_timeout_s, 'stop_timeout_s')}",
        "UMask=0077",
        "NoNewPrivileges=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
    ]
    if not service.user_mode:
        lines += [
            "ProtectSystem=strict",
            f"ReadWritePaths={' '.join(writable)}",
            "ProtectHome=read-only",
            "PrivateTmp=yes",
            "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes",
            "ProtectControlGroups=yes",
        ]
    target = "default.target" if service.user_mode else "multi-user.target"
    lines += ["", "[Install]", f"WantedBy={target}", ""]
    return "\n".join(lines)
