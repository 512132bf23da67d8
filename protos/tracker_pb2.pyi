from protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeviceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEVICE_STATE_UNSPECIFIED: _ClassVar[DeviceState]
    FREE: _ClassVar[DeviceState]
    LEASED: _ClassVar[DeviceState]
    LOST: _ClassVar[DeviceState]
DEVICE_STATE_UNSPECIFIED: DeviceState
FREE: DeviceState
LEASED: DeviceState
LOST: DeviceState

class RegisterRequest(_message.Message):
    __slots__ = ("agent_id", "agent_address", "devices")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    agent_address: str
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceSpec]
    def __init__(self, agent_id: _Optional[str] = ..., agent_address: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_common_pb2.DeviceSpec, _Mapping]]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s", "fence_floors")
    class FenceFloorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    FENCE_FLOORS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    fence_floors: _containers.ScalarMap[str, int]
    def __init__(self, heartbeat_interval_s: _Optional[float] = ..., fence_floors: _Optional[_Mapping[str, int]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("key", "tag_selector", "priority", "user", "timeout_s", "lease_ttl_s", "request_id")
    class TagSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAG_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    tag_selector: _containers.ScalarMap[str, str]
    priority: int
    user: str
    timeout_s: float
    lease_ttl_s: float
    request_id: str
    def __init__(self, key: _Optional[str] = ..., tag_selector: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ..., user: _Optional[str] = ..., timeout_s: _Optional[float] = ..., lease_ttl_s: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "device", "expires_at_unix", "token", "user", "fence")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    device: _common_pb2.DeviceSpec
    expires_at_unix: float
    token: str
    user: str
    fence: int
    def __init__(self, lease_id: _Optional[str] = ..., device: _Optional[_Union[_common_pb2.DeviceSpec, _Mapping]] = ..., expires_at_unix: _Optional[float] = ..., token: _Optional[str] = ..., user: _Optional[str] = ..., fence: _Optional[int] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("status", "lease", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    lease: Lease
    reason: str
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, str]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("lease_id", "lease_ttl_s")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    lease_ttl_s: float
    def __init__(self, lease_id: _Optional[str] = ..., lease_ttl_s: _Optional[float] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("status", "lease", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    lease: Lease
    reason: str
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, str]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released", "reason")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    released: bool
    reason: str
    def __init__(self, released: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ListDevicesRequest(_message.Message):
    __slots__ = ("key", "page_size", "page_token")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    page_size: int
    page_token: str
    def __init__(self, key: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class DeviceStatus(_message.Message):
    __slots__ = ("spec", "state", "lease_holder", "heartbeat_age_s", "queue_depth")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.DeviceSpec
    state: DeviceState
    lease_holder: str
    heartbeat_age_s: float
    queue_depth: int
    def __init__(self, spec: _Optional[_Union[_common_pb2.DeviceSpec, _Mapping]] = ..., state: _Optional[_Union[DeviceState, str]] = ..., lease_holder: _Optional[str] = ..., heartbeat_age_s: _Optional[float] = ..., queue_depth: _Optional[int] = ...) -> None: ...

class ListDevicesResponse(_message.Message):
    __slots__ = ("devices", "next_page_token")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceStatus]
    next_page_token: str
    def __init__(self, devices: _Optional[_Iterable[_Union[DeviceStatus, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
