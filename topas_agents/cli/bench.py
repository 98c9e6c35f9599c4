"""`topas bench`: every policy on the same Poisson trace(s) in the simulated engine.

    topas bench --workload chain3 --policies fcfs,lpm,topas --load 0.3,0.6 --tasks 100 --seed 0
    topas bench --workload metagpt-tl --protocol paper --host-tier paper --jobs 2 --json out.json
    topas bench --workload metagpt-tl --rate 0.0175 --policies topas,topas-base --seeds 0,1,2,3,4
    topas bench --trace run.jsonl --rate 0.2 --json out.json --plot out.png
    topas bench --decision-cost --policies topas,lpm --profile h100-80g-qwen2.5-32b
    topas bench --suite random --workflows 20 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from ..bench.hosttier import HostTier, parse_host_tier
from ..bench.options import (
    load_policy_config,
    merge_options,
    parse_policy_list,
    parse_policy_opts,
    parse_positive_floats,
    parse_positive_int,
    parse_seed_list,
)
from ..bench.protocol import LIMITS, PROTOCOLS, check_range
from ..costmodel import DEFAULT_PROFILE, load_profile
from ..errors import ConfigError
from ..policies import BASELINES, available_policies
from .args import (
    check_output,
    int_between,
    model_name,
    non_negative_int,
    positive_float,
    positive_int,
    write_json,
)
from .bench_modes import check_mode_flags

DEFAULT_POLICIES = ",".join((*BASELINES, "topas"))
MICROBENCH = "topas_agents.bench.microbench"
SUITES = ("random",)


def _arg(parse: Any, what: str) -> Any:
    """An argparse `type=` that reports our one-line message (argparse adds the option)."""

    def convert(text: str) -> Any:
        try:
            return parse(text, what)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{what}: ")) from None

    convert.__name__ = what  # argparse names the converter in some messages
    return convert


def _bounded_floats(bounds: tuple[float, float], unit: str = "") -> Any:
    def parse(text: str, what: str) -> tuple[float, ...]:
        values = parse_positive_floats(text, what)
        check_range(values, bounds, what, unit)
        return values

    return parse


def _tasks(text: str, what: str) -> int:
    value = parse_positive_int(text, what)
    check_range((value,), LIMITS.tasks, what)
    return value


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark scheduling policies on a workflow in the simulated engine",
        description="Run every policy on the same Poisson arrival trace at each rate/load and "
        "compare mean/p99 JCT against an oracle lower bound. With --seeds: per policy the paper "
        "rule (section V-A: each metric averaged over the points, ratio to the baseline with the "
        "lowest average), its mean over seeds and a 95% t confidence interval.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", metavar="NAME|PATH.yaml", help="built-in workflow name or YAML file")
    src.add_argument("--trace", metavar="FILE.jsonl", help="replay recorded calls (see topas_agents/bench/trace.py)")
    src.add_argument("--suite", choices=SUITES, help="run the random-workflow suite (topas_agents.suite)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, type=_arg(lambda t, w: parse_policy_list(t), "--policies"),
                   help=f"comma-separated policy names (default {DEFAULT_POLICIES})")
    point = p.add_mutually_exclusive_group()
    point.add_argument("--rate", type=_arg(_bounded_floats(LIMITS.rate, " tasks/s"), "--rate"), metavar="R[,R2...]",
                       help=f"arrival rates in tasks/s, each in [{LIMITS.rate[0]:g}, {LIMITS.rate[1]:g}]")
    point.add_argument("--load", type=_arg(_bounded_floats(LIMITS.load), "--load"), metavar="U[,U2...]",
                       help="offered load as a fraction of the engine's capacity for the workload, each in "
                       f"[{LIMITS.load[0]:g}, {LIMITS.load[1]:g}] (default: the workflow's `loads`)")
    p.add_argument("--tasks", type=_arg(_tasks, "--tasks"), default=None,
                   help=f"tasks per run, at most {LIMITS.tasks[1]} (default 100, --protocol's; a trace: all)")
    seed = p.add_mutually_exclusive_group()
    seed.add_argument("--seed", type=non_negative_int, default=0, help="seed for arrivals and task sizes (default 0)")
    seed.add_argument("--seeds", type=_arg(lambda t, w: parse_seed_list(t, w, LIMITS.seeds), "--seeds"),
                      metavar="S1,S2,...", help="run at each seed; adds the paper rule's mean and 95%% CI over seeds")
    p.add_argument("--protocol", choices=sorted(PROTOCOLS),
                   help="named defaults for what is not given: paper = seeds 0-4, 200 tasks, the workflow's "
                   "loads plus the rates the paper states (bench/protocol.py)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"cost profile name or YAML (default {DEFAULT_PROFILE})")
    p.add_argument("--kv-budget", type=_arg(parse_positive_int, "--kv-budget"), metavar="TOKENS",
                   help="KV budget in tokens (default: the profile's)")
    tier = p.add_mutually_exclusive_group()
    tier.add_argument("--host-tier", metavar="all|none|paper|POLICY,...",
                      type=_arg(lambda t, w: parse_host_tier(t, available_policies()), "--host-tier"),
                      help="which policies keep evicted prefixes in CPU memory (else dropped and recomputed): "
                      "all (symmetric, SGLang hierarchical cache), none, paper (Topas variants only) or a "
                      "policy list (default: the profile's host_tier for every policy)")
    tier.add_argument("--no-host-tier", action="store_true", help="alias of --host-tier none")
    p.add_argument("--policy-opt", action="append", default=[], metavar="POLICY.KEY=VALUE",
                   help="an option for one policy's factory (repeatable); VALUE is a YAML scalar")
    p.add_argument("--policy-config", metavar="FILE.yaml",
                   help="YAML mapping policy name -> options; sections for policies not in --policies are "
                        "ignored (one file can serve many runs), an unknown policy name is an error")
    _add_output_options(p)
    _add_suite_options(p)
    from ..cluster.cli import add_cluster_bench_options

    add_cluster_bench_options(p)  # --replicas, --router, --tasks-per-replica, --scaling, --p99-target
    _add_real_engine_options(p)
    p.set_defaults(run=run)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """How a bench runs and what it writes: parallel jobs, JSON, plots, timelines, checks, and
    the decision-cost mode."""
    p.add_argument("--jobs", type=positive_int, default=1, help="simulations run in parallel processes (default 1)")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.add_argument("--task-jcts", action="store_true", help="put every task's JCT in the JSON (for CDFs)")
    p.add_argument("--plot", metavar="OUT.png", help="plot mean and p99 JCT vs load (CI bands with --seeds)")
    p.add_argument("--timeline", metavar="DIR",
                   help="also write per-run timelines: DIR/<workload>-<policy>-<load>.trace.json (Chrome/"
                   "Perfetto trace events: ui.perfetto.dev) and .gantt.png, one pair per policy and point, "
                   "of the first seed only (each run is simulated once more with recording on; the engine "
                   "is deterministic, so it is the same run). Not with --suite/--replicas (docs/timelines.md)")
    p.add_argument("--timeline-tasks", type=positive_int, default=None, metavar="N",
                   help="--timeline: record and draw the first N tasks of each run (default 40)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--check", action="store_true", help="check engine invariants at every decision (slow)")
    p.add_argument("--decision-cost", action="store_true",
                   help="instead of a bench, time one decision per policy (50 agents, 1000 waiting; "
                        "--policy-opt/--policy-config time a configuration)")


def _add_suite_options(p: argparse.ArgumentParser) -> None:
    """--suite's own flags (topas_agents.suite)."""
    p.add_argument("--workflows", type=int_between(*LIMITS.workflows, " (bench.protocol.Limits)"), default=20,
                   help="--suite: random workflows (default 20)")
    p.add_argument("--suite-seed", type=non_negative_int, default=None, metavar="N",
                   help="--suite: seed of the workflow generator (default: --seed; --seeds only sets "
                        "the arrival seeds, so a held-out suite is --suite-seed N --seeds ...)")
    p.add_argument("--worst-dir", default="results/suite-worst", metavar="DIR",
                   help="--suite: where the worst cases are written (default results/suite-worst)")
    p.add_argument("--reuse", default=None, metavar="FILE.json",
                   help="--suite: take the baselines' runs from an earlier --json of the same suite "
                        "(same --suite-seed, --tasks, profile, budget, host tier; checked) instead of "
                        "rerunning them; the policies judged always run")
    p.add_argument("--recheck", type=_arg(lambda t, w: parse_seed_list(t, w, LIMITS.seeds), "--recheck"),
                   default=None, metavar="S1,S2,...",
                   help="--suite: afterwards rerun each losing (workflow, load) cell at these extra arrival "
                        "seeds (every policy, that load only) and judge it over all its seeds "
                        "(topas_agents/suite/recheck.py)")


def _add_real_engine_options(p: argparse.ArgumentParser) -> None:
    """`--server URL` / `--engine sglang`: replay the trace as labelled calls against a real
    endpoint (topas_agents.realbench); --workload, --policies, --tasks, --rate, --seed, --json
    keep their meaning."""
    real = p.add_argument_group("real engine (topas_agents.realbench, docs/sglang.md)")
    real.add_argument("--server", default=None, metavar="URL", help="OpenAI base URL (.../v1) to replay the trace against")
    real.add_argument("--engine", choices=("sim", "sglang"), default="sim",
                      help="sglang: start a fresh real SGLang server per policy (needs --model-path)")
    real.add_argument("--model-path", default=None, metavar="DIR", help="--engine sglang: model directory")
    real.add_argument("--engine-arg", action="append", default=[], metavar="ARG", help="extra SGLang argument")
    real.add_argument("--scale", type=float, default=0.05,
                      help="real engine: prefix/input/output size factor (default 0.05: the workload at 1/20 of "
                      "its sizes, so a CPU-served or small model finishes in minutes; 1 for the workflow as defined)")
    real.add_argument("--kv-tokens", type=positive_int, default=4096, help="--engine sglang: --max-total-tokens")
    real.add_argument("--ignore-eos", action="store_true", help="real engine: fix lengths with ignore_eos")
    real.add_argument("--model", type=model_name, default=None, help="real engine: model id (default: the server's first)")
    real.add_argument("--timeout", type=positive_float, default=900.0, help="real engine: per-policy run limit (s)")
    real.add_argument("--words-per-token", type=positive_float, default=None, help="real engine: prompt words per token")
    real.add_argument("--sim", action="store_true", help="real engine: also simulate the same trace per policy")
    real.add_argument("--api-key", default=None, metavar="KEY", help="--server's API key (default: $TOPAS_API_KEY)")


def _real_engine(args: argparse.Namespace) -> int:
    from ..realbench.runner import run_from_args
    from .args import client_api_key

    if getattr(args, "api_key", None) is not None and args.engine == "sglang":
        raise ConfigError("--api-key applies to --server (a server started by --engine sglang takes no key)")
    given = getattr(args, "given", None) or frozenset()
    if args.server and "--policies" in given and len(args.policies) > 1:
        # the server runs its own policy; several names were ignored (and with --sim none matched the run)
        raise ConfigError("--server runs the policy the server was started with: give that one as --policies "
                          "(the simulated run --sim compares with it), or leave --policies out")
    real = argparse.Namespace(**vars(args))
    real.engine = None if args.engine == "sim" else args.engine
    real.api_key = client_api_key(args) if args.server else None
    real.policies = ",".join(args.policies)
    real.workload = args.workload or "chain3"
    real.tasks = args.tasks or 8
    real.rate = args.rate[0] if args.rate else 0.5
    real.profile = None if args.profile == DEFAULT_PROFILE else args.profile
    return run_from_args(real)


def _decision_cost(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module(MICROBENCH)
        bench = module.run_decision_benchmark
    except (ModuleNotFoundError, AttributeError):
        raise ConfigError(f"--decision-cost needs {MICROBENCH}:run_decision_benchmark, "
                          "which is not available in this install") from None
    load_profile(args.profile)  # a bad --profile fails here with its one-line message
    options = load_policy_config(args.policy_config, args.policies) if args.policy_config else {}
    options = merge_options(options, parse_policy_opts(args.policy_opt, args.policies))
    result = bench(list(args.policies), n_agents=50, n_waiting=1000, seed=args.seed, profile=args.profile,
                   options=options)
    print(json.dumps(result, indent=2))
    if args.json:
        write_json(args.json, result)
    return 0


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in what later steps (and `suite.run_suite_cli`) read: `policy_options` (merged
    --policy-config and --policy-opt: {policy: {key: value}}), `host_tier` (a `HostTier`, or
    None for the profile's setting), `seeds` (tuple of ints or None), `tasks`, `extra_rates`
    (the protocol's stated rates for the workload)."""
    options = load_policy_config(args.policy_config, args.policies) if args.policy_config else {}
    args.policy_options = merge_options(options, parse_policy_opts(args.policy_opt, args.policies))
    if args.no_host_tier:
        args.host_tier = HostTier("none")
    tier = args.host_tier
    if isinstance(tier, HostTier) and tier.mode == "policies":
        absent = [p for p in tier.policies if p not in args.policies]
        if absent:  # it gave the tier to nobody that runs, without a word
            raise ConfigError(f"--host-tier {tier.label}: {', '.join(absent)} not among --policies "
                              f"({', '.join(args.policies)})")
    args.extra_rates = ()
    if args.protocol:
        proto = PROTOCOLS[args.protocol]
        args.seeds = args.seeds or proto.seeds
        args.tasks = args.tasks or proto.tasks
        if not (args.rate or args.load) and args.workload:
            args.extra_rates = proto.rates_for(_paper_workload(args.workload))
    if args.trace and args.seeds and len(args.seeds) > 1 and not (args.rate or args.load):
        # a recorded trace replays its own arrivals and sizes: the seeds drew nothing, and the
        # identical runs were reported with a zero-width "confidence interval"
        raise ConfigError("--seeds with --trace replays the recorded arrivals every time (each seed the same "
                          "run); add --rate or --load to draw arrivals per seed")
    return args


def _paper_workload(workload: str) -> str:
    """The built-in whose paper rates apply: the workflow's own name when it is that built-in's
    definition (the file's name said nothing: a small workflow in chain3.yaml got chain3's
    0.15 task/s, load 0.00004 for it); "" otherwise."""
    from ..errors import WorkflowError
    from ..workflow import load_workflow

    wf = load_workflow(workload)
    try:
        return wf.name if load_workflow(wf.name) == wf else ""
    except WorkflowError:  # no built-in of that name
        return ""


def _config(args: argparse.Namespace) -> Any:
    from ..bench.runner import BenchConfig  # the bench package pulls in the policy registry only
    from ..bench.trace import load_trace
    from ..workflow import load_workflow

    if not args.workload and not args.trace:
        raise ConfigError("give --workload NAME|PATH.yaml, --trace FILE.jsonl or --suite NAME")
    common = dict(policies=args.policies, profile=load_profile(args.profile), rates=args.rate or (),
                  loads=args.load or (), extra_rates=args.extra_rates, seed=args.seed, kv_budget=args.kv_budget,
                  host_tier=args.host_tier, policy_options=args.policy_options, check=args.check,
                  task_jcts=args.task_jcts)
    if args.trace:
        # --tasks cuts the trace before its arrival rate is checked (the run replays that
        # many); --rate/--load redraw the arrivals, so the recorded ones are not checked.
        recorded = load_trace(args.trace, max_tasks=args.tasks, redrawn=bool(args.rate or args.load))
        return BenchConfig(recorded=recorded, workload=Path(args.trace).name,
                           tasks=args.tasks or len(recorded), **common)
    return BenchConfig(workflow=load_workflow(args.workload), tasks=args.tasks or 100, **common)


def _suite(args: argparse.Namespace) -> int:
    try:
        from ..suite import run_suite_cli
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("topas_agents.suite"):
            raise ConfigError("--suite needs topas_agents.suite, which is not available in this install") from None
        raise
    except ImportError:
        raise ConfigError("--suite needs topas_agents.suite.run_suite_cli, which is not available") from None
    return int(run_suite_cli(args) or 0)


def _check_timeline(args: argparse.Namespace) -> None:
    if args.timeline_tasks is not None and not args.timeline:
        raise ConfigError("--timeline-tasks needs --timeline DIR")
    if args.timeline and (args.decision_cost or args.server or args.engine != "sim" or args.suite or args.replicas):
        raise ConfigError("--timeline needs the simulated single-engine bench (--workload or --trace; "
                          "not --suite, --replicas, --decision-cost or a real engine)")


def _write_timelines(args: argparse.Namespace, config: Any) -> None:
    from dataclasses import replace

    from ..bench.timeline import DEFAULT_TIMELINE_TASKS, write_bench_timelines

    first = replace(config, seed=args.seeds[0]) if args.seeds else config
    paths = write_bench_timelines(first, args.timeline, args.timeline_tasks or DEFAULT_TIMELINE_TASKS)
    print(f"timelines: {len(paths)} files in {args.timeline}", file=sys.stderr)


def _check_sources(args: argparse.Namespace) -> None:
    """An empty --workload/--trace path is named as such (it read as not given, so the error
    asked for one of them)."""
    for flag, value in (("--workload", args.workload), ("--trace", args.trace)):
        if value is not None and not value.strip():
            raise ConfigError(f"{flag}: empty path")


def _check_plot_format(path: Path) -> None:
    """The plot's format is one matplotlib writes (it is chosen by the suffix): an
    unsupported one failed only after the whole run."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.removeprefix(".").lower()
    if suffix not in formats:
        raise ConfigError(f"--plot {path}: format '{suffix}' is not supported "
                          f"(supported: {', '.join(sorted(formats))})")


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output path before the run (a run can take hours; failing after it loses it)."""
    check_output("--json", args.json)
    if args.plot and Path(args.plot).is_dir():  # figure_path made /tmp into /tmp.png beside it
        raise ConfigError(f"--plot {args.plot}: is a directory (give a file, such as {Path(args.plot) / 'jct.png'})")
    if args.plot:
        from ..bench.plots import figure_path

        args.plot = str(figure_path(args.plot))  # the file that will be written is the one checked
    check_output("--plot", args.plot)
    if args.plot:
        _check_plot_format(Path(args.plot))
    check_output("--timeline", args.timeline, "dir")
    if args.suite:
        check_output("--worst-dir", args.worst_dir, "dir")


def run(args: argparse.Namespace) -> int:
    from ..cluster.cli import check_cluster_flags

    _check_sources(args)
    _check_timeline(args)
    check_cluster_flags(args)
    check_mode_flags(args)
    _check_outputs(args)
    if args.decision_cost:
        return _decision_cost(args)
    if args.server or args.engine != "sim":
        return _real_engine(args)
    resolve_args(args)
    if args.suite:
        return _suite(args)
    if args.replicas:  # the simulated cluster (docs/cluster.md)
        from ..cluster.cli import run_cluster_from_args

        return run_cluster_from_args(args)
    from ..bench.report import format_seeds_table, format_table, plot_result
    from ..bench.runner import capacity_for, run_bench, run_seeds

    config = _config(args)
    show = not args.no_progress and sys.stderr.isatty()
    # a failing policy's runs are reported and left out; the others' results are kept
    if args.seeds:
        result = run_seeds(config, args.seeds, jobs=args.jobs, progress=show, keep_going=True)
    else:
        result = run_bench(config, progress=show, jobs=args.jobs, keep_going=True)
    if args.json:  # saved before the table is formatted: a run can take hours
        write_json(args.json, result)
    failures = result.get("failures", [])
    if len({f["policy"] for f in failures}) < len(config.policies):
        print(format_seeds_table(result) if args.seeds else format_table(result, capacity_for(config)))
        if args.plot:
            print(f"plot: {plot_result(result, args.plot)}", file=sys.stderr)
        if args.timeline:
            _write_timelines(args, config)
    for f in failures:
        where = f"load {f['load']}" if f["load"] is not None else f"rate {f['rate']:.4g}/s"
        print(f"error: {f['policy']} (seed {f['seed']}, {where}): {f['error']}", file=sys.stderr)
    return 1 if failures else 0
