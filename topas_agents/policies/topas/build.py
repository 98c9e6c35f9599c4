"""A decision's `Context` built from a snapshot over the policy's cross-decision caches."""

from __future__ import annotations

from ...snapshot import Snapshot
from .caches import DecisionCaches, snap_to_grid
from .config import TopasConfig
from .context import Context
from .longest_path import PathEstimator
from .profiles import ServiceProfiles
from .terms import CreditStore


def _running_reuse(ctx: Context) -> None:
    """V_reuse pairs of the running requests. A stage cannot finish before its current
    request does, so only requests that may finish within the horizon are looked at."""
    for req in ctx.snap.running:
        if req.workflow is None or ctx.remaining(req) > ctx.horizon_s:
            continue
        for child, value in ctx.running_reuse(req):
            key = (req.agent, child)
            ctx.reuse_pairs[key] = ctx.reuse_pairs.get(key, 0.0) + value


def build_context(snap: Snapshot, cfg: TopasConfig, credits: CreditStore, profiles: ServiceProfiles,
                  paths: PathEstimator, scales: tuple[float, float], caches: DecisionCaches | None = None) -> Context:
    """The decision's context over the policy's cross-decision `caches` (a fresh set when
    None); they are in place before anything is valued (V_reuse of running requests is)."""
    ctx = Context(snap, cfg, credits, profiles, paths)
    if caches is not None:
        ctx.caches = caches
    ctx.age_scale_s = profiles.stage_scale(scales.stage_s)
    ctx.horizon_s = snap_to_grid(cfg.horizon * profiles.request_scale(scales.request_s))
    ctx.quantum_s = max(ctx.horizon_s, 1e-6)
    ctx.prefix = {p.agent: p for p in snap.prefixes}
    ctx.tokens = {p.agent: p.tokens for p in snap.prefixes}
    # Resident: on-GPU or loading prefixes, plus the agents of running requests (which hold
    # their prefix even if the engine does not list it).
    ctx.gpu = frozenset([p.agent for p in snap.prefixes if p.on_gpu] + [r.agent for r in snap.running])
    ctx.views = {t.task_id: t for t in snap.tasks}
    tokens, waiting, oldest = ctx.tokens, ctx.waiting, ctx.oldest
    for req in snap.running:
        agent = req.agent
        if agent not in ctx.prefix:  # unregistered agent: the largest claim (conservative)
            tokens[agent] = max(tokens.get(agent, 0), req.prefix_tokens)
        ctx.running_reqs.setdefault(agent, []).append(req)
        ctx.running_kv[agent] = ctx.running_kv.get(agent, 0) + req.kv_tokens
        ctx.running_by_task.setdefault(req.task_id, []).append(req)
    if cfg.beta > 0.0:
        _running_reuse(ctx)
    for req in snap.waiting:
        agent = req.agent
        group = waiting.get(agent)
        if group is None:
            waiting[agent] = [req]
            oldest[agent] = req.task_arrival_s
        else:
            group.append(req)
            if req.task_arrival_s < oldest[agent]:
                oldest[agent] = req.task_arrival_s
    for agent, group in waiting.items():
        if agent not in ctx.prefix:
            tokens[agent] = max(tokens.get(agent, 0), max(r.prefix_tokens for r in group))
    return ctx
