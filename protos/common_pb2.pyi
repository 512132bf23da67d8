from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ArtifactFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARTIFACT_FORMAT_UNSPECIFIED: _ClassVar[ArtifactFormat]
    SHARED_OBJECT: _ClassVar[ArtifactFormat]
    CUBIN: _ClassVar[ArtifactFormat]
    PTX: _ClassVar[ArtifactFormat]
    ACCEL_PROGRAM: _ClassVar[ArtifactFormat]

class ArgRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARG_ROLE_UNSPECIFIED: _ClassVar[ArgRole]
    INPUT: _ClassVar[ArgRole]
    OUTPUT: _ClassVar[ArgRole]
    WORKSPACE: _ClassVar[ArgRole]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    OK: _ClassVar[Status]
    BUILD_ERROR: _ClassVar[Status]
    UPLOAD_ERROR: _ClassVar[Status]
    LOAD_ERROR: _ClassVar[Status]
    RUNTIME_ERROR: _ClassVar[Status]
    CRASH: _ClassVar[Status]
    TIMEOUT: _ClassVar[Status]
    WRONG_ANSWER: _ClassVar[Status]
    DEVICE_LOST: _ClassVar[Status]
    NO_DEVICE: _ClassVar[Status]
    UNAUTHORIZED: _ClassVar[Status]
ARTIFACT_FORMAT_UNSPECIFIED: ArtifactFormat
SHARED_OBJECT: ArtifactFormat
CUBIN: ArtifactFormat
PTX: ArtifactFormat
ACCEL_PROGRAM: ArtifactFormat
ARG_ROLE_UNSPECIFIED: ArgRole
INPUT: ArgRole
OUTPUT: ArgRole
WORKSPACE: ArgRole
STATUS_UNSPECIFIED: Status
OK: Status
BUILD_ERROR: Status
UPLOAD_ERROR: Status
LOAD_ERROR: Status
RUNTIME_ERROR: Status
CRASH: Status
TIMEOUT: Status
WRONG_ANSWER: Status
DEVICE_LOST: Status
NO_DEVICE: Status
UNAUTHORIZED: Status

class DeviceSpec(_message.Message):
    __slots__ = ("device_id", "key", "tags", "agent_address", "backend")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    key: str
    tags: _containers.ScalarMap[str, str]
    agent_address: str
    backend: str
    def __init__(self, device_id: _Optional[str] = ..., key: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ..., agent_address: _Optional[str] = ..., backend: _Optional[str] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype", "role")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    role: ArgRole
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., role: _Optional[_Union[ArgRole, str]] = ...) -> None: ...

class EntryPoint(_message.Message):
    __slots__ = ("symbol", "timing_symbol", "args", "flop")
    SYMBOL_FIELD_NUMBER: _ClassVar[int]
    TIMING_SYMBOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    FLOP_FIELD_NUMBER: _ClassVar[int]
    symbol: str
    timing_symbol: str
    args: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    flop: float
    def __init__(self, symbol: _Optional[str] = ..., timing_symbol: _Optional[str] = ..., args: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., flop: _Optional[float] = ...) -> None: ...

class ArtifactMeta(_message.Message):
    __slots__ = ("sha256", "format", "target", "entries", "workspace_bytes", "size_bytes")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    format: ArtifactFormat
    target: str
    entries: _containers.RepeatedCompositeFieldContainer[EntryPoint]
    workspace_bytes: int
    size_bytes: int
    def __init__(self, sha256: _Optional[str] = ..., format: _Optional[_Union[ArtifactFormat, str]] = ..., target: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[EntryPoint, _Mapping]]] = ..., workspace_bytes: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class EvaluatorConfig(_message.Message):
    __slots__ = ("warmup", "number", "repeat", "min_repeat_ms", "cooldown_ms", "flush_cache_bytes", "timeout_s")
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    REPEAT_FIELD_NUMBER: _ClassVar[int]
    MIN_REPEAT_MS_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_MS_FIELD_NUMBER: _ClassVar[int]
    FLUSH_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    warmup: int
    number: int
    repeat: int
    min_repeat_ms: float
    cooldown_ms: float
    flush_cache_bytes: int
    timeout_s: float
    def __init__(self, warmup: _Optional[int] = ..., number: _Optional[int] = ..., repeat: _Optional[int] = ..., min_repeat_ms: _Optional[float] = ..., cooldown_ms: _Optional[float] = ..., flush_cache_bytes: _Optional[int] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class CheckSpec(_message.Message):
    __slots__ = ("reference_sha256", "reference_symbol", "rtol", "atol")
    REFERENCE_SHA256_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_SYMBOL_FIELD_NUMBER: _ClassVar[int]
    RTOL_FIELD_NUMBER: _ClassVar[int]
    ATOL_FIELD_NUMBER: _ClassVar[int]
    reference_sha256: str
    reference_symbol: str
    rtol: float
    atol: float
    def __init__(self, reference_sha256: _Optional[str] = ..., reference_symbol: _Optional[str] = ..., rtol: _Optional[float] = ..., atol: _Optional[float] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("load_1m", "cpu_mhz", "temperature_c", "power_w")
    LOAD_1M_FIELD_NUMBER: _ClassVar[int]
    CPU_MHZ_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    load_1m: float
    cpu_mhz: float
    temperature_c: float
    power_w: float
    def __init__(self, load_1m: _Optional[float] = ..., cpu_mhz: _Optional[float] = ..., temperature_c: _Optional[float] = ..., power_w: _Optional[float] = ...) -> None: ...

class MeasureResult(_message.Message):
    __slots__ = ("status", "samples_s", "error", "signal", "number_used", "telemetry", "device_id", "emulated", "missing_sha256", "accel")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    NUMBER_USED_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    EMULATED_FIELD_NUMBER: _ClassVar[int]
    MISSING_SHA256_FIELD_NUMBER: _ClassVar[int]
    ACCEL_FIELD_NUMBER: _ClassVar[int]
    status: Status
    samples_s: _containers.RepeatedScalarFieldContainer[float]
    error: str
    signal: int
    number_used: int
    telemetry: Telemetry
    device_id: str
    emulated: bool
    missing_sha256: _containers.RepeatedScalarFieldContainer[str]
    accel: AccelCycles
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., samples_s: _Optional[_Iterable[float]] = ..., error: _Optional[str] = ..., signal: _Optional[int] = ..., number_used: _Optional[int] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ..., device_id: _Optional[str] = ..., emulated: _Optional[bool] = ..., missing_sha256: _Optional[_Iterable[str]] = ..., accel: _Optional[_Union[AccelCycles, _Mapping]] = ...) -> None: ...

class ModuleCycles(_message.Message):
    __slots__ = ("module", "busy_cycles", "token_stall_cycles", "dram_wait_cycles")
    MODULE_FIELD_NUMBER: _ClassVar[int]
    BUSY_CYCLES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_STALL_CYCLES_FIELD_NUMBER: _ClassVar[int]
    DRAM_WAIT_CYCLES_FIELD_NUMBER: _ClassVar[int]
    module: str
    busy_cycles: int
    token_stall_cycles: int
    dram_wait_cycles: int
    def __init__(self, module: _Optional[str] = ..., busy_cycles: _Optional[int] = ..., token_stall_cycles: _Optional[int] = ..., dram_wait_cycles: _Optional[int] = ...) -> None: ...

class AccelCycles(_message.Message):
    __slots__ = ("total_cycles", "gemm_cycles", "modules")
    TOTAL_CYCLES_FIELD_NUMBER: _ClassVar[int]
    GEMM_CYCLES_FIELD_NUMBER: _ClassVar[int]
    MODULES_FIELD_NUMBER: _ClassVar[int]
    total_cycles: int
    gemm_cycles: int
    modules: _containers.RepeatedCompositeFieldContainer[ModuleCycles]
    def __init__(self, total_cycles: _Optional[int] = ..., gemm_cycles: _Optional[int] = ..., modules: _Optional[_Iterable[_Union[ModuleCycles, _Mapping]]] = ...) -> None: ...

class NDArray(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...
