"""SGLang plugin entry point and hook registration (SGLang's official HookRegistry).

Entry point (pyproject): `[project.entry-points."sglang.srt.plugins"] topas =
"topas_agents.server.sglang.plugin:register"`. SGLang calls `register()` in every process
it starts (HTTP/main, scheduler, detokenizer), then applies the registered hooks. With
`TOPAS_SGLANG_POLICY` unset, `register()` does nothing at all.

HookRegistry hooks cannot be removed, so each hook is a thin trampoline into the module's
active `Adapter`: `install(adapter)` activates one, `uninstall()` releases its pins and
deactivates it, and with none active every trampoline returns without effect (the class
REPLACEs only add an optional `topas` field). This module is the only place that patches
SGLang, and only through HookRegistry, only when `register()` is called.

| target                                                          | type    | why                        |
|-----------------------------------------------------------------|---------|----------------------------|
| openai.protocol.ChatCompletionRequest / CompletionRequest        | REPLACE | typed `topas` body field   |
| OpenAIServingChat/Completion._convert_to_internal_request        | AFTER   | label -> routing_key (400) |
| io_struct.GenerateReqInput.__getitem__                           | AFTER   | keep routing_key in n>1    |
| openai.protocol.ResponsesRequest                                 | REPLACE | typed `topas` body field   |
| OpenAIServingResponses.create_responses                          | AROUND  | label checked (400), kept  |
| tokenizer_manager.TokenizerManager.generate_request              | BEFORE  | kept label -> routing_key  |
| scheduler.Scheduler._create_generation_req                       | AFTER   | label onto the Req, book it|
| scheduler.Scheduler.get_new_batch_prefill                        | AROUND  | decide + apply + admit     |
| schedule_policy.SchedulePolicy.calc_priority                     | AFTER   | keep the decision's order  |
| schedule_batch.ScheduleBatch._get_decode_retraction_order        | AFTER   | policy-ranked retraction   |
| schedule_policy.PrefillAdder.add_one_req                         | AFTER   | why admission stopped (log)|
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import TopasError
from .adapter import Adapter
from .config import PluginConfig

logger = logging.getLogger(__name__)

_ACTIVE: Adapter | None = None

_SGL = "sglang.srt"
HTTP_TARGETS = (
    f"{_SGL}.entrypoints.openai.serving_chat.OpenAIServingChat._convert_to_internal_request",
    f"{_SGL}.entrypoints.openai.serving_completions.OpenAIServingCompletion._convert_to_internal_request",
)
# The Responses API builds its engine request itself (no _convert_to_internal_request): its
# label is checked and kept on the HTTP request, and put on each engine request it sends
# (a built-in tool's next turn builds another one).
RESPONSES_TARGET = f"{_SGL}.entrypoints.openai.serving_responses.OpenAIServingResponses.create_responses"
GENERATE_TARGET = f"{_SGL}.managers.tokenizer_manager.TokenizerManager.generate_request"
GETITEM_TARGET = f"{_SGL}.managers.io_struct.GenerateReqInput.__getitem__"
CREATE_REQ_TARGET = f"{_SGL}.managers.scheduler.Scheduler._create_generation_req"
PREFILL_TARGET = f"{_SGL}.managers.scheduler.Scheduler.get_new_batch_prefill"
PRIORITY_TARGET = f"{_SGL}.managers.schedule_policy.SchedulePolicy.calc_priority"
RETRACT_TARGET = f"{_SGL}.managers.schedule_batch.ScheduleBatch._get_decode_retraction_order"
ADD_REQ_TARGET = f"{_SGL}.managers.schedule_policy.PrefillAdder.add_one_req"


def install(adapter: Adapter) -> None:
    """Make `adapter` the one the hooks call (replacing, and closing, any previous one)."""
    global _ACTIVE
    if _ACTIVE is not None and _ACTIVE is not adapter:
        _ACTIVE.close()
    _ACTIVE = adapter


def uninstall() -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.close()
    _ACTIVE = None


def active() -> Adapter | None:
    return _ACTIVE


# ---------------------------------------------------------------------------- trampolines


def after_convert(result: Any, serving: Any, request: Any, raw_request: Any = None) -> None:
    if _ACTIVE is not None:
        _ACTIVE.on_convert(result, request, raw_request)


def around_create_responses(orig: Any, serving: Any, request: Any, raw_request: Any = None,
                            *args: Any, **kwargs: Any) -> Any:
    """A malformed label is the same one-line 400 as on chat (SGLang's error body)."""
    if _ACTIVE is not None:
        try:
            _ACTIVE.on_responses(request, raw_request)
        except ValueError as exc:  # LabelError
            return _refused(serving, str(exc))
    return orig(serving, request, raw_request, *args, **kwargs)


async def _refused(serving: Any, message: str) -> Any:
    return serving.create_error_response(message)


def before_generate_request(manager: Any, obj: Any, request: Any = None, *args: Any, **kwargs: Any) -> None:
    if _ACTIVE is not None:
        _ACTIVE.on_generate(obj, request)


def after_getitem(sub: Any, parent: Any, i: Any) -> None:
    if _ACTIVE is not None:
        from .labels_http import copy_routing_key

        copy_routing_key(sub, parent)


def after_create_req(req: Any, sched: Any, *args: Any, **kwargs: Any) -> None:
    if _ACTIVE is not None:
        _ACTIVE.on_new_request(req)


def around_prefill(orig: Any, sched: Any, running_batch: Any, *args: Any, **kwargs: Any) -> Any:
    if _ACTIVE is None or args or kwargs:
        return orig(sched, running_batch, *args, **kwargs)
    return _ACTIVE.on_prefill(orig, sched, running_batch)


def after_calc_priority(result: Any, policy: Any, waiting_queue: list, *args: Any, **kwargs: Any) -> None:
    if _ACTIVE is not None:
        _ACTIVE.order_waiting(waiting_queue)


def after_add_one_req(result: Any, adder: Any, *args: Any, **kwargs: Any) -> None:
    if _ACTIVE is not None:
        _ACTIVE.note_add_result(result)


def after_retraction_order(result: list[int], reqs: list, *args: Any, **kwargs: Any) -> list[int] | None:
    return _ACTIVE.retraction_order(result, reqs) if _ACTIVE is not None else None


# ---------------------------------------------------------------------------- registration


def hook_specs() -> list[tuple[str, Any, str]]:
    """(target, hook, HookType name) for every hook; the request models are imported here."""
    from .labels_http import request_models

    specs: list[tuple[str, Any, str]] = [(path, cls, "REPLACE") for path, cls in request_models().items()]
    specs += [(t, after_convert, "AFTER") for t in HTTP_TARGETS]
    specs += [
        (RESPONSES_TARGET, around_create_responses, "AROUND"),
        (GENERATE_TARGET, before_generate_request, "BEFORE"),
        (GETITEM_TARGET, after_getitem, "AFTER"),
        (CREATE_REQ_TARGET, after_create_req, "AFTER"),
        (PREFILL_TARGET, around_prefill, "AROUND"),
        (PRIORITY_TARGET, after_calc_priority, "AFTER"),
        (RETRACT_TARGET, after_retraction_order, "AFTER"),
        (ADD_REQ_TARGET, after_add_one_req, "AFTER"),
    ]
    return specs


def register() -> None:
    """The `sglang.srt.plugins` entry point. Reads the configuration once, from the environment."""
    try:
        config = PluginConfig.from_env()
        if config is None:
            return
        adapter = Adapter(config)
    except (TopasError, OSError) as exc:  # bad configuration, unreadable file, decision log path
        # Explicitly requested but unusable: refuse to serve stock SGLang silently (SGLang
        # catches Exceptions from plugins and carries on; SystemExit stops this process).
        logger.error("topas plugin: %s", exc)
        raise SystemExit(f"topas plugin: {exc}") from None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    specs = hook_specs()
    for target, hook, kind in specs:
        HookRegistry.register(target, hook, HookType[kind])
    install(adapter)
    adapter.log_event("loaded", policy=config.policy, hooks=len(specs))
    logger.info("topas plugin: policy %r, %d hooks registered", config.policy, len(specs))
