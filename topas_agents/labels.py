"""The label protocol: one definition used by clients, the embedded server and SGLang.

Body (preferred; clients send it through openai's `extra_body`):

    "topas": {"task_id": str, "stage": str, "agent": str,
              "workflow": str (optional), "prefix_tokens": int (optional)}

Headers (alternative): X-Topas-Task-Id, X-Topas-Stage, X-Topas-Agent, X-Topas-Workflow,
X-Topas-Prefix-Tokens. When both are present the body wins, field by field never mixed:
a body label is taken whole. A Responses API request may also carry it in `metadata`
(`METADATA_KEYS`: what the cluster front sends through smg), read last.
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
import re
import reprlib
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
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
MAX_LABEL_CHARS = 256  # a label's text (task id, stage, agent, workflow)
# An unlabelled call is a one-call task of its own, in this stage and agent, on every engine
# (the embedded server and the SGLang plugin): no prefix is shared with it.
UNLABELLED_STAGE = "default"
UNLABELLED_AGENT = "default"


def unlabelled_task_id(rid: str) -> str:
    return f"untagged-{rid}"

# Larger than any KV budget; also bounds the digits int() parses (a 5000-digit header raised).
MAX_PREFIX_TOKENS = 2**31 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 and C1 control characters and DEL: never part of a real id, and not sendable in an HTTP
# header (h11 refuses them, which the openai client reported as "Connection error." after
# four retries).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _clip(value: Any) -> str:
    """User input in an error message: short and valid Unicode (never echoed at length)."""
    try:
        text = reprlib.repr(value)
    except ValueError:  # an int of more than 4300 digits
        text = "a huge integer"
    return _SURROGATE.sub("?", text)[:80]


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

    @property
    def ascii(self) -> bool:
        """Every field is ASCII: an httpx client built with these headers can send them (it
        encodes header values given at construction as ASCII; see integrations/openai_client)."""
        return all(str(v).isascii() for v in asdict(self).values() if v is not None)


def _text(data: Mapping[str, Any], key: str, required: bool) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise LabelError(key, "is required")
        return None
    if not isinstance(value, str):
        raise LabelError(key, f"must be a string, got {type(value).__name__}")
    if not value:
        raise LabelError(key, "must not be empty")
    if not value.strip():  # "\u2028" was refused as "empty"
        raise LabelError(key, f"is whitespace only ({_clip(value)})")
    if len(value) > MAX_LABEL_CHARS:
        raise LabelError(key, f"longer than {MAX_LABEL_CHARS} characters")
    problem = text_problem(value)
    if problem is not None:
        raise LabelError(key, problem)
    # a str subclass (`class Stage(str, Enum)`) as its text: str() of such an enum member is
    # "Stage.PLAN", which the header hook sent while the body wrappers sent "plan"
    return value if type(value) is str else str.__str__(value)


def check_label_text(field: str, value: Any) -> str:
    """`value` if it can be the label field `field` (a non-empty string that can travel in a
    header: no control characters, no surrounding spaces, at most 256 characters);
    LabelError naming the field otherwise. For names that code hands to label builders."""
    checked = _text({field: value}, field, True)
    assert checked is not None  # required: None raised
    return checked


def text_problem(value: str) -> str | None:
    """Why `value` cannot be a label's text (nor a workflow, agent or stage name, which labels
    name), or None. Lone surrogates are not Unicode. Control characters and whitespace at
    either end cannot travel in an HTTP header (h11 refuses the one, the other arrives
    stripped), so a header label and a body label of the same call would differ."""
    if _SURROGATE.search(value):
        return "contains a lone UTF-16 surrogate (invalid Unicode)"
    if _CONTROL.search(value):
        return "contains a control character"
    if value != value.strip():
        return "starts or ends with whitespace"
    return None


def _prefix_tokens(value: Any) -> int | None:
    if value is None:
        return None
    # ASCII digits only: str.isdigit() accepts e.g. '²', which int() then rejects
    digits = value.strip() if isinstance(value, str) else ""
    if digits.isascii() and digits.isdigit() and len(digits) <= len(str(MAX_PREFIX_TOKENS)):
        value = int(digits)
    elif not isinstance(value, bool | int | str) and hasattr(type(value), "__index__"):
        value = operator.index(value)  # numpy.int64 and other integer types: as the int they are
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PREFIX_TOKENS:
        raise LabelError("prefix_tokens", f"must be an integer >= 0 and <= {MAX_PREFIX_TOKENS}, "
                                          f"got {_clip(value)} ({type(value).__name__})")
    return int(value)


REQUIRED = ("task_id", "stage", "agent")


def label_fields(data: Any, *, complete: bool = True) -> dict[str, Any]:
    """The validated, non-None fields of a label mapping; `complete=False` accepts a partial
    label (a task scope without stage/agent: `label(task_id=...)`, `task(...)`)."""
    if not isinstance(data, Mapping):
        raise LabelError(BODY_KEY, f"must be an object, got {type(data).__name__}")
    unknown = sorted(str(k) for k in set(data) - set(HEADERS))
    if unknown:
        raise LabelError(_clip(unknown[0])[1:-1], "unknown field")
    fields = {key: _text(data, key, complete and key in REQUIRED) for key in (*REQUIRED, "workflow")}
    fields["prefix_tokens"] = _prefix_tokens(data.get("prefix_tokens"))
    return {k: v for k, v in fields.items() if v is not None}


def label_from_mapping(data: Any) -> Label:
    return Label(**label_fields(data))


def header_text(value: str) -> str:
    """A header value as the client meant it. ASGI servers (Starlette: our server, SGLang, the
    cluster front) decode header bytes as Latin-1, while httpx, hence our wrappers, encodes
    them as UTF-8: without this a task id `café` sent in a header became `cafÃ©`, another
    task than the same id in the body. Bytes that are not UTF-8 keep their Latin-1 reading."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def path_segment(text: str | bytes) -> str:
    """A label value (task id, stage) as one URL path segment with these characters: "/" as
    %2F, and "." or ".." as %2E (httpx and curl resolve literal dot segments: a done call for
    task ".." went to /v1/topas/done, a 404, and the task stayed open)."""
    escaped = urllib.parse.quote(text, safe="")
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def header_fields(headers: Mapping[str, str]) -> dict[str, str]:
    """The label fields present in X-Topas-* headers (case-insensitive), as the client sent
    them (`header_text`), not yet validated. A header given twice with two values is a
    LabelError (one was taken silently: which task a call belongs to was a guess)."""
    fields = {h.lower(): f for f, h in HEADERS.items()}
    out: dict[str, str] = {}
    for key, value in headers.items():  # a server's headers list a repeated one each time
        field = fields.get(key.lower())
        if field is None:
            continue
        text = header_text(value)
        if out.get(field, text) != text:
            raise LabelError(field, f"header {HEADERS[field]} is given twice with different values")
        out[field] = text
    return out


def carries_label(body: Mapping[str, Any] | None, header_names: Iterable[str]) -> bool:
    """The caller already labelled the request: a non-null body `topas` field, or any X-Topas-*
    label header (names compared case-insensitively, as HTTP does). Client wrappers then add
    nothing of the label in force: a label is taken whole, never merged with another (the
    server reads the body first, so a context body label would override an explicit header one)."""
    if body is not None and body.get(BODY_KEY) is not None:
        return True
    return any(name.lower() in _LABEL_HEADERS for name in header_names)


_LABEL_HEADERS = frozenset(h.lower() for h in HEADERS.values())


def label_from_headers(headers: Mapping[str, str]) -> Label | None:
    fields = header_fields(headers)
    return label_from_mapping(fields) if fields else None


# A Responses API request's string `metadata` carries the label where neither the body field
# nor the headers travel: smg (1.13) refuses unknown /v1/responses body fields and forwards no
# X-Topas-* header, but passes `metadata` on to the worker. One key per field (metadata values
# are strings of at most 512 characters; a label's text is at most MAX_LABEL_CHARS).
METADATA_KEYS = {field: f"topas_{field}" for field in HEADERS}


def to_metadata(fields: Mapping[str, Any]) -> dict[str, str]:
    """Label fields as Responses `metadata` entries."""
    return {METADATA_KEYS[k]: str(v) for k, v in fields.items() if k in METADATA_KEYS and v is not None}


def label_from_metadata(metadata: Any) -> Label | None:
    """The label in a Responses request's `metadata` (None: none there); LabelError when malformed."""
    if not isinstance(metadata, Mapping):
        return None
    fields = {field: metadata[key] for field, key in METADATA_KEYS.items() if key in metadata}
    return label_from_mapping(fields) if fields else None


def parse_label(body: Mapping[str, Any] | None, headers: Mapping[str, str] | None = None,
                metadata: Any = None) -> Label | None:
    """The request's label, or None if unlabelled: the body field, else the X-Topas-* headers,
    else (a Responses request) its `metadata` entries. Raises LabelError when malformed."""
    if body is not None and not isinstance(body, Mapping):
        raise LabelError(BODY_KEY, f"the request body must be a JSON object, got {type(body).__name__}")
    if body is not None and body.get(BODY_KEY) is not None:
        return label_from_mapping(body[BODY_KEY])
    return label_from_headers(headers or {}) or label_from_metadata(metadata)


# ---------------------------------------------------------------------------- context

# The fields in force: possibly partial (a task scope set by the runner or `task()` before a
# role supplies stage and agent). Immutable mappings only, so a context never shares state.
_CURRENT: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar("topas_label", default=None)


def current_fields() -> dict[str, Any]:
    """The label fields in force in this context, complete or not ({} outside any label)."""
    return dict(_CURRENT.get() or {})


def current_label() -> Label | None:
    """The complete label in force in this context (thread / asyncio task): None outside any
    label, and while task_id, stage or agent is still missing (such calls go unlabelled)."""
    fields = _CURRENT.get() or {}
    return Label(**fields) if all(k in fields for k in REQUIRED) else None


def _scoped(outer: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The fields an inner label puts in force over `outer`. A field left None inherits,
    except where it belongs to a field the inner label changes: a new task id starts afresh
    (another task's workflow, stage and agent are not this one's), a new agent drops the
    inherited prefix size (a prefix is an agent's: it was fixed on the server for the new
    agent at its first call), and a new workflow drops the inherited stage (stage names are
    per workflow)."""
    new = {k: v for k, v in given.items() if v is not None}
    inherited = dict(outer)
    if "task_id" in new and new["task_id"] != inherited.get("task_id"):
        inherited = {}
    if "agent" in new and new["agent"] != inherited.get("agent"):
        inherited.pop("prefix_tokens", None)
    if "workflow" in new and new["workflow"] != inherited.get("workflow"):
        inherited.pop("stage", None)
    return {**inherited, **new}


@contextlib.contextmanager
def label(*, task_id: str | None = None, stage: str | None = None, agent: str | None = None,
          workflow: str | None = None, prefix_tokens: int | None = None) -> Iterator[Label | None]:
    """Label every LLM call made inside the block. Fields left None inherit the enclosing
    label, except those tied to a field this block changes (`_scoped`: a new task id starts
    afresh, a new agent drops the prefix size, a new workflow the stage). Keyword-only: a
    positional first argument silently named another task.

    A partial label is valid (e.g. `label(task_id="t1")` around a framework whose roles add
    stage and agent); calls made while task_id, stage or agent is missing go unlabelled.
    Yields the complete label, or None while it is partial. Uses contextvars, so it follows
    asyncio tasks created inside the block and is isolated between concurrent tasks.

    Do not yield from a generator inside the block: the generator runs in its consumer's
    context, so the label is in force in the consumer between the generator's steps, and a
    generator finalised elsewhere exits in another context. Such an exit restores the label
    it replaced only where this block's label is still the one in force, and never raises.
    """
    outer = _CURRENT.get()
    mine = MappingProxyType(label_fields(_scoped(outer or {}, {
        "task_id": task_id, "stage": stage, "agent": agent, "workflow": workflow,
        "prefix_tokens": prefix_tokens}), complete=False))
    token = _CURRENT.set(mine)
    try:
        yield current_label()
    finally:
        _restore(token, mine, outer)


def _restore(token: contextvars.Token[Mapping[str, Any] | None], mine: Mapping[str, Any],
             outer: Mapping[str, Any] | None) -> None:
    """Undo a label block: leave alone a label that another block (entered after this one and
    still open, e.g. the consumer of a generator) put in force; in another context (a
    generator closed from another asyncio task), set the outer label instead of raising
    "created in a different Context", which lost the task's done call."""
    if _CURRENT.get() is not mine:
        return
    try:
        _CURRENT.reset(token)
    except ValueError:
        _CURRENT.set(outer)
