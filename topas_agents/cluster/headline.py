"""The cluster bench's headline: which policies it covers and the router each is shown with.

One rule for the single-seed summary (`bench.py`) and the summary over seeds (`seeds.py`):
every Topas policy that ran (`topas` and each built-in or plugin variant named `topas-*`,
`topas-core` included) gets a headline. Its router is chosen once, by the lowest mean JCT, and
every number in its headline (mean and p99 JCT, and their ratios) is that one pair's: taking
the p99 from whichever router had the lowest p99 would put two configurations in one line.
Other policies (the baselines, and peers such as kvflow) are in the per-pair table only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

RECOMMENDED = "topas"  # `headline` is this policy's when it ran (the others are in `headlines`)
SGLANG_DEFAULT_PAIR = "lpm+cache"  # SGLang's default stack: LPM in the engine, cache-aware routing


def pair_policy(pair: str) -> str:
    """The policy of a `POLICY+ROUTER` pair (router names have no '+')."""
    return pair.rpartition("+")[0]


def is_topas(policy: str) -> bool:
    return policy == RECOMMENDED or policy.startswith(f"{RECOMMENDED}-")


def headline_policies(pairs: Iterable[str]) -> list[str]:
    """The Topas policies among `pairs`, in the order they first appear."""
    return list(dict.fromkeys(p for p in map(pair_policy, pairs) if is_topas(p)))


def best_pair(policy: str, pairs: Iterable[str], mean_jct: Callable[[str], float | None]) -> str | None:
    """`policy`'s pair with the lowest mean JCT (None if none has one)."""
    own = [p for p in pairs if pair_policy(p) == policy and mean_jct(p) is not None]
    return min(own, key=lambda p: mean_jct(p)) if own else None  # type: ignore[arg-type, return-value]


def with_headlines(out: dict[str, Any], heads: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """Put `headlines` (one per Topas policy) and `headline` (the recommended policy's, else
    the first Topas policy's; {} when none ran) into a summary block."""
    out["headline"] = heads.get(RECOMMENDED) or next(iter(heads.values()), {})
    out["headlines"] = dict(heads)
    return out
