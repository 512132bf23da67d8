"""Build candidates on a Dask distributed cluster: `--builder dask://HOST:PORT`.

When builds outgrow the workstation they go to build workers run by an existing engine, Dask
distributed, rather than a farm of our own: start `dask scheduler` on one machine and
`dask worker tcp://HOST:8786 --nworkers N --nthreads 1` on any number of others (processes, one
thread each: lowering is Python and holds the GIL). A worker needs only what the compiler needs
(this package installed: numpy, and `distributed`) and a C toolchain for the target; it never
talks to the pool.

Each unit of `per_unit` candidates is one Dask task running `tuner.measure.builder.build_unit`
on a worker; its result is the artifact bytes with their sha256 (checked on arrival) or a
BUILD_ERROR-bound result, exactly what `LocalBuilder` gives. Results stream back as tasks finish
(`BuildStream`), each with the per-build timeout. A worker that dies mid-batch costs nothing: the
scheduler runs its tasks again on the others (up to `distributed.scheduler.allowed-failures`
deaths per task, then the task fails with KilledWorker, a BUILD_ERROR). Earlier batches go first
(each batch's tasks get a lower priority than the one before), so a batch built ahead never
delays the one being measured.

Workers compile with their own compile cache ($KILN_CACHE_DIR in the worker's environment, else
~/.cache/kiln/build on its machine). "host" is resolved here, on the client, to the concrete
target name, so that a worker never builds for a "host" that is not this machine's class.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from compiler.toolchain import BuildError, get_target
from tuner.measure.build_stream import BuildResult, BuildStream
from tuner.measure.builder import BUILD_TIMEOUT_S, build_unit
from tuner.records import Workload

if TYPE_CHECKING:
    from distributed import Client

SCHEME = "dask://"
CONNECT_TIMEOUT_S = 30.0
# A finished task's bytes still cross the network on `result()`: this bounds that fetch.
FETCH_TIMEOUT_S = 60.0


def scheduler_address(spec: str) -> str:
    """The Dask address of `dask://HOST:PORT` (a `tcp://` or `tls://` address as it is).

    Raises:
        ValueError: anything else, or a port that is not a number.
    """
    if spec.startswith(("tcp://", "tls://")):
        return spec
    if not spec.startswith(SCHEME):
        raise ValueError(f"a Dask builder is dask://HOST:PORT, got {spec!r}")
    host, sep, port = spec[len(SCHEME) :].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a Dask builder is dask://HOST:PORT, got {spec!r}")
    return f"tcp://{host}:{port}"


class _DaskEngine:
    """A `BuildStream`'s view of a Dask client's futures: each future's done-callback wakes the
    stream (`distributed.wait` wants a default client, and a library must not set one)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._finished = threading.Event()

    def watch(self, future: Any) -> Any:
        future.add_done_callback(self._wake)
        return future

    def _wake(self, future: Any) -> None:
        del future
        self._finished.set()

    def wait_any(self, handles: Sequence[Any], timeout_s: float) -> None:
        # Cleared right after waking, before the stream looks at which are done: a future that
        # finishes after that look sets it again, so none is missed.
        self._finished.wait(timeout_s)
        self._finished.clear()

    def done(self, handle: Any) -> bool:
        return bool(handle.done())

    def started(self, handles: Sequence[Any]) -> list[bool]:
        try:
            processing = self.client.processing()
        except Exception:  # the scheduler is gone: start every clock so the stream ends
            return [True] * len(handles)
        running = set(itertools.chain.from_iterable(processing.values()))
        return [h.key in running or h.done() for h in handles]

    def result(self, handle: Any) -> list[BuildResult]:
        return list(handle.result(timeout=FETCH_TIMEOUT_S))

    def cancel(self, handle: Any) -> None:
        handle.cancel()


class DaskBuilder:
    """Builds on the workers of a Dask scheduler (see the module docstring).

    Args:
        address: `dask://HOST:PORT` (or a Dask `tcp://` / `tls://` address).
        target: "host" (this machine's class, resolved here) or a name in
            compiler.toolchain.TARGETS.
        per_unit: candidates compiled together in one translation unit, one task per unit.
        timeout_s: a unit not built this long after the scheduler gave it to a worker is a
            BUILD_ERROR, and its task is cancelled (None: no limit).
        connect_timeout_s: how long to try to reach the scheduler.
        threads: the thread count the kernels are built for (see `LocalBuilder`).

    Raises:
        ValueError: a bad address or per_unit below 1.
        OSError: the scheduler cannot be reached (the message names it).
    """

    def __init__(
        self,
        address: str,
        target: str = "host",
        per_unit: int = 4,
        timeout_s: float | None = BUILD_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        threads: int = 1,
    ) -> None:
        from distributed import Client

        if per_unit < 1:
            raise ValueError(f"per_unit must be >= 1, got {per_unit}")
        self.address = scheduler_address(address)
        try:
            self.target = get_target(target).name
        except BuildError:
            self.target = target  # the workers may know it; each unit fails alone if not
        self.per_unit = per_unit
        self.timeout_s = timeout_s
        self.threads = threads
        try:
            self._client = Client(self.address, timeout=connect_timeout_s, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise OSError(f"cannot reach the Dask scheduler at {self.address}: {exc}") from None
        self._batches = 0

    @property
    def client(self) -> Client:
        """The Dask client (for its dashboard link, or a test that asks the workers)."""
        return self._client

    def units(self, indices: Sequence[int]) -> list[list[int]]:
        """How `indices` are grouped into translation units, in order."""
        return [list(indices[i : i + self.per_unit]) for i in range(0, len(indices), self.per_unit)]

    def submit(
        self, workload: Workload, indices: Sequence[int], check: bool = False
    ) -> BuildStream:
        """One task per unit on the cluster, returned at once; results stream back as tasks
        finish. This batch's tasks go after every earlier batch's."""
        self._batches += 1
        units = self.units(indices)
        engine = _DaskEngine(self._client)
        tasks = [
            engine.watch(
                self._client.submit(
                    build_unit,
                    workload,
                    unit,
                    self.target,
                    check,
                    self.threads,
                    key=f"kiln-build-{uuid.uuid4().hex}",
                    priority=-self._batches,
                )
            )
            for unit in units
        ]
        return BuildStream(zip(units, tasks, strict=True), engine, self.timeout_s)

    def build(
        self, workload: Workload, indices: Sequence[int], check: bool = False
    ) -> list[BuildResult]:
        """One BuildResult per index, in order; never raises for a bad config or a lost task."""
        return self.submit(workload, indices, check).results()

    def workers(self) -> int:
        """The threads the cluster's workers run tasks on, now."""
        return sum(self._client.nthreads().values())

    def close(self) -> None:
        """Disconnect from the scheduler; tasks of this client still queued are released."""
        self._client.close()
