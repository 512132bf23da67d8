"""`kiln.Pool`: a pool of devices to tune on, a tracker's or a local one started for the session.

    with kiln.Pool() as pool:                                  # a local tracker + agent
        ...
    with kiln.Pool("tracker:9190", key="x86", token_file="pool.secrets") as pool:
        ...

On entering, the pool lists the tracker's devices that match `key` and `tags`: none at all is a
NoDeviceError at once (a mistyped key fails before anything is built), and the first match's
tags decide the compile target (`tuner.measure.device_target`); `target=` overrides it, and a
target those devices cannot run is a TargetError naming both. Its `threads` tag (an agent
pinned to a core set, `kiln-agent --cores`) decides the thread count the pool's builders build
for (`threads`: the templates' `parallel` knob is searched only above 1) and the records'
target (`records_target`, "x86_64-avx512/threads=4"). A local pool's devices take such core
sets with `core_sets` (`kiln tune --cores 0-3`), so a local run tunes for that many threads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Any

import grpc

from protos import tracker_pb2
from protos.auth import TlsFiles
from protos.rpc_errors import explain_rpc_error
from tuner.measure.builder import BUILD_TIMEOUT_S, Builder, LocalBuilder
from tuner.measure.device_target import (
    check_target,
    device_records_target,
    device_target,
    device_threads,
)
from tuner.measure.local_pool import LocalPool
from tuner.measure.pool_runner import NoDeviceError, PoolConfig, PoolRunner
from tuner.measure.result import EvaluatorConfig
from tuner.measure.tracker_client import TrackerClient, read_client_token
from tuner.options import TuneOptions


def every_core_held(core_sets: Sequence[Sequence[int]]) -> bool:
    """Whether local devices on `core_sets` hold every core this process may run on.

    Then nothing should run beside their measurements, so tuning does not pipeline: the next
    batch's builds (at idle priority there) and the search would share the cores of a
    measurement. A device of several threads suffers most: its kernel waits at each barrier for
    a thread that lost its core. `kiln demo --model mobilenet_v2 --cores 0-1` on 2 vCPUs,
    200 trials: pipelined, 92 of 200 records noisy and the parallel configs' fastest-to-slowest
    sample spread 1.72 (serial 1.08), so the search took serial configs and the tuned build ran
    0.75x the untuned one's speed; not pipelined, 17 noisy, spread 1.04, 0.96x.
    """
    held = {core for cores in core_sets for core in cores}
    return bool(held) and held >= os.sched_getaffinity(0)


def pipeline_fitted(options: TuneOptions, core_sets: Sequence[Sequence[int]]) -> TuneOptions:
    """`options` without `pipeline` where local devices on `core_sets` hold every core
    (`every_core_held`), else `options` itself: the one rule of the CLI and the API."""
    if options.pipeline and every_core_held(core_sets):
        return dataclasses.replace(options, pipeline=False)
    return options


class Pool:
    """Devices leased from a tracker (`tracker="host:port"`) or from a local pool (None).

    Args:
        tracker: HOST:PORT of a tracker; None starts a local tracker and agent on 127.0.0.1.
        key: the device key to lease (required with a tracker).
        tags: k=v every leased device must carry.
        token_file: the pool's secrets file (its client token goes with every call).
        tls: the CA (and client certificate) of a pool run with TLS.
        devices: how many devices to measure on at once (a local pool starts that many).
        pin_cores: a local pool's device cores (see LocalPool); the builds get the others.
        core_sets: a local pool's devices on these core sets, one set per device, each device
            running kernels on as many threads as its set has cores (`kiln-agent --cores`;
            sets `devices`); the builds get the other cores, if any.
        target: the compile target; None lets the devices decide.

    Raises (on entering):
        NoDeviceError: no registered device matches the key and tags.
        TargetError: `target` cannot run on the matching devices.
        ValueError: (on creating) core sets with a tracker, or as LocalPool's.
    """

    def __init__(
        self,
        tracker: str | None = None,
        key: str = "",
        tags: Mapping[str, str] | None = None,
        token_file: str | os.PathLike[str] | None = None,
        tls: TlsFiles | None = None,
        devices: int = 1,
        pin_cores: tuple[int, ...] = (),
        target: str | None = None,
        core_sets: tuple[tuple[int, ...], ...] = (),
    ) -> None:
        if tracker and not key:
            raise ValueError("a key is required with a tracker")
        if tracker and core_sets:
            raise ValueError("core sets are for a local pool; a tracker's agents have their own")
        if core_sets:
            devices = len(core_sets)
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        self.tracker = tracker
        self.key = key
        self.tags = dict(tags or {})
        self.token_file = token_file
        self.tls = tls
        self.devices = devices
        self.pin_cores = pin_cores
        self.core_sets = core_sets
        self.requested_target = target
        self.local: LocalPool | None = None
        self.config: PoolConfig | None = None
        self.device_tags: dict[str, str] = {}
        self.target = target or "host"
        self.threads = 1  # the matched device's `threads` tag, once open
        # the thread counts of every live matching device, once open (a lease takes any of them)
        self.thread_counts: tuple[int, ...] = ()
        self.records_target = self.target
        self._stack = ExitStack()

    def __enter__(self) -> Pool:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open(self) -> None:
        """Start the local pool or reach the tracker, and settle the target (see the class)."""
        if self.tracker:
            token = read_client_token(str(self.token_file)) if self.token_file else None
            self.config = PoolConfig(
                tracker=self.tracker, key=self.key, tags=self.tags, token=token, tls=self.tls
            )
        else:
            self.local = self._stack.enter_context(
                LocalPool(devices=self.devices, pin_cores=self.pin_cores, core_sets=self.core_sets)
            )
            self.key = self.local.key
            self.config = PoolConfig(
                tracker=self.local.tracker_address,
                key=self.local.key,
                tags=self.tags,
                token=self.local.client_token,
            )
        device_id, self.device_tags = self._matching_device()
        where = f"device {device_id}"
        if self.requested_target is None:
            self.target = device_target(self.device_tags)
        else:
            self.target = check_target(self.requested_target, self.device_tags, where)
        self.threads = device_threads(self.device_tags)
        self.records_target = device_records_target(self.device_tags, self.target)

    def _matching_device(self) -> tuple[str, dict[str, str]]:
        assert self.config is not None
        client = TrackerClient(self.config.tracker, self.config.token, self.config.tls)
        try:
            listed = client.list_devices(self.config.key)
        except grpc.RpcError as exc:
            why = explain_rpc_error(exc, self.config.tracker, self.config.tls is not None)
            raise NoDeviceError(f"cannot list the devices of tracker {why}") from None
        finally:
            client.close()
        lost = tracker_pb2.DeviceState.Value("LOST")
        matching = [
            d
            for d in listed.devices
            if all(d.spec.tags.get(k) == v for k, v in self.config.tags.items())
        ]
        live = [d for d in matching if d.state != lost] or matching
        if not live:
            raise NoDeviceError(
                f"no registered device matches key={self.config.key!r} "
                f"tags={self.config.tags!r} on tracker {self.config.tracker}"
            )
        self.thread_counts = tuple(sorted({device_threads(d.spec.tags) for d in live}))
        first = live[0].spec
        return first.device_id, dict(first.tags)

    @property
    def emulated(self) -> bool:
        """Whether the devices run under emulation (their timings are not the real device's)."""
        return "emulated" in self.device_tags

    def runner(self, evaluator: EvaluatorConfig | None = None, **kwargs: Any) -> PoolRunner:
        """A PoolRunner over this pool's devices. Close it when done (`contextlib.closing`): it
        keeps its leases between batches, so an open runner holds its devices from the next."""
        if self.config is None:
            raise RuntimeError("the pool is not open: use it in a with block")
        return PoolRunner(self.config, evaluator, devices=self.devices, **kwargs)

    def builder(
        self,
        workers: int = 2,
        per_unit: int = 4,
        spec: str = "local",
        timeout_s: float | None = BUILD_TIMEOUT_S,
    ) -> Builder:
        """A builder for this pool's target (close it).

        Args:
            workers: build processes of a local builder.
            per_unit: candidates compiled together in one translation unit.
            spec: "local", a LocalBuilder on the cores the local devices are not pinned to when
                they are (so builds do not disturb measurements), with one more worker per
                device core at idle priority, which builds only while that core's device is
                not measuring; or "dask://HOST:PORT", a DaskBuilder on that scheduler's workers.
            timeout_s: a unit not built this long after a worker took it is a build error.

        Raises:
            ValueError: a spec that is neither; OSError: the Dask scheduler cannot be reached.
        """
        if spec != "local":
            from tuner.measure.dask_builder import DaskBuilder

            return DaskBuilder(
                spec,
                target=self.target,
                per_unit=per_unit,
                timeout_s=timeout_s,
                threads=self.threads,
            )
        pinned = {*self.pin_cores, *(c for cores in self.core_sets for c in cores)}
        cpus = tuple(sorted(os.sched_getaffinity(0) - pinned)) if pinned else ()
        if pinned:
            workers = min(workers, len(cpus))  # 0 when the devices hold every core
        return LocalBuilder(
            target=self.target,
            workers=workers,
            per_unit=per_unit,
            cpus=cpus,
            timeout_s=timeout_s,
            threads=self.threads,
            idle_cpus=tuple(sorted(pinned)),
        )

    def describe(self) -> str:
        """One line: where the devices are and what they run."""
        assert self.config is not None
        where = (
            f"local pool (tracker {self.config.tracker})"
            if self.local
            else f"tracker {self.config.tracker}"
        )
        emulated = f", emulated by {self.device_tags['emulated']}" if self.emulated else ""
        backend = self.device_tags.get("backend", "?")
        return f"{where}, key {self.config.key}, backend {backend}, target {self.target}{emulated}"

    def close(self) -> None:
        """Stop a local pool (by pid); idempotent."""
        self._stack.close()
