"""`run_suite_cli(args)`: the entry `topas bench --suite random` calls with its parsed args.

Attributes read (the bench parser's names; the optional ones with `getattr` defaults, so a
parser that lacks them still works): suite, workflows, suite_seed, seed, seeds, load, tasks, profile,
kv_budget, policies, json, no_progress, worst_dir, and optionally jobs (1), worst_n (5), reuse (None),
recheck (None: extra seeds for the losing cells, suite.recheck),
policy_options (a ready policy -> options mapping) or policy_config / policy_opt (the bench's
raw option flags), host_tier (a bench.hosttier.HostTier, a bool, or None) or no_host_tier.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..policies import BASELINES
from .runner import SuiteConfig

# Operating points when --load is not given: light to near-saturated, evenly spaced.
DEFAULT_LOADS = (0.1, 0.3, 0.5, 0.7, 0.9)
# Tasks per run when --tasks is not given: 60 keeps a 20-workflow x 2-seed x 5-load suite
# of six policies within minutes on two cores while every run still reaches steady state.
DEFAULT_TASKS = 60
DEFAULT_WORKFLOWS = 20
SUITES = ("random",)


def _policy_options(args: argparse.Namespace, policies: tuple[str, ...]) -> Mapping[str, Mapping[str, Any]]:
    ready = getattr(args, "policy_options", None)
    if isinstance(ready, Mapping):
        return ready
    from ..bench.options import load_policy_config, merge_options, parse_policy_opts

    path = getattr(args, "policy_config", None)
    options = load_policy_config(path, policies) if path else {}
    return merge_options(options, parse_policy_opts(getattr(args, "policy_opt", None) or [], policies))


def _host_tier(args: argparse.Namespace) -> Any:
    """The bench's `host_tier` as given (a `bench.hosttier.HostTier`, a bool, or None for the
    profile's setting; `BenchConfig` takes each), else `--no-host-tier` as False."""
    tier = getattr(args, "host_tier", None)
    if tier is not None:
        return tier
    return False if getattr(args, "no_host_tier", False) else None


def config_from_args(args: argparse.Namespace) -> SuiteConfig:
    from ..costmodel import DEFAULT_PROFILE, load_profile

    suite = getattr(args, "suite", "random") or "random"
    if suite not in SUITES:
        raise ConfigError(f"unknown suite '{suite}' (known: {', '.join(SUITES)})")
    seed = int(getattr(args, "seed", 0) or 0)
    seeds = getattr(args, "seeds", None)
    policies = tuple(getattr(args, "policies", None) or (*BASELINES, "topas"))
    return SuiteConfig(
        workflows=int(getattr(args, "workflows", None) or DEFAULT_WORKFLOWS),
        gen_seed=seed if getattr(args, "suite_seed", None) is None else int(args.suite_seed),
        seeds=tuple(seeds) if seeds else (seed,),
        loads=tuple(getattr(args, "load", None) or DEFAULT_LOADS),
        tasks=int(getattr(args, "tasks", None) or DEFAULT_TASKS),
        profile=load_profile(getattr(args, "profile", None) or DEFAULT_PROFILE),
        policies=policies,
        kv_budget=getattr(args, "kv_budget", None),
        host_tier=_host_tier(args),
        policy_options=_policy_options(args, policies),
        jobs=int(getattr(args, "jobs", None) or 1),
        progress=not getattr(args, "no_progress", False) and sys.stderr.isatty(),
        reuse=Path(args.reuse) if getattr(args, "reuse", None) else None,
        profile_arg=getattr(args, "profile", None),
    )


def run_suite_cli(args: argparse.Namespace) -> int:
    """Run the suite, print the verdict, write the worst YAMLs and (with --json) the JSON.
    Exit status 1 when any run failed (after all of that is written), else 0."""
    from ..cli.args import write_json
    from .report import (
        DEFAULT_WORST_N,
        failures,
        format_report,
        primary,
        result_json,
        worst_cases,
        write_failed,
        write_worst,
    )
    from .runner import run_suite

    config = config_from_args(args)
    seeds = tuple(getattr(args, "recheck", None) or ())
    if seeds:
        from .recheck import check_recheck

        check_recheck(config, seeds)  # now, not after the suite's hours
    results = run_suite(config)
    worst = worst_cases(results, primary(config), int(getattr(args, "worst_n", None) or DEFAULT_WORST_N))
    worst_dir = getattr(args, "worst_dir", None)
    paths = write_worst(worst, Path(worst_dir), config, primary(config)) if worst_dir else []
    failed = failures(results)
    if worst_dir:
        write_failed(failed, Path(worst_dir) / "failed", config, primary(config))
    doc = result_json(results, config, worst, paths)
    if getattr(args, "json", None):  # saved before the report is formatted: a suite takes hours
        write_json(args.json, doc)
    print(format_report(results, config, worst, paths))
    if seeds:
        from .recheck import format_recheck, run_recheck

        rechecks = run_recheck(results, config, seeds)
        if getattr(args, "json", None):
            write_json(args.json, {**doc, "recheck": [c.as_dict() for c in rechecks]})
        print(format_recheck(rechecks, seeds))
    if failed:  # everything is written and reported; the exit status says the suite is incomplete
        print(f"{len(failed)} run(s) failed (listed under FAILED runs)", file=sys.stderr)
    return 1 if failed else 0
