"""Per-(workflow, stage) service-time distributions, learned from `snapshot.events`.

A stage's service X is its total LLM service over all ReAct rounds (tool waits excluded).
Until a stage has completed executions, X is a point mass at the profiled estimate
(`expected rounds x Profile.request_service_s(prefix, mean input, mean output)`); afterwards
it is the empirical distribution of the last `history` executions.

Every stage also owns a fixed, seeded column of Latin-hypercube uniforms (common random
numbers): its sample column is the inverse empirical CDF at those uniforms, so every task and
every candidate state is evaluated on the same draws, and decisions are deterministic.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from ...costmodel import Profile
from ...snapshot import RequestView, Snapshot, StageDone
from ...workflow import Workflow
from .config import TopasConfig

# When the attained service already exceeds every sample, the residual is unknown: use a
# small point mass (a fraction of the stage mean) rather than zero, so the stage still counts.
_EXHAUSTED_FRACTION = 0.05


def crn_uniforms(seed: int, workflow: str, stage: str, n: int) -> np.ndarray:
    """Stratified uniforms ((k + 0.5)/n, seeded permutation) for one stage: the CRN column."""
    key = zlib.crc32(f"{seed}|{workflow}|{stage}".encode())
    perm = np.random.default_rng(key).permutation(n)
    return (perm + 0.5) / n


class StageDist:
    """An immutable service distribution: sorted values, their mean and the CRN column."""

    __slots__ = ("values", "mean", "uniforms", "column", "point", "serial")

    def __init__(self, values: np.ndarray, uniforms: np.ndarray, serial: int = 0) -> None:
        self.serial = serial  # unique per built distribution: identifies cache versions
        self.values = np.sort(np.asarray(values, dtype=float))
        self.mean = float(self.values.mean())
        self.uniforms = uniforms
        self.point = bool(self.values[0] == self.values[-1])
        self.column = self._quantiles(self.values)

    def _quantiles(self, values: np.ndarray) -> np.ndarray:
        idx = (self.uniforms * len(values)).astype(np.int64)
        return values[idx]

    def residual_values(self, attained: float) -> np.ndarray:
        """Sorted support of Z = X - e | X > e (a small point mass when no sample exceeds e)."""
        if attained <= 0.0:
            return self.values
        cut = int(np.searchsorted(self.values, attained, side="right"))
        if cut >= len(self.values):
            return np.array([max(_EXHAUSTED_FRACTION * self.mean, 1e-6)])
        return self.values[cut:] - attained

    def residual(self, attained: float) -> tuple[np.ndarray, float, np.ndarray]:
        """(sorted residual support, its exact mean, its CRN sample column)."""
        if attained <= 0.0:
            return self.values, self.mean, self.column
        vals = self.residual_values(attained)
        return vals, float(vals.mean()), self._quantiles(vals)


def prior_service_s(wf: Workflow, stage: str, profile: Profile) -> float:
    """Profiled estimate of a stage's total service: expected rounds x one round's service."""
    st = wf.stage(stage)
    one = profile.request_service_s(
        wf.prefix_tokens(st.agent), int(st.input_tokens.mean), int(st.output_tokens.mean)
    )
    return st.requests.mean * one


class ServiceProfiles:
    """Learned stage-service distributions plus the observed service-time scales."""

    def __init__(self, config: TopasConfig) -> None:
        self._cfg = config
        self._hist: dict[tuple[str, str], deque[float]] = {}
        self._pending: dict[tuple[str, str], int] = {}
        self._dists: dict[tuple[str, str], StageDist] = {}
        self._uniforms: dict[tuple[str, str], np.ndarray] = {}
        self._serial = 0
        self._stage_sum = 0.0
        self._stage_n = 0
        self._rounds = 0

    # ------------------------------------------------------------------ learning
    def observe(self, events: Iterable[StageDone]) -> None:
        for ev in events:
            if ev.service_s <= 0.0 or ev.service_s != ev.service_s:
                continue
            self._stage_sum += ev.service_s
            self._stage_n += 1
            self._rounds += max(1, ev.rounds)
            if ev.workflow is None:
                continue
            key = (ev.workflow, ev.stage)
            hist = self._hist.get(key)
            if hist is None:
                hist = self._hist[key] = deque(maxlen=self._cfg.history)
            hist.append(float(ev.service_s))
            self._pending[key] = self._pending.get(key, 0) + 1

    def samples(self, workflow: str, stage: str) -> tuple[float, ...]:
        return tuple(self._hist.get((workflow, stage), ()))

    # ------------------------------------------------------------------ scales
    def stage_scale(self, fallback: float) -> float:
        """Mean stage service seen so far (H_age); `fallback` before any completion."""
        return self._stage_sum / self._stage_n if self._stage_n else fallback

    def request_scale(self, fallback: float) -> float:
        """Mean service per LLM request (per ReAct round) seen so far."""
        return self._stage_sum / self._rounds if self._rounds else fallback

    # ------------------------------------------------------------------ distributions
    def dist(self, wf: Workflow, stage: str, profile: Profile) -> StageDist:
        key = (wf.name, stage)
        hist = self._hist.get(key)
        cached = self._dists.get(key)
        if cached is not None:
            pending = self._pending.get(key, 0)
            # Fold the first samples in at once, later ones in batches of `refresh`.
            if not pending or pending < min(self._cfg.refresh, len(hist or ()) - pending):
                return cached
        uniforms = self._uniforms.get(key)
        if uniforms is None:
            uniforms = self._uniforms[key] = crn_uniforms(self._cfg.seed, wf.name, stage, self._cfg.samples)
        if hist:
            values = np.fromiter(hist, dtype=float, count=len(hist))
        else:
            values = np.array([prior_service_s(wf, stage, profile)])
        self._serial += 1
        dist = self._dists[key] = StageDist(values, uniforms, self._serial)
        self._pending[key] = 0
        return dist


# prior_scales() without workflows: the mean over this many requests is enough for a scale.
_PRIOR_SAMPLE = 64


def remaining_service_s(req: RequestView, snap: Snapshot) -> float:
    """Profiled remaining service of one request (re-prefill if it still has to prefill)."""
    prof = snap.profile
    ctx = req.prefix_tokens + req.input_tokens + req.generated
    decode = req.remaining_tokens * prof.decode_step_s(1, ctx)
    if req.service_s > 0.0 and req.preemptions == 0:
        return decode
    return prof.prefill_s(req.input_tokens + req.generated, req.prefix_tokens) + decode


class PriorScales(NamedTuple):
    """Mean service of a stage and of a request, predicted by the profile, for cold start."""

    stage_s: float
    request_s: float


def prior_scales(snap: Snapshot) -> PriorScales:
    """The profile's prediction before any history (the two were easy to swap as a pair)."""
    stages = rounds = 0.0
    n = 0
    for wf in snap.workflows.values():
        for st in wf.stages:
            s = prior_service_s(wf, st.name, snap.profile)
            stages += s
            rounds += s / st.requests.mean
            n += 1
    if n:
        return PriorScales(stages / n, rounds / n)
    reqs = snap.waiting + snap.running
    if not reqs:
        return PriorScales(1.0, 1.0)
    mean = sum(remaining_service_s(r, snap) for r in reqs[:_PRIOR_SAMPLE]) / min(_PRIOR_SAMPLE, len(reqs))
    return PriorScales(mean, mean)


class PriorCache:
    """`prior_scales` of the snapshot's workflows and profile, recomputed only when they change
    (both policies keep one; it was a (key, value) pair in each)."""

    __slots__ = ("_key", "_value")

    def __init__(self) -> None:
        self._key: object = None
        self._value: PriorScales | None = None

    def get(self, snap: Snapshot) -> PriorScales:
        key = (tuple(sorted(snap.workflows)), snap.profile)
        if self._value is None or self._key != key:
            self._key, self._value = key, prior_scales(snap)
        return self._value
