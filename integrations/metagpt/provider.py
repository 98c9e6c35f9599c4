"""`TopasOpenAILLM`: MetaGPT's OpenAI provider, labelled, with the static prefix first.

Needs MetaGPT imported: call `environment.prepare_metagpt` first.

`OpenAILLM._cons_kwargs` is the one choke point of every chat request in MetaGPT 0.8.2
(non-stream, stream, function calls). The override:
1. restructures the messages (`layout.restructure`; `ProviderOptions.restructure`);
2. takes the label in force (`topas_agents.label`, contextvars: task set by the runner,
   agent/stage by the labelled roles) and adds `prefix_tokens` = the static prefix size;
3. puts it in `extra_body["topas"]` and `X-Topas-*` headers (`openai_client.with_label`);
4. optionally drops `max_tokens` (the embedded simulator then samples the stage's output
   length from the workflow instead of reserving MetaGPT's fixed 4096).
Completed calls are reported to an optional `CallRecorder` (traces, per-run summaries).

Per role, the workflows pass an instance explicitly (`Role(context=ctx, llm=...)`), which
needs no global change. `register_topas_provider()` / `topas_provider()` additionally make
MetaGPT's own factory build this class for `api_type: openai` (explicit, reversible).
"""

from __future__ import annotations

from .environment import require_prepared

require_prepared(__name__)  # before any metagpt import
# ruff: noqa: E402

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from metagpt.configs.llm_config import LLMConfig, LLMType
from metagpt.const import USE_CONFIG_TIMEOUT
from metagpt.provider.llm_provider_registry import LLM_REGISTRY
from metagpt.provider.openai_api import OpenAILLM
from openai import APIConnectionError

from topas_agents.integrations.openai_client import with_label
from topas_agents.labels import Label, current_label
from topas_agents.server.tokens import count_tokens

from .layout import Shaped, keep, restructure
from .server_gone import WATCH

if TYPE_CHECKING:
    from .recorder import CallRecorder


@dataclass(frozen=True, slots=True)
class ProviderOptions:
    restructure: bool = True  # static prefix first (layout.py)
    send_max_tokens: bool = True  # False: omit max_tokens (simulator samples the workflow's)
    client_max_retries: int | None = None  # openai client retries (None: openai's default 2)


@dataclass(frozen=True, slots=True)
class SentCall:
    """What one request carried, kept until its response arrives (same asyncio context)."""

    label: Label | None
    shaped: Shaped


_SENT: contextvars.ContextVar[SentCall | None] = contextvars.ContextVar("topas_mg_sent", default=None)


class TopasOpenAILLM(OpenAILLM):
    """OpenAILLM whose requests carry the Topas label and lead with the static prefix."""

    def __init__(self, config: LLMConfig, options: ProviderOptions | None = None,
                 recorder: CallRecorder | None = None, clock: Callable[[], float] = time.time) -> None:
        self.topas_options = options or ProviderOptions()
        self.recorder = recorder
        self._clock = recorder.clock if recorder is not None else clock
        super().__init__(config)

    def _make_client_kwargs(self) -> dict:
        kwargs = super()._make_client_kwargs()
        if self.topas_options.client_max_retries is not None:
            kwargs["max_retries"] = self.topas_options.client_max_retries
        return kwargs

    def topas_label(self) -> Label | None:
        """The label for a request made now (the stock-role hook in `stock.py` overrides it)."""
        return current_label()

    def shape(self, messages: list[dict]) -> Shaped:
        return restructure(messages) if self.topas_options.restructure else keep(messages)

    def _cons_kwargs(self, messages: list[dict], timeout: int = USE_CONFIG_TIMEOUT, **extra_kwargs: Any) -> dict:
        shaped = self.shape(messages)
        kwargs = super()._cons_kwargs(shaped.messages, timeout=timeout, **extra_kwargs)
        if not self.topas_options.send_max_tokens:
            kwargs.pop("max_tokens", None)
        lab = self.topas_label()
        if lab is not None:
            lab = replace(lab, prefix_tokens=shaped.prefix_tokens)
        _SENT.set(SentCall(lab, shaped))
        return with_label(kwargs, lab)

    async def _achat_completion(self, messages: list[dict], timeout: int = USE_CONFIG_TIMEOUT) -> Any:
        WATCH.check(self.config.base_url)
        t_submit = self._clock()
        try:
            rsp = await super()._achat_completion(messages, timeout=timeout)
        except APIConnectionError as exc:
            await self._raise_if_gone(exc)
            raise
        usage = rsp.usage
        self._record(t_submit, getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None),
                     self.get_choice_text(rsp))
        return rsp

    async def _achat_completion_stream(self, messages: list[dict], timeout: int = USE_CONFIG_TIMEOUT) -> str:
        WATCH.check(self.config.base_url)
        t_submit = self._clock()
        try:
            text = await super()._achat_completion_stream(messages, timeout=timeout)
        except APIConnectionError as exc:
            await self._raise_if_gone(exc)
            raise
        self._record(t_submit, None, None, text)
        return text

    async def _raise_if_gone(self, exc: APIConnectionError) -> None:
        """`ServerGoneError` (server_gone.py) when the server stopped answering; else the caller
        re-raises `exc` for MetaGPT's retries."""
        gone = await WATCH.after_connection_error(self.config.base_url, exc)
        if gone is not exc:
            raise gone from exc

    def _record(self, t_submit: float, prompt_tokens: int | None, completion_tokens: int | None,
                text: str | None) -> None:
        sent = _SENT.get()
        if self.recorder is None or sent is None:
            return
        if prompt_tokens is None:  # no usage: estimate with the server's tokenizer
            prompt_tokens = sent.shaped.prefix_tokens + sum(count_tokens(m["content"]) for m in
                                                            sent.shaped.messages[1:])
        if completion_tokens is None:
            completion_tokens = count_tokens(text or "")
        self.recorder.on_call(sent.label, sent.shaped, t_submit, self._clock(), prompt_tokens, completion_tokens)


# ---------------------------------------------------------------------------- registry

_REGISTRY_KEYS = (LLMType.OPENAI,)


def register_topas_provider() -> Callable[[], None]:
    """Make MetaGPT build `TopasOpenAILLM` for `api_type: openai`; returns the undo."""
    return register_llm(TopasOpenAILLM, _REGISTRY_KEYS)


def register_llm(factory: Callable[..., Any], keys: Iterable[Any]) -> Callable[[], None]:
    """Register `factory` in MetaGPT's LLM registry for `keys`; returns the undo, which puts
    back exactly what was there (or nothing)."""
    keys = tuple(keys)
    previous = {key: LLM_REGISTRY.providers.get(key) for key in keys}
    for key in keys:
        LLM_REGISTRY.register(key, factory)

    def undo() -> None:
        for key, cls in previous.items():
            if cls is None:
                LLM_REGISTRY.providers.pop(key, None)
            else:
                LLM_REGISTRY.register(key, cls)

    return undo


@contextlib.contextmanager
def topas_provider() -> Iterator[None]:
    """`register_topas_provider()` for the duration of a block."""
    undo = register_topas_provider()
    try:
        yield
    finally:
        undo()
