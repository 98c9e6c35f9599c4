"""`topas docs`: regenerate the results page (docs/results.md, docs/results/*.json|png).

Runs the bench on every built-in paper workload at its default loads with every baseline,
Topas and its ablations (those importable), then writes one markdown table per workload.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from ..costmodel import DEFAULT_PROFILE, load_profile
from ..errors import ConfigError
from ..policies import BASELINES
from .args import positive_int

WORKLOADS = ("chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl")
TOPAS = ("topas", "topas-base", "topas-noreuse", "topas-noaging")
DEFAULT_TASKS = 100
QUICK_TASKS = 20


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("docs", help="regenerate the results page (docs/results.md)",
                              description="Bench every built-in workload at its default loads with all "
                              "policies and write docs/results.md, docs/results/*.json and *.png.")
    p.add_argument("--out", default="docs/results.md", help="markdown page to write (default docs/results.md); "
                   "JSON and plots go to a results/ folder next to it")
    p.add_argument("--tasks", type=positive_int, help=f"tasks per run (default {DEFAULT_TASKS}; --quick: {QUICK_TASKS})")
    p.add_argument("--quick", action="store_true", help=f"a fast smoke run ({QUICK_TASKS} tasks per run)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated workflows (default: all five)")
    p.add_argument("--policies", help="comma-separated policies (default: baselines, topas and its ablations)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"cost profile (default {DEFAULT_PROFILE})")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def _policies(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(policies to run, default policies skipped because they are not importable)."""
    from ..bench.options import parse_policy_list
    from ..bench.runner import build_policy

    if args.policies:
        names = parse_policy_list(args.policies)
        for name in names:
            build_policy(name)  # explicit requests must work
        return names, ()
    ok, missing = [], []
    for name in (*BASELINES, *TOPAS):
        try:
            build_policy(name)
            ok.append(name)
        except ConfigError:
            missing.append(name)
    return tuple(ok), tuple(missing)


def _prepare_out(out: Path) -> Path:
    results = out.parent / "results"
    try:
        if out.is_dir():
            raise ConfigError(f"--out {out}: is a directory")
        results.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create {results}: {exc.strerror or exc}") from None
    return results


def run(args: argparse.Namespace) -> int:
    from ..bench.report import plot_result
    from ..bench.results_page import render_page
    from ..bench.runner import BenchConfig, capacity_for, run_bench
    from ..workflow import load_workflow

    workflows = [load_workflow(w.strip()) for w in args.workloads.split(",")]
    policies, missing = _policies(args)
    profile = load_profile(args.profile)
    tasks = args.tasks or (QUICK_TASKS if args.quick else DEFAULT_TASKS)
    out = Path(args.out)
    results_dir = _prepare_out(out)
    if missing:
        print(f"note: skipping unavailable policies: {', '.join(missing)}", file=sys.stderr)
    show = not args.no_progress and sys.stderr.isatty()
    entries = []
    for wf in workflows:
        config = BenchConfig(policies=policies, profile=profile, workflow=wf, tasks=tasks, seed=args.seed)
        print(f"bench {wf.name}: loads {list(wf.loads)}, {len(policies)} policies, {tasks} tasks", file=sys.stderr)
        result = run_bench(config, progress=show)
        stem = wf.name
        _write(results_dir / f"{stem}.json", json.dumps(result, indent=2, allow_nan=False) + "\n")
        plot_result(result, results_dir / f"{stem}.png")
        entries.append((result, wf.description, capacity_for(config), stem))
    page = render_page(entries, command=_command(args), policies=policies, missing=missing)
    _write(out, page)
    print(f"wrote {out} and {results_dir}/*.json, *.png")
    return 0


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


def _command(args: argparse.Namespace) -> str:
    """The command line that regenerates this page (non-default options only)."""
    parts = ["topas", "docs"]
    if args.out != "docs/results.md":
        parts += ["--out", args.out]
    if args.quick:
        parts.append("--quick")
    if args.tasks:
        parts += ["--tasks", str(args.tasks)]
    if args.workloads != ",".join(WORKLOADS):
        parts += ["--workloads", args.workloads]
    if args.policies:
        parts += ["--policies", args.policies]
    if args.profile != DEFAULT_PROFILE:
        parts += ["--profile", args.profile]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    return " ".join(shlex.quote(p) for p in parts)
