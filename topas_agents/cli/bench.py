"""`topas bench`: every policy on the same Poisson trace(s) in the simulated engine.

    topas bench --workload chain3 --policies fcfs,lpm,topas --load 0.3,0.6 --tasks 100 --seed 0
    topas bench --trace run.jsonl --rate 0.2 --json out.json --plot out.png
    topas bench --decision-cost --policies topas,lpm
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from ..bench.options import (
    load_policy_config,
    merge_options,
    parse_policy_list,
    parse_policy_opts,
    parse_positive_floats,
    parse_positive_int,
)
from ..costmodel import DEFAULT_PROFILE, load_profile
from ..errors import ConfigError
from ..policies import BASELINES
from .args import non_negative_int, write_json

DEFAULT_POLICIES = ",".join((*BASELINES, "topas"))
MICROBENCH = "topas_agents.policies.topas.microbench"


def _arg(parse: Any, what: str) -> Any:
    """An argparse `type=` that reports our one-line message (argparse adds the option)."""

    def convert(text: str) -> Any:
        try:
            return parse(text, what)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{what}: ")) from None

    convert.__name__ = what  # argparse names the converter in some messages
    return convert


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark scheduling policies on a workflow in the simulated engine",
        description="Run every policy on the same Poisson arrival trace at each rate/load and "
        "compare mean/p99 JCT against an oracle lower bound.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", metavar="NAME|PATH.yaml", help="built-in workflow name or YAML file")
    src.add_argument("--trace", metavar="FILE.jsonl", help="replay recorded calls (see topas_agents/bench/trace.py)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, type=_arg(lambda t, w: parse_policy_list(t), "--policies"),
                   help=f"comma-separated policy names (default {DEFAULT_POLICIES})")
    point = p.add_mutually_exclusive_group()
    point.add_argument("--rate", type=_arg(parse_positive_floats, "--rate"), metavar="R[,R2...]",
                       help="arrival rates in tasks/s")
    point.add_argument("--load", type=_arg(parse_positive_floats, "--load"), metavar="U[,U2...]",
                       help="offered load as a fraction of the engine's capacity for the workload "
                       "(default: the workflow's `loads`)")
    p.add_argument("--tasks", type=_arg(parse_positive_int, "--tasks"), default=None,
                   help="tasks per run (default 100; a trace: all of its tasks)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed for arrivals and task sizes (default 0)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"cost profile name or YAML (default {DEFAULT_PROFILE})")
    p.add_argument("--kv-budget", type=_arg(parse_positive_int, "--kv-budget"), metavar="TOKENS",
                   help="KV budget in tokens (default: the profile's)")
    p.add_argument("--no-host-tier", action="store_true", help="evicted prefixes are dropped, not kept in CPU memory")
    p.add_argument("--policy-opt", action="append", default=[], metavar="POLICY.KEY=VALUE",
                   help="an option for one policy's factory (repeatable); VALUE is a YAML scalar")
    p.add_argument("--policy-config", metavar="FILE.yaml", help="YAML mapping policy name -> options")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="plot mean and p99 JCT vs rate")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--check", action="store_true", help="check engine invariants at every decision (slow)")
    p.add_argument("--decision-cost", action="store_true",
                   help="instead of a bench, time one decision per policy (50 agents, 1000 waiting)")
    p.set_defaults(run=run)


def _decision_cost(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module(MICROBENCH)
        bench = module.run_decision_benchmark
    except (ModuleNotFoundError, AttributeError):
        raise ConfigError(f"--decision-cost needs {MICROBENCH}:run_decision_benchmark, "
                          "which is not available in this install") from None
    result = bench(list(args.policies), n_agents=50, n_waiting=1000, seed=args.seed)
    print(json.dumps(result, indent=2))
    if args.json:
        write_json(args.json, result)
    return 0


def _config(args: argparse.Namespace) -> Any:
    from ..bench.runner import BenchConfig  # the bench package pulls in the policy registry only
    from ..bench.trace import load_trace
    from ..workflow import load_workflow

    if not args.workload and not args.trace:
        raise ConfigError("give --workload NAME|PATH.yaml or --trace FILE.jsonl")
    options = load_policy_config(args.policy_config, args.policies) if args.policy_config else {}
    options = merge_options(options, parse_policy_opts(args.policy_opt, args.policies))
    common = dict(policies=args.policies, profile=load_profile(args.profile), rates=args.rate or (),
                  loads=args.load or (), seed=args.seed, kv_budget=args.kv_budget,
                  host_tier=False if args.no_host_tier else None, policy_options=options, check=args.check)
    if args.trace:
        recorded = load_trace(args.trace)
        return BenchConfig(recorded=recorded, workload=Path(args.trace).name,
                           tasks=args.tasks or len(recorded), **common)
    return BenchConfig(workflow=load_workflow(args.workload), tasks=args.tasks or 100, **common)


def run(args: argparse.Namespace) -> int:
    if args.decision_cost:
        return _decision_cost(args)
    from ..bench.report import format_table, plot_result
    from ..bench.runner import capacity_for, run_bench

    config = _config(args)
    show = not args.no_progress and sys.stderr.isatty()
    result = run_bench(config, progress=show)
    print(format_table(result, capacity_for(config)))
    if args.json:
        write_json(args.json, result)
    if args.plot:
        plot_result(result, args.plot)
    return 0
