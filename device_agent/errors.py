"""Errors of the agent's core, which the servicer maps to gRPC status codes.

A well-formed request whose measurement fails gets a result with a status, not one of these: these
mean the request itself cannot be served.

    AgentError
    ├── UnknownDeviceError          NOT_FOUND            the request names no device of this agent
    ├── InvalidRequestError         INVALID_ARGUMENT     a malformed hash, missing meta, bad inputs
    └── UploadRejectedError                              nothing was stored
        ├── ArtifactTooLargeError   RESOURCE_EXHAUSTED   past --max-artifact-bytes
        ├── HashMismatchError       DATA_LOSS            the bytes do not hash to meta.sha256
        └── TruncatedUploadError    DATA_LOSS            fewer (or more) bytes than meta.size_bytes
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of the errors a request to the agent can raise."""


class UnknownDeviceError(AgentError):
    """The request names a device this agent does not serve."""


class InvalidRequestError(AgentError):
    """The request is malformed."""


class UploadRejectedError(AgentError):
    """An upload was refused; nothing was stored."""


class ArtifactTooLargeError(UploadRejectedError):
    """The artifact exceeds the agent's size limit."""


class HashMismatchError(UploadRejectedError):
    """The uploaded bytes do not hash to the announced sha256."""


class TruncatedUploadError(UploadRejectedError):
    """The upload ended with a byte count other than the meta's size_bytes."""
