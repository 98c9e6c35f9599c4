"""The HTTP probes of `topas calibrate` (what they measure: `cli/calibrate.py`'s docstring).

Every failure of a probe is a one-line ConfigError that names the server and what went wrong:
a server that answers 200 with a body that is not an OpenAI chat completion (no JSON, no
`usage`, token counts that are not integers) was a traceback, and a timeout, whose message
is empty, read "cannot reach URL: " with no reason.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Coroutine
from typing import Any, NamedTuple

from ..errors import ConfigError

WORDS = ("plan", "code", "test", "data", "user", "agent", "task", "value", "queue", "cache")
PREFILL_WORDS = (32, 128, 512, 1024)  # prompt sizes (words ~ tokens) for the prefill slope
BATCHES = (1, 2, 4, 8)
DECODE_TOKENS = 32  # output tokens per decode probe (long enough to amortize the prefill)
# Fewer extra steps than this between the long and the short probe time nothing but noise.
MIN_DECODE_STEPS = 8
REPEATS = 3  # prefill keeps the minimum (least disturbed); decode and bursts the median
CALL_PROBES = 9  # sequential minimal calls, reported beside the burst estimate
CALL_PROBE_WORDS = 8  # prompt of a minimal call: model time is then close to one batch-1 step
CALL_BURST = 16  # concurrent minimal calls per burst (fewer if the KV pool is small)
# A probe is at most a 1024-word prefill or DECODE_TOKENS steps of batch 8: minutes only on a
# server that has stopped answering.
CALL_TIMEOUT_S = 300.0
BODY_CHARS = 200  # how much of a bad answer an error quotes


class Usage(NamedTuple):
    """The token counts of a chat completion's `usage`."""

    prompt_tokens: int
    completion_tokens: int


class Probe(NamedTuple):
    """One probe call: its wall time and the tokens the server says it read and generated."""

    seconds: float
    prompt_tokens: int
    completion_tokens: int


class CallBurst(NamedTuple):
    """`calls` minimal calls sent at once: their prompt tokens and the wall time of all."""

    calls: int
    prompt_tokens: int
    wall_s: float


class PrefillPoint(NamedTuple):
    """A prompt size's prefill: the prompt tokens the server read, and the least wall time of a
    1-token call over REPEATS."""

    tokens: int
    seconds: float


class DecodePoint(NamedTuple):
    """A batch size and its decode step time (median over REPEATS long/short pairs)."""

    batch: int
    step_s: float


class BatchRun(NamedTuple):
    """`b` concurrent calls: their wall time, and the steps they took (the most tokens a call of
    the batch generated, as the server's usage says)."""

    wall_s: float
    steps: int


class Measurements(NamedTuple):
    """What `measure` takes through HTTP."""

    prefill: list[PrefillPoint]
    decode: list[DecodePoint]
    calls: list[CallBurst]  # CALL_PROBES single calls (calls=1), then REPEATS bursts


def reason(exc: BaseException) -> str:
    """What happened, on one line and never blank: an exception's message can be empty
    (httpx's ReadTimeout from an async client has none), so its type leads."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def failure(url: str, exc: BaseException) -> ConfigError:
    """A probe's transport failure as one line naming the server and what happened."""
    import httpx

    what = reason(exc)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return ConfigError(f"calibrate: cannot reach {url}: {what}")
    if isinstance(exc, httpx.TimeoutException):
        what += f" (no answer within {CALL_TIMEOUT_S:g} s)"
    return ConfigError(f"calibrate: a probe call to {url} failed: {what}")


def _quote(text: str) -> str:
    """A body for a one-line error: its whitespace folded, cut to BODY_CHARS, never blank."""
    folded = " ".join(text.split())
    return folded[:BODY_CHARS] if folded else "(empty body)"


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_usage(url: str, body: str) -> Usage:
    """The token counts of a 200 answer, or a ConfigError saying what is wrong with it. Both
    are required: the decode probes time steps by completion_tokens (a missing one read as 0
    and was blamed on min_tokens)."""
    where = f"calibrate: {url}/chat/completions answered 200"
    try:
        data = json.loads(body)
    except ValueError:
        raise ConfigError(f"{where} with a body that is not JSON: {_quote(body)}") from None
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        raise ConfigError(f"{where} without a `usage` object (the token counts calibrate times by): {_quote(body)}")
    prompt, completion = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
    if prompt is None or completion is None:
        bad = [f"usage.{key} = {usage[key]!r}" if key in usage else f"no usage.{key}"
               for key, n in (("prompt_tokens", prompt), ("completion_tokens", completion)) if n is None]
        raise ConfigError(f"{where} with {' and '.join(bad)} (each must be a whole number >= 0)")
    return Usage(prompt, completion)


async def _call(client: Any, url: str, model: str, prompt: str, tokens: int) -> Probe:
    t0 = time.perf_counter()
    r = await client.post(f"{url}/chat/completions", json={
        "model": model, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0.0,
        "messages": [{"role": "user", "content": prompt}]})
    if r.status_code != 200:
        raise ConfigError(f"calibrate: HTTP {r.status_code} from {url}: {_quote(r.text)}")
    seconds = time.perf_counter() - t0
    usage = parse_usage(url, r.text)
    return Probe(seconds, usage.prompt_tokens, usage.completion_tokens)


def _prompt(n_words: int, rng: random.Random) -> str:
    return f"{rng.random():.12f} " + " ".join(rng.choice(WORDS) for _ in range(n_words))


def prefill_sizes(kv_budget: int | None) -> tuple[int, ...]:
    """Prompt sizes (words) that fit half the KV pool (a word is at most ~5 tokens here)."""
    if kv_budget is None:
        return PREFILL_WORDS
    fit = tuple(n for n in PREFILL_WORDS if n * 5 <= kv_budget // 2)
    return fit if len(fit) >= 2 else (8, max(16, kv_budget // 20))


def burst_size(kv_budget: int | None) -> int:
    """CALL_BURST, or fewer so a burst's prompts fit half the KV pool (<= ~5 tokens a word)."""
    per_call = 5 * (CALL_PROBE_WORDS + 1)
    return CALL_BURST if kv_budget is None else max(2, min(CALL_BURST, kv_budget // 2 // per_call))


async def measure(url: str, model: str, kv_budget: int | None = None, api_key: str | None = None) -> Measurements:
    """Prefill, decode-step and minimal-call points (see `cli/calibrate.py`'s docstring); a
    call that fails on the way is a one-line ConfigError (`failure`)."""
    import httpx

    from ..integrations.task import auth_headers

    try:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT_S, headers=auth_headers(api_key)) as client:
            return await _measure(client, url, model, kv_budget)
    except httpx.HTTPError as exc:
        raise failure(url, exc) from None


async def _measure(client: Any, url: str, model: str, kv_budget: int | None) -> Measurements:
    rng = random.Random(0)

    def call(words: int, tokens: int) -> Coroutine[Any, Any, Probe]:
        """A probe with a fresh prompt, drawn now (in call order, so a run is repeatable)."""
        return _call(client, url, model, _prompt(words, rng), tokens)

    await call(8, 1)  # warm-up
    calls = [CallBurst(1, p.prompt_tokens, p.seconds) for p in [await call(CALL_PROBE_WORDS, 1)
                                                                 for _ in range(CALL_PROBES)]]
    k = burst_size(kv_budget)
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        done = await asyncio.gather(*(call(CALL_PROBE_WORDS, 1) for _ in range(k)))
        calls.append(CallBurst(k, sum(p.prompt_tokens for p in done), time.perf_counter() - t0))
    prefill = []
    for n in prefill_sizes(kv_budget):
        runs = [await call(n, 1) for _ in range(REPEATS)]
        prefill.append(PrefillPoint(runs[0].prompt_tokens, min(p.seconds for p in runs)))

    async def batch(b: int, tokens: int) -> BatchRun:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(call(16, tokens) for _ in range(b)))
        return BatchRun(time.perf_counter() - t0, max(p.completion_tokens for p in done))

    decode = []
    for b in BATCHES:
        steps = [_step_s(await batch(b, DECODE_TOKENS), await batch(b, 1), url) for _ in range(REPEATS)]
        decode.append(DecodePoint(b, max(1e-6, statistics.median(steps))))
    return Measurements(prefill, decode, calls)


def _step_s(long: BatchRun, short: BatchRun, url: str) -> float:
    """Seconds per decode step from a long and a short batch, by the steps each generated (the
    server's usage): an engine that ignores min_tokens and stops early (the simulator's echo
    responder stopped at 24 of 32) made the step 25% short when 31 steps were assumed."""
    steps = long.steps - short.steps
    if steps < MIN_DECODE_STEPS:
        raise ConfigError(f"calibrate: {url} generated {long.steps} tokens for a {DECODE_TOKENS}-token probe "
                          f"(min_tokens is ignored, and it stops early); decode steps cannot be timed: give a "
                          "server that generates max_tokens (topas serve: --responder lorem)")
    return (long.wall_s - short.wall_s) / steps
