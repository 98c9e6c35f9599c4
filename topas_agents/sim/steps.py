"""Closed-form step arithmetic: decode jumps and chunked prefill batches.

A decode step for batch B over total context C costs `decode_step_s(B, C) = a + b*C` (the
KV-read term is linear in C). Within a jump the batch is fixed and the context grows by B
per step, so k steps cost an arithmetic series:

    S(k) = k*step0 + slope*k*(k-1)/2,   step0 = decode_step_s(B, C0),
                                        slope = decode_step_s(B, C0+B) - step0

`slope` is read off the profile rather than its fields, so any profile whose decode cost
is affine in context is summed exactly (tests compare against a per-step loop).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..costmodel import Profile

# SGLang's default `chunked_prefill_size` for large GPUs: at most this many new tokens per
# prefill step; a longer prefill continues in the next step.
PREFILL_CHUNK_TOKENS = 8192


def jump_s(k: int, step0: float, slope: float) -> float:
    """Total time of k decode steps."""
    return k * step0 + slope * k * (k - 1) / 2


def steps_to_cover(dt: float, step0: float, slope: float) -> int:
    """Smallest k >= 1 with jump_s(k) >= dt (the first step boundary at or after dt)."""
    if dt <= step0:
        return 1
    if slope <= 0.0:
        k = math.ceil(dt / step0)
    else:
        a, b = slope / 2, step0 - slope / 2
        k = math.ceil((-b + math.sqrt(b * b + 4 * a * dt)) / (2 * a))
    k = max(1, k)
    # The closed form can be off by one in floating point: settle on the exact boundary.
    while k > 1 and jump_s(k - 1, step0, slope) >= dt:
        k -= 1
    while jump_s(k, step0, slope) < dt:
        k += 1
    return k


def steps_within(limit_s: float, step0: float, slope: float) -> int:
    """Largest k >= 1 with jump_s(k) <= limit_s (at least one step always runs)."""
    k = steps_to_cover(limit_s, step0, slope)
    if jump_s(k, step0, slope) > limit_s:
        k -= 1
    return max(1, k)


def decode_jump_terms(profile: Profile, batch: int, context: int) -> tuple[float, float]:
    """(step0, slope) of a decode jump starting with `batch` requests over `context` tokens."""
    step0 = profile.decode_step_s(batch, context)
    slope = profile.decode_step_s(batch, context + batch) - step0
    return step0, max(0.0, slope)


def prefill_batch_s(profile: Profile, chunks: Iterable[tuple[int, int]]) -> float:
    """One batched prefill step over (new_tokens, context_before) chunks.

    One forward pass: the dense term is paid once for all N new tokens together and the
    attention pairs are summed per request (each new token attends to the context before
    it plus, causally, half its own chunk). For a single chunk this is exactly
    `profile.prefill_s(new, cached)`.
    """
    new = 0
    pairs = 0.0
    for tokens, before in chunks:
        new += tokens
        pairs += tokens * (before + tokens / 2)
    if new <= 0:
        return 0.0
    return profile.step_s(new, 0, pairs)
