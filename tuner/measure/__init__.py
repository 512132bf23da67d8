"""Measurement: build candidates, lease devices, measure them on the pool, and what comes back.

    result      MeasureResult and Status (re-exported here), plain records free of protobuf
    builder     LocalBuilder: config indices -> artifacts, in a process pool
    runner      the Runner protocol (artifacts -> results)
    pool_runner PoolRunner: measures on devices leased from a tracker, over gRPC
    fake_runner FakeRunner: timings from a formula, for tests that open no socket
    tracker_client, serde, local_pool: the gRPC client, wire conversions, an embedded pool

This package's `__init__` imports only `result`: the grpc-using modules load when named.
"""

from tuner.measure.result import EvaluatorConfig, MeasureResult, Status

__all__ = ["EvaluatorConfig", "MeasureResult", "Status"]
