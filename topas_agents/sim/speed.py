"""Simulator speed check: `python -m topas_agents.sim.speed` prints seconds per run as JSON.

Default: 1000 dag10wide tasks per baseline at 0.06 tasks/s on the default A100 profile.
That rate is heavy: about 0.9 of the best baseline's saturated throughput (LPM, ~0.068
tasks/s when everything arrives at once) and over 2x what FCFS-like orders sustain
(~0.027), so their waiting queues grow into the thousands; this is the engine's worst case.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

from ..costmodel import DEFAULT_PROFILE, load_profile
from ..policies import BASELINES, make_policy
from ..workflow import load_workflow
from .driver import make_trace, simulate

HEAVY_RATE = 0.06


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m topas_agents.sim.speed", description=__doc__.splitlines()[0])
    from ..bench.options import parse_policy_list
    from ..cli.args import non_negative_int, positive_float, positive_int

    ap.add_argument("--workload", default="dag10wide")
    ap.add_argument("--tasks", type=positive_int, default=1000)
    ap.add_argument("--rate", type=positive_float, default=HEAVY_RATE, help="task arrivals per second")
    ap.add_argument("--policies", default=",".join(BASELINES))
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--seed", type=non_negative_int, default=0)
    args = ap.parse_args(argv)
    policies = parse_policy_list(args.policies)
    profile = load_profile(args.profile)
    trace = make_trace(load_workflow(args.workload), args.tasks, args.rate, args.seed)
    runs = {}
    for name in policies:
        t0 = time.perf_counter()
        result = simulate(trace, make_policy(name), profile)
        wall = time.perf_counter() - t0
        runs[name] = {
            "wall_s": round(wall, 2),
            "simulated_s": round(result.makespan_s, 1),
            "decisions": result.stats.decisions,
            "gpu_runs": result.stats.runs,
            "requests": result.requests,
            "mean_jct": round(result.mean_jct, 1),
            "mean_batch": round(result.mean_batch, 2),
        }
    out = {"workload": args.workload, "tasks": args.tasks, "rate": args.rate, "profile": profile.name,
           "seconds_per_run": {k: v["wall_s"] for k, v in runs.items()}, "runs": runs}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    from ..cli.args import run_module

    run_module(main)
