"""`topas-paper`: section IV of the paper as printed (docs/topas.md maps each step to code).

The policy learns only from what the snapshot reports: service profiles from `snap.events`,
and admission credits (lambda_r, eq 10) granted when a request it admitted is seen running,
not when it is emitted (an engine may admit only the front of the admit list).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from ...snapshot import Decision, RequestView, Snapshot
from ..baselines import LPM, ParrotFCFS
from .guard import work_conserving
from .paper_config import PaperConfig
from .paper_occupancy import reserve_head
from .paper_pack import Index, better, rival_pack
from .paper_search import Choice, search
from .paper_value import RequestService, TaskValue, aging, imminence, reuse_counts, single_value, task_value
from .profiles import PriorCache, PriorScales, ServiceProfiles


class Valuation(NamedTuple):
    """Per-decision valuation (see `Index` for the meaning of each map)."""

    weight: dict[str, float]
    values: dict[str, TaskValue]
    vkey: dict[str, str]
    col: dict[str, int]
    service: dict[str, float]
    uncapped: dict[str, float]  # D_r before option horizon's cap (only where it cut)


def _groups(snap: Snapshot) -> tuple[dict[str, int], dict[str, list[RequestView]], dict[str, list[RequestView]]]:
    """l_a of every known agent, and the waiting and running requests by agent."""
    tokens = {p.agent: p.tokens for p in snap.prefixes}
    for wf in snap.workflows.values():
        for agent in wf.agents:
            tokens.setdefault(agent.name, agent.prefix_tokens)
    waiting: dict[str, list[RequestView]] = {}
    running: dict[str, list[RequestView]] = {}
    for group, reqs in ((waiting, snap.waiting), (running, snap.running)):
        for r in reqs:
            group.setdefault(r.agent, []).append(r)
    registered = {p.agent for p in snap.prefixes}
    for r in snap.waiting + snap.running:
        if r.agent not in registered:  # unregistered agent: its largest claim (conservative)
            tokens[r.agent] = max(tokens.get(r.agent, 0), r.prefix_tokens)
    return tokens, waiting, running


class TopasPaperPolicy:
    """Topas exactly as the paper writes it (no project-specific options)."""

    def __init__(self, config: PaperConfig | None = None, name: str = "topas-paper") -> None:
        self.name = name
        self.config = config or PaperConfig()
        self.profiles = ServiceProfiles(self.config.profile_config())
        self.request_service = RequestService()
        self.credits: dict[str, float] = {}  # lambda_r of requests seen running after our admit
        self.pending: dict[str, float] = {}  # credits of emitted admissions, not yet seen running
        self._h_prior = PriorCache()
        self.last_states = None  # the StateSet of the last decision (diagnostics, tests)
        # option rivals: the baselines decide on every snapshot (their queues stay synced)
        self._rivals = (ParrotFCFS(), LPM()) if self.config.rivals else ()

    def decide(self, snap: Snapshot) -> Decision:
        decision = self._decide(snap)
        if self.config.work_conserving:  # its fallback admits one agent's fitting requests: cut to K
            decision = work_conserving(snap, decision)
            if self.config.K and len(decision.admit) > self.config.K:
                decision = replace(decision, admit=decision.admit[:self.config.K])
        for rival in self._rivals:
            rival.note_applied(decision.admit)
        return decision

    def _decide(self, snap: Snapshot) -> Decision:
        self.profiles.observe(snap.events)
        self.request_service.observe(snap.events)
        self._settle_credits(snap)
        if not snap.waiting and not snap.running:
            out = tuple(sorted(p.agent for p in snap.prefixes if p.on_gpu))
            return Decision(prefix_out=out)  # R' is empty: idle prefixes are infeasible
        ix = self.index(snap)
        choice, self.last_states = search(ix)
        for rival in self._rivals:
            alt = rival.decide(snap)
            pack = rival_pack(ix, alt.admit) if not alt.preempt else None
            if pack is not None:
                k, score = pack.states[0]
                if choice is None or better(score, k, choice.score, choice.k):
                    choice = Choice(pack, k, score)
        if choice is None:
            return Decision()
        return self._emit(ix, choice)

    def _settle_credits(self, snap: Snapshot) -> None:
        """Completion (or any exit from Q_t) clears lambda_r; a pending credit becomes lambda_r
        when the request is seen running, and is dropped once it is neither running nor waiting."""
        running = {r.rid for r in snap.running}
        waiting = {r.rid for r in snap.waiting}
        self.credits = {rid: v for rid, v in self.credits.items() if rid in running}
        for rid in list(self.pending):
            if rid in running:
                self.credits.setdefault(rid, self.pending.pop(rid))
            elif rid not in waiting:
                del self.pending[rid]

    def _priors(self, snap: Snapshot) -> PriorScales:
        return self._h_prior.get(snap)

    def h_age(self, snap: Snapshot) -> float:
        """H_age: observed mean stage service; before any completion the profiled mean."""
        return self.profiles.stage_scale(self._priors(snap).stage_s)

    def horizon_s(self, snap: Snapshot) -> float:
        """Option `horizon`: the cap on D_r (0 when off)."""
        if self.config.horizon <= 0.0:
            return 0.0
        return self.config.horizon * self.profiles.request_scale(self._priors(snap).request_s)

    def index(self, snap: Snapshot) -> Index:
        """Everything one decision needs: groups, l_a, and the valuation of every request."""
        cfg = self.config
        tokens, waiting, running = _groups(snap)
        val = self._valuation(snap)
        resident = frozenset(p.agent for p in snap.prefixes if p.on_gpu) | frozenset(running)
        credit = {r.rid: self.credits.get(r.rid, 0.0) for r in snap.running}
        counts = reuse_counts(snap, self._imminent(snap, val) if cfg.reuse_imminence else None)
        ix = Index(snap, cfg, resident, tokens, waiting, running, val.weight, val.values, val.vkey, val.col,
                   val.service, credit, counts, _pinned(snap) if cfg.pin_finishing else frozenset(),
                   uncapped=val.uncapped)
        if cfg.backfill > 0.0:
            ix.reservation = reserve_head(ix, self.profiles.request_scale(self._priors(snap).request_s))
        return ix

    def _imminent(self, snap: Snapshot, val: Valuation) -> Callable[[str, str], float]:
        """Option reuse_imminence: a running stage's release weighs g x P(it ends within the
        horizon): option horizon's cap, or the mean request service when that is off."""
        h = self.horizon_s(snap) or self.profiles.request_scale(self._priors(snap).request_s)

        def imminent(task_id: str, stage: str) -> float:
            value = val.values.get(task_id)
            return 0.0 if value is None else val.weight[task_id] * imminence(value, stage, h)
        return imminent

    def _valuation(self, snap: Snapshot) -> Valuation:
        """g_i, L_i, D_r and each request's source column (eqs 4-6, 12)."""
        cfg, profile = self.config, snap.profile
        views = {t.task_id: t for t in snap.tasks}
        h_age, cap = self.h_age(snap), self.horizon_s(snap)
        val = Valuation({}, {}, {}, {}, {}, {})
        for r in snap.waiting + snap.running:
            d = self.request_service.estimate(r, profile)
            val.service[r.rid] = min(d, cap) if cap > 0.0 else d
            if val.service[r.rid] < d:
                val.uncapped[r.rid] = d
            view = views.get(r.task_id)
            if r.task_id not in val.weight:
                tau = view.arrival_s if view is not None else r.task_arrival_s
                val.weight[r.task_id] = aging(snap.now, tau, h_age, cfg.rho)
            wf = snap.workflows.get(r.workflow) if r.workflow is not None else None
            if wf is not None and wf.has_stage(r.stage) and r.task_id not in val.values:
                done = view.done_stages if view is not None else frozenset()
                attained = dict(view.active_stages) if view is not None else {}
                dists = {s.name: self.profiles.dist(wf, s.name, profile) for s in wf.stages}
                val.values[r.task_id] = task_value(wf, done, attained, dists, cfg.exact_rows)
            value = val.values.get(r.task_id)
            if value is not None and r.stage in value.col:
                val.vkey[r.rid], val.col[r.rid] = r.task_id, value.col[r.stage]
            else:  # no known workflow (or a stage the task view does not list as ready)
                val.vkey[r.rid], val.col[r.rid] = "rid:" + r.rid, 0
                val.values[val.vkey[r.rid]] = single_value(val.service[r.rid])
        if cfg.size_weight > 0.0:  # option: SRPT-like weight on the task's remaining work
            work: dict[str, float] = {}
            for r in snap.waiting + snap.running:
                work.setdefault(r.task_id, val.values[val.vkey[r.rid]].work)
            for tid, w in work.items():
                val.weight[tid] *= (h_age / max(w, 1e-3 * h_age)) ** cfg.size_weight
        return val

    def _emit(self, ix: Index, choice: Choice) -> Decision:
        pack, k = choice.pack, choice.k
        admits = pack.admits[:k]
        for adm in admits:
            self.pending[adm.req.rid] = adm.credit
        on_gpu = {p.agent for p in ix.snap.prefixes if p.on_gpu}
        admitted = {adm.req.agent for adm in admits}
        return Decision(
            admit=tuple(adm.req.rid for adm in admits),
            preempt=tuple(r.rid for r in pack.preempt),
            # option prefetch: an idle member of R' not resident is loaded now
            prefix_in=tuple(sorted(pack.agents - on_gpu - admitted)),
            prefix_out=tuple(sorted(a for a in on_gpu if a not in pack.agents)),
        )


def _pinned(snap: Snapshot) -> frozenset[str]:
    """Option `pin_finishing`: running requests that may stop at any token (they produced the
    smallest output their stage declares): their KV frees itself, preempting wastes their work."""
    out = []
    for r in snap.running:
        wf = snap.workflows.get(r.workflow) if r.workflow is not None else None
        if wf is not None and wf.has_stage(r.stage) and r.generated + 1 >= wf.stage(r.stage).output_tokens.lo:
            out.append(r.rid)
    return frozenset(out)
