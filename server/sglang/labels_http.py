"""HTTP process: the Topas label from an OpenAI request to SGLang's internal request.

SGLang's OpenAI request models drop unknown keys, and its internal request structs cannot
carry extra attributes to the scheduler. The one free-form string that survives the trip
HTTP -> TokenizerManager -> scheduler `Req` unchanged is `routing_key` (notes section 5), so
the label travels there as `topas1:<compact JSON of Label.to_body()>`.

- `request_models()` builds subclasses of `ChatCompletionRequest` / `CompletionRequest` with a
  typed `topas` field (the plugin REPLACEs SGLang's classes with them, so FastAPI parses it).
- `label_of(request, raw_request, workflows)` parses the body field or the X-Topas-* headers
  with `topas_agents.labels.parse_label`; a malformed label raises `LabelError`, a
  `ValueError`, which SGLang's `handle_request` turns into HTTP 400 with the message
  "topas label field '<field>': ...".
- `copy_routing_key(sub, parent)` is the `GenerateReqInput.__getitem__` fix: batch and n>1
  expansion otherwise drops `routing_key` (verified in the notes).

Nothing here imports SGLang at module import.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from ...errors import LabelError
from ...labels import BODY_KEY, Label, label_from_mapping, parse_label
from ...workflow import Workflow

ROUTING_PREFIX = "topas1:"


def encode_label(label: Label) -> str:
    return ROUTING_PREFIX + json.dumps(label.to_body(), separators=(",", ":"), sort_keys=True)


def decode_routing_key(key: str | None) -> Label | None:
    """The label carried by a routing key; None for keys that are not ours.

    Raises LabelError for a `topas1:` key whose payload is not a valid label (a client can
    set `x-smg-routing-key` itself, bypassing the HTTP checks).
    """
    if not key or not key.startswith(ROUTING_PREFIX):
        return None
    try:
        data = json.loads(key[len(ROUTING_PREFIX):])
    except json.JSONDecodeError:
        raise LabelError(BODY_KEY, "routing key payload is not JSON") from None
    return label_from_mapping(data)


def check_workflow(label: Label, workflows: Mapping[str, Workflow]) -> None:
    """With workflows registered, the label must name a known workflow/stage/agent."""
    if label.workflow is None or not workflows:
        return
    wf = workflows.get(label.workflow)
    if wf is None:
        known = ", ".join(sorted(workflows))
        raise LabelError("workflow", f"unknown workflow '{label.workflow}' (registered: {known})")
    if not wf.has_stage(label.stage):
        raise LabelError("stage", f"workflow '{wf.name}' has no stage '{label.stage}'")
    expected = wf.stage(label.stage).agent
    if label.agent != expected:
        raise LabelError("agent", f"stage '{label.stage}' of workflow '{wf.name}' is run by agent "
                                  f"'{expected}', got '{label.agent}'")


def label_of(request: Any, raw_request: Any, workflows: Mapping[str, Workflow],
             metadata: Any = None) -> Label | None:
    """The request's label (body field `topas`, else X-Topas-* headers, else `metadata`
    entries: a Responses request's, which smg forwards), validated."""
    body = {BODY_KEY: getattr(request, BODY_KEY, None)}
    headers = getattr(raw_request, "headers", None) or {}
    label = parse_label(body, headers, metadata)  # a metadata that is no mapping holds no label
    if label is not None:
        check_workflow(label, workflows)
    return label


def attach_label(converted: Any, label: Label) -> None:
    """Put `label` on the internal request returned by `_convert_to_internal_request`."""
    adapted = converted[0] if isinstance(converted, tuple) else converted
    adapted.routing_key = encode_label(label)


def keep_label(raw_request: Any, label: Label) -> None:
    """Keep a Responses API call's label on its HTTP request (`attach_kept_label` puts it on
    the engine requests the call sends)."""
    state = getattr(raw_request, "state", None)
    if state is not None:
        state.topas_label = label


def attach_kept_label(obj: Any, raw_request: Any) -> None:
    """The kept label onto an engine request that carries none (a chat/completions request
    has its own from `attach_label`)."""
    label = getattr(getattr(raw_request, "state", None), "topas_label", None)
    if isinstance(label, Label) and not getattr(obj, "routing_key", None):
        obj.routing_key = encode_label(label)


def copy_routing_key(sub: Any, parent: Any) -> None:
    key = getattr(parent, "routing_key", None)
    if key is not None and key.startswith(ROUTING_PREFIX):
        sub.routing_key = key


# SGLang class path -> name of our subclass. REPLACE works only if it runs before
# `sglang.srt.entrypoints.http_server` is imported (its routes capture the body model);
# launch_server / `sglang serve` / Engine all load plugins first.
REQUEST_MODELS = {
    "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest": "TopasChatCompletionRequest",
    "sglang.srt.entrypoints.openai.protocol.CompletionRequest": "TopasCompletionRequest",
    "sglang.srt.entrypoints.openai.protocol.ResponsesRequest": "TopasResponsesRequest",
}


@functools.cache
def request_models() -> dict[str, type]:
    """{SGLang class path: subclass with an optional `topas` field} (imports SGLang)."""
    from sglang.srt.entrypoints.openai import protocol

    out: dict[str, type] = {}
    for path, name in REQUEST_MODELS.items():
        base = getattr(protocol, path.rsplit(".", 1)[1])
        # `Any`, not a typed model: parse_label validates, so every malformed label gets the
        # same one-line 400 naming the field.
        out[path] = type(name, (base,), {"__annotations__": {BODY_KEY: Any | None},
                                         BODY_KEY: None, "__module__": __name__})
    return out
