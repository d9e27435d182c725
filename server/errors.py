"""One error type for every front end, mapped once to gRPC and once to HTTP (TF Serving's mapping)."""

from __future__ import annotations

import grpc
import tensorflow as tf

# gRPC code -> HTTP status, as TF Serving's REST handler maps them (FAILED_PRECONDITION is a client error: 400).
_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}

# TensorFlow's error codes share numbers with gRPC's: index the gRPC enum by number.
_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


class ServingError(Exception):
    """A request failure with the TF Serving status code it must be reported as."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self.code]

    @property
    def code_name(self) -> str:
        return self.code.name

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


def invalid_argument(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def failed_precondition(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.FAILED_PRECONDITION, message)


def unavailable(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNAVAILABLE, message)


def deadline_exceeded(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, message)


def unimplemented(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNIMPLEMENTED, message)


def from_exception(exc: BaseException) -> ServingError:
    """Keeps a TensorFlow error's own code (its numbers are gRPC's); anything else is INTERNAL."""
    if isinstance(exc, ServingError):
        return exc
    if isinstance(exc, tf.errors.OpError):
        return ServingError(_BY_NUMBER.get(exc.error_code, grpc.StatusCode.UNKNOWN), exc.message)
    return ServingError(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
