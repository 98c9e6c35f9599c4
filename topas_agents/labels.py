"""The label protocol: one definition used by clients, the embedded server and SGLang.

Body (preferred; clients send it through openai's `extra_body`):

    "topas": {"task_id": str, "stage": str, "agent": str,
              "workflow": str (optional), "prefix_tokens": int (optional)}

Headers (alternative): X-Topas-Task-Id, X-Topas-Stage, X-Topas-Agent, X-Topas-Workflow,
X-Topas-Prefix-Tokens. When both are present the body wins, field by field never mixed:
a body label is taken whole.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import LabelError

BODY_KEY = "topas"
HEADERS = {
    "task_id": "X-Topas-Task-Id",
    "stage": "X-Topas-Stage",
    "agent": "X-Topas-Agent",
    "workflow": "X-Topas-Workflow",
    "prefix_tokens": "X-Topas-Prefix-Tokens",
}
_MAX_ID = 256


@dataclass(frozen=True, slots=True)
class Label:
    task_id: str
    stage: str
    agent: str
    workflow: str | None = None
    prefix_tokens: int | None = None

    def to_body(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_headers(self) -> dict[str, str]:
        return {HEADERS[k]: str(v) for k, v in asdict(self).items() if v is not None}


def _text(data: Mapping[str, Any], key: str, required: bool) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise LabelError(key, "is required")
        return None
    if not isinstance(value, str):
        raise LabelError(key, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise LabelError(key, "must not be empty")
    if len(value) > _MAX_ID:
        raise LabelError(key, f"longer than {_MAX_ID} characters")
    return value


def _prefix_tokens(value: Any) -> int | None:
    if value is None:
        return None
    # ASCII digits only: str.isdigit() accepts e.g. '²', which int() then rejects
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LabelError("prefix_tokens", f"must be an integer >= 0, got {value!r}")
    return value


def label_from_mapping(data: Any) -> Label:
    if not isinstance(data, Mapping):
        raise LabelError(BODY_KEY, f"must be an object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(HEADERS))
    if unknown:
        raise LabelError(unknown[0], "unknown field")
    return Label(
        task_id=_text(data, "task_id", True),  # type: ignore[arg-type]
        stage=_text(data, "stage", True),  # type: ignore[arg-type]
        agent=_text(data, "agent", True),  # type: ignore[arg-type]
        workflow=_text(data, "workflow", False),
        prefix_tokens=_prefix_tokens(data.get("prefix_tokens")),
    )


def label_from_headers(headers: Mapping[str, str]) -> Label | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    values = {k: lowered.get(h.lower()) for k, h in HEADERS.items()}
    if all(v is None for v in values.values()):
        return None
    return label_from_mapping({k: v for k, v in values.items() if v is not None})


def parse_label(body: Mapping[str, Any] | None, headers: Mapping[str, str] | None = None) -> Label | None:
    """The request's label, or None if unlabelled. Raises LabelError when malformed."""
    if body is not None and body.get(BODY_KEY) is not None:
        return label_from_mapping(body[BODY_KEY])
    return label_from_headers(headers or {})


# ---------------------------------------------------------------------------- context

_CURRENT: contextvars.ContextVar[Label | None] = contextvars.ContextVar("topas_label", default=None)


def current_label() -> Label | None:
    """The label in force in this context (thread / asyncio task), if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def label(task_id: str | None = None, stage: str | None = None, agent: str | None = None,
          workflow: str | None = None, prefix_tokens: int | None = None) -> Iterator[Label]:
    """Label every LLM call made inside the block. Fields left None inherit the enclosing label.

    Uses contextvars, so it follows asyncio tasks created inside the block and is isolated
    between concurrent tasks.
    """
    outer = _CURRENT.get()
    given = {"task_id": task_id, "stage": stage, "agent": agent, "workflow": workflow,
             "prefix_tokens": prefix_tokens}
    given = {k: v for k, v in given.items() if v is not None}
    new = replace(outer, **given) if outer is not None else label_from_mapping(given)
    label_from_mapping(new.to_body())  # validate the merged label
    token = _CURRENT.set(new)
    try:
        yield new
    finally:
        _CURRENT.reset(token)
