"""Configuration of `topas-paper`: the numbers the paper leaves unspecified, each with its reason.

`topas-paper` implements section IV as printed (docs/topas.md, "topas-paper: the algorithm as
printed"); every project-specific change is a named option, off by default (`TOPAS_OPTIONS`
sets them all at `topas`'s values). Options are validated like `TopasConfig`'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

from ...errors import ConfigError
from .config import MAX_BETA, MAX_SIZE_WEIGHT, OptionLimit, TopasConfig, _convert


@dataclass(frozen=True, slots=True)
class PaperConfig:
    """Unspecified numbers of the paper, chosen once for every workload.

    M          Algorithm 1 enumerates P(A_t) when |A_t| <= M. 6: at most 2^6 = 64 GreedyPack
               runs, the same order as the O(|A_t|^2) greedy branch for ~10 agents; every
               built-in workload except dag10wide (10 agents) is then searched exhaustively.
    K          cap on |A_R| and on |P_R| separately (K = 0 removes both). 32: SGLang admits a
               few dozen requests per prefill step anyway, and decisions recur at every event,
               so deferring the rest costs one event; a larger K only lengthens every pack.
    beta       weight of V_reuse (eq 11). 1.0: the reload time is already in seconds, the
               unit of every other term, so the neutral weight is 1.
    rho        aging strength (eq 12). 1.0: an age of (e - 1) H_age doubles a task's weight,
               the neutral log scale; the paper gives no value.
    samples    rows of the Monte Carlo estimate of E[LP] when the joint support is too large
               to enumerate: Latin-hypercube uniforms, common random numbers across tasks and
               candidate states (profiles.py). 64: the estimator error measured by accuracy.py
               for the tuned policy is a few percent of a stage at 64 rows.
    exact_rows E[LP] is computed exactly (product of the residual supports) when that product
               has at most this many points: two-point fork/join cases and point masses are
               exact, larger ones fall back to `samples` rows. 256: 4x the MC cost at most.
    history    completed executions kept per (workflow, stage) for F_{a(v),v}. 64: the
               empirical distribution of a long run, while following drift.
    seed       seed of the CRN sample matrix (decisions are deterministic given it).

    Project options (named deviations of the tuned `topas`; every one is OFF by default, i.e.
    `topas-paper` is the printed algorithm; docs/topas.md has the table):

    horizon       0 = off. > 0: D_r is capped at horizon x the observed mean request service
                  (`topas` credits only the service delivered within one scheduling interval).
    work_floor    0 = off. > 0: Delta(r | H) >= work_floor x D_r (off-critical work still counts).
    size_weight   0 = off. > 0: g_i is multiplied by (H_age / W_i)^size_weight, W_i = expected
                  remaining LLM work of the task (SRPT-like).
    kv_exp        1 = the paper (progress per KV token). 0: GreedyPack orders by weighted
                  progress alone (`topas` default).
    redo_prefill  0 = the paper (J_redo = T_decode y_r). 1: J_redo = re-prefill of input +
                  generated tokens (what the simulated engine and SGLang's retract then pay).
    k_preempt     0 = the paper (K caps preemptions too). > 0: preemptions are capped at
                  k_preempt instead (`topas`: 4, fewer than admissions: preemption churn).
    forfeit       0 = off. 1: a preemption also forfeits the preempted request's own progress
                  g Delta(p | {}). 2: its task forfeits g x (L_i with its retained running
                  requests served - L_i with all of them served), `topas`'s J_admit over Q'.
    keep_idle     0 = off (idle prefixes are infeasible). 1: a resident prefix with n_a > 0 (a
                  downstream stage of its agent is about to be released) may stay in R' idle,
                  paying its KV; it is never loaded for that (no prefetch).
    pin_finishing 0 = off. 1: a prefix set that would preempt a running request that may finish
                  now (it has produced its stage's smallest declared output) is infeasible.
    prefetch      0 = off. 1: with keep_idle, a prefix with n_a > 0 that is not resident may
                  join R' idle too, and is loaded now (`prefix_in`); eq 8 charges its load
                  only to tasks admitted on incoming prefixes, eq 11 credits it
                  (`topas`: idle prefixes kept and prefetched when V_reuse > 0).
    block         0 = off. > 0: J_block of `topas` (occupancy.py): a pack whose admissions leave
                  KV free that some waiting agent cannot use is charged block x those agents'
                  waiting tasks' weights x the longest admission's D_r x the free fraction
                  (`topas`: 0.5).
    backfill      0 = off. > 0: `topas`'s EASY head reservation (paper_occupancy.py) for the
                  oldest task's first waiting request once it has waited backfill x the mean
                  request service (`topas`: 4).
    advance       0 = off. > 0 (with backfill): a state that starts a waiting head now,
                  preempting only younger tasks, gains advance x g(head) x its reserved wait
                  (`topas`: 1).
    drop_incumbent 0 = off. 1: a best state that admits nothing and preempts nothing gives way
                  to the best state that admits without preempting (`topas`: always).
    width         0 = the paper (every outside agent tried at each greedy step, in the pair test
                  and in Repair). > 0: only the `width` outside agents of most waiting
                  progress (sum of g Delta(r | {})) (`topas`: 4, ranked by aged queue length).
    max_additions 0 = the paper (no limit). > 0: at most this many greedy additions per
                  decision (`topas`: 8).
    smith_move    0 = eq 8. 1: `topas`'s J_move: each incoming prefix delays the tasks admitted
                  on it (weighted by g), host-link swaps serialized in Smith order, a
                  recompute also stalls the running batch, evictions free.
    reserve_first 0 = the paper (a prefix of R that no retained request covers holds a slot and
                  its smallest request's KV; GreedyPack's order decides). n > 0: its best
                  fitting request among its n of highest priority is admitted first
                  (`topas`: 4).
    reuse_imminence 0 = the paper (n_a counts each release). 1: each release of a running
                  stage weighs g(task) x P(the stage ends within the horizon) (option
                  horizon's cap, else the mean request service) (`topas`: the same weight).
    rivals        0 = off. 1: the admissions LPM and Parrot would make on the same snapshot
                  (when they preempt nothing) are scored as one more state with eq 13 and win
                  when better (`topas`: `TopasConfig.rivals`).
    work_conserving 0 = off. 1: a decision that leaves the GPU idle while requests wait
                  becomes the oldest task's admission, evicting idle prefixes
                  (`topas`: guard.py, always on).

    H_age (eq 12) is "the observed service-time scale": the running mean of completed stage
    services, before any completion the mean profiled stage service of the loaded workflows.
    """

    M: int = 6
    K: int = 32
    beta: float = 1.0
    rho: float = 1.0
    samples: int = 64
    exact_rows: int = 256
    history: int = 64
    seed: int = 0
    horizon: float = 0.0
    work_floor: float = 0.0
    size_weight: float = 0.0
    kv_exp: float = 1.0
    redo_prefill: int = 0
    pin_finishing: int = 0
    k_preempt: int = 0
    forfeit: int = 0
    keep_idle: int = 0
    prefetch: int = 0
    block: float = 0.0
    backfill: float = 0.0
    advance: float = 0.0
    drop_incumbent: int = 0
    smith_move: int = 0
    reserve_first: int = 0
    reuse_imminence: int = 0
    width: int = 0
    max_additions: int = 0
    rivals: int = 0
    work_conserving: int = 0

    def profile_config(self) -> TopasConfig:
        """Settings of the shared `ServiceProfiles`: F is rebuilt at every completed stage
        (refresh = 1), as the paper updates it "when the stage finishes"."""
        return TopasConfig(samples=self.samples, history=self.history, refresh=1, seed=self.seed)


# The paper core with `topas`'s option values (set "F" of docs/topas.md, the closest measured
# to the tuned `topas`; `make_topas` stays on its own code path until this matches it).
TUNED_OPTIONS: dict[str, float | int] = {
    "horizon": 0.3, "work_floor": 0.25, "size_weight": 1.0, "kv_exp": 0.0, "redo_prefill": 1,
    "pin_finishing": 1, "k_preempt": 4, "forfeit": 1,
}

# Every named option at `topas`'s value: the paper core with each of `topas`'s deviations that
# is an option (docs/topas.md, "Named options"; what each adds: bench/paper_options.py).
TOPAS_OPTIONS: dict[str, float | int] = {
    **TUNED_OPTIONS, "forfeit": 2, "block": 0.5, "backfill": 4.0, "advance": 1.0, "rivals": 1, "work_conserving": 1,
    "drop_incumbent": 1, "smith_move": 1, "reserve_first": 4, "width": 4, "max_additions": 8, "keep_idle": 1,
    "prefetch": 1, "reuse_imminence": 1,
}

_PAPER_LIMITS: dict[str, OptionLimit] = {
    "M": OptionLimit(int, 0, 16),
    "K": OptionLimit(int, 0, None),
    "beta": OptionLimit(float, 0.0, MAX_BETA),
    "rho": OptionLimit(float, 0.0, None),
    "samples": OptionLimit(int, 1, 4096),
    "exact_rows": OptionLimit(int, 1, 65536),
    "history": OptionLimit(int, 1, 100_000),
    "seed": OptionLimit(int, 0, None),
    "horizon": OptionLimit(float, 0.0, None),
    "work_floor": OptionLimit(float, 0.0, 1.0),
    "size_weight": OptionLimit(float, 0.0, MAX_SIZE_WEIGHT),
    "kv_exp": OptionLimit(float, 0.0, 2.0),
    "redo_prefill": OptionLimit(int, 0, 1),
    "pin_finishing": OptionLimit(int, 0, 1),
    "k_preempt": OptionLimit(int, 0, None),
    "forfeit": OptionLimit(int, 0, 2),
    "keep_idle": OptionLimit(int, 0, 1),
    "prefetch": OptionLimit(int, 0, 1),
    "block": OptionLimit(float, 0.0, None),
    "backfill": OptionLimit(float, 0.0, None),
    "advance": OptionLimit(float, 0.0, None),
    "drop_incumbent": OptionLimit(int, 0, 1),
    "smith_move": OptionLimit(int, 0, 1),
    "reserve_first": OptionLimit(int, 0, None),
    "reuse_imminence": OptionLimit(int, 0, 1),
    "width": OptionLimit(int, 0, None),
    "max_additions": OptionLimit(int, 0, None),
    "rivals": OptionLimit(int, 0, 1),
    "work_conserving": OptionLimit(int, 0, 1),
}
assert set(_PAPER_LIMITS) == {f.name for f in dataclasses.fields(PaperConfig)}


def make_paper_config(base: PaperConfig | None = None, **options: Any) -> PaperConfig:
    """`base` (default `PaperConfig()`) with `options` validated, converted and applied."""
    base = base or PaperConfig()
    unknown = sorted(set(options) - set(_PAPER_LIMITS))
    if unknown:
        raise ConfigError(f"unknown topas-paper option '{unknown[0]}' (known: {', '.join(_PAPER_LIMITS)})")
    return replace(base, **{k: _convert(k, v, _PAPER_LIMITS) for k, v in options.items()}) if options else base
