"""The project's one percentile: numpy's default definition (linear interpolation between
order statistics), in plain Python so the light client, the server's stats, the MetaGPT
evaluation and the bench all report the same p99 of the same numbers without numpy."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of `values`; nan when there are none.

    Equals `numpy.percentile(values, q)` (method "linear"): rank h = (n - 1) q / 100,
    interpolated between the order statistics floor(h) and floor(h) + 1.
    """
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def percentile_or_none(values: Iterable[float], q: float) -> float | None:
    """`percentile`, with None for no values (JSON reports)."""
    p = percentile(values, q)
    return None if math.isnan(p) else p
