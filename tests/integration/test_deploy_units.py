"""deploy.units and deploy/compose.yaml: the units systemd reads are the units we meant.

Three independent readers check the ExecStart= quoting: a reference parser here, written from
systemd.service(5) "COMMAND LINES", systemd.syntax(7) "QUOTING" and systemd's config_parse_exec;
systemd itself (`systemd --test` loads the units without running anything and dumps each parsed
command line, re-quoted, which `_decode_dump_command_line` reads back); and the daemons' own
argument parsers, which must accept the argv the units start. `systemd-analyze verify` checks
every rendered unit, after a deliberately broken one shows that it does complain. The systemd
programs come from Debian's `systemd` package; tests that need one skip, naming it, without it.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.inventory import parse_inventory
from deploy.operations import agent_argv
from deploy.services import Layout, SystemdService
from deploy.units import Service, exec_line, quote_exec_arg, render_unit, tracker_service

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
SYSTEMD = next(
    (p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if os.access(p, os.X_OK)),
    None,
)
NEEDS_ANALYZE = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (Debian package: systemd)"
)

TRICKY = [
    "plain",
    "two words",
    "  leading and trailing  ",
    "",
    'double"quote',
    "single'quote",
    "'",
    '"',
    "back\\slash",
    "trailing\\",
    "\\\\",
    "100%",
    "%n",
    "%%",
    "$HOME",
    "${HOME}",
    "$$",
    "$",
    ";",
    "\\;",
    "a;",
    "&",
    "|",
    ">out",
    "#not-a-comment",
    "-x",
    "@y",
    "+z",
    "!",
    ":colon",
    "ünïcödé",
    "€ and 🦀",
    "--tag=board=rpi 4",
    "\\x41\\n",
]

# ---------------------------------------------------------------- a reference parser of ExecStart=

_WHITESPACE = " \t\n\r"
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}


def _unescape(text: str, i: int) -> tuple[str, int]:
    """The C escape whose letter is at text[i] (after the backslash): (character, next index)."""
    if i >= len(text):
        raise AssertionError(f"trailing backslash in {text!r}")
    c = text[i]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 1
    for letter, digits, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if c == letter:
            return chr(int(text[i + 1 : i + 1 + digits], base)), i + 1 + digits
    if c in "0123" and re.fullmatch(r"[0-7]{3}", text[i : i + 3]):
        return chr(int(text[i : i + 3], 8)), i + 3
    raise AssertionError(f"unknown escape \\{c} in {text!r}: systemd warns and keeps it")


def _extract_word(text: str, i: int) -> tuple[str, int]:
    """extract_first_word(EXTRACT_UNQUOTE | EXTRACT_CUNESCAPE) from text[i] (not whitespace)."""
    out: list[str] = []
    quote = ""
    while i < len(text):
        c = text[i]
        if quote and c == quote:
            quote = ""
            i += 1
        elif c == "\\":
            char, i = _unescape(text, i + 1)
            out.append(char)
        elif quote:
            out.append(c)
            i += 1
        elif c in _WHITESPACE:
            break
        elif c in "'\"":
            quote = c
            i += 1
        else:
            out.append(c)
            i += 1
    if quote:
        raise AssertionError(f"unbalanced quote in {text!r}")
    return "".join(out), i


def _specifiers(word: str) -> str:
    """Resolve % specifiers; only %% may appear, since the renderer means none."""
    out = []
    i = 0
    while i < len(word):
        if word[i] == "%":
            if word[i + 1 : i + 2] != "%":
                raise AssertionError(f"specifier {word[i : i + 2]!r} in {word!r} would be expanded")
            out.append("%")
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def _environment(word: str) -> str:
    """Substitute variables as the service manager does at start; only $$ may appear."""
    out = []
    i = 0
    while i < len(word):
        if word[i] == "$":
            if word[i + 1 : i + 2] != "$":
                raise AssertionError(f"{word!r} would substitute a variable")
            out.append("$")
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def parse_exec_start(value: str) -> list[str]:
    """The argv systemd runs for `ExecStart=value`, by config_parse_exec's rules.

    Raises AssertionError where systemd would read something else than one command: a second
    command after a lone ";", a prefix (-@:+!) on the program, a relative or unsafe program path,
    unbalanced quotes, unknown escapes, specifiers or variables.
    """
    argv: list[str] = []
    i = 0
    while True:
        while i < len(value) and value[i] in _WHITESPACE:
            i += 1
        if i == len(value):
            break
        after = value[i + 1 : i + 2]
        if argv and value[i] == ";" and (not after or after in _WHITESPACE):
            raise AssertionError(f"a lone ';' starts a second command in {value!r}")
        after_escaped = value[i + 2 : i + 3]
        if (
            argv
            and value.startswith("\\;", i)
            and (not after_escaped or after_escaped in "\t\n\r ")
        ):
            argv.append(";")
            i += 2
            continue
        word, i = _extract_word(value, i)
        if not argv:
            if word[:1] in ("-", "@", ":", "+", "!", ";"):
                raise AssertionError(f"the program {word!r} would be read as a prefix")
            word = _specifiers(word)
            if not word.startswith("/") or re.search(r"[\x00-\x1f\x7f\"'\\]", word):
                raise AssertionError(f"systemd refuses the program path {word!r}")
            argv.append(word)
        else:
            argv.append(_specifiers(word))
    if not argv:
        raise AssertionError("no command")
    return [_environment(word) for word in argv]


def unit_settings(text: str) -> dict[str, list[str]]:
    """{"Section.Key": [values]} of a unit file (no continuation lines: the renderer writes none)."""
    section = ""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        assert not line.endswith("\\"), f"a continuation line: {line!r}"
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, sep, value = line.partition("=")
        assert sep, line
        found.setdefault(f"{section}.{key}", []).append(value)
    return found


def exec_argv(unit_text: str) -> list[str]:
    (value,) = unit_settings(unit_text)["Service.ExecStart"]
    return parse_exec_start(value)


# ----------------------------------------------------------------------------- quoting, in Python


@pytest.mark.parametrize("arg", TRICKY)
def test_quote_exec_arg_round_trips(arg: str) -> None:
    line = exec_line(["/usr/bin/printf", arg, "next"])
    assert parse_exec_start(line) == ["/usr/bin/printf", arg, "next"]


def test_whole_tricky_argv_round_trips() -> None:
    argv = ["/opt/my venv %i/bin/python", *TRICKY]
    assert parse_exec_start(exec_line(argv)) == argv


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(
            st.characters(min_codepoint=0x20, blacklist_categories=["Cs"]).filter(
                lambda c: c != "\x7f"
            )
        ),
        max_size=6,
    )
)
def test_any_printable_argv_round_trips(args: list[str]) -> None:
    argv = ["/usr/bin/env", *args]
    assert parse_exec_start(exec_line(argv)) == argv


def test_the_reference_parser_catches_shell_quoting() -> None:
    """Shell quoting is not systemd quoting: the reference parser must notice the difference."""
    for arg in ("100%", "$HOME", "a\\b"):
        naive = f"/usr/bin/printf {shlex.quote(arg)}"
        with pytest.raises(AssertionError):
            assert parse_exec_start(naive) == ["/usr/bin/printf", arg]


@pytest.mark.parametrize("arg", ["a\nb", "nul\x00", "cr\r", "tab\t", "del\x7f", "esc\x1b[0m"])
def test_control_characters_are_refused_naming_the_argument(arg: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(arg))):
        quote_exec_arg(arg)
    with pytest.raises(ValueError, match=re.escape(repr(arg))):
        exec_line(["/usr/bin/python3", "-m", "tracker", arg])


def test_lone_surrogates_are_refused() -> None:
    bad = os.fsdecode(b"caf\xe9")  # surrogateescape
    with pytest.raises(ValueError, match="UTF-8"):
        quote_exec_arg(bad)


@pytest.mark.parametrize(
    "program",
    ["python3", "./venv/bin/python", '/opt/"x"/python', "/opt/it's/python", "/opt/a\\b",
     "/opt/$VENV/python", "/opt/bin/", ""],
)  # fmt: skip
def test_programs_systemd_refuses_are_refused(program: str) -> None:
    with pytest.raises(ValueError):
        exec_line([program, "-m", "tracker"])
    with pytest.raises(ValueError):
        exec_line([])


# ------------------------------------------------------------------------------------ the units


def agent_unit_text(root: str, user_mode: bool, **pool: Any) -> tuple[str, list[str]]:
    """The agent's unit as `kiln deploy` writes it (inventory -> argv -> SystemdService)."""
    inventory = parse_inventory(
        {
            "pool": {"tracker": "10.0.0.5:9190", "secrets": "pool.secrets", **pool},
            "defaults": {"user": "kiln"},
            "host": [
                {
                    "name": "edge1",
                    "address": "10.0.0.11",
                    "key": "arm-a72",
                    "root": root,
                    "service": "systemd-user" if user_mode else "systemd",
                    "tags": {"board": 'rpi 4 "b" 100% $x', "note": "it's\\fine"},
                    "devices": 2,
                }
            ],
        },
        Path("/nonexistent/inventory.toml"),
    )
    host = inventory.hosts[0]
    layout = Layout(root)
    argv = agent_argv(inventory, host, layout)
    return SystemdService(host, layout, user_mode=user_mode).render(argv), argv


def tracker_unit_text(python: str, user_mode: bool) -> tuple[str, list[str]]:
    args = [
        "--listen",
        "0.0.0.0:9190",
        "--token-file",
        "/etc/kiln/pool secrets",
        "--store-file",
        "/etc/kiln/store-url",
        "--metrics-port",
        "9191",
        "--lost-retention-s",
        "3600",
    ]
    service = tracker_service(
        python,
        args,
        working_dir="/var/lib/kiln-tracker",
        user_mode=user_mode,
        run_as="" if user_mode else "root",
    )
    return render_unit(service), [python, "-m", "tracker", *args]


@pytest.mark.parametrize("user_mode", [False, True])
def test_agent_unit_starts_what_the_agent_accepts(user_mode: bool) -> None:
    from device_agent.__main__ import parse_args

    text, argv = agent_unit_text("/var/lib/kiln-agent/edge 1", user_mode)
    parsed = exec_argv(text)
    assert parsed == argv
    assert parsed[1:3] == ["-m", "device_agent"]
    args = parse_args(parsed[3:])
    assert args.key == "arm-a72"
    assert dict(args.tag)["board"] == 'rpi 4 "b" 100% $x'
    assert dict(args.tag)["note"] == "it's\\fine"
    assert args.cache_dir == "/var/lib/kiln-agent/edge 1/cache"


@pytest.mark.parametrize("user_mode", [False, True])
def test_tracker_unit_starts_what_the_tracker_accepts(user_mode: bool) -> None:
    from tracker.__main__ import build_parser

    text, argv = tracker_unit_text("/opt/kiln/venv/bin/python", user_mode)
    parsed = exec_argv(text)
    assert parsed == argv
    assert parsed[1:3] == ["-m", "tracker"]
    args = build_parser().parse_args(parsed[3:])
    assert args.token_file == "/etc/kiln/pool secrets"
    assert args.listen == "0.0.0.0:9190"


def test_system_unit_settings() -> None:
    service = Service(
        name="kiln-agent-edge1",
        description="Kiln device agent edge1 (100% arm)",
        exec_start=("/var/lib/kiln-agent/edge1/venv/bin/python", "-m", "device_agent"),
        working_dir="/var/lib/kiln-agent/edge1",
        user_mode=False,
        run_as="kiln-agent",
        state_dirs=("/var/lib/kiln-agent/edge1", "/srv/kiln cache"),
        environment=(("GREETING", 'say "hi" 100%'),),
        restart_sec=1.5,
    )
    found = unit_settings(render_unit(service))
    one = {key: values[0] for key, values in found.items() if len(values) == 1}
    assert one["Unit.Description"] == "Kiln device agent edge1 (100%% arm)"
    assert one["Unit.After"] == one["Unit.Wants"] == "network-online.target"
    assert one["Service.Type"] == "simple"
    assert one["Service.User"] == "kiln-agent"
    assert one["Service.WorkingDirectory"] == "/var/lib/kiln-agent/edge1"
    assert one["Service.Restart"] == "on-failure"
    assert one["Service.RestartSec"] == "1500ms"
    assert one["Service.KillSignal"] == "SIGTERM"
    assert one["Service.TimeoutStopSec"] == "20s"
    assert one["Service.Environment"] == '"GREETING=say \\"hi\\" 100%%"'
    assert one["Service.ReadWritePaths"] == '/var/lib/kiln-agent/edge1 "/srv/kiln cache"'
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "read-only",
        "PrivateTmp": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "UMask": "0077",
    }.items():
        assert one[f"Service.{key}"] == value, key
    assert one["Install.WantedBy"] == "multi-user.target"
    # What would break the agent's executors (fork, exec, dlopen of its cache) or its GPUs.
    for key in ("MemoryDenyWriteExecute", "SystemCallFilter", "PrivateDevices", "DevicePolicy"):
        assert f"Service.{key}" not in found


def test_user_unit_takes_only_what_a_user_manager_applies() -> None:
    service = Service(
        name="kiln-agent-edge1",
        description="Kiln device agent edge1",
        exec_start=("/home/kiln/.kiln-agent/edge1/venv/bin/python", "-m", "device_agent"),
        working_dir="/home/kiln/.kiln-agent/edge1",
        user_mode=True,
        state_dirs=("/home/kiln/.kiln-agent/edge1",),
    )
    found = unit_settings(render_unit(service))
    assert found["Service.NoNewPrivileges"] == ["yes"]
    assert found["Service.UMask"] == ["0077"]
    assert found["Install.WantedBy"] == ["default.target"]
    for key in (
        "Service.User",
        "Service.ProtectSystem",
        "Service.ProtectHome",
        "Service.PrivateTmp",
        "Service.ReadWritePaths",
        "Service.ProtectKernelTunables",
        "Service.ProtectControlGroups",
        "Unit.Wants",
    ):
        assert key not in found, key


def test_run_as_must_fit_the_mode() -> None:
    base: dict[str, Any] = {
        "name": "kiln-tracker",
        "description": "t",
        "exec_start": ("/usr/bin/python3", "-m", "tracker"),
        "working_dir": "/var/lib/kiln-tracker",
    }
    with pytest.raises(ValueError, match="needs run_as"):
        render_unit(Service(**base, user_mode=False))
    with pytest.raises(ValueError, match="run_as must be empty"):
        render_unit(Service(**base, user_mode=True, run_as="kiln"))
    with pytest.raises(ValueError, match="not a valid user name"):
        render_unit(Service(**base, user_mode=False, run_as="bad user"))


@pytest.mark.parametrize(
    "change",
    [
        {"name": "kiln agent"},
        {"name": "kiln-agent.service"},
        {"description": "two\nlines"},
        {"description": "ends in \\"},
        {"working_dir": "relative/dir"},
        {"working_dir": "/var/lib/x\n"},
        {"state_dirs": ("cache",)},
        {"environment": (("1BAD", "x"),)},
        {"environment": (("GOOD", "new\nline"),)},
        {"restart_sec": float("nan")},
        {"restart_sec": -1.0},
        {"stop_timeout_s": 0.0},
    ],
)
def test_fields_systemd_would_misread_are_refused(change: dict[str, Any]) -> None:
    fields: dict[str, Any] = {
        "name": "kiln-agent",
        "description": "Kiln device agent",
        "exec_start": ("/usr/bin/python3", "-m", "device_agent"),
        "working_dir": "/var/lib/kiln-agent",
        "user_mode": False,
        "run_as": "kiln-agent",
    }
    with pytest.raises(ValueError):
        render_unit(Service(**{**fields, **change}))


# ---------------------------------------------------------------- systemd itself reads the units


@pytest.fixture
def unit_dir() -> Iterator[Path]:
    """A folder that an unprivileged `systemd --test` may read (tmp_path's parents are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="kiln-units-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def _unprivileged() -> list[str]:
    """A command prefix that runs a program as a user other than root (test mode refuses root)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and setpriv (Debian package: util-linux) is missing")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("running as root and there is no user 'nobody' to run systemd --test as")
    return [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


def systemd_dump(folder: Path, unit_file: str, user_mode: bool) -> dict[str, list[str]]:
    """Load `folder`'s units into `systemd --test` and return its dump of `unit_file`:
    {"Key": [values]}, the parsed command lines under "Command Line"."""
    if SYSTEMD is None:
        pytest.skip("systemd is not installed (Debian package: systemd)")
    prefix = _unprivileged()
    runtime = Path(tempfile.mkdtemp(prefix="runtime-", dir=folder))
    if prefix:
        os.chown(runtime, int(prefix[1].split("=")[1]), int(prefix[2].split("=")[1]))
    for path in folder.glob("*.service"):
        path.chmod(0o644)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(folder),
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": str(runtime),
        "SYSTEMD_UNIT_PATH": f"{folder}:",
    }
    mode = "--user" if user_mode else "--system"
    result = subprocess.run(
        [*prefix, SYSTEMD, "--test", mode, f"--unit={unit_file}", "--log-target=console"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert not [line for line in result.stderr.splitlines() if unit_file in line], result.stderr
    dump: dict[str, list[str]] = {}
    inside = False
    for line in result.stdout.splitlines():
        if line.startswith("\t-> Unit "):
            inside = line == f"\t-> Unit {unit_file}:"
        elif inside:
            key, sep, value = line.strip().partition(": ")
            if sep:
                dump.setdefault(key, []).append(value)
    assert dump, f"{unit_file} is not in systemd's dump:\n{result.stdout[-4000:]}"
    return dump


def _decode_dump_command_line(text: str) -> list[str]:
    """Words of systemd's quote_command_line(): bare, or "..." with \\ before \\ " ` $."""
    words = []
    i = 0
    while i < len(text):
        if text[i] == " ":
            i += 1
        elif text[i] == '"':
            word = []
            i += 1
            while text[i] != '"':
                if text[i] == "\\":
                    i += 1
                word.append(text[i])
                i += 1
            i += 1
            words.append("".join(word))
        else:
            assert not text.startswith("$'", i), f"unexpected C-quoted word in {text!r}"
            end = text.find(" ", i)
            end = len(text) if end < 0 else end
            words.append(text[i:end])
            i = end
    return words


def systemd_argv(dump: dict[str, list[str]]) -> list[str]:
    """The argv systemd would run: the dumped command line after variable substitution
    (which happens at start, so the dump still shows $$)."""
    (line,) = dump["Command Line"]
    return [_environment(word) for word in _decode_dump_command_line(line)]


@pytest.mark.parametrize("user_mode", [False, True])
def test_systemd_reads_back_the_argv_and_settings(unit_dir: Path, user_mode: bool) -> None:
    argv = ["/opt/my venv %i/bin/python", *TRICKY]
    service = Service(
        name="kiln-quoting",
        description="Kiln 100% $quoting",
        exec_start=tuple(argv),
        working_dir="/srv/kiln %i/work dir",
        user_mode=user_mode,
        run_as="" if user_mode else "kiln-agent",
        state_dirs=('/srv/kiln %i/sta"te dir', "/srv/cache"),
        environment=(("NOTE", 'say "hi" 100% $HOME \\o/'),),
    )
    (unit_dir / service.unit_file).write_text(render_unit(service))
    # The control: shell quoting, which systemd reads differently (a specifier, a variable).
    naive = service.unit_file.replace("quoting", "naive")
    naive_argv = ["/usr/bin/printf", "%n", "it is $HOME"]
    (unit_dir / naive).write_text(f"[Service]\nExecStart={shlex.join(naive_argv)}\n")

    dump = systemd_dump(unit_dir, service.unit_file, user_mode)
    assert systemd_argv(dump) == argv
    assert dump["Description"] == ["Kiln 100% $quoting"]
    assert dump["WorkingDirectory"] == ["/srv/kiln %i/work dir"]
    assert dump["Environment"] == ['NOTE=say "hi" 100% $HOME \\o/']
    assert dump["Restart"] == ["on-failure"]
    assert dump["KillMode"] == ["mixed"]
    assert dump["KillSignal"] == ["SIGTERM"]
    assert dump["UMask"] == ["0077"]
    assert dump["LockPersonality"] == ["yes"]
    assert dump["RestrictSUIDSGID"] == ["yes"]
    if user_mode:
        assert dump["ProtectSystem"] == ["no"]
        assert "User" not in dump
    else:
        assert dump["User"] == ["kiln-agent"]
        assert dump["ProtectSystem"] == ["strict"]
        assert dump["ProtectHome"] == ["read-only"]
        assert dump["PrivateTmp"] == ["yes"]
        assert dump["ProtectKernelTunables"] == ["yes"]
        assert dump["ProtectControlGroups"] == ["yes"]
        assert dump["ReadWritePaths"] == [
            '/srv/kiln %i/work dir /srv/kiln %i/sta"te dir /srv/cache'
        ]

    (naive_line,) = systemd_dump(unit_dir, naive, user_mode)["Command Line"]
    assert _decode_dump_command_line(naive_line) == [
        "/usr/bin/printf",
        "kiln-naive.service",
        "it is $HOME",
    ]


# ------------------------------------------------------------------------- systemd-analyze verify


def analyze_verify(path: Path, user_mode: bool) -> tuple[int, list[str]]:
    """`systemd-analyze [--user] verify` of one unit: its exit status and what it said about it.

    verify exits 0 on warnings (an unknown key, a value it cannot parse), so every line that
    names the unit counts; lines about the host's own units do not.
    """
    assert SYSTEMD_ANALYZE is not None
    with tempfile.TemporaryDirectory() as runtime:  # --user needs a runtime dir; any will do
        env = {**os.environ, "XDG_RUNTIME_DIR": runtime, "SYSTEMD_LOG_COLOR": "0"}
        mode = ["--user"] if user_mode else []
        result = subprocess.run(
            [SYSTEMD_ANALYZE, *mode, "verify", "--man=no", "--generators=no", str(path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    said = (result.stdout + result.stderr).splitlines()
    return result.returncode, [line for line in said if path.name in line]


def stand_in_python(path: Path) -> Path:
    """An executable at `path` (verify checks the program exists and may be run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@NEEDS_ANALYZE
@pytest.mark.parametrize("user_mode", [False, True])
def test_verify_complains_about_broken_units(tmp_path: Path, user_mode: bool) -> None:
    """The control: verify must be able to fail, or the checks below prove nothing."""
    python = stand_in_python(tmp_path / "bin" / "python")
    unknown_key = tmp_path / "kiln-unknown-key.service"
    unknown_key.write_text(f"[Service]\nExecStart={python}\nProtectSystem=bogus\nBogus=1\n")
    _, said = analyze_verify(unknown_key, user_mode)
    assert any("Bogus" in line for line in said), said
    assert any("bogus" in line for line in said), said

    relative = tmp_path / "kiln-relative.service"
    relative.write_text('[Service]\nExecStart=venv/bin/python "unbalanced\n')
    rc, said = analyze_verify(relative, user_mode)
    assert rc != 0 and said, said

    missing = tmp_path / "kiln-missing.service"
    missing.write_text(f"[Service]\nExecStart={tmp_path}/no-such-python -m tracker\n")
    rc, said = analyze_verify(missing, user_mode)
    assert rc != 0 and any("not executable" in line for line in said), said


@NEEDS_ANALYZE
@pytest.mark.parametrize("user_mode", [False, True])
def test_rendered_units_pass_verify(tmp_path: Path, user_mode: bool) -> None:
    root = tmp_path / "kiln agent %i"
    stand_in_python(root / "venv" / "bin" / "python")
    agent, _ = agent_unit_text(str(root), user_mode)
    tracker, _ = tracker_unit_text(str(stand_in_python(tmp_path / "bin" / "python")), user_mode)
    if not user_mode:
        # verify does not look users up, but use one that exists wherever this runs.
        agent = agent.replace("User=kiln-agent", "User=root")
    for name, text in (("kiln-agent-edge1.service", agent), ("kiln-tracker.service", tracker)):
        path = tmp_path / name
        path.write_text(text)
        rc, said = analyze_verify(path, user_mode)
        assert (rc, said) == (0, []), f"{name}:\n{text}"


# ------------------------------------------------------------------------- compose and Dockerfile


def load_yaml(path: Path) -> Any:
    """PyYAML's safe_load, from this interpreter or else from the system's python3 (Debian's
    python3-yaml); skips when neither has it."""
    try:
        yaml = importlib.import_module("yaml")
    except ImportError:
        pass
    else:
        return yaml.safe_load(path.read_text())
    code = "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)"
    for python in ("/usr/bin/python3", shutil.which("python3")):
        if python and os.access(python, os.X_OK):
            result = subprocess.run(
                [python, "-c", code, str(path)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if result.returncode == 0:
                return json.loads(result.stdout)
    pytest.skip("PyYAML is not importable here nor by the system python3 (python3-yaml)")


def test_compose_runs_a_tracker_the_tracker_accepts_on_a_healthy_redis() -> None:
    from tracker.__main__ import build_parser, is_loopback
    from tracker.store import is_store_name

    compose = load_yaml(ROOT / "deploy" / "compose.yaml")
    services = compose["services"]
    assert set(services) == {"redis", "tracker"}

    redis = services["redis"]
    assert redis["image"].split(":")[0] == "redis"
    assert " ".join(redis["command"]).endswith("--appendonly yes")
    volume, target = redis["volumes"][0].split(":")
    assert target == "/data" and volume in compose["volumes"]
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert redis["restart"] == "unless-stopped"

    tracker = services["tracker"]
    command = tracker["command"]
    assert all(isinstance(word, str) for word in command), command
    assert command[:3] == ["python", "-m", "tracker"]
    args = build_parser().parse_args(command[3:])
    # What main() checks after parsing: a store it has, and a token file on a public address.
    assert is_store_name(args.store) and args.store.startswith("redis://redis:")
    host, port = args.listen.rsplit(":", 1)
    assert args.token_file and not is_loopback(host)
    (secret,) = tracker["secrets"]
    assert args.token_file == f"/run/secrets/{secret}"
    assert secret in compose["secrets"]
    assert f"{port}:{port}" in tracker["ports"]
    assert f"127.0.0.1:{args.metrics_port}:{args.metrics_port}" in tracker["ports"]
    assert tracker["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert tracker["restart"] == "unless-stopped"
    assert tracker["stop_signal"] == "SIGTERM"

    health = tracker["healthcheck"]["test"]
    assert health[:3] == ["CMD", "python", "-c"]
    ast.parse(health[3])  # one line of Python
    assert f'"127.0.0.1:{port}"' in health[3]

    build = tracker["build"]
    dockerfile = (ROOT / "deploy" / build["context"]).resolve() / build["dockerfile"]
    assert dockerfile == ROOT / "deploy" / "Dockerfile.tracker"


def test_tracker_dockerfile_copies_what_exists_and_installs_the_tracker_extra() -> None:
    import tomllib

    text = (ROOT / "deploy" / "Dockerfile.tracker").read_text()
    copies = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ")]
    sources = [source for sources in copies for source in sources]
    assert {"pyproject.toml", "protos", "tracker"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "tracker" in extras["optional-dependencies"]
    assert 'pip install ".[tracker]"' in text


# ------------------------------------------------------------------ kiln deploy tracker-unit (CLI)


@NEEDS_ANALYZE
def test_tracker_unit_command_prints_a_unit_that_verifies(tmp_path: Path) -> None:
    python = stand_in_python(tmp_path / "bin" / "python")
    flags = ["--listen", "0.0.0.0:9190", "--token-file", "/etc/kiln/pool.secrets"]
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "deploy", "tracker-unit", "--python", str(python),
         "--run-as", "root", "--", *flags],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert exec_argv(result.stdout) == [str(python), "-m", "tracker", *flags]
    path = tmp_path / "kiln-tracker.service"
    path.write_text(result.stdout)
    assert analyze_verify(path, user_mode=False) == (0, [])


def test_tracker_unit_command_refuses_what_the_tracker_refuses() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kiln", "deploy", "tracker-unit", "--", "--no-such-flag"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--no-such-flag" in result.stderr and result.stdout == ""
