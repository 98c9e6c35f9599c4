"""The ONE place that changes MetaGPT objects at run time: its retry settings.

MetaGPT 0.8.2 retries a reply its parsers reject up to 6 times with random exponential
waits (ActionNode 1-20 s, WriteCode/WriteCodeReview 1-60 s), and connection errors 6 times
(1-60 s), so one bad server reply costs 20 s to minutes before `Team.run` gives up. There
is no config knob for it. `fast_retries(attempts, wait_s)` sets the `stop`/`wait` of those
tenacity retry objects for the duration of a block and restores them after; it is never
applied at import. Used by the tests and by `topas run --parse-retries N`. `never_retry(...)`
likewise wraps their `retry` predicates so that given exceptions are not retried (the runner
passes `ServerGoneError`: a server that stopped answering, server_gone.py).

Relies on tenacity <= 8.2's decorator calling its own Retrying object (the pinned 8.2.3);
`fast_retries` checks that each target exposes one and raises otherwise.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

from tenacity import RetryCallState, stop_after_attempt, wait_fixed

from topas_agents.errors import ConfigError

# (module, class, method) of every tenacity-decorated MetaGPT call on the SOP/TL path
TARGETS = (
    ("metagpt.actions.action_node", "ActionNode", "_aask_v1"),
    ("metagpt.actions.write_code", "WriteCode", "write_code"),
    ("metagpt.actions.write_code_review", "WriteCodeReview", "write_code_review_and_rewrite"),
    ("metagpt.actions.summarize_code", "SummarizeCode", "summarize_code"),
    ("metagpt.provider.openai_api", "OpenAILLM", "acompletion_text"),
)


def _retrying(module: str, cls: str, method: str):  # -> tenacity.BaseRetrying
    fn = getattr(getattr(importlib.import_module(module), cls), method)
    retrying = getattr(fn, "retry", None)
    if retrying is None or not hasattr(retrying, "stop") or not hasattr(retrying, "wait"):
        raise ConfigError(f"{module}.{cls}.{method} has no tenacity retry object to configure")
    return retrying


_active: dict[str, object] = {"depth": 0, "setting": None, "saved": None}


@contextlib.contextmanager
def fast_retries(attempts: int = 1, wait_s: float = 0.0) -> Iterator[None]:
    """MetaGPT retries at most `attempts` times, `wait_s` apart, inside the block.

    Re-entrant (concurrent runs may share one setting; the first entry applies it and the
    last exit restores MetaGPT's own); a different setting while one is active is an error."""
    if attempts < 1 or wait_s < 0:
        raise ConfigError(f"fast_retries needs attempts >= 1 and wait_s >= 0, got {attempts}, {wait_s}")
    setting = (attempts, wait_s)
    if _active["depth"] and _active["setting"] != setting:
        raise ConfigError(f"fast_retries{_active['setting']} is active; cannot nest {setting}")
    if not _active["depth"]:
        objects = [_retrying(*t) for t in TARGETS]
        _active["saved"] = [(r, r.stop, r.wait) for r in objects]
        for r in objects:
            r.stop, r.wait = stop_after_attempt(attempts), wait_fixed(wait_s)
        _active["setting"] = setting
    _active["depth"] += 1  # type: ignore[operator]
    try:
        yield
    finally:
        _active["depth"] -= 1  # type: ignore[operator]
        if not _active["depth"]:
            for r, stop, wait in _active["saved"]:  # type: ignore[union-attr]
                r.stop, r.wait = stop, wait
            _active["saved"] = _active["setting"] = None


_never: dict[str, object] = {"depth": 0, "saved": None}


@contextlib.contextmanager
def never_retry(*exc_types: type[BaseException]) -> Iterator[None]:
    """MetaGPT does not retry an exception of `exc_types` inside the block (`ServerGoneError`:
    retrying a server that stopped answering took minutes). Re-entrant like `fast_retries`
    (one setting for all concurrent runs); each target's own predicate applies otherwise."""
    if not _never["depth"]:
        objects = [_retrying(*t) for t in TARGETS]
        _never["saved"] = [(r, r.retry) for r in objects]
        for r in objects:
            r.retry = _unless(exc_types, r.retry)
    _never["depth"] += 1  # type: ignore[operator]
    try:
        yield
    finally:
        _never["depth"] -= 1  # type: ignore[operator]
        if not _never["depth"]:
            for r, retry in _never["saved"]:  # type: ignore[union-attr]
                r.retry = retry
            _never["saved"] = None


def _unless(exc_types: tuple[type[BaseException], ...], retry: object) -> object:
    def decide(state: RetryCallState) -> bool:
        outcome = state.outcome
        if outcome is not None and outcome.failed and isinstance(outcome.exception(), exc_types):
            return False
        return bool(retry(state))  # type: ignore[operator]

    return decide
