"""topas-paper per-decision index and GreedyPack (section IV-E), as printed, and the named
options that act on a pack (paper_config.py; off by default).

GreedyPack(R): retain the running requests covered by R, preempt the others (P_R); reserve an
admission slot and the smallest request KV for every prefix of R no retained request covers
(R is rejected when they cannot all be covered: idle prefixes are infeasible); then repeatedly
admit the fitting request with the largest g_i Delta(r | A_i^<r) / d_r, updating the marginals
of the chosen request's task, continuing through zero-gain choices (a represented task first).
Every allocation in which every prefix of R is covered is a candidate state.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...snapshot import PrefixView, RequestView, Snapshot
from .occupancy import Reservation
from .paper_config import PaperConfig
from .paper_occupancy import delays_head, head_advance, uses_spare
from .paper_value import _ZERO, Served, TaskValue, j_move, j_redo, j_redo_prefill, v_reuse
from .terms import j_move as smith_j_move
from .terms import load_cost

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
    counts: dict[str, float]  # n_a(t) of V_reuse (option reuse_imminence: weighted)
    pinned: frozenset[str] = frozenset()  # option pin_finishing: rids that must not be preempted
    delta0: dict[str, float] = field(default_factory=dict)  # rid -> Delta(r | {}) (shared by packs)
    reservation: Reservation | None = None  # option backfill: the head's (paper_occupancy.py)
    views: dict[str, PrefixView] | None = None  # the engine's prefixes by agent (built on first use)
    uncapped: dict[str, float] = field(default_factory=dict)  # rid -> D_r before option horizon's cap

    def prefix_views(self) -> dict[str, PrefixView]:
        if self.views is None:
            self.views = {p.agent: p for p in self.snap.prefixes}
        return self.views

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


def idle_allowed(ix: Index, agent: str) -> bool:
    """Options keep_idle (resident) and prefetch (any known prefix): `agent` may be in R' with
    nothing to run when a downstream stage of it is about to be released (n_a > 0)."""
    if not ix.cfg.keep_idle or ix.counts.get(agent, 0) <= 0:
        return False
    return agent in ix.resident or (bool(ix.cfg.prefetch) and agent in ix.prefix_views())


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
    res = ix.reservation
    if res is not None and res.now and (res.agent not in agents or preempt):
        return None  # option backfill: the head fits without preempting anyone: it runs in every state
    uncovered = {a for a in agents if not ix.running.get(a)}
    need: dict[str, int] = {}
    for a in sorted(uncovered):
        group = ix.waiting.get(a)
        if not group:
            if idle_allowed(ix, a):
                uncovered.discard(a)  # options keep_idle/prefetch: for a stage about to be released
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
    if ix.cfg.forfeit == 1:
        fixed -= sum(ix.gain_weight[r.task_id] * ix.first_delta(r) for r in preempt)
    elif ix.cfg.forfeit == 2:
        fixed -= _forfeit_tasks(ix, agents, preempt)
    return fixed


def _forfeit_tasks(ix: Index, agents: frozenset[str], preempt: tuple[RequestView, ...]) -> float:
    """Option forfeit = 2 (`topas`'s J_admit over Q'): each task with a preempted request loses
    g x (L_i(its retained running requests served) - L_i(all its running requests served))."""
    lost = 0.0
    for key in sorted({ix.vkey[r.rid] for r in preempt}):
        every, kept = Served(), Served()
        for a, group in ix.running.items():
            for r in group:
                if ix.vkey[r.rid] == key:
                    every = every.plus(ix.col[r.rid], ix.service[r.rid])
                    if a in agents:
                        kept = kept.plus(ix.col[r.rid], ix.service[r.rid])
        task_id = next(r.task_id for r in preempt if ix.vkey[r.rid] == key)
        value = ix.values[key]
        lost += ix.gain_weight[task_id] * max(0.0, value.expected(kept) - value.expected(every))
    return lost


def move_cost(ix: Index, r_in: frozenset[str], r_out: frozenset[str], tasks_in: dict[str, dict[str, float]]) -> float:
    """J_move (eq 8): T_move x |T_in|, `tasks_in` = the tasks admitted on each incoming prefix.

    Option `smith_move` (`topas`'s pricing, terms.j_move): each incoming prefix delays only the
    tasks admitted on it, weighted by g; swaps over the host link are serialized in Smith order;
    a recompute is charged to its tasks and, as a prefill, to every running request; evictions
    are free."""
    if not ix.cfg.smith_move:
        return j_move(r_in, r_out, ix.tokens, ix.snap.profile, len({t for tasks in tasks_in.values() for t in tasks}))
    views = ix.prefix_views()
    stall = len(ix.snap.running)
    items = []
    for agent, tasks in tasks_in.items():
        seconds, on_link = load_cost(views.get(agent), ix.tokens[agent], ix.snap.profile)
        items.append((seconds, on_link, sum(tasks.values()) + (0 if on_link else stall)))
    return smith_j_move(items)


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
    res = ix.reservation
    if res is not None and res.now:  # option backfill: only states that start the head
        if not pack.admits or pack.admits[0].req.rid != res.rid:
            return None
        pack.states = [(k, score) for k, score in pack.states if k]
    if ix.cfg.block > 0.0:
        cost = stranded_cost(ix, pack, fr.free)
        pack.states = [(k, score - cost if k else score) for k, score in pack.states]
    return pack


def stranded_cost(ix: Index, pack: Pack, free: int) -> float:
    """Option `block` (J_block of `topas`, occupancy.py): the pack's admissions leave `free` KV
    that a shut-out agent cannot use (its smallest waiting request, plus its prefix unless in R',
    does not fit) until the longest of them ends. Charged block x the shut-out agents' waiting
    tasks' weights x that request's D_r (uncapped) x the stranded fraction of the budget, to
    every state of the pack that admits something (computed once, at the pack's end)."""
    if not pack.admits or free <= 0:
        return 0.0
    admitted: dict[str, int] = {}
    for adm in pack.admits:
        admitted[adm.req.agent] = admitted.get(adm.req.agent, 0) + 1
    tasks: set[str] = set()
    for agent, group in ix.waiting.items():
        kept = agent in pack.agents
        need = min(r.kv_tokens for r in group) + (0 if kept else ix.tokens[agent])
        if need > free and not (kept and admitted.get(agent, 0) == len(group)):
            tasks.update(r.task_id for r in group)
    if not tasks:
        return 0.0
    weight = sum(ix.gain_weight[t] for t in tasks)
    longest = max(ix.uncapped.get(a.req.rid, ix.service[a.req.rid]) for a in pack.admits)
    return ix.cfg.block * weight * longest * free / max(1, ix.snap.kv_budget)


def _reserved_first(ix: Index, fr: _Frame, represented: set[str]) -> frozenset[str]:
    """Option reserve_first (`topas`'s reserve): for each prefix of R no retained request covers,
    the best fitting of its `reserve_first` highest-priority waiting requests, admitted before
    the greedy order (the paper holds a slot and the smallest request's KV instead)."""
    out = []
    for a in sorted(fr.uncovered):
        room = fr.free - fr.reserve + fr.need[a]
        best = heapq.nsmallest(ix.cfg.reserve_first, ix.waiting.get(a, ()),
                               key=lambda r: _key(ix, r, ix.first_delta(r), r.task_id in represented))
        pick = next((r for r in best if r.kv_tokens <= room), None)
        if pick is not None:
            out.append(pick.rid)
    return frozenset(out)


def _serve(ix: Index, r: RequestView, served: dict[str, Served], tasks_in: dict[str, dict[str, float]],
           r_in: frozenset[str]) -> float:
    """Admit `r` in a pack's accounting: its credit g Delta(r | its task's earlier admissions)
    (eqs 6-7); `r` joins its task's served set and, on an incoming prefix, J_move's tasks."""
    task = ix.vkey[r.rid]
    before = served.get(task, Served())
    served[task] = before.plus(ix.col[r.rid], ix.service[r.rid])
    if r.agent in r_in:
        tasks_in.setdefault(r.agent, {})[r.task_id] = ix.gain_weight[r.task_id]
    return ix.gain_weight[r.task_id] * ix.marginal(r, before)


def _admit_loop(ix: Index, fr: _Frame, pack: Pack, fixed: float) -> None:
    """Admit by largest g Delta / d_r among fitting requests; emit each covering allocation."""
    K, agents = ix.cfg.K, pack.agents
    r_in, r_out = agents - ix.resident, ix.resident - agents
    represented = {r.task_id for r in fr.retained}
    served: dict[str, Served] = {}
    version: dict[str, int] = {}
    members: dict[str, list[RequestView]] = {}
    heap: list[tuple] = []
    res = ix.reservation  # options backfill and advance (paper_occupancy.py)
    spare = res.extra if res is not None else 0
    advance = head_advance(ix, fr.preempt)
    first = _reserved_first(ix, fr, represented) if ix.cfg.reserve_first else frozenset()
    for a in sorted(agents):
        for r in ix.waiting.get(a, ()):
            members.setdefault(ix.vkey[r.rid], []).append(r)
            key = _key(ix, r, ix.first_delta(r), r.task_id in represented)
            if res is not None and res.now and r.rid == res.rid:
                key = (float("-inf"), -1, *key[2:])  # the head fits now: admitted first
            elif r.rid in first:
                key = (float("-inf"), *key[1:])  # option reserve_first: next
            heap.append((key, 0, r))
    heapq.heapify(heap)
    done: set[str] = set()
    tasks_in: dict[str, dict[str, float]] = {}  # incoming agent -> {task admitted on it: g}
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
        if res is not None and delays_head(ix, r, spare):
            continue  # the spare only shrinks too
        credit = _serve(ix, r, served, tasks_in, r_in)
        if res is not None and r.rid == res.rid:
            credit += advance
        elif uses_spare(ix, r):
            spare -= r.kv_tokens
        fr.free -= r.kv_tokens
        if covers:
            fr.uncovered.discard(r.agent)
            fr.reserve -= fr.need[r.agent]
        represented.add(r.task_id)
        admit_value += credit
        pack.admits.append(Admission(r, credit))
        if not fr.uncovered:
            score = admit_value - move_cost(ix, r_in, r_out, tasks_in) + fixed
            pack.states.append((len(pack.admits), score))
        # same-task marginals change after each choice: re-queue the task's candidates
        version[task] = version.get(task, 0) + 1
        for other in members.get(task, ()):
            if other.rid not in done:
                heapq.heappush(heap, (_key(ix, other, ix.marginal(other, served[task]), True), version[task], other))


def rival_pack(ix: Index, admit: Sequence[str]) -> Pack | None:
    """Option `rivals`: another policy's admissions (it preempts nothing) as one more state.

    R' = the agents of Q' (every running request retained, each admitted one) and, with option
    `keep_idle`, the resident prefixes it may keep idle; the admissions keep that policy's
    order, cut to K, each credited g Delta with the same sequential same-task marginals as
    GreedyPack, and the state is scored with eq 13. None when a request is not waiting or the
    state does not fit the KV budget. With option `block` it pays J_block like any pack.
    """
    waiting = {r.rid: r for group in ix.waiting.values() for r in group}
    reqs = [waiting.get(rid) for rid in (admit[:ix.cfg.K] if ix.cfg.K else admit)]
    if not reqs or any(r is None for r in reqs):
        return None
    agents = set(ix.running) | {r.agent for r in reqs}
    agents = frozenset(agents | {a for a in ix.resident if idle_allowed(ix, a)})
    used = sum(ix.tokens[a] for a in agents) + sum(r.kv_tokens for rs in ix.running.values() for r in rs)
    free = ix.snap.kv_budget - used - sum(r.kv_tokens for r in reqs)
    if free < 0:
        return None
    pack = Pack(agents, ())
    r_in, r_out = agents - ix.resident, ix.resident - agents
    served: dict[str, Served] = {}
    tasks_in: dict[str, dict[str, float]] = {}
    admit_value = 0.0
    for r in reqs:
        credit = _serve(ix, r, served, tasks_in, r_in)
        admit_value += credit
        pack.admits.append(Admission(r, credit))
    score = admit_value - move_cost(ix, r_in, r_out, tasks_in) + _fixed_terms(ix, agents, ())
    if ix.cfg.block > 0.0:  # scored like GreedyPack's states (the head's reservation binds only those)
        score -= stranded_cost(ix, pack, free)
    pack.states.append((len(pack.admits), score))
    return pack
