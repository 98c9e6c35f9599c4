"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any

from ..errors import (
    LabelError,
    TaskClosedError,
    TaskError,
    TaskWorkflowMismatchError,
    UnknownStageError,
    UnknownTaskError,
)
from ..labels import BODY_KEY

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
          409: "conflict_error", 413: "invalid_request_error", 503: "service_unavailable",
          500: "server_error"}


class ApiError(Exception):
    """A request-level error with its HTTP status; never escapes as a 500."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def from_label_error(exc: LabelError) -> ApiError:
    """A malformed label names the field as `topas.<field>` (`topas` for the whole object)."""
    param = BODY_KEY if exc.field == BODY_KEY else f"{BODY_KEY}.{exc.field}"
    return ApiError(400, str(exc), param)


# The task tracker's errors (topas_agents.task_tracker) as HTTP: (status, param). A label's
# fields are named `topas.<field>`; URL path parts by their route name.
_TASK_ERRORS: dict[type[TaskError], tuple[int, str | None]] = {
    TaskClosedError: (409, f"{BODY_KEY}.task_id"),
    TaskWorkflowMismatchError: (400, f"{BODY_KEY}.workflow"),
    UnknownTaskError: (404, "task_id"),
    UnknownStageError: (400, "stage"),
}


def from_task_error(exc: TaskError) -> ApiError:
    status, param = _TASK_ERRORS.get(type(exc), (400, None))
    return ApiError(status, str(exc), param)


def shutting_down() -> ApiError:
    return ApiError(503, "server is shutting down; request not accepted")
