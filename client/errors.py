"""Errors the client raises: a server's answer keeps TF Serving's status code and message."""

from __future__ import annotations

import grpc

# TF Serving's HTTP mapping (http_server.cc) read backwards. A few HTTP statuses stand for several gRPC codes
# (400: INVALID_ARGUMENT, FAILED_PRECONDITION or OUT_OF_RANGE); REST cannot tell them apart, so the error says so.
HTTP_TO_CODES: dict[int, tuple[str, ...]] = {
    400: ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"),
    401: ("UNAUTHENTICATED",),
    403: ("PERMISSION_DENIED",),
    404: ("NOT_FOUND",),
    409: ("ALREADY_EXISTS", "ABORTED"),
    429: ("RESOURCE_EXHAUSTED",),
    499: ("CANCELLED",),
    500: ("INTERNAL", "UNKNOWN", "DATA_LOSS"),
    501: ("UNIMPLEMENTED",),
    503: ("UNAVAILABLE",),
    504: ("DEADLINE_EXCEEDED",),
}


class ServingError(RuntimeError):
    """A request the server (or the network) refused. `code` is the gRPC status name, e.g. "NOT_FOUND"; over
    REST it is the name HTTP maps back to, or several joined by "|" where HTTP is ambiguous."""

    def __init__(self, code: str, message: str, target: str, http_status: int | None = None):
        self.code = code
        self.message = message
        self.target = target
        self.http_status = http_status
        http = f" (HTTP {http_status})" if http_status is not None else ""
        super().__init__(f"{code}{http} from {target}: {message}")

    @classmethod
    def from_grpc(cls, error: grpc.RpcError, target: str) -> "ServingError":
        return cls(error.code().name, error.details() or "", target)

    @classmethod
    def from_http(cls, status: int, message: str, target: str) -> "ServingError":
        codes = HTTP_TO_CODES.get(status, ("UNKNOWN",))
        return cls("|".join(codes), message, target, http_status=status)

    @property
    def retryable(self) -> bool:
        """UNAVAILABLE means the server could not take the request now (queue full, restarting, unreachable)."""
        return self.code == "UNAVAILABLE"
