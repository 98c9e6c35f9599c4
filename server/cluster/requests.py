"""What the front checks and rewrites in a request before relaying or fanning it out: the
replicas' body limits (read and parsed by `server.bodies`, as on one server), the label lifted
from headers into the body, the routing key, and task-done paths rebuilt from their parts."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, NamedTuple

from topas_agents.errors import LabelError
from topas_agents.labels import (
    BODY_KEY,
    MAX_LABEL_CHARS,
    header_fields,
    path_segment,
    text_problem,
    to_metadata,
)
from topas_agents.server.api_errors import ApiError, bad_request, from_label_error
from topas_agents.server.config import ServerConfig

from .config import KEYED_POLICIES

# The replicas' body limits (ServerConfig; the launcher never changes them), enforced before
# the body is read whole: a 200 MiB body grew the front to 820 MB before the replica's 413.
_REPLICA_LIMITS = ServerConfig()
MAX_CALL_BODY_BYTES = _REPLICA_LIMITS.max_body_bytes
MAX_WORKFLOW_BODY_BYTES = _REPLICA_LIMITS.max_workflow_bytes
# A call body above this is parsed and re-encoded in a worker thread, as a replica parses it.
OFFLOAD_BYTES = _REPLICA_LIMITS.offload_bytes
# The replicas' bound on `?calls=` (server/app.py `_calls_param`: 0..999999999): a longer value
# is refused here with their message, not sent (70000 digits made a URL httpx refuses).
MAX_CALLS_DIGITS = 9
CALLS_PROBLEM = "'calls' must be an integer in 0..999999999"
_DONE_PREFIX = b"/v1/topas/tasks/"
# smg 1.13's /v1/responses refuses a `metadata` of more entries (OpenAI's limit too)
SMG_METADATA_ENTRIES = 16


def lift_label(body: dict[str, Any], headers: Mapping[str, str]) -> Any:
    """The request's label as smg will forward it: the body's, else one built from the
    X-Topas-* headers and written into the body (validated by the replica, as before)."""
    if body.get(BODY_KEY) is not None:
        return body[BODY_KEY]
    try:
        from_headers = header_fields(headers)
    except LabelError as exc:
        raise from_label_error(exc) from None
    if from_headers:
        body[BODY_KEY] = from_headers
        return from_headers
    return None


def label_into_metadata(body: dict[str, Any]) -> None:
    """A Responses request's label moved from the `topas` body field into `metadata` entries
    (`labels.METADATA_KEYS`), which smg forwards: its /v1/responses refuses unknown body
    fields (400 "unknown field `topas`") and it forwards no X-Topas-* header. A label that
    is not an object, or a `metadata` that is not one, is left for the replica to refuse."""
    label, metadata = body.get(BODY_KEY), body.get("metadata")
    if not isinstance(label, Mapping) or not (metadata is None or isinstance(metadata, dict)):
        return
    merged = {**(metadata or {}), **to_metadata(label)}
    if len(merged) > SMG_METADATA_ENTRIES:  # smg's own 400 ("17 properties") did not say why
        own = len(metadata or {})
        raise bad_request(f"'metadata' holds {own} entries and the topas label travels in {len(merged) - own} "
                          f"more through the gateway, which allows {SMG_METADATA_ENTRIES} in all: send at most "
                          f"{SMG_METADATA_ENTRIES - len(merged) + own} of your own", "metadata")
    body.pop(BODY_KEY)
    body["metadata"] = merged


def route_key_header(key: str) -> bytes:
    """The route key as a header value smg can read (visible ASCII and inner spaces): every
    other character, such as the "é" of the task id "café", percent-encoded as UTF-8 (any
    one-to-one spelling keeps a task's calls together; a printable ASCII key is sent as it is,
    so existing deployments route as before)."""
    return "".join(c if " " <= c <= "~" else urllib.parse.quote(c.encode("utf-8", "surrogatepass"), safe="")
                   for c in key).encode("ascii")


def route_key(label: Any, policy: str) -> str | None:
    """The label's task id or agent as the routing key; None when there is none or it is not
    valid label text (a lone surrogate, a control character, surrounding whitespace, too
    long): the replica refuses such a label with a 400 naming the field, while as a header it
    failed before reaching it (a 500, a 502, smg's empty 400)."""
    if policy not in KEYED_POLICIES or not isinstance(label, Mapping):
        return None
    value = label.get("task_id" if policy == "task" else "agent")
    if not isinstance(value, str) or not value or len(value) > MAX_LABEL_CHARS or text_problem(value):
        return None
    return value


class DonePath(NamedTuple):
    """A done call's path as the replicas get it, and the task (and stage) it names."""

    path: str
    task_id: str
    stage: str | None = None


def done_path(raw_path: bytes) -> DonePath:
    """The replica path and the task id (and stage) of `POST /v1/topas/tasks/{task}/done` or `.../{task}/stages/
    {stage}/done`, split on the raw path as a replica splits it (server/app.py `done_target`)
    and rebuilt from the parsed parts, each re-escaped: a raw `..` would otherwise be resolved
    by httpx (`tasks/../../chat/completions` reached the replicas' chat endpoint), and an id
    holding "/" (%2F) arrives whole. 404 for any other shape, as a replica answers."""
    rest = raw_path.split(b"?", 1)[0]
    parts = rest[len(_DONE_PREFIX):].split(b"/") if rest.startswith(_DONE_PREFIX) else []
    raw = [urllib.parse.unquote_to_bytes(p) for p in parts]
    text = [p.decode("utf-8", "replace") for p in raw]
    stage = None
    if len(raw) == 2 and text[1] == "done" and text[0]:
        segments = [path_segment(raw[0]), "done"]
    elif len(raw) == 4 and text[1] == "stages" and text[3] == "done" and text[0] and text[2]:
        segments = [path_segment(raw[0]), "stages", path_segment(raw[2]), "done"]
        stage = text[2]
    else:
        raise ApiError(404, "Not Found")
    return DonePath(_DONE_PREFIX.decode() + "/".join(segments), text[0], stage)
