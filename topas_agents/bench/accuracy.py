"""Measure the E[longest path] estimator against a large independent Monte Carlo reference.

    python -m topas_agents.bench.accuracy [--workloads dag4,dag10wide] [--tasks 60]

Service distributions are the ones Topas learns in a simulator run of the workload; for a
sample of task states (down-closed done sets) the estimator's L and its gain for one horizon
of service on each source are compared with a 2^16-sample plain Monte Carlo reference.
"""

from __future__ import annotations

import argparse
import random
import time
import zlib

import numpy as np

from ..costmodel import load_profile
from ..policies.topas.config import TopasConfig
from ..policies.topas.longest_path import PathEstimator
from ..policies.topas.policy import TopasPolicy
from ..workflow import Workflow, load_workflow


def _reference(wf: Workflow, dists: dict, done: frozenset[str], reduce: str | None, delta: float,
               n: int, rng: np.random.Generator) -> float:
    """E[LP] of the remaining DAG by plain Monte Carlo (`reduce` source served for delta)."""
    finish: dict[str, np.ndarray] = {}
    for name in wf.topo_order:
        if name in done:
            continue
        x = rng.choice(dists[name].values, size=n)
        if name == reduce:
            x = x - np.minimum(delta, x)
        preds = [finish[p] for p in wf.stage(name).after if p not in done]
        finish[name] = x + (np.max(np.stack(preds), axis=0) if preds else 0.0)
    return float(np.max(np.stack(list(finish.values())), axis=0).mean())


def _states(wf: Workflow, k: int, rng: random.Random) -> list[frozenset[str]]:
    out = {frozenset()}
    for _ in range(20 * k):
        done: set[str] = set()
        for name in wf.topo_order:
            if name in wf.ready_stages(done) and rng.random() < 0.5:
                done.add(name)
        if len(done) < len(wf.stages):
            out.add(frozenset(done))
        if len(out) >= k:
            break
    return sorted(out, key=lambda s: (len(s), sorted(s)))


def measure(workload: str, tasks: int = 60, states: int = 40, samples: int | None = None, seed: int = 0) -> dict:
    from ..sim import make_trace, simulate
    from .capacity import capacity_rps

    wf = load_workflow(workload)
    profile = load_profile()
    policy = TopasPolicy()
    simulate(make_trace(wf, tasks, 0.6 * capacity_rps(wf, profile), seed), policy, profile)
    cfg = policy.config if samples is None else TopasConfig(samples=samples)
    est = PathEstimator(policy.profiles) if samples is None else _relearned(policy, cfg)
    model = est.model(wf, profile)
    horizon = policy.config.horizon * policy.profiles.request_scale(1.0)
    l_err, g_err, build = [], [], []
    est.task(model, frozenset(), {}).gain1(0, horizon)  # warm up (numpy paths)
    for done in _states(wf, states, random.Random(seed)):
        t0 = time.perf_counter()
        tp = est.task(model, done, {})
        build.append(time.perf_counter() - t0)
        # the reference uses common random numbers too, so its gains are not noise differences
        state_seed = zlib.crc32(f"{seed}|{sorted(done)}".encode())
        ref = _reference(wf, model.dists, done, None, 0.0, 1 << 16, np.random.default_rng(state_seed))
        l_err.append(abs(tp.expected_path - ref) / ref)
        for j, src in enumerate(tp.sources):
            ref_gain = ref - _reference(wf, model.dists, done, src, horizon, 1 << 16,
                                        np.random.default_rng(state_seed))
            g_err.append(abs(tp.gain1(j, horizon) - ref_gain) / horizon)
    return {"workload": workload, "samples": cfg.samples, "states": len(l_err),
            "L_rel_err_mean": float(np.mean(l_err)), "L_rel_err_max": float(np.max(l_err)),
            "gain_err_mean_of_horizon": float(np.mean(g_err)), "gain_err_max_of_horizon": float(np.max(g_err)),
            "build_us_mean": 1e6 * float(np.mean(build))}


def _relearned(policy: TopasPolicy, cfg: TopasConfig) -> PathEstimator:
    from ..policies.topas.profiles import ServiceProfiles

    profiles = ServiceProfiles(cfg)
    profiles._hist = policy.profiles._hist  # same learned samples, another sample budget
    profiles._pending = {k: len(v) for k, v in profiles._hist.items()}
    return PathEstimator(profiles)


def main(argv: list[str] | None = None) -> int:
    from ..cli.args import positive_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="dag4,dag10wide,metagpt-sop")
    ap.add_argument("--tasks", type=positive_int, default=60)
    ap.add_argument("--samples", default="", help="comma-separated sample budgets (default: config)")
    args = ap.parse_args(argv)
    try:
        budgets = [positive_int(x) for x in args.samples.split(",") if x] or [None]
    except argparse.ArgumentTypeError as exc:
        ap.error(f"argument --samples: {exc}")
    for w in args.workloads.split(","):
        for b in budgets:
            r = measure(w, args.tasks, samples=b)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    from ..cli.args import run_module

    run_module(main)
