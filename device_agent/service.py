"""The gRPC servicer (grpc.aio): unpack a request, call the agent, map its errors to status codes.

    UnknownDeviceError        NOT_FOUND
    InvalidRequestError       INVALID_ARGUMENT
    ArtifactTooLargeError     RESOURCE_EXHAUSTED
    HashMismatchError         DATA_LOSS
    TruncatedUploadError      DATA_LOSS
    any other AgentError      INTERNAL
A job that fails (crash, timeout, refused lease, busy device) is a result, never a status.

Handlers are coroutines on the server's event loop. Measure and Run wait for their device there
(an asyncio.Lock per device, so a waiter holds no thread) for at most `Admission.wait_s`; a waiter
whose client leaves is cancelled, leaves the queue at once and never runs. Holding the device, the
job runs on a bounded thread pool (a thread per device plus `_SPARE_THREADS` for Has, Info and
upload commits); if the RPC is cancelled meanwhile the job's cancel event is set, the executor
kills the child, and the device is free once that thread returns. Upload hashes and writes its
chunks on the loop (about 40 µs for a 64 KiB chunk, less than a hop to a thread).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import grpc.aio

from device_agent import serde
from device_agent.agent import Admission, Agent
from device_agent.cache import CachedArtifact, PendingArtifact
from device_agent.errors import (
    AgentError,
    ArtifactTooLargeError,
    HashMismatchError,
    InvalidRequestError,
    TruncatedUploadError,
    UnknownDeviceError,
)
from device_agent.jobs import StopSignal
from protos import agent_pb2, agent_pb2_grpc, common_pb2
from protos.ratelimit import RateLimitedLog

_LOG = logging.getLogger(__name__)
_CUT_SHORT = RateLimitedLog(_LOG)
# Pool threads beyond one per device: Has, Info, upload commits and refused jobs' answers.
_SPARE_THREADS = 4

_CODES: tuple[tuple[type[AgentError], grpc.StatusCode], ...] = (
    (UnknownDeviceError, grpc.StatusCode.NOT_FOUND),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (ArtifactTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (HashMismatchError, grpc.StatusCode.DATA_LOSS),
    (TruncatedUploadError, grpc.StatusCode.DATA_LOSS),
)

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])
Job = Callable[[Admission, StopSignal], _T]


def _mapped(method: _F) -> _F:
    """Turn the agent's errors into the RPC's status code and message."""

    @functools.wraps(method)
    async def wrapper(self: AgentServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except AgentError as e:
            code = next((c for t, c in _CODES if isinstance(e, t)), grpc.StatusCode.INTERNAL)
            await context.abort(code, str(e))

    return wrapper  # type: ignore[return-value]


class DeviceQueues:
    """One job at a time per device: waiters queue on the loop, jobs run on `pool`."""

    def __init__(self, device_ids: Iterable[str], pool: ThreadPoolExecutor) -> None:
        self._locks = {device_id: asyncio.Lock() for device_id in device_ids}
        self._pool = pool

    async def run(self, admission: Admission, job: Job[_T]) -> _T:
        """`job(admission, cancelled)` on the pool once the admission's device is free.

        A refused admission goes to `job` at once, without the device; so does
        `admission.stayed_busy()` when the device is not free within `admission.wait_s`.
        """
        loop = asyncio.get_running_loop()
        if admission.refused is None:
            lock = self._locks[admission.device_id]
            if await _acquire(lock, admission.wait_s):
                return await self._hold(lock, admission, job)
            admission = admission.stayed_busy()
        return await loop.run_in_executor(self._pool, job, admission, StopSignal())

    async def _hold(self, lock: asyncio.Lock, admission: Admission, job: Job[_T]) -> _T:
        """Run `job` with `lock` held until its thread returns, even when the RPC ends first."""
        cancelled = StopSignal()
        try:
            future = asyncio.get_running_loop().run_in_executor(
                self._pool, job, admission, cancelled
            )
        except BaseException:
            lock.release()
            raise
        future.add_done_callback(functools.partial(_release, lock))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The client left: the executor sees this, kills the child, and the thread returns.
            cancelled.set()
            raise


async def _acquire(lock: asyncio.Lock, wait_s: float) -> bool:
    """Whether `lock` was acquired within `wait_s` seconds."""
    try:
        async with asyncio.timeout(max(wait_s, 0.0)):
            await lock.acquire()
    except TimeoutError:
        return False
    return True


def _release(lock: asyncio.Lock, future: asyncio.Future[Any]) -> None:
    lock.release()
    if not future.cancelled():
        future.exception()  # retrieved here when its RPC was cancelled and nobody awaits it


def _upload_outcome(error: BaseException) -> str:
    """Why an Upload stored nothing, as `AgentStats.upload_done` counts it."""
    for kind, outcome in (
        (asyncio.CancelledError, "cancelled"),
        (InvalidRequestError, "invalid"),
        (ArtifactTooLargeError, "too_large"),
        (HashMismatchError, "hash_mismatch"),
        (TruncatedUploadError, "truncated"),
    ):
        if isinstance(error, kind):
            return outcome
    return "error"


def _commit(pending: PendingArtifact) -> CachedArtifact:
    """`pending.commit()`, aborting it on any failure (it runs on after a client leaves)."""
    try:
        return pending.commit()
    except BaseException:
        pending.abort()
        raise


class AgentServicer(agent_pb2_grpc.AgentServicer):
    """kiln.v1.Agent over an `Agent`; `close()` ends its thread pool."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._pool = ThreadPoolExecutor(
            max_workers=len(agent.devices) + _SPARE_THREADS, thread_name_prefix="kiln-agent-job"
        )
        self._devices = DeviceQueues((d.device_id for d in agent.devices), self._pool)

    def close(self) -> None:
        """Wait for the pool's threads to finish and end them (after the server stopped)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    async def _in_pool(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @_mapped
    async def Upload(
        self,
        request_iterator: AsyncIterator[agent_pb2.UploadChunk],
        context: grpc.aio.ServicerContext,
    ) -> agent_pb2.UploadResponse:
        try:
            response = await self._upload(request_iterator)
        except BaseException as e:
            self._agent.stats.upload_done(_upload_outcome(e))
            raise
        self._agent.stats.upload_done("stored", response.size_bytes)
        return response

    async def _upload(
        self, request_iterator: AsyncIterator[agent_pb2.UploadChunk]
    ) -> agent_pb2.UploadResponse:
        first = await anext(request_iterator, None)
        if first is None or not first.HasField("meta"):
            raise InvalidRequestError("the first upload chunk must carry the ArtifactMeta")
        pending = self._agent.begin_upload(serde.meta_from_pb(first.meta))
        committing = False
        try:
            pending.write(first.data)
            async for chunk in request_iterator:
                pending.write(chunk.data)
            committing = True
            stored = await asyncio.shield(
                asyncio.get_running_loop().run_in_executor(self._pool, _commit, pending)
            )
        except asyncio.CancelledError:
            if not committing:
                _CUT_SHORT.log(
                    "upload",
                    logging.INFO,
                    "upload of %s cut short by the client; nothing stored",
                    first.meta.sha256,
                )
            raise
        finally:
            if not committing:
                pending.abort()  # rejected, or the client went away mid-stream: keep nothing
        return agent_pb2.UploadResponse(
            sha256=stored.meta.sha256, size_bytes=stored.meta.size_bytes
        )

    @_mapped
    async def Has(
        self, request: agent_pb2.HasRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.HasResponse:
        return agent_pb2.HasResponse(present=await self._in_pool(self._agent.has, request.sha256))

    @_mapped
    async def Measure(
        self, request: agent_pb2.MeasureRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.MeasureResult:
        measure = serde.measure_request_from_pb(request)
        admission = self._agent.admit_measure(measure)
        result = await self._devices.run(admission, functools.partial(self._agent.measure, measure))
        return serde.measure_result_to_pb(result)

    @_mapped
    async def Run(
        self, request: agent_pb2.RunRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RunResponse:
        run = serde.run_request_from_pb(request)
        admission = self._agent.admit_run(run)
        result = await self._devices.run(admission, functools.partial(self._agent.run, run))
        return serde.run_result_to_pb(result)

    @_mapped
    async def Info(
        self, request: agent_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.InfoResponse:
        return serde.info_to_pb(await self._in_pool(self._agent.info))
