"""topas-paper per-decision index and GreedyPack (section IV-E), as printed.

GreedyPack(R): retain the running requests covered by R, preempt the others (P_R); reserve an
admission slot and the smallest request KV for every prefix of R no retained request covers
(R is rejected when they cannot all be covered: idle prefixes are infeasible); then repeatedly
admit the fitting request with the largest g_i Delta(r | A_i^<r) / d_r, updating the marginals
of the chosen request's task, continuing through zero-gain choices (a represented task first).
Every allocation in which every prefix of R is covered is a candidate state.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ...snapshot import RequestView, Snapshot
from .paper_config import PaperConfig
from .paper_value import _ZERO, Served, TaskValue, j_move, j_redo, j_redo_prefill, v_reuse

_TOL = 1e-9  # relative score tolerance of deterministic tie-breaking


@dataclass(slots=True)
class Index:
    """What one decision needs, built once from the snapshot (valuation filled by the policy)."""

    snap: Snapshot
    cfg: PaperConfig
    resident: frozenset[str]  # R_t: GPU-resident (or loading) prefixes
    tokens: dict[str, int]  # l_a
    waiting: dict[str, list[RequestView]]  # by agent
    running: dict[str, list[RequestView]]  # by agent
    gain_weight: dict[str, float]  # task_id -> g_i(t)
    values: dict[str, TaskValue]  # value key -> L_i
    vkey: dict[str, str]  # rid -> value key: its task_id (or "rid:<rid>" outside any workflow)
    col: dict[str, int]  # rid -> source column of its stage in its task's L_i
    service: dict[str, float]  # rid -> D_r
    credit: dict[str, float]  # rid -> lambda_r of a running request (0 when none)
    counts: dict[str, int]  # n_a(t) of V_reuse
    pinned: frozenset[str] = frozenset()  # option pin_finishing: rids that must not be preempted
    delta0: dict[str, float] = field(default_factory=dict)  # rid -> Delta(r | {}) (shared by packs)

    def marginal(self, req: RequestView, served: Served) -> float:
        """Delta(r | H) (eq 6); with option work_floor at least work_floor x D_r."""
        d = self.service[req.rid]
        m = self.values[self.vkey[req.rid]].delta(served, self.col[req.rid], d)
        return max(m, self.cfg.work_floor * d) if self.cfg.work_floor > 0.0 else m

    def first_delta(self, req: RequestView) -> float:
        hit = self.delta0.get(req.rid)
        if hit is None:
            hit = self.delta0[req.rid] = self.marginal(req, Served())
        return hit


@dataclass(frozen=True, slots=True)
class Admission:
    req: RequestView
    credit: float  # g_i(t) Delta(r | A_i^<r, t): lambda_r if the engine runs it


@dataclass(slots=True)
class Pack:
    """GreedyPack(R): its preemptions, admissions in order, and the emitted states (k, score)."""

    agents: frozenset[str]
    preempt: tuple[RequestView, ...]
    admits: list[Admission] = field(default_factory=list)
    states: list[tuple[int, float]] = field(default_factory=list)

    def best(self) -> tuple[float, int] | None:
        """Phi(R) and its k: best score; equal scores (to rounding) prefer more admissions
        (a zero-gain admission still serves work the task needs, on otherwise idle KV)."""
        best: tuple[float, int] | None = None
        for k, score in self.states:
            if best is None or better(score, k, best[0], best[1]):
                best = (score, k)
        return best


def better(score: float, k: int, best_score: float, best_k: int) -> bool:
    tol = _TOL * max(1.0, abs(score), abs(best_score))
    return score > best_score + tol or (score >= best_score - tol and k > best_k)


def _key(ix: Index, req: RequestView, m: float, represented: bool) -> tuple:
    kv_exp = ix.cfg.kv_exp
    prio = ix.gain_weight[req.task_id] * m / max(1, req.kv_tokens) ** kv_exp if m > _ZERO else 0.0
    return (-prio, 0 if represented else 1, req.task_arrival_s, req.arrival_s, req.rid)


@dataclass(slots=True)
class _Frame:
    """Feasibility state of one GreedyPack run: KV left, prefixes still to cover, reservations."""

    retained: list[RequestView]
    preempt: tuple[RequestView, ...]
    uncovered: set[str]
    need: dict[str, int]  # smallest request KV of each uncovered prefix (its reservation)
    free: int
    reserve: int


def _frame(ix: Index, agents: frozenset[str]) -> _Frame | None:
    """Retained and preempted requests, reservations; None when R is infeasible."""
    K = ix.cfg.K
    retained = [r for a in sorted(agents) for r in ix.running.get(a, ())]
    preempt = tuple(sorted((r for a, rs in ix.running.items() if a not in agents for r in rs), key=lambda r: r.rid))
    cap = ix.cfg.k_preempt or K
    if cap and len(preempt) > cap or any(r.rid in ix.pinned for r in preempt):
        return None
    uncovered = {a for a in agents if not ix.running.get(a)}
    need: dict[str, int] = {}
    for a in sorted(uncovered):
        group = ix.waiting.get(a)
        if not group:
            if ix.cfg.keep_idle and a in ix.resident and ix.counts.get(a, 0) > 0:
                uncovered.discard(a)  # option keep_idle: kept for a stage about to be released
                continue
            return None  # an idle prefix: infeasible
        need[a] = min(r.kv_tokens for r in group)
    free = ix.snap.kv_budget - sum(ix.tokens[a] for a in agents) - sum(r.kv_tokens for r in retained)
    reserve = sum(need.values())
    if free < reserve or (K and len(uncovered) > K):
        return None
    return _Frame(retained, preempt, uncovered, need, free, reserve)


def _fixed_terms(ix: Index, agents: frozenset[str], preempt: tuple[RequestView, ...]) -> float:
    """V_reuse - J_redo - J_revoke of the set (the same for every allocation of it)."""
    profile = ix.snap.profile
    redo = (j_redo_prefill if ix.cfg.redo_prefill else j_redo)(preempt, profile)
    fixed = v_reuse(agents, ix.counts, ix.tokens, profile, ix.cfg.beta) - redo
    fixed -= sum(ix.credit.get(r.rid, 0.0) for r in preempt)
    if ix.cfg.forfeit:
        fixed -= sum(ix.gain_weight[r.task_id] * ix.first_delta(r) for r in preempt)
    return fixed


def greedy_pack(ix: Index, agents: frozenset[str]) -> Pack | None:
    """GreedyPack of prefix set `agents`; None when R cannot be covered or does not fit."""
    fr = _frame(ix, agents)
    if fr is None:
        return None
    pack = Pack(agents, fr.preempt)
    fixed = _fixed_terms(ix, agents, fr.preempt)
    if not fr.uncovered:
        pack.states.append((0, fixed))
    _admit_loop(ix, fr, pack, fixed)
    return pack


def _admit_loop(ix: Index, fr: _Frame, pack: Pack, fixed: float) -> None:
    """Admit by largest g Delta / d_r among fitting requests; emit each covering allocation."""
    K, agents = ix.cfg.K, pack.agents
    r_in, r_out = agents - ix.resident, ix.resident - agents
    represented = {r.task_id for r in fr.retained}
    served: dict[str, Served] = {}
    version: dict[str, int] = {}
    members: dict[str, list[RequestView]] = {}
    heap: list[tuple] = []
    for a in sorted(agents):
        for r in ix.waiting.get(a, ()):
            members.setdefault(ix.vkey[r.rid], []).append(r)
            heap.append((_key(ix, r, ix.first_delta(r), r.task_id in represented), 0, r))
    heapq.heapify(heap)
    done: set[str] = set()
    tasks_in: set[str] = set()
    admit_value = 0.0
    while heap and not (K and len(pack.admits) >= K):
        _, ver, r = heapq.heappop(heap)
        task = ix.vkey[r.rid]
        if r.rid in done or ver != version.get(task, 0):
            continue  # admitted, discarded, or a stale marginal (its task changed)
        done.add(r.rid)
        covers = r.agent in fr.uncovered
        held = fr.reserve - (fr.need[r.agent] if covers else 0)
        slots = len(fr.uncovered) - (1 if covers else 0)
        if r.kv_tokens > fr.free - held or (K and len(pack.admits) + 1 + slots > K):
            continue  # free - held and the slots left only shrink: it never fits
        credit = ix.gain_weight[r.task_id] * ix.marginal(r, served.get(task, Served()))
        fr.free -= r.kv_tokens
        if covers:
            fr.uncovered.discard(r.agent)
            fr.reserve -= fr.need[r.agent]
        served[task] = served.get(task, Served()).plus(ix.col[r.rid], ix.service[r.rid])
        represented.add(r.task_id)
        if r.agent in r_in:
            tasks_in.add(r.task_id)
        admit_value += credit
        pack.admits.append(Admission(r, credit))
        if not fr.uncovered:
            score = admit_value - j_move(r_in, r_out, ix.tokens, ix.snap.profile, len(tasks_in)) + fixed
            pack.states.append((len(pack.admits), score))
        # same-task marginals change after each choice: re-queue the task's candidates
        version[task] = version.get(task, 0) + 1
        for other in members.get(task, ()):
            if other.rid not in done:
                heapq.heappush(heap, (_key(ix, other, ix.marginal(other, served[task]), True), version[task], other))
