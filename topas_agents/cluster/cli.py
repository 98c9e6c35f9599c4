"""`topas bench --replicas N[,N2] --router R[,R2] [--seeds S1,S2]`: the options and the hand-off from
`cli/bench.py` (docs/cluster.md).

    from ..cluster.cli import add_cluster_bench_options, run_cluster_from_args   # in cli/bench.py
    add_cluster_bench_options(p)                                                 # in add_parser
    if args.replicas: return run_cluster_from_args(args)      # in run, after resolve_args(args)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..bench.options import parse_positive_int
from ..bench.protocol import LIMITS, check_range
from ..cli.args import positive_float, write_json
from ..errors import ConfigError
from .routing import ROUTERS

DEFAULT_TASKS_PER_REPLICA = 40
# Flags that mean something only with --replicas (given without it they were silently ignored).
CLUSTER_ONLY = {"router": "--router", "tasks_per_replica": "--tasks-per-replica", "scaling": "--scaling",
                "p99_target": "--p99-target"}


def check_cluster_flags(args: argparse.Namespace) -> None:
    """ConfigError for a cluster-only flag given without --replicas, and for --p99-target
    without --scaling."""
    if not getattr(args, "replicas", None):
        given = [flag for attr, flag in CLUSTER_ONLY.items() if getattr(args, attr, None)]
        if given:
            raise ConfigError(f"{given[0]} applies to the simulated cluster only: add --replicas N")
    if getattr(args, "p99_target", None) is not None and not getattr(args, "scaling", None):
        raise ConfigError("--p99-target applies to --scaling only")
    if getattr(args, "replicas", None) and getattr(args, "protocol", None):
        # it set the seeds but not its 200 tasks a run or the paper's stated rates (per engine:
        # no cluster meaning), and nothing said so
        raise ConfigError(f"--protocol {args.protocol} applies to the single-engine bench and --suite, not "
                          "--replicas: give --seeds, --load and --tasks-per-replica")


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 4,8, got {text!r}") from None
    if not values or any(not 1 <= v <= 64 for v in values):
        raise argparse.ArgumentTypeError(f"replica counts must be in 1..64, got {text!r}")
    if len(set(values)) < len(values):  # as --seeds: a repeated count would run twice
        raise argparse.ArgumentTypeError(f"a replica count is given twice in {text!r}")
    return values


def _tasks_per_replica(text: str) -> int:
    """As --tasks: a positive integer within the tasks a run supports (`bench.protocol.LIMITS`;
    the run's own size, K x replicas, is checked against it too: `ClusterBenchConfig`)."""
    try:
        value = parse_positive_int(text, "--tasks-per-replica")
        check_range((value,), LIMITS.tasks, "--tasks-per-replica")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--tasks-per-replica: ")) from None
    return value


def _routers(text: str) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [v for v in values if v not in ROUTERS]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"routers are {', '.join(ROUTERS)}; got {text!r}")
    _refuse_repeats(values, "a router", text)  # was dropped silently
    return values


def _refuse_repeats(values: tuple[Any, ...], what: str, text: str) -> None:
    """As --seeds: a value given twice would run (or be dropped) without a word."""
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"{what} is given twice in {text!r}")


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in text.split(","):
        policy, sep, router = item.strip().partition("+")
        if not sep or router not in ROUTERS:
            raise argparse.ArgumentTypeError(f"expected POLICY+ROUTER (routers: {', '.join(ROUTERS)}), got {item!r}")
        out.append((policy, router))
    _refuse_repeats(tuple(out), "a POLICY+ROUTER pair", text)  # each pair ran twice
    return tuple(out)


def add_cluster_bench_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("simulated cluster (N engines behind a router; docs/cluster.md)")
    g.add_argument("--replicas", type=_ints, default=None, metavar="N[,N2...]",
                   help="run the policies on N simulated replicas (loads relative to N x one engine); "
                   "with --seeds: the paper rule per seed, then mean and 95%% CI over seeds (--jobs: seeds in parallel)")
    g.add_argument("--router", type=_routers, default=None, metavar="R[,R2...]",
                   help=f"--replicas: routers to compare (default all: {','.join(ROUTERS)})")
    g.add_argument("--tasks-per-replica", type=_tasks_per_replica, default=None, metavar="K",
                   help=f"--replicas: tasks per run = K x replicas, at most {LIMITS.tasks[1]} (default 40)")
    g.add_argument("--scaling", type=_pairs, default=(), metavar="POLICY+ROUTER[,...]",
                   help="--replicas: also the max rate under a p99 target at 1,2,4,8 replicas and scaling efficiency")
    g.add_argument("--p99-target", type=positive_float, default=None, metavar="S",
                   help="--scaling: p99 JCT target in simulated seconds (default 1.5 x one replica's p99 at load 0.3)")


def run_cluster_from_args(args: argparse.Namespace) -> int:
    from ..costmodel import load_profile
    from ..workflow import load_workflow
    from .bench import ClusterBenchConfig, run_cluster_bench

    if not getattr(args, "workload", None):
        raise ConfigError("--replicas needs --workload NAME|PATH.yaml")
    cfg = ClusterBenchConfig(
        workflow=load_workflow(args.workload), profile=load_profile(args.profile),
        policies=tuple(args.policies), routers=tuple(args.router or ROUTERS), replicas=tuple(args.replicas),
        loads=tuple(args.load or ()), tasks_per_replica=args.tasks_per_replica or DEFAULT_TASKS_PER_REPLICA,
        seed=args.seed,
        kv_budget=args.kv_budget, policy_options=getattr(args, "policy_options", None) or {},
        scaling_pairs=tuple(args.scaling), p99_target_s=args.p99_target)
    show = not getattr(args, "no_progress", False) and sys.stderr.isatty()
    progress = (lambda msg: print(msg, file=sys.stderr)) if show else None
    seeds = getattr(args, "seeds", None)
    if seeds:  # the paper rule per seed, then mean and 95% CI over seeds (seeds.py)
        from .seeds import run_cluster_seeds

        doc = run_cluster_seeds(cfg, seeds, jobs=getattr(args, "jobs", 1) or 1, progress=progress)
        table = format_cluster_seeds_table
    else:
        doc = run_cluster_bench(cfg, progress=progress)
        table = format_cluster_table
    if getattr(args, "json", None):  # saved before anything else can fail: the runs took minutes
        write_json(args.json, doc)
    print(table(doc))
    return 0


def format_cluster_table(doc: dict[str, Any]) -> str:
    lines = [f"{doc['workload']} on {doc['profile']}, loads {doc['loads']}, seed {doc['seed']} "
             "(mean/p99 JCT averaged over loads, simulated s)"]
    for block in doc["by_replicas"]:
        s = block["summary"]
        lines.append(f"\n{block['replicas']} replicas")
        for pair, v in sorted(s["pairs"].items(), key=lambda kv: kv[1]["mean_jct"]):
            lines.append(f"  {pair:24s} mean {v['mean_jct']:9.2f}  p99 {v['p99_jct']:9.2f}")
        for head in s.get("headlines", {}).values():  # one per Topas policy (headline.py)
            if "mean_jct_vs_lpm_cache" in head:
                lines.append(f"  {head['topas_best_router']} vs lpm+cache: mean x{head['mean_jct_vs_lpm_cache']:.3f}, "
                             f"p99 x{head['p99_jct_vs_lpm_cache']:.3f}")
    for sc in doc.get("scaling", []):
        rows = ", ".join(f"{r['replicas']}: {r['max_rate_rps']:.3f}/s"
                         + (f" (eff {r['efficiency']:.2f})" if r["efficiency"] is not None else "")
                         for r in sc["rows"])
        lines.append(f"\nscaling {sc['policy']}+{sc['router']} at p99 <= {sc['p99_target_s']:.1f} s: {rows}")
    return "\n".join(lines)


def _ci(v: dict[str, Any] | None, fmt: str = ".2f") -> str:
    """`mean [low, high]` of an `Interval.as_dict()`."""
    if v is None:
        return "n/a"
    if v["ci95"] is None:
        return format(v["mean"], fmt)
    lo, hi = v["ci95"]
    return f"{v['mean']:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def format_cluster_seeds_table(doc: dict[str, Any]) -> str:
    lines = [f"{doc['workload']} on {doc['profile']}, loads {doc['loads']}, seeds {doc['seeds']}, "
             f"{doc['tasks_per_replica']} tasks/replica: per seed the paper rule (mean/p99 JCT averaged "
             "over loads, simulated s; comparator = best baseline pair), then mean [95% CI] over seeds"]
    for block in doc["by_replicas"]:
        agg = block["over_seeds"]
        lines.append(f"\n{block['replicas']} replicas{'':16s} mean JCT{'':16s} p99 JCT{'':17s} "
                     "mean vs best baseline  p99 vs best baseline")
        ranked = sorted(agg.items(), key=lambda kv: kv[1]["mean_jct"]["mean"] if kv[1]["mean_jct"] else float("inf"))
        for pair, v in ranked:
            lines.append(f"  {pair:24s} {_ci(v['mean_jct']):24s} {_ci(v['p99_jct']):24s} "
                         f"{_ci(v['mean_jct_vs_best_baseline'], '.3f'):22s} {_ci(v['p99_jct_vs_best_baseline'], '.3f')}")
        for head in block.get("headlines", {}).values():  # one per Topas policy (headline.py)
            lines.append(f"  headline {head['topas_best_router']}: vs best baseline pair "
                         f"(per seed {','.join(b or 'none ran' for b in head['best_baseline'])}) mean x{_ci(head['mean_jct_vs_best_baseline'], '.3f')}, "
                         f"p99 x{_ci(head['p99_jct_vs_best_baseline'], '.3f')}")
            if "mean_jct_vs_lpm_cache" in head:
                lines.append(f"  headline {head['topas_best_router']} vs lpm+cache: "
                             f"mean x{_ci(head['mean_jct_vs_lpm_cache'], '.3f')}, "
                             f"p99 x{_ci(head['p99_jct_vs_lpm_cache'], '.3f')}")
    for sc in doc.get("scaling", []):
        rows = ", ".join(f"{r['replicas']}: {r['max_rate_rps']:.3f}/s" for r in sc["rows"])
        lines.append(f"\nscaling (seed {doc['seeds'][0]}) {sc['policy']}+{sc['router']} "
                     f"at p99 <= {sc['p99_target_s']:.1f} s: {rows}")
    return "\n".join(lines)
