"""Conversions between protos and tracker records; the only tracker module that imports *_pb2."""

from __future__ import annotations

from protos import common_pb2, tracker_pb2
from tracker.model import (
    AcquireResult,
    DevicePage,
    DeviceSpec,
    DeviceState,
    DeviceStatus,
    Lease,
    LeaseRequest,
    Registered,
    ReleaseResult,
)

_STATES = {
    DeviceState.FREE: tracker_pb2.FREE,
    DeviceState.LEASED: tracker_pb2.LEASED,
    DeviceState.LOST: tracker_pb2.LOST,
}


def device_spec_from_proto(message: common_pb2.DeviceSpec) -> DeviceSpec:
    return DeviceSpec(
        device_id=message.device_id,
        key=message.key,
        tags=dict(message.tags),
        agent_address=message.agent_address,
        backend=message.backend,
    )


def device_spec_to_proto(spec: DeviceSpec) -> common_pb2.DeviceSpec:
    return common_pb2.DeviceSpec(
        device_id=spec.device_id,
        key=spec.key,
        tags=dict(spec.tags),
        agent_address=spec.agent_address,
        backend=spec.backend,
    )


def register_args(
    message: tracker_pb2.RegisterRequest,
) -> tuple[str, str, list[DeviceSpec]]:
    """(agent_id, agent_address, devices) of a RegisterRequest."""
    devices = [device_spec_from_proto(device) for device in message.devices]
    return message.agent_id, message.agent_address, devices


def lease_request_from_proto(message: tracker_pb2.AcquireRequest) -> LeaseRequest:
    return LeaseRequest(
        key=message.key,
        tag_selector=dict(message.tag_selector),
        priority=message.priority,
        user=message.user,
        timeout_s=message.timeout_s,
        lease_ttl_s=message.lease_ttl_s,
        request_id=message.request_id,
    )


def lease_to_proto(lease: Lease) -> tracker_pb2.Lease:
    return tracker_pb2.Lease(
        lease_id=lease.lease_id,
        device=device_spec_to_proto(lease.device),
        expires_at_unix=lease.expires_at_unix,
        token=lease.token,
        user=lease.user,
        fence=lease.fence,
    )


def acquire_response(result: AcquireResult) -> tracker_pb2.AcquireResponse:
    if result.lease is None:
        return tracker_pb2.AcquireResponse(status=common_pb2.NO_DEVICE, reason=result.reason)
    return tracker_pb2.AcquireResponse(status=common_pb2.OK, lease=lease_to_proto(result.lease))


def renew_response(lease: Lease) -> tracker_pb2.RenewResponse:
    return tracker_pb2.RenewResponse(status=common_pb2.OK, lease=lease_to_proto(lease))


def renew_lost(reason: str) -> tracker_pb2.RenewResponse:
    return tracker_pb2.RenewResponse(status=common_pb2.DEVICE_LOST, reason=reason)


def release_response(result: ReleaseResult) -> tracker_pb2.ReleaseResponse:
    return tracker_pb2.ReleaseResponse(released=result.released, reason=result.reason)


def device_status_to_proto(status: DeviceStatus) -> tracker_pb2.DeviceStatus:
    return tracker_pb2.DeviceStatus(
        spec=device_spec_to_proto(status.spec),
        state=_STATES[status.state],
        lease_holder=status.lease_holder,
        heartbeat_age_s=status.heartbeat_age_s,
        queue_depth=status.queue_depth,
    )


def list_devices_response(page: DevicePage) -> tracker_pb2.ListDevicesResponse:
    return tracker_pb2.ListDevicesResponse(
        devices=[device_status_to_proto(status) for status in page.devices],
        next_page_token=page.next_page_token,
    )


def register_response(registered: Registered) -> tracker_pb2.RegisterResponse:
    return tracker_pb2.RegisterResponse(
        heartbeat_interval_s=registered.heartbeat_interval_s,
        fence_floors=registered.fence_floors,
    )


def heartbeat_response(known: bool) -> tracker_pb2.HeartbeatResponse:
    return tracker_pb2.HeartbeatResponse(known=known)


def deregister_response(removed: int) -> tracker_pb2.DeregisterResponse:
    return tracker_pb2.DeregisterResponse(removed=removed)
