"""Evaluate Topas against the baselines in the simulator and print a ratio table.

    python -m topas_agents.policies.topas.evaluate --tasks 100 [--workloads chain3,dag4]
        [--policies topas,fcfs,...] [--loads 0.3,0.6,0.9] [--seed 0] [--jobs 2]

Each workload runs at its default loads (`loads:` in its YAML; a load is a fraction of the
capacity `topas_agents.bench.capacity_rps` computes), one trace per load shared by every
policy. Per workload and metric the best baseline is the one with the lowest average over
the loads; the reduction reported is 1 - topas_avg / best_baseline_avg.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from ...costmodel import load_profile
from ...workflow import load_workflow
from .. import BASELINES, make_policy

DEFAULT_WORKLOADS = ("chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl")
DEFAULT_POLICIES = ("topas", *BASELINES)


def _run(job: tuple[str, str, float, int, int, str, dict]) -> tuple[str, float, str, dict]:
    from ...bench import capacity_rps, rate_for_load
    from ...sim import make_trace, simulate

    workload, policy, load, tasks, seed, profile_name, options, host_tier = job
    wf = load_workflow(workload)
    profile = load_profile(profile_name)
    rate = rate_for_load(load, capacity_rps(wf, profile))
    trace = make_trace(wf, tasks, rate, seed)
    t0 = time.perf_counter()
    try:
        res = simulate(trace, make_policy(policy, options if policy.startswith("topas") else {}), profile,
                       host_tier=host_tier)
    except Exception as exc:  # report the failing run instead of losing the whole table
        raise RuntimeError(f"{policy} on {workload} at load {load}: {type(exc).__name__}: {exc}") from exc
    return workload, load, policy, {"mean": res.mean_jct, "p99": res.p99_jct, "rate": rate,
                                    "wall_s": time.perf_counter() - t0,
                                    "dec_ms": res.decision_ms_mean, "dec_p99_ms": res.decision_ms_p99,
                                    "preempt": res.preemptions, "swaps": res.prefix_swaps,
                                    "batch": res.mean_batch}


def evaluate(workloads, policies, tasks, seed, loads=None, jobs=1, profile="a100-80g-qwen2.5-32b",
             options=None, host_tier=None) -> dict:
    plan = []
    for w in workloads:
        for load in loads or load_workflow(w).loads:
            plan += [(w, p, load, tasks, seed, profile, dict(options or {}), host_tier) for p in policies]
    results: dict = {}
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as ex:
            outs = list(ex.map(_run, plan))
    else:
        outs = [_run(j) for j in plan]
    for w, load, p, r in outs:
        results.setdefault(w, {}).setdefault(load, {})[p] = r
    return results


def summary(results: dict, target: str = "topas") -> dict:
    out = {}
    for w, by_load in results.items():
        policies = next(iter(by_load.values())).keys()
        avg = {p: {m: sum(by_load[u][p][m] for u in by_load) / len(by_load) for m in ("mean", "p99")}
               for p in policies}
        row = {}
        for m in ("mean", "p99"):
            base = [b for b in BASELINES if b in avg]
            if not base or target not in avg:
                continue
            best = min(base, key=lambda b: avg[b][m])
            row[m] = {"best": best, "best_avg": avg[best][m], "topas_avg": avg[target][m],
                      "reduction": 1 - avg[target][m] / avg[best][m]}
        out[w] = {"avg": avg, "vs_best": row}
    return out


def format_table(results: dict, summ: dict) -> str:
    lines = []
    for w, by_load in results.items():
        policies = list(next(iter(by_load.values())).keys())
        lines.append(f"== {w}")
        lines.append("load   rate    " + "".join(f"{p:>22}" for p in policies))
        for u, row in by_load.items():
            rate = next(iter(row.values()))["rate"]
            cells = "".join(f"{row[p]['mean']:>10.1f}/{row[p]['p99']:<11.1f}" for p in policies)
            lines.append(f"{u:<6} {rate:<7.4f} {cells}")
        for m, r in summ[w]["vs_best"].items():
            lines.append(f"  {m:4}: topas {r['topas_avg']:.1f} vs best baseline {r['best']} {r['best_avg']:.1f}"
                         f" -> reduction {100 * r['reduction']:+.1f}%")
    return "\n".join(lines)


def format_seeds(summaries: dict) -> str:
    """Reduction vs the best baseline per workload and metric, per seed and averaged."""
    seeds = list(summaries)
    lines = ["# reduction vs best baseline (per metric), by seed: " + ", ".join(map(str, seeds)) + " | mean"]
    workloads = list(next(iter(summaries.values())))
    for w in workloads:
        cells = []
        for m in ("mean", "p99"):
            if any(m not in summaries[s][w]["vs_best"] for s in seeds):  # no baseline was run
                continue
            reds = [100 * summaries[s][w]["vs_best"][m]["reduction"] for s in seeds]
            cells.append(f"{m} " + " ".join(f"{r:+5.1f}" for r in reds) + f" | {sum(reds) / len(reds):+5.1f}%")
        lines.append(f"{w:12} " + "   ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--loads", default=None, help="comma-separated loads (default: each workload's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (overrides --seed); adds a summary")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--profile", default="a100-80g-qwen2.5-32b")
    ap.add_argument("--opt", action="append", default=[], help="topas option key=value (repeatable)")
    ap.add_argument("--json", default=None, help="also write the raw results here")
    ap.add_argument("--no-host-tier", action="store_true", help="evicted prefixes are dropped (recomputed)")
    args = ap.parse_args(argv)
    loads = tuple(float(x) for x in args.loads.split(",")) if args.loads else None
    options = dict(kv.split("=", 1) for kv in args.opt)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    runs = {}
    for seed in seeds:
        res = evaluate(args.workloads.split(","), args.policies.split(","), args.tasks, seed, loads,
                       args.jobs, args.profile, options, False if args.no_host_tier else None)
        summ = summary(res)
        print(f"# seed {seed}")
        print(format_table(res, summ))
        runs[seed] = {"results": {w: {str(u): r for u, r in v.items()} for w, v in res.items()}, "summary": summ}
    if len(seeds) > 1:
        print(format_seeds({s: r["summary"] for s, r in runs.items()}))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(runs, fh, indent=1)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
