"""Fuzz every RPC of real `kiln-tracker` and `kiln-agent` processes: the pool holds.

Both daemons run in dev mode (no pool secrets, so every method is reachable) on 127.0.0.1 port 0,
each under a 4 GiB address-space limit so that a runaway allocation fails inside the daemon
instead of taking this machine's memory. The agent serves one `null` device, standalone; the
tracker has a fake agent's two devices registered and leased, so Acquire, Renew and Release reach
their busy paths.

For every method (Tracker, Agent, and grpc.health.v1.Health Check and Watch on both) hypothesis
sends, with a fixed budget, derandomized and without shrinking (every example costs real RPCs):

- raw bytes on the wire (identity serializers): known-bad, random and mutated encodings. Bytes the
  request type cannot decode must get INVALID_ARGUMENT, on the streaming Watch and Upload too;
- real request messages with wild values: huge and odd strings, NaN, infinite and negative floats,
  extreme integers, unknown enum numbers, many map entries and repeated elements, empty fields.

Every call must end within its timeout (DEADLINE_EXCEEDED is a hang), OK or with a code of
ALLOWED_CODES (never INTERNAL or UNKNOWN), and after every call the daemon must still be alive
and answer Health/Check SERVING. Then 20,000 undecodable calls to each daemon must leave its RSS
flat, and so must 1,000 Health/Watch calls for new service names, each cancelled after its first
answer (the way a prober watches), which must not wedge the server either.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import math
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from protos import agent_pb2, common_pb2, tracker_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
RPC_TIMEOUT_S = 5.0
ADDRESS_SPACE_BYTES = 4 << 30
# The servers' receive limits: the tracker keeps gRPC's 4 MiB default (tracker.config), the agent
# takes 256 MiB (device_agent.server). A bigger request is refused with RESOURCE_EXHAUSTED before
# it is decoded.
MAX_MESSAGE_BYTES = {"tracker": 4 * 1024 * 1024, "agent": 256 * 1024 * 1024}
# The longest wait a fuzzed Acquire asks for: a matching device is always busy (the fixture leases
# the fake agent's devices), so a longer timeout_s would make each such example wait that long.
ACQUIRE_MAX_WAIT_S = 0.3

# The codes a daemon may answer a fuzzed call with, and why:
ALLOWED_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,  # undecodable bytes, or a field out of its bounds
        grpc.StatusCode.NOT_FOUND,  # an unknown device (agent), an unknown service (health)
        grpc.StatusCode.UNAUTHENTICATED,  # the token checks; no token is needed in dev mode,
        grpc.StatusCode.PERMISSION_DENIED,  # but a refusal by them is still a typed answer
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # past the receive limit or the artifact bounds
        grpc.StatusCode.DATA_LOSS,  # an upload whose bytes do not match its meta
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
# Not allowed: INTERNAL and UNKNOWN (a servicer bug or an escaped exception), DEADLINE_EXCEEDED
# (a hang), UNIMPLEMENTED, and UNAVAILABLE. The tracker answers UNAVAILABLE only when its store is
# unreachable or it is shutting down; here the store is in memory and nothing stops a daemon
# during the fuzz, so UNAVAILABLE would mean the daemon went away.

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
FUZZ_DATA = b"kiln rpc fuzz artifact"
FUZZ_SHA = hashlib.sha256(FUZZ_DATA).hexdigest()
JUNK = b"\xff\xff\xff\xff"  # a truncated varint tag: no message decodes from it

# Lease ids of the fake agent's leases, filled by the `daemons` fixture, drawn by Renew/Release.
_LIVE_LEASES: list[str] = []


@dataclass(frozen=True)
class Rpc:
    """One method of one daemon: its path, its request type and which side streams."""

    daemon: str
    path: str
    request: type[Message]
    streaming: str = "unary"  # "unary", "server" (Health/Watch) or "client" (Upload)

    def __str__(self) -> str:
        return f"{self.daemon}{self.path}"


def _tracker_rpcs() -> list[Rpc]:
    """The tracker's methods (every one its proto declares) and its health service."""
    names = [m.name for m in tracker_pb2.DESCRIPTOR.services_by_name["Tracker"].methods]
    rpcs = [
        Rpc("tracker", f"/kiln.v1.Tracker/{n}", getattr(tracker_pb2, f"{n}Request")) for n in names
    ]
    return [*rpcs, *_health_rpcs("tracker")]


def _agent_rpcs() -> list[Rpc]:
    """The agent's methods and its health service; Upload last, after Measure and Run."""
    rpcs = [Rpc("agent", f"/kiln.v1.Agent/{n}", getattr(agent_pb2, f"{n}Request")) for n in ("Has", "Info", "Measure", "Run")]  # fmt: skip
    upload = Rpc("agent", "/kiln.v1.Agent/Upload", agent_pb2.UploadChunk, "client")
    return [*rpcs, *_health_rpcs("agent"), upload]


def _health_rpcs(daemon: str) -> list[Rpc]:
    """grpc.health.v1.Health Check and Watch on `daemon`."""
    return [
        Rpc(daemon, HEALTH_CHECK, health_pb2.HealthCheckRequest),
        Rpc(daemon, HEALTH_WATCH, health_pb2.HealthCheckRequest, "server"),
    ]


RPCS = [*_tracker_rpcs(), *_agent_rpcs()]


# ---------------------------------------------------------------------------------------------
# The daemons


@dataclass
class Daemon:
    """A daemon process this module started (ended by its pid), and a channel to it."""

    name: str
    proc: subprocess.Popen[bytes]
    address: str
    log_path: Path
    channel: grpc.Channel
    broken: str = ""  # why it stopped answering; later tests then fail at once, not by timeouts

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the daemon's log, for failure messages."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]


def _spawn(workdir: Path, name: str, args: list[str], procs: list[Any]) -> Daemon:
    """Start `python -m <args> --ready-file F` (appended to `procs` at once) and wait for F."""
    ready, log_path = workdir / f"{name}.ready", workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args, "--ready-file", str(ready)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    procs.append(proc)
    resource.prlimit(proc.pid, resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{log_path.read_text()}"
        assert time.monotonic() < deadline, f"{name} never became ready:\n{log_path.read_text()}"
        time.sleep(0.02)
    address = ready.read_text().splitlines()[0]
    return Daemon(name, proc, address, log_path, _channel(address))


def _channel(address: str) -> grpc.Channel:
    """A plaintext channel without client-side size limits: only the server's limits apply."""
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    return grpc.insecure_channel(address, options=options)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process by pid; SIGKILL it when it has not exited within STOP_TIMEOUT_S."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


@contextlib.contextmanager
def _running(workdir: Path, names: Sequence[str]) -> Iterator[dict[str, Daemon]]:
    """The named daemons ("tracker", "agent"), started in `workdir` and stopped by pid on exit."""
    starters = {"tracker": _start_tracker, "agent": _start_agent}
    procs: list[Any] = []
    started: dict[str, Daemon] = {}
    try:
        for name in names:
            started[name] = starters[name](workdir, procs)
        yield started
    finally:
        for daemon in started.values():
            daemon.channel.close()
        for proc in procs:
            _stop(proc)


def _start_tracker(workdir: Path, procs: list[Any]) -> Daemon:
    """A dev-mode tracker that fails unmatched Acquires at once and never expires the fake agent."""
    args = ["tracker", "--listen", "127.0.0.1:0", "--startup-grace-s", "0",
            "--heartbeat-interval-s", "600", "--log-level", "warning"]  # fmt: skip
    return _spawn(workdir, "tracker", args, procs)


def _start_agent(workdir: Path, procs: list[Any]) -> Daemon:
    """A dev-mode standalone agent with one `null` device, "fuzz/0"."""
    args = ["device_agent", "--key", "fuzz", "--backend", "null", "--listen", "127.0.0.1:0",
            "--agent-id", "fuzz", "--cache-dir", str(workdir / "agent-cache"),
            "--log-level", "warning"]  # fmt: skip
    return _spawn(workdir, "agent", args, procs)


def _typed_call(daemon: Daemon, path: str, request: Message, response: type[Message]) -> Any:
    """A unary call with real (de)serializers, for the fixture's setup."""
    call = daemon.channel.unary_unary(
        path, request_serializer=type(request).SerializeToString,
        response_deserializer=response.FromString,
    )  # fmt: skip
    return call(request, timeout=RPC_TIMEOUT_S)


def _lease_fake_devices(tracker: Daemon) -> list[str]:
    """Register a fake agent with two "x86" devices and lease both; their lease ids."""
    devices = [common_pb2.DeviceSpec(key="x86", backend="null") for _ in range(2)]
    register = tracker_pb2.RegisterRequest(agent_id="fuzz-agent", agent_address="127.0.0.1:9", devices=devices)  # fmt: skip
    _typed_call(tracker, "/kiln.v1.Tracker/Register", register, tracker_pb2.RegisterResponse)
    acquire = tracker_pb2.AcquireRequest(key="x86", user="fuzz", lease_ttl_s=600)
    path = "/kiln.v1.Tracker/Acquire"
    leases = [_typed_call(tracker, path, acquire, tracker_pb2.AcquireResponse) for _ in devices]
    assert all(lease.status == common_pb2.OK for lease in leases), leases
    return [lease.lease.lease_id for lease in leases]


def _upload_fuzz_artifact(agent: Daemon) -> None:
    """Store FUZZ_DATA with entry "f" (float32[4] in, float32[4] out) for Measure and Run."""
    x = common_pb2.TensorSpec(name="x", shape=[4], dtype="float32", role=common_pb2.INPUT)
    y = common_pb2.TensorSpec(name="y", shape=[4], dtype="float32", role=common_pb2.OUTPUT)
    meta = common_pb2.ArtifactMeta(
        sha256=FUZZ_SHA, format=common_pb2.SHARED_OBJECT, target="x86_64",
        entries=[common_pb2.EntryPoint(symbol="f", args=[x, y])], size_bytes=len(FUZZ_DATA),
    )  # fmt: skip
    upload = agent.channel.stream_unary(
        "/kiln.v1.Agent/Upload", request_serializer=agent_pb2.UploadChunk.SerializeToString,
        response_deserializer=agent_pb2.UploadResponse.FromString,
    )  # fmt: skip
    stored = upload(iter([agent_pb2.UploadChunk(meta=meta, data=FUZZ_DATA)]), timeout=RPC_TIMEOUT_S)
    assert stored.sha256 == FUZZ_SHA


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Daemon]]:
    """A tracker and an agent for the whole module, stopped by pid at its end."""
    with _running(tmp_path_factory.mktemp("rpc-fuzz"), ("tracker", "agent")) as started:
        _LIVE_LEASES[:] = _lease_fake_devices(started["tracker"])
        _upload_fuzz_artifact(started["agent"])
        yield started


# ---------------------------------------------------------------------------------------------
# Calls and what they may answer


class Frames(tuple[bytes, ...]):
    """The request messages of one call, as bytes on the wire; a short repr for reports."""

    __slots__ = ()

    def __repr__(self) -> str:
        shown = ", ".join(f"{len(f)} B {f[:24]!r}" for f in self[:3])
        return f"Frames({shown}{', ...' if len(self) > 3 else ''})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints a falsifying draw with this: the short repr, not megabytes."""
        printer.text(repr(self))


def _call(daemon: Daemon, rpc: Rpc, frames: Frames) -> tuple[grpc.StatusCode, str]:
    """Send `frames` raw (identity serializers); the status code and details of the answer.

    A server stream (Watch) never ends by itself: its first message (or its end) is the answer,
    then the call is cancelled.
    """
    try:
        if rpc.streaming == "client":
            daemon.channel.stream_unary(rpc.path)(iter(frames), timeout=RPC_TIMEOUT_S)
        elif rpc.streaming == "server":
            _first_message(daemon.channel.unary_stream(rpc.path)(frames[0], timeout=RPC_TIMEOUT_S))
        else:
            daemon.channel.unary_unary(rpc.path)(frames[0], timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def _first_message(call: Any) -> None:
    """Read a server stream's first message or its end (raising its error), then cancel it."""
    try:
        next(call, None)
    finally:
        call.cancel()


def _decodes(request: type[Message], raw: bytes) -> bool:
    """Whether `raw` parses as a `request`."""
    try:
        request.FromString(raw)
    except Exception:
        return False
    return True


def _expected_codes(daemon: Daemon, rpc: Rpc, frames: Frames) -> frozenset[grpc.StatusCode]:
    """The codes `frames` may get: RESOURCE_EXHAUSTED past the receive limit, INVALID_ARGUMENT
    when the (first) request does not decode, else OK or an allowed code."""
    if frames and len(frames[0]) > MAX_MESSAGE_BYTES[daemon.name]:
        return frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
    if frames and not _decodes(rpc.request, frames[0]):
        return frozenset({grpc.StatusCode.INVALID_ARGUMENT})
    return ALLOWED_CODES | {grpc.StatusCode.OK}


def _assert_serving(daemon: Daemon) -> None:
    """The daemon is alive and answers Health/Check SERVING (else it is marked broken)."""
    assert not daemon.broken, daemon.broken
    if daemon.proc.poll() is not None:
        daemon.broken = f"{daemon.name} died with {daemon.proc.returncode}"
        pytest.fail(f"{daemon.broken}:\n{daemon.log_tail()}")
    check = health_pb2.HealthCheckRequest()
    try:
        answer = _typed_call(daemon, HEALTH_CHECK, check, health_pb2.HealthCheckResponse)
    except grpc.RpcError as error:
        daemon.broken = f"{daemon.name} stopped answering Health/Check: {error.code().name}"
        pytest.fail(f"{daemon.broken}: {error.details()}\n{daemon.log_tail()}")
    assert answer.status == health_pb2.HealthCheckResponse.SERVING, answer


def _send_and_check(daemons: dict[str, Daemon], rpc: Rpc, frames: Frames) -> None:
    """Call `rpc` with `frames`; assert an expected code and a daemon still serving."""
    daemon = daemons[rpc.daemon]
    assert not daemon.broken, daemon.broken
    code, details = _call(daemon, rpc, frames)
    expected = _expected_codes(daemon, rpc, frames)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        daemon.broken = f"{daemon.name} hung on {rpc} ({frames!r})"
    assert code in expected, (
        f"{rpc} answered {code.name} ({details[:300]!r}) to {frames!r}; expected one of "
        f"{sorted(c.name for c in expected)}\n--- {daemon.name} log ---\n{daemon.log_tail()}"
    )
    _assert_serving(daemon)


# ---------------------------------------------------------------------------------------------
# Strategies: wild values by protobuf field type, and whole messages from their descriptors

_ODD_STRINGS = ("", "\x00", " ", "\n", "|", "%s%n", "a" * 129, "é", "🔥", "../../etc/passwd",
                "0f" * 32, "fuzz/1", "fuzz-agent/0", "main", "object", "V0", "float32,int8")  # fmt: skip
# Real values by field name: the agent's device, the uploaded artifact and its entry, a key the
# tracker knows, a new agent (not the fixture's fake one). A message's "plausible" variant has
# them all, so that its other, wild fields get past the first checks.
_HINTS: dict[str, tuple[str, ...]] = {
    "device_id": ("fuzz/0",),
    "artifact_sha256": (FUZZ_SHA,),
    "reference_sha256": (FUZZ_SHA,),
    "sha256": (FUZZ_SHA,),
    "symbol": ("f",),
    "reference_symbol": ("f",),
    "key": ("x86",),
    "agent_id": ("fuzz-other",),
    "agent_address": ("127.0.0.1:9",),
    "dtype": ("float32",),
    "service": ("", "kiln.v1.Tracker", "kiln.v1.Agent"),
}
_ODD_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, -1.0, 1e-9, 1e308, -1e308, 2.0**63)
_LONG_LENGTHS = (1025, 70_000, 1_100_000)
_INT_BITS = {
    FieldDescriptor.TYPE_INT32: (32, True), FieldDescriptor.TYPE_SINT32: (32, True),
    FieldDescriptor.TYPE_SFIXED32: (32, True), FieldDescriptor.TYPE_ENUM: (32, True),
    FieldDescriptor.TYPE_INT64: (64, True), FieldDescriptor.TYPE_SINT64: (64, True),
    FieldDescriptor.TYPE_SFIXED64: (64, True), FieldDescriptor.TYPE_UINT32: (32, False),
    FieldDescriptor.TYPE_FIXED32: (32, False), FieldDescriptor.TYPE_UINT64: (64, False),
    FieldDescriptor.TYPE_FIXED64: (64, False),
}  # fmt: skip


def _repeat_to(unit: Any, length: int) -> Any:
    """`unit` (a str or bytes) repeated to exactly `length` items."""
    return (unit * (length // len(unit) + 1))[:length]


def _strings(name: str, small: bool) -> st.SearchStrategy[str]:
    """Hints for the field, odd and random text, and (unless small) 1 K to 1.1 M characters."""
    choices = [st.sampled_from(_HINTS.get(name, ()) + _ODD_STRINGS), st.text(max_size=24)]
    if name == "lease_id":
        choices.insert(0, st.integers(0, 3).map(_live_lease))
    if not small:
        long = st.sampled_from(_LONG_LENGTHS)
        choices.append(st.builds(_repeat_to, st.text(min_size=1, max_size=3), long))
    return st.one_of(choices)


def _live_lease(index: int) -> str:
    """One of the fixture's lease ids (drawn at call time, once the fixture has run)."""
    return _LIVE_LEASES[index % len(_LIVE_LEASES)] if _LIVE_LEASES else ""


def _bytes(small: bool) -> st.SearchStrategy[bytes]:
    """Empty, FUZZ_DATA, random, and (unless small) 1 K to 1.1 M bytes."""
    choices = [st.sampled_from((b"", FUZZ_DATA, bytes(16))), st.binary(max_size=64)]
    if not small:
        long = st.sampled_from(_LONG_LENGTHS)
        choices.append(st.builds(_repeat_to, st.binary(min_size=1, max_size=3), long))
    return st.one_of(choices)


def _floats(field: FieldDescriptor) -> st.SearchStrategy[float]:
    """NaN, infinities, signed zeros, the extremes, and any float."""
    if field.full_name == "kiln.v1.AcquireRequest.timeout_s":
        return _acquire_waits()
    wide = st.floats(width=32) if field.type == FieldDescriptor.TYPE_FLOAT else st.floats()
    return st.one_of(st.sampled_from(_ODD_FLOATS), wide)


def _acquire_waits() -> st.SearchStrategy[float]:
    """Acquire timeouts: NaN, infinities and negatives (refused), or waits of at most 0.3 s."""
    odd = (math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, -1.0, -1e308, ACQUIRE_MAX_WAIT_S)
    return st.one_of(st.sampled_from(odd), st.floats(max_value=ACQUIRE_MAX_WAIT_S))


def _ints(field: FieldDescriptor) -> st.SearchStrategy[int]:
    """The type's extremes, 0 and +-1, the enum's own numbers, and any value in range."""
    bits, signed = _INT_BITS[field.type]
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    odd = {low, high, 0, 1, -1 if signed else 2}
    if field.enum_type is not None:
        odd |= {value.number for value in field.enum_type.values}
    return st.one_of(st.sampled_from(sorted(odd)), st.integers(low, high))


def _scalar(field: FieldDescriptor, small: bool) -> st.SearchStrategy[Any]:
    """Wild values for one non-repeated field."""
    if field.message_type is not None:
        return _message(message_factory.GetMessageClass(field.message_type), small)
    if field.type == FieldDescriptor.TYPE_STRING:
        return _strings(field.name, small)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return _bytes(small)
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return _floats(field)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    return _ints(field)


def _repeated(element: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """0 to 3 elements, or one element 300 or 5,000 times (past any sane bound)."""
    repeated = st.builds(lambda e, n: [e] * n, element, st.sampled_from((300, 5000)))
    return st.one_of(st.lists(element, max_size=3), repeated)


def _map(entry: Descriptor, small: bool) -> st.SearchStrategy[dict[Any, Any]]:
    """0 to 3 entries with wild values, or 65 or 3,000 small ones."""
    key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
    key, small_value = _scalar(key_field, True), _scalar(value_field, True)
    many = st.builds(_many_entries, key, small_value, st.sampled_from((65, 3000)))
    return st.one_of(st.dictionaries(key, _scalar(value_field, small), max_size=3), many)


def _many_entries(key: Any, value: Any, count: int) -> dict[Any, Any]:
    """`count` distinct keys made from `key`, all mapped to `value`."""
    return {f"{key}{i}" if isinstance(key, str) else key + i: value for i in range(count)}


def _field(field: FieldDescriptor, small: bool) -> st.SearchStrategy[Any]:
    """Wild values for one field, repeated and map fields included."""
    if field.is_repeated and field.message_type and field.message_type.GetOptions().map_entry:
        return _map(field.message_type, small)
    if field.is_repeated:
        return _repeated(_scalar(field, True))
    return _scalar(field, small)


def _message(request: type[Message], small: bool = False) -> st.SearchStrategy[Message]:
    """`request` messages, each field absent or wild, or plausible: hinted fields real, the others
    absent or wild. `small` keeps every string and list short (repeated elements are always
    small, so a message stays within tens of megabytes)."""
    descriptors = cast(Sequence[FieldDescriptor], request.DESCRIPTOR.fields)
    fields = {field.name: _field(field, small) for field in descriptors}
    hinted = {f.name: st.sampled_from(_HINTS[f.name]) for f in descriptors if _hinted(f)}
    others = {name: strategy for name, strategy in fields.items() if name not in hinted}
    wild = st.fixed_dictionaries({}, optional=fields)
    plausible = st.fixed_dictionaries(hinted, optional=others)
    return st.one_of(wild, plausible).map(lambda values: request(**values))


def _hinted(field: FieldDescriptor) -> bool:
    """Whether a field is a single string with real values in _HINTS."""
    is_string = field.type == FieldDescriptor.TYPE_STRING
    return is_string and not field.is_repeated and field.name in _HINTS


_BAD_FRAMES = (JUNK, b"\x0a\xff\x01garbage", b"\x0a\x80", b"\x08", b"\x0a\x02\xc3\x28", b"\x0b",
               b"\x0c", b"\x12\x05ab", b"\x0f", b"\x09\x01")  # fmt: skip


def _mutate(raw: bytes, position: int, how: int) -> bytes:
    """`raw` truncated, with a byte inverted, with 0xff inserted, or with a dangling tag added."""
    if not raw:
        return JUNK
    i = position % len(raw)
    mutants = (
        raw[:i],
        raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1 :],
        raw[:i] + b"\xff" + raw[i:],
        raw + b"\x0a",
    )
    return mutants[how]


def _raw_frame(request: type[Message]) -> st.SearchStrategy[bytes]:
    """Known-bad bytes, random bytes, and mutated encodings of small `request` messages."""
    encoded = _message(request, True).map(lambda m: m.SerializeToString())
    mutated = st.builds(_mutate, encoded, st.integers(0, 2**20), st.integers(0, 3))
    return st.one_of(st.sampled_from(_BAD_FRAMES), st.binary(max_size=256), mutated)


@functools.cache
def _raw_frames(rpc: Rpc) -> st.SearchStrategy[Frames]:
    """One raw frame, or 1 to 3 for Upload."""
    most = 3 if rpc.streaming == "client" else 1
    return st.lists(_raw_frame(rpc.request), min_size=1, max_size=most).map(Frames)


@functools.cache
def _wild_frames(rpc: Rpc) -> st.SearchStrategy[Frames]:
    """One wild message encoded, or 0 to 3 Upload chunks: any, or led by one with a meta (often
    naming their hash and size)."""
    if rpc.streaming != "client":
        return _message(rpc.request).map(lambda m: Frames((m.SerializeToString(),)))
    chunk = _message(rpc.request)
    first = st.builds(_with_meta, chunk, _message(common_pb2.ArtifactMeta))
    led = st.builds(lambda head, rest: [head, *rest], first, st.lists(chunk, max_size=2))
    return st.builds(_upload_frames, st.one_of(st.lists(chunk, max_size=3), led), st.booleans())


def _with_meta(chunk: Any, meta: Any) -> Any:
    """`chunk` when it carries an ArtifactMeta, else a copy of it carrying `meta`."""
    if chunk.HasField("meta"):
        return chunk
    led = agent_pb2.UploadChunk(meta=meta)
    led.data = chunk.data
    return led


def _upload_frames(chunks: Sequence[Any], consistent: bool) -> Frames:
    """Upload chunks encoded; when `consistent`, the first one's meta names their sha256 and size,
    so the upload gets past the hash check to the cache with its wild meta."""
    if consistent and chunks and chunks[0].HasField("meta"):
        data = b"".join(chunk.data for chunk in chunks)
        first = agent_pb2.UploadChunk()
        first.CopyFrom(chunks[0])
        first.meta.sha256, first.meta.size_bytes = hashlib.sha256(data).hexdigest(), len(data)
        chunks = [first, *chunks[1:]]
    return Frames(chunk.SerializeToString() for chunk in chunks)


def _slow_acquire(rpc: Rpc, frames: Frames) -> bool:
    """Random bytes that decode as an Acquire asking to wait longer than ACQUIRE_MAX_WAIT_S."""
    if rpc.request is not tracker_pb2.AcquireRequest or not _decodes(rpc.request, frames[0]):
        return False
    return not tracker_pb2.AcquireRequest.FromString(frames[0]).timeout_s <= ACQUIRE_MAX_WAIT_S


FUZZ_SETTINGS = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: each step costs real RPCs
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
    print_blob=False,
    report_multiple_bugs=False,
)


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("rpc", RPCS, ids=str)
@FUZZ_SETTINGS
@given(data=st.data())
def test_raw_bytes_get_invalid_argument_unless_they_decode_and_the_daemon_holds(
    daemons: dict[str, Daemon], rpc: Rpc, data: st.DataObject
) -> None:
    """Undecodable bytes get INVALID_ARGUMENT (Watch and Upload too); decodable ones an allowed
    answer; no call hangs, and the daemon stays up and SERVING."""
    frames = data.draw(_raw_frames(rpc), label="frames")
    assume(not _slow_acquire(rpc, frames))
    _send_and_check(daemons, rpc, frames)


@pytest.mark.parametrize("rpc", RPCS, ids=str)
@FUZZ_SETTINGS
@given(data=st.data())
def test_wild_messages_get_an_answer_or_an_allowed_error_and_the_daemon_holds(
    daemons: dict[str, Daemon], rpc: Rpc, data: st.DataObject
) -> None:
    """Real messages with wild values get OK or an allowed code (never INTERNAL or UNKNOWN), no
    call hangs, and the daemon stays up and SERVING."""
    _send_and_check(daemons, rpc, data.draw(_wild_frames(rpc), label="frames"))


# ---------------------------------------------------------------------------------------------
# The leak

LEAK_WARMUP_CALLS = 2_000
LEAK_CALLS = 20_000
LEAK_IN_FLIGHT = 200
LEAK_TIMEOUT_S = 60.0
# The bug this catches kept ~16-19 KB per undecodable call (gRPC's failed request deserialization
# in the server, on the streaming methods), ~160-190 MB over the 10,000 streaming LEAK_CALLS. A daemon that keeps nothing per call still moves a
# few MB after the warm-up (allocator arenas of its worker threads, gRPC's caches: 0-4 MiB over
# 20,000 strictly decoded unary calls, measured on both daemons), so 20 MB separates the two by
# more than an order of magnitude, and a leak of 1 KB per call still fails.
MAX_RSS_GROWTH_BYTES = 20 * 1024 * 1024


def _rss_bytes(pid: int) -> int:
    """VmRSS of `pid` from /proc/<pid>/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _start_junk_call(channel: grpc.Channel, rpc: Rpc) -> Any:
    """Start one call of JUNK to `rpc`; a future (a Watch's call object is one too)."""
    if rpc.streaming == "client":
        return channel.stream_unary(rpc.path).future(iter([JUNK]), timeout=LEAK_TIMEOUT_S)
    if rpc.streaming == "server":
        return channel.unary_stream(rpc.path)(JUNK, timeout=LEAK_TIMEOUT_S)
    return channel.unary_unary(rpc.path).future(JUNK, timeout=LEAK_TIMEOUT_S)


def _flood_cycle(rpcs: Sequence[Rpc]) -> list[Rpc]:
    """Each unary method followed by a streaming one in turn: half the calls stream (Watch,
    Upload), the kind whose requests gRPC itself decodes and where the leak was."""
    unary = [rpc for rpc in rpcs if rpc.streaming == "unary"]
    streaming = [rpc for rpc in rpcs if rpc.streaming != "unary"]
    return [rpc for i, one in enumerate(unary) for rpc in (one, streaming[i % len(streaming)])]


def _flood(daemon: Daemon, rpcs: Sequence[Rpc], calls: int) -> collections.Counter[str]:
    """`calls` JUNK calls spread over `rpcs`, LEAK_IN_FLIGHT at a time; counts of "path CODE"."""
    answers: collections.Counter[str] = collections.Counter()
    for start in range(0, calls, LEAK_IN_FLIGHT):
        batch = [rpcs[i % len(rpcs)] for i in range(start, min(start + LEAK_IN_FLIGHT, calls))]
        futures = [(rpc, _start_junk_call(daemon.channel, rpc)) for rpc in batch]
        for rpc, future in futures:
            answers[f"{rpc.path} {future.code().name}"] += 1
    return answers


@pytest.mark.parametrize("name", ["tracker", "agent"])
def test_rss_stays_flat_over_20000_undecodable_calls(daemons: dict[str, Daemon], name: str) -> None:
    """After a warm-up, 20,000 calls of JUNK spread over every method (half of them to the
    streaming Health/Watch and Upload) grow the daemon's RSS by less than MAX_RSS_GROWTH_BYTES,
    and all get INVALID_ARGUMENT."""
    daemon = daemons[name]
    assert not daemon.broken, daemon.broken
    rpcs = _flood_cycle([rpc for rpc in RPCS if rpc.daemon == name])
    _flood(daemon, rpcs, LEAK_WARMUP_CALLS)
    before = _rss_bytes(daemon.proc.pid)
    answers = _flood(daemon, rpcs, LEAK_CALLS)
    growth = _rss_bytes(daemon.proc.pid) - before
    report = (
        f"{name} RSS grew {growth / 2**20:.1f} MiB over {LEAK_CALLS} calls; answers {dict(answers)}"
    )
    assert growth < MAX_RSS_GROWTH_BYTES, report
    assert all(key.endswith(" INVALID_ARGUMENT") for key in answers), report
    _assert_serving(daemon)


# ---------------------------------------------------------------------------------------------
# Watches that come and go

WATCH_CHURN_CALLS = 1_000
WATCH_CHURN_IN_FLIGHT = 8
# Each Watch names a new service this long: a servicer that keeps a name per Watch ends up
# holding 64 MB, past MAX_RSS_GROWTH_BYTES.
WATCH_NAME_CHARS = 64 * 1024


def _watch_once(daemon: Daemon, index: int) -> grpc.StatusCode:
    """Watch a new WATCH_NAME_CHARS service name, take the first answer, cancel; the code."""
    service = f"churn-{index}-".ljust(WATCH_NAME_CHARS, "x")
    frames = Frames((health_pb2.HealthCheckRequest(service=service).SerializeToString(),))
    return _call(
        daemon, Rpc(daemon.name, HEALTH_WATCH, health_pb2.HealthCheckRequest, "server"), frames
    )[0]


def _churn_watches(daemon: Daemon, calls: int) -> collections.Counter[str]:
    """`calls` Watches, WATCH_CHURN_IN_FLIGHT at a time, stopping after a batch with a failure."""
    answers: collections.Counter[str] = collections.Counter()
    with ThreadPoolExecutor(WATCH_CHURN_IN_FLIGHT) as pool:
        for start in range(0, calls, WATCH_CHURN_IN_FLIGHT):
            batch = range(start, min(start + WATCH_CHURN_IN_FLIGHT, calls))
            answers.update(code.name for code in pool.map(lambda i: _watch_once(daemon, i), batch))
            if set(answers) != {"OK"}:
                break
    return answers


@pytest.mark.parametrize("name", ["tracker", "agent"])
def test_watches_cancelled_after_their_first_answer_neither_wedge_nor_pile_up(
    tmp_path: Path, name: str
) -> None:
    """1,000 Health/Watch calls for new 64 KiB service names, 8 at a time, each cancelled after
    its first answer, all get that answer in time; the daemon (a fresh one: a wedged daemon must
    not fail the other tests) stays SERVING and its RSS grows less than MAX_RSS_GROWTH_BYTES."""
    with _running(tmp_path, (name,)) as started:
        daemon = started[name]
        _churn_watches(daemon, 100)
        before = _rss_bytes(daemon.proc.pid)
        answers = _churn_watches(daemon, WATCH_CHURN_CALLS)
        growth = _rss_bytes(daemon.proc.pid) - before
        report = f"{name}: answers {dict(answers)}, RSS grew {growth / 2**20:.1f} MiB"
        assert answers == {"OK": WATCH_CHURN_CALLS}, f"{report}\n{daemon.log_tail()}"
        assert growth < MAX_RSS_GROWTH_BYTES, report
        _assert_serving(daemon)
