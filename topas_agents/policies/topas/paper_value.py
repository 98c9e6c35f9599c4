"""topas-paper valuation: eqs 4-13 of the paper, as printed.

    Z = X - e | X > e                                   (eq 4, residual of a started stage)
    L_i(H) = E[LP(G, Z_i(H))],  Z_v(H) = [Z_v - sum of D_r of H at v]+      (eq 5)
    Delta(r | H) = L_i(H) - L_i(H + r)                   (eq 6; eq 7 sums them sequentially)
    T_move = mu/B_swap (sum_{R_out} l_a + sum_{R_in} l_a);  J_move = T_move |T_in|   (eq 8)
    J_redo = sum_P T_decode y_r                           (eq 9)
    V_reuse = beta sum_{a in R'} n_a mu l_a / B_swap      (eq 11)
    g_i = 1 + rho log(1 + (t - tau_i)/H_age)              (eq 12)

The expectation sits outside LP: every row of a joint sample (or of the exact product of the
stage supports) is one residual realization, LP is taken per row in reverse topological order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

import numpy as np

from ...costmodel import Profile
from ...snapshot import RequestView, Snapshot, StageDone
from ...workflow import Workflow
from .profiles import StageDist

_ZERO = 1e-12  # below this a marginal is a zero-gain choice (float noise of the row means)


class Served(NamedTuple):
    """Hypothetical completions H of one task: total D_r per source column."""

    cols: tuple[tuple[int, float], ...] = ()

    def plus(self, col: int, d: float) -> Served:
        acc = dict(self.cols)
        acc[col] = acc.get(col, 0.0) + d
        return Served(tuple(sorted(acc.items())))


NOTHING = Served()  # H = {}


class TaskValue:
    """L_i(H) of one task: residual rows Z (rows x sources), tails, row weights."""

    __slots__ = ("sources", "col", "z", "tail", "w", "work", "_memo")

    def __init__(self, sources: tuple[str, ...], z: np.ndarray, tail: np.ndarray, w: np.ndarray,
                 work: float = 0.0) -> None:
        self.sources = sources
        self.work = work  # expected remaining LLM work (only the `size_weight` option uses it)
        self.col = {s: j for j, s in enumerate(sources)}
        self.z, self.tail, self.w = z, tail, w
        self._memo: dict[Served, float] = {}

    def expected(self, served: Served = NOTHING) -> float:
        """L_i(H): E over rows of max_j ([Z_j - D_j(H)]+ + Tail_j) (eq 5)."""
        hit = self._memo.get(served)
        if hit is None:
            z = self.z
            if served.cols:
                z = z.copy()
                for j, d in served.cols:
                    z[:, j] = np.maximum(z[:, j] - d, 0.0)
            hit = self._memo[served] = float(self.w @ (z + self.tail).max(axis=1))
        return hit

    def delta(self, served: Served, col: int, d: float) -> float:
        """Delta_task(r | H) (eq 6), clipped at 0 against rounding."""
        return max(0.0, self.expected(served) - self.expected(served.plus(col, d)))


def _support(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values and their probabilities (empirical: equal weight per sample)."""
    vals, counts = np.unique(values, return_counts=True)
    return vals, counts / counts.sum()


def _product_rows(supports: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every point of the product of the stages' supports, and its probability. A stage with
    one value is a constant column, not a grid axis: numpy grids have at most 32 axes, and a
    33-stage chain (one value per stage before any history) raised ValueError. The same rows,
    in the same order, as a grid over every stage."""
    varying = [s for s, (values, _) in supports.items() if len(values) > 1]
    rows: dict[str, np.ndarray] = {}
    w = np.ones(1)
    if varying:
        grids = np.meshgrid(*[supports[s][0] for s in varying], indexing="ij")
        probs = np.meshgrid(*[supports[s][1] for s in varying], indexing="ij")
        rows = {s: g.ravel() for s, g in zip(varying, grids, strict=True)}
        w = np.prod(np.stack([p.ravel() for p in probs]), axis=0)
    for s, (values, _) in supports.items():
        if s not in rows:
            rows[s] = np.full(len(w), values[0])
    return rows, w


def task_value(wf: Workflow, done: frozenset[str], attained: Mapping[str, float],
               dists: Mapping[str, StageDist], exact_rows: int) -> TaskValue:
    """Build L_i for a task: sources are its ready stages (residual eq 4, `attained` = e),
    every other unfinished stage keeps its full X; finished stages are zero (not in G)."""
    remaining = [s for s in wf.topo_order if s not in done]
    sources = tuple(s for s in wf.ready_stages(done))
    source_set = set(sources)
    full = {s: (dists[s].residual_values(attained.get(s, 0.0)) if s in source_set else dists[s].values)
            for s in remaining}
    supports = {s: _support(v) for s, v in full.items()}
    size = math.prod(len(v) for v, _ in supports.values())
    if size <= exact_rows:  # exact: every point of the product of independent supports
        rows, w = _product_rows(supports)
    else:  # Monte Carlo on the stages' CRN columns (independent Latin-hypercube strata)
        rows = {s: (dists[s].residual(attained.get(s, 0.0))[2] if s in source_set else dists[s].column)
                for s in remaining}
        n = len(next(iter(rows.values())))
        w = np.full(n, 1.0 / n)
    through: dict[str, np.ndarray] = {}
    tails: dict[str, np.ndarray] = {}
    for s in reversed(remaining):
        succ = [c for c in wf.successors[s] if c not in done]
        tails[s] = np.max(np.stack([through[c] for c in succ]), axis=0) if succ else np.zeros_like(w)
        through[s] = rows[s] + tails[s]
    z = np.column_stack([rows[s] for s in sources])
    tail = np.column_stack([tails[s] for s in sources])
    work = sum(float(v.mean()) for v in full.values())
    return TaskValue(sources, z, tail, w, work)


def single_value(service_s: float) -> TaskValue:
    """A task outside any known workflow: one stage whose X is the request's own D_r."""
    return TaskValue(("",), np.array([[service_s]]), np.zeros((1, 1)), np.ones(1), service_s)


# ---------------------------------------------------------------------------- D_r


def t_decode(req: RequestView, profile: Profile) -> float:
    """T_decode: profiled batch-1 decode time per token at the request's context."""
    return profile.decode_step_s(1, req.prefix_tokens + req.input_tokens)


class RequestService:
    """D_r: empirical mean LLM service per request of each (workflow, stage, agent) pair."""

    __slots__ = ("_sum",)

    def __init__(self) -> None:
        self._sum: dict[tuple[str | None, str, str], tuple[float, int]] = {}

    def observe(self, events: Iterable[StageDone]) -> None:
        for ev in events:
            if not ev.service_s > 0.0:  # also skips NaN
                continue
            key = (ev.workflow, ev.stage, ev.agent)
            total, n = self._sum.get(key, (0.0, 0))
            self._sum[key] = (total + ev.service_s, n + max(1, ev.rounds))

    def estimate(self, req: RequestView, profile: Profile) -> float:
        """Observed per-request mean; before any observation T_prefill(|input|) +
        T_decode max_new (prefix assumed cached: it is in R' when r runs)."""
        hit = self._sum.get((req.workflow, req.stage, req.agent))
        if hit is not None:
            return hit[0] / hit[1]
        return profile.prefill_s(req.input_tokens, req.prefix_tokens) + t_decode(req, profile) * req.max_new_tokens


# ---------------------------------------------------------------------------- terms


def aging(t: float, tau: float, h_age: float, rho: float) -> float:
    """g_i(t) = 1 + rho log(1 + (t - tau_i)/H_age)   (eq 12)."""
    return 1.0 + rho * math.log1p(max(0.0, t - tau) / max(h_age, 1e-9))


def move_in_s(tokens: int, profile: Profile) -> float:
    """mu l_a / B_swap for a prefix entering R'. Without a host tier the paper gives no
    formula; the prefix is then recomputed, so its in-move is priced as its prefill."""
    return profile.swap_s(tokens) if profile.host_tier else profile.prefill_s(tokens)


def move_out_s(tokens: int, profile: Profile) -> float:
    """mu l_a / B_swap for a prefix leaving R'; without a host tier it is dropped (free)."""
    return profile.swap_s(tokens) if profile.host_tier else 0.0


def j_move(r_in: Iterable[str], r_out: Iterable[str], tokens: Mapping[str, int], profile: Profile,
           tasks_in: int) -> float:
    """J_move = T_move |T_in| (eq 8), transfers serialized."""
    if tasks_in == 0:
        return 0.0
    t_move = sum(move_out_s(tokens[a], profile) for a in r_out) + sum(move_in_s(tokens[a], profile) for a in r_in)
    return t_move * tasks_in


def j_redo(preempted: Iterable[RequestView], profile: Profile) -> float:
    """J_redo = sum over P of T_decode y_r, y_r = tokens generated so far (eq 9)."""
    return sum(t_decode(r, profile) * r.generated for r in preempted)


def j_redo_prefill(preempted: Iterable[RequestView], profile: Profile) -> float:
    """Option `redo_prefill`: the resumed request re-prefills its input and generated tokens."""
    return sum(profile.prefill_s(r.input_tokens + r.generated, r.prefix_tokens) for r in preempted)


def reuse_counts(snap: Snapshot, imminent: Callable[[str, str], float] | None = None) -> dict[str, float]:
    """n_a(t): downstream stages assigned to a whose only unfinished predecessor is running
    (a stage with a request in Q_t). Each fork child counts; a join only when all its other
    predecessors have finished.

    Option `reuse_imminence`: `imminent(task_id, stage)` weighs each such release (`topas`:
    the task's g x the probability that the running stage finishes within the horizon)."""
    views = {t.task_id: t for t in snap.tasks}
    running = {(r.task_id, r.workflow, r.stage) for r in snap.running if r.workflow is not None}
    counts: dict[str, float] = {}
    for task_id, wf_name, stage in sorted(running, key=lambda x: (x[0], x[1] or "", x[2])):
        wf = snap.workflows.get(wf_name)
        view = views.get(task_id)
        if wf is None or not wf.has_stage(stage):
            continue
        weight = 1 if imminent is None else imminent(task_id, stage)
        if weight <= 0.0:
            continue
        done = view.done_stages if view is not None else frozenset()
        for child in wf.successors[stage]:
            if child in done:
                continue
            if all(p == stage or p in done for p in wf.stage(child).after):
                agent = wf.stage(child).agent
                counts[agent] = counts.get(agent, 0) + weight
    return counts


def imminence(value: TaskValue, stage: str, horizon_s: float) -> float:
    """P(the residual of ready stage `stage` is at most `horizon_s`) under L_i's rows."""
    j = value.col.get(stage)
    return 0.0 if j is None else float(value.w[value.z[:, j] <= horizon_s].sum())


def v_reuse(agents: Iterable[str], counts: Mapping[str, float], tokens: Mapping[str, int], profile: Profile,
            beta: float) -> float:
    """V_reuse = beta sum_{a in R'} n_a mu l_a / B_swap (eq 11); without a host tier the
    reload is a recompute, priced like `move_in_s`."""
    return beta * sum(counts.get(a, 0) * move_in_s(tokens[a], profile) for a in agents if a in tokens)
