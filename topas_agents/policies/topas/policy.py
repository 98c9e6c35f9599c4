"""The Topas policy object: learns service profiles from events, searches, emits a Decision."""

from __future__ import annotations

from ...snapshot import NOOP, Decision, Snapshot
from ..baselines import LPM, ParrotFCFS
from .build import build_context
from .caches import DecisionCaches
from .config import TopasConfig
from .context import Context
from .guard import work_conserving
from .longest_path import PathEstimator
from .occupancy import reserve_head
from .profiles import PriorCache, PriorScales, ServiceProfiles
from .search import Choice, better, rival_choice, search
from .terms import CreditStore


class TopasPolicy:
    """Task-Oriented Prefix-Aware Scheduler (see docs/topas.md)."""

    def __init__(self, config: TopasConfig | None = None, name: str = "topas-core") -> None:
        self.name = name
        self.config = config or TopasConfig()
        self.profiles = ServiceProfiles(self.config)
        self.paths = PathEstimator(self.profiles)
        self.credits = CreditStore()
        self._priors = PriorCache()
        self.caches = DecisionCaches()  # valuations carried across decisions (caches.py)
        # TopasConfig.rivals: the baselines decide on every snapshot (their queues stay synced)
        self._rivals = (ParrotFCFS(), LPM()) if self.config.rivals else ()

    def decide(self, snap: Snapshot) -> Decision:
        decision = work_conserving(snap, self._decide(snap))
        for rival in self._rivals:
            rival.note_applied(decision.admit)
        return decision

    def _decide(self, snap: Snapshot) -> Decision:
        self.profiles.observe(snap.events)
        self.credits.sweep(r.rid for r in snap.running)
        if not snap.waiting and (self.config.beta <= 0.0 or not snap.running):
            return NOOP
        self.paths.begin(len(snap.tasks))
        ctx = build_context(snap, self.config, self.credits, self.profiles, self.paths, self._prior(snap),
                            self.caches)
        if self.config.backfill > 0.0:
            ctx.reservation = reserve_head(ctx)
        choice = search(ctx)
        for rival in self._rivals:
            alt = rival_choice(ctx, rival.decide(snap))
            if alt is not None and (choice is None or better(alt.score, alt.changes, choice.score, choice.changes)):
                choice = alt
        self.caches.prune(snap)
        if choice is None:
            return NOOP
        return self._emit(ctx, choice)

    def _prior(self, snap: Snapshot) -> PriorScales:
        return self._priors.get(snap)

    def _emit(self, ctx: Context, choice: Choice) -> Decision:
        pack, k = choice.pack, choice.k
        admits = pack.admits[:k]
        admit_agents = {it.req.agent for it in admits}
        reuse: dict[str, float] = {}
        if self.config.beta > 0.0:
            for (src, child), value in ctx.reuse_pairs.items():
                if src in pack.agents:
                    reuse[child] = reuse.get(child, 0.0) + value
            for it in admits:
                for agent, value in ctx.reuse(it):
                    reuse[agent] = reuse.get(agent, 0.0) + value
        resident = {a for a in pack.agents if a in ctx.gpu or a in admit_agents or reuse.get(a, 0.0) > 0.0}
        prefix_out = tuple(sorted(a for a in ctx.gpu if a not in resident and a in ctx.prefix))
        proactive = [a for a in resident if a not in ctx.gpu and a not in admit_agents and a in ctx.prefix]
        proactive.sort(key=lambda a: (-reuse.get(a, 0.0), a))
        for it in pack.preempt:
            self.credits.revoke(it.req.rid)
        for it, value in zip(admits, pack.credit, strict=False):
            self.credits.grant(it.req.rid, value)
        return Decision(
            admit=tuple(it.req.rid for it in admits),
            preempt=tuple(it.req.rid for it in pack.preempt),
            prefix_in=tuple(proactive),
            prefix_out=prefix_out,
        )
