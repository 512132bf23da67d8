from protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UploadChunk(_message.Message):
    __slots__ = ("meta", "data")
    META_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.ArtifactMeta
    data: bytes
    def __init__(self, meta: _Optional[_Union[_common_pb2.ArtifactMeta, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadResponse(_message.Message):
    __slots__ = ("sha256", "size_bytes")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size_bytes: int
    def __init__(self, sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class HasRequest(_message.Message):
    __slots__ = ("sha256",)
    SHA256_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    def __init__(self, sha256: _Optional[str] = ...) -> None: ...

class HasResponse(_message.Message):
    __slots__ = ("present",)
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    present: bool
    def __init__(self, present: _Optional[bool] = ...) -> None: ...

class MeasureRequest(_message.Message):
    __slots__ = ("device_id", "lease_id", "lease_token", "artifact_sha256", "symbol", "seed", "config", "check")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SHA256_FIELD_NUMBER: _ClassVar[int]
    SYMBOL_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    lease_id: str
    lease_token: str
    artifact_sha256: str
    symbol: str
    seed: int
    config: _common_pb2.EvaluatorConfig
    check: _common_pb2.CheckSpec
    def __init__(self, device_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., artifact_sha256: _Optional[str] = ..., symbol: _Optional[str] = ..., seed: _Optional[int] = ..., config: _Optional[_Union[_common_pb2.EvaluatorConfig, _Mapping]] = ..., check: _Optional[_Union[_common_pb2.CheckSpec, _Mapping]] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("device_id", "lease_id", "lease_token", "artifact_sha256", "symbol", "inputs", "seed", "timeout_s")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SHA256_FIELD_NUMBER: _ClassVar[int]
    SYMBOL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    lease_id: str
    lease_token: str
    artifact_sha256: str
    symbol: str
    inputs: _containers.RepeatedCompositeFieldContainer[_common_pb2.NDArray]
    seed: int
    timeout_s: float
    def __init__(self, device_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., artifact_sha256: _Optional[str] = ..., symbol: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[_common_pb2.NDArray, _Mapping]]] = ..., seed: _Optional[int] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class RunResponse(_message.Message):
    __slots__ = ("status", "outputs", "error", "signal")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    outputs: _containers.RepeatedCompositeFieldContainer[_common_pb2.NDArray]
    error: str
    signal: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, str]] = ..., outputs: _Optional[_Iterable[_Union[_common_pb2.NDArray, _Mapping]]] = ..., error: _Optional[str] = ..., signal: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("agent_id", "devices", "telemetry", "version")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceSpec]
    telemetry: _common_pb2.Telemetry
    version: str
    def __init__(self, agent_id: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_common_pb2.DeviceSpec, _Mapping]]] = ..., telemetry: _Optional[_Union[_common_pb2.Telemetry, _Mapping]] = ..., version: _Optional[str] = ...) -> None: ...
