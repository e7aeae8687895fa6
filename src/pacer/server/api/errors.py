"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

from __future__ import annotations

import logging
import uuid
from typing import Any

__all__ = ["APIError", "bad_request", "error_body", "log_error"]

log = logging.getLogger("pacer.server")


class APIError(Exception):
    """An error the client sees as an HTTP status plus an OpenAI error object."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def bad_request(param: str | None, message: str, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def queue_full(retry_after_s: int) -> APIError:
    return APIError(429, "the server's waiting queue is full; retry later", "rate_limit_error",
                    None, "queue_full", {"Retry-After": str(retry_after_s)})


def displaced(retry_after_s: int) -> APIError:
    return APIError(429, "request shed from the waiting queue by a higher-priority request; retry later",
                    "rate_limit_error", None, "displaced", {"Retry-After": str(retry_after_s)})


def slo_unattainable() -> APIError:
    return APIError(429, "the request can no longer meet its TTFT target (shed before it was scheduled); "
                         "retry later or relax its slo", "rate_limit_error", "slo", "slo_unattainable",
                    {"Retry-After": "1"})


def slow_client(max_queued_outputs: int) -> APIError:
    """A streaming client stopped reading (or reads slower than the engine writes): its request
    was aborted once `max_queued_outputs` outputs per choice waited unread."""
    return APIError(408, f"the client read the stream too slowly: {max_queued_outputs} outputs per choice waited "
                         "unread (the server's --max-queued-outputs), so the request was aborted",
                    "invalid_request_error", None, "stream_backlog_exceeded")


def internal(message: str, error_id: str | None = None) -> APIError:
    """A 500 whose message never carries an exception's text: `error_id` names the log line."""
    if error_id is not None:
        message = f"{message} (error id {error_id}; the server log has the details)"
    return APIError(500, message, "server_error", None, "internal_error")


def unavailable(message: str) -> APIError:
    return APIError(503, message, "server_error", None, "service_unavailable", {"Retry-After": "5"})


def log_error(message: str, error: BaseException) -> str:
    """Log `error` (with its traceback) under a fresh id and return the id: a client is shown
    the id, never the exception's text."""
    error_id = uuid.uuid4().hex[:12]
    log.error("%s [error id %s]", message, error_id, exc_info=error)
    return error_id
