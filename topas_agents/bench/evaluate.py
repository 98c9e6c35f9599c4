"""Evaluate policies on several workloads in the simulator and print the paper-rule table.

    python -m topas_agents.bench.evaluate --tasks 100 [--workloads chain3,dag4]
        [--policies topas,fcfs,...] [--loads 0.3,0.6,0.9] [--seeds 0,1,2] [--jobs 2]
        [--opt key=value ...] [--host-tier all|none|paper|POLICY,...]

A thin front end over `run_many` (the bench's one harness): each workload at its default
loads (or `--loads`), one trace per load and seed shared by every policy. Per workload and
metric the comparator is the baseline with the lowest average over the loads (section V-A,
`bench.aggregate.paper_rule`); with several seeds the ratio's mean and 95% t interval over
seeds is printed too. `--opt` options go to every Topas variant (`--policies topas --opt k=v`
alone screens one variant quickly).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..costmodel import DEFAULT_PROFILE, load_profile
from ..errors import TopasError
from ..policies import BASELINES
from ..workflow import load_workflow
from .hosttier import TOPAS_PREFIX, parse_host_tier
from .options import parse_policy_list, parse_positive_floats, parse_seed_list
from .runner import BenchConfig, run_many, seeds_document

DEFAULT_WORKLOADS = ("chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl")
DEFAULT_POLICIES = ("topas", *BASELINES)


def evaluate(workloads: Sequence[str], policies: Sequence[str], tasks: int, seeds: Sequence[int],
             loads: tuple[float, ...] = (), jobs: int = 1, profile: str = DEFAULT_PROFILE,
             options: Mapping[str, Any] | None = None, host_tier: Any = None) -> dict[str, dict[str, Any]]:
    """Per workload, the `run_seeds` document (all runs of all workloads in one pool)."""
    prof = load_profile(profile)
    opts = {p: dict(options or {}) for p in policies if p.startswith(TOPAS_PREFIX)}
    configs = [BenchConfig(policies=tuple(policies), profile=prof, workflow=load_workflow(w), loads=loads,
                           tasks=tasks, seed=s, host_tier=host_tier, policy_options=opts)
               for w in workloads for s in seeds]
    docs = run_many(configs, jobs=jobs)
    n = len(seeds)
    return {w: seeds_document(configs[i * n], docs[i * n:(i + 1) * n]) for i, w in enumerate(workloads)}


def _pct(x: float | None) -> str:
    return "    -" if x is None else f"{100 * (1 - x):+5.1f}"


def format_table(docs: Mapping[str, Mapping[str, Any]], target: str = "topas") -> str:
    """Per workload: mean/p99 JCT per policy and load (seed by seed), then the target's
    reduction 1 - ratio vs the best baseline (per seed, and mean [95% CI] over seeds)."""
    lines = []
    for w, doc in docs.items():
        lines.append(f"== {w} (host tier: {doc['host_tier']['setup']})")
        for run in doc["per_seed"]:
            policies = list(run["points"][0]["results"])
            lines.append(f"seed {run['seed']}  load   rate    " + "".join(f"{p:>22}" for p in policies))
            for pt in run["points"]:
                load = "-" if pt["load"] is None else f"{pt['load']:.3g}"
                cells = "".join(f"{pt['results'][p]['mean_jct']:>10.1f}/{pt['results'][p]['p99_jct']:<11.1f}"
                                for p in policies)
                lines.append(f"        {load:<6} {pt['rate']:<7.4f} {cells}")
        agg = doc["over_seeds"].get(target)
        if agg is None:
            continue
        for metric, best in (("mean_jct", "best_baseline"), ("p99_jct", "best_baseline_p99")):
            ratio = agg[f"{metric}_vs_best_baseline"]
            if ratio is None:
                continue
            per = " ".join(_pct(v) for v in ratio["values"])
            ci = "" if ratio["ci95"] is None else f" [{_pct(ratio['ci95'][1])}, {_pct(ratio['ci95'][0])}]"
            lines.append(f"  {metric}: {target} reduction vs best baseline ({'/'.join(agg[best])}) by seed "
                         f"{per} | mean {_pct(ratio['mean'])}%{ci}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--loads", default=None, help="comma-separated loads (default: each workload's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (overrides --seed)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--opt", action="append", default=[], help="Topas option key=value (repeatable; YAML value)")
    ap.add_argument("--json", default=None, help="also write the documents here (one per workload)")
    ap.add_argument("--host-tier", default=None, help="all | none | paper | POLICY,... (default: the profile's)")
    ap.add_argument("--no-host-tier", action="store_true", help="alias of --host-tier none")
    return ap


def main(argv: list[str] | None = None) -> int:
    import yaml

    from ..cli.args import check_output, write_json
    from ..policies import available_policies

    args = _parser().parse_args(argv)
    try:
        policies = parse_policy_list(args.policies)
        loads = parse_positive_floats(args.loads, "--loads") if args.loads else ()
        seeds = list(parse_seed_list(args.seeds)) if args.seeds else [args.seed]
        tier = "none" if args.no_host_tier else args.host_tier
        host_tier = parse_host_tier(tier, available_policies()) if tier else None
        options = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.opt)}
        check_output("--json", args.json)  # before the evaluation, not after it
        docs = evaluate(args.workloads.split(","), policies, args.tasks, seeds, loads, args.jobs, args.profile,
                        options, host_tier)
        print(format_table(docs))
        if args.json:
            write_json(args.json, docs)
    except (TopasError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
