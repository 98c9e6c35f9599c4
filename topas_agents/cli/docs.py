"""`topas docs`: regenerate the results page (docs/results.md, docs/results/*.json|png).

Runs the `paper` protocol (bench/protocol.py: seeds 0-4, 200 tasks, each workload's default
loads plus the rates the paper states) on every built-in workload under both host-tier setups
(`all`: symmetric; `paper`: only Topas variants have the CPU tier), plus the Fig. 5 ablation,
and writes the paper rule over seeds with 95% CIs. The benches run one after another, each
over a process pool of `--jobs` workers, so that stderr can say which one runs and how many
are done (`DocsProgress`); results do not depend on the number of workers, nor on the order.
Every command the page prints reproduces what it shows, options included.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from ..bench.hosttier import ALL, PAPER
from ..bench.protocol import ABLATION_POLICIES, ABLATION_RATE, ABLATION_WORKLOAD, PROTOCOLS
from ..costmodel import DEFAULT_PROFILE, load_profile
from ..errors import ConfigError
from ..policies import BASELINES, PEERS
from .args import check_output, positive_int
from .docs_progress import DocsProgress

WORKLOADS = ("chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl")
PROTOCOL = PROTOCOLS["paper"]
DEFAULT_POLICIES = (*BASELINES, *PEERS, "topas", "topas-paper")
SETUPS = {"all": ALL, "paper": PAPER}
QUICK_TASKS = 20
QUICK_SEEDS = (0, 1)
# A `--quick` run of every workload, policy and setup on one core, as users timed it; the
# benches differ widely (dag10wide and the MetaGPT workloads take the most), and the progress
# lines on stderr give the elapsed time as it goes.
QUICK_DURATION = "about 40 min on one core; --jobs N divides it"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("docs", help="regenerate the results page (docs/results.md)",
                              description="Bench every built-in workload (paper protocol) under both host-tier "
                              "setups and write docs/results.md, docs/results/*.json and *.png.")
    p.add_argument("--out", default="docs/results.md", help="markdown page to write (default docs/results.md); "
                   "JSON and plots go to a results/ folder next to it")
    p.add_argument("--tasks", type=positive_int, help=f"tasks per run (default {PROTOCOL.tasks}; --quick: {QUICK_TASKS})")
    p.add_argument("--seeds", help="comma-separated seeds (default "
                   f"{','.join(map(str, PROTOCOL.seeds))}; --quick: {','.join(map(str, QUICK_SEEDS))})")
    p.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_TASKS} tasks, seeds "
                   f"{','.join(map(str, QUICK_SEEDS))} ({QUICK_DURATION}; the full run takes many times that)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated workflows (default: all five)")
    p.add_argument("--policies", help=f"comma-separated policies (default {','.join(DEFAULT_POLICIES)})")
    p.add_argument("--setups", default="all,paper", help="host-tier setups to report: all, paper or both (default)")
    p.add_argument("--no-ablation", action="store_true", help="skip the Fig. 5 ablation run")
    p.add_argument("--task-jcts", action="store_true", help="keep every task's JCT in the JSON (for CDFs; ~2 MB)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"cost profile (default {DEFAULT_PROFILE})")
    p.add_argument("--jobs", type=positive_int, default=1, help="parallel simulator processes (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr (by default a bar on a "
                   "terminal, else a line as each bench starts)")
    p.set_defaults(run=run)


def _available(names: tuple[str, ...], explicit: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(policies to run, policies skipped because they do not build). Explicit requests must
    build (a one-line error otherwise); defaults that do not are skipped with a note."""
    from ..bench.runner import build_policy

    ok, missing = [], []
    for name in names:
        try:
            build_policy(name)
            ok.append(name)
        except ConfigError:
            if explicit:
                raise
            missing.append(name)
    return tuple(ok), tuple(missing)


def _results_dir(out: Path) -> Path:
    """Where the JSON and plots go: a results/ folder next to the page. Checked before the
    runs: a page that is (or would be) that folder failed only after all of them."""
    results = out.parent / "results"
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory")
    if out == results:
        raise ConfigError(f"--out {out}: the page cannot be the results folder it writes beside it")
    return results


def _make_dir(results: Path, out: Path) -> Path | None:
    """Create `results` (and its missing parents); returns the topmost folder created, for
    `_remove_if_empty` after a failed run (None if it all existed)."""
    created = next((d for d in reversed((results, *results.parents)) if not d.exists()), None)
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create {results}: {exc.strerror or exc}") from None
    return created


def _remove_if_empty(top: Path | None, results: Path) -> None:
    """Undo `_make_dir` after a failed run: the folders it created, if nothing was written."""
    if top is None:
        return
    for d in (results, *results.parents):
        try:
            d.rmdir()  # only an empty folder goes
        except OSError:
            return
        if d == top:
            return


def _names(text: str, flag: str) -> list[str]:
    """A comma-separated list without blanks or repeats (a repeat ran and was reported twice)."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise ConfigError(f"{flag}: empty name in {text!r}")
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise ConfigError(f"{flag}: '{dup}' given twice")
    return names


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    from ..bench.options import parse_policy_list, parse_seed_list
    from ..workflow import load_workflow

    names = parse_policy_list(args.policies) if args.policies else DEFAULT_POLICIES
    policies, missing = _available(names, explicit=bool(args.policies))
    setups = _names(args.setups, "--setups")
    for s in setups:
        if s not in SETUPS:
            raise ConfigError(f"--setups: expected all and/or paper, got {s!r}")
    seeds = parse_seed_list(args.seeds) if args.seeds else (QUICK_SEEDS if args.quick else PROTOCOL.seeds)
    ablation = () if args.no_ablation else _available(ABLATION_POLICIES, explicit=False)[0]
    return {"workflows": [load_workflow(w) for w in _names(args.workloads, "--workloads")], "policies": policies,
            "missing": missing, "setups": setups, "seeds": seeds, "ablation": ablation,
            "tasks": args.tasks or (QUICK_TASKS if args.quick else PROTOCOL.tasks)}


def run(args: argparse.Namespace) -> int:
    plan = _plan(args)
    profile, out = load_profile(args.profile), Path(args.out)
    results_dir = _results_dir(out)
    created = _make_dir(results_dir, out)
    try:
        check_output("--out", out)  # the page itself, before the runs (now that its folder exists)
        _run_plan(args, plan, profile, out, results_dir)
    except BaseException:  # an interrupted or failed run leaves no empty folders behind
        _remove_if_empty(created, results_dir)
        raise
    return 0


def _run_plan(args: argparse.Namespace, plan: dict[str, Any], profile: Any, out: Path, results_dir: Path) -> None:
    from dataclasses import replace

    from ..bench.report import plot_result
    from ..bench.results_page import Entry, render_page
    from ..bench.runner import BenchConfig, run_many, seeds_document, validate_config

    seeds = plan["seeds"]
    if plan["missing"]:
        print(f"note: skipping unavailable policies: {', '.join(plan['missing'])}", file=sys.stderr)
    groups: list[tuple[str, str, BenchConfig]] = []  # (setup, stem, config at seed 0)
    for label in plan["setups"]:
        for wf in plan["workflows"]:
            groups.append((label, f"{wf.name}-{label}", BenchConfig(
                policies=plan["policies"], profile=profile, workflow=wf, tasks=plan["tasks"],
                extra_rates=PROTOCOL.rates_for(wf.name), host_tier=SETUPS[label])))
    if len(plan["ablation"]) > 1:
        from ..workflow import load_workflow
        groups.append(("ablation", f"ablation-{ABLATION_WORKLOAD}", BenchConfig(
            policies=plan["ablation"], profile=profile, workflow=load_workflow(ABLATION_WORKLOAD),
            tasks=plan["tasks"], rates=(ABLATION_RATE,), host_tier=PAPER)))
    for _, _, config in groups:  # every bench is checked before the first runs (they run one by one)
        validate_config(config)
    print(f"docs: {len(groups)} benches x {len(seeds)} seeds, {plan['tasks']} tasks per run, "
          f"{args.jobs} job(s)", file=sys.stderr)
    docs = []  # written only once every bench has run: a failed or interrupted run changes no file
    with DocsProgress(len(groups), enabled=not args.no_progress) as progress:
        for _, stem, config in groups:
            with progress.bench(stem, f"seeds {','.join(map(str, seeds))}, {len(config.policies)} policies"):
                runs = run_many([replace(config, seed=s, task_jcts=args.task_jcts) for s in seeds],
                                jobs=args.jobs, progress=progress.bars)
            docs.append(seeds_document(config, runs))
    setups: dict[str, list[Entry]] = {}
    ablation = None
    for (label, stem, config), doc in zip(groups, docs, strict=True):
        _write(results_dir / f"{stem}.json", json.dumps(doc, indent=1, allow_nan=False) + "\n")
        plot_result(doc, results_dir / f"{stem}.png")
        if label == "ablation":
            ablation = (doc, _ablation_command(args, plan), stem)
        else:
            assert config.workflow is not None
            setups.setdefault(label, []).append(Entry(doc, config.workflow.description, stem))
    page = render_page(setups, command=_command(args), policies=plan["policies"], missing=plan["missing"],
                       ablation=ablation)
    _write(out, page)
    print(f"wrote {out} and {results_dir}/*.json, *.png")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


def _ablation_command(args: argparse.Namespace, plan: dict[str, Any]) -> str:
    """The `topas bench` command that reruns the ablation as `_run_plan` ran it: its policies,
    seeds and tasks, the `paper` host tier (bench's default is the profile's, for every policy)
    and this run's --profile (without it the printed command benched another profile)."""
    parts = ["topas", "bench", "--workload", ABLATION_WORKLOAD, "--rate", str(ABLATION_RATE),
             "--policies", ",".join(plan["ablation"]), "--seeds", ",".join(map(str, plan["seeds"])),
             "--tasks", str(plan["tasks"]), "--host-tier", PAPER.label]
    if args.profile != DEFAULT_PROFILE:
        parts += ["--profile", args.profile]
    if args.task_jcts:
        parts.append("--task-jcts")
    return shlex.join(parts)


def _command(args: argparse.Namespace) -> str:
    """The command line that regenerates this page (non-default options only)."""
    parts = ["topas", "docs"]
    if args.out != "docs/results.md":
        parts += ["--out", args.out]
    if args.quick:
        parts.append("--quick")
    for flag, value, default in (("--tasks", args.tasks, None), ("--seeds", args.seeds, None),
                                 ("--workloads", args.workloads, ",".join(WORKLOADS)),
                                 ("--policies", args.policies, None), ("--setups", args.setups, "all,paper"),
                                 ("--profile", args.profile, DEFAULT_PROFILE)):
        if value is not None and value != default:
            parts += [flag, str(value)]
    parts += [flag for flag, on in (("--no-ablation", args.no_ablation), ("--task-jcts", args.task_jcts)) if on]
    return shlex.join(parts)
