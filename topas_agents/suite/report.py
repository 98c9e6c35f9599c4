"""The suite's verdict: ratio distributions, the worst cases (written as replayable YAMLs),
and the JSON document."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bench.options import options_record
from ..percentile import percentile
from .generate import workflow_to_dict, workflow_to_yaml
from .ratios import METRICS, Ratio, worst_load
from .reuse import profile_record
from .runner import KEPT_METRICS, SuiteConfig, WorkflowResult

# A ratio above this counts as a loss: 2% is about the seed-to-seed noise of a 60-task
# mean JCT in this simulator, so smaller excesses are not evidence of a worse policy.
LOSS_THRESHOLD = 1.02
DEFAULT_WORST_N = 5
FLOOR_LABEL = "(1 baseline)"
PERCENTILES = (10, 50, 90)


@dataclass(frozen=True, slots=True)
class Dist:
    n: int
    min: float | None
    p10: float | None
    p50: float | None
    p90: float | None
    max: float | None
    losses: int  # how many ratios exceed LOSS_THRESHOLD
    unknown: int  # ratios the bench could not compute (non-finite JCT)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def distribution(values: Sequence[float | None]) -> Dist:
    known = sorted(v for v in values if v is not None)
    unknown = len(values) - len(known)
    if not known:
        return Dist(0, None, None, None, None, None, 0, unknown)
    p10, p50, p90 = (percentile(known, q) for q in PERCENTILES)
    return Dist(len(known), known[0], p10, p50, p90, known[-1],
                sum(v > LOSS_THRESHOLD for v in known), unknown)


def distributions(results: Sequence[WorkflowResult], policy: str) -> dict[str, dict[str, Dist]]:
    """metric -> {"paper": over workflows, "per_load": over (workflow, load) pairs, and, when
    LPM ran, "vs_lpm": per load relative to LPM alone}."""
    out = {m: {"paper": distribution([r.paper[policy][m].ratio for r in results]),
               "per_load": distribution([x.ratio for r in results for x in r.per_load[policy][m]])}
           for m in METRICS}
    if results and all(r.vs_lpm for r in results):
        for m in METRICS:
            out[m]["vs_lpm"] = distribution([x.ratio for r in results for x in r.vs_lpm[policy][m]])
    return out


def floor_distributions(results: Sequence[WorkflowResult]) -> dict[str, Dist]:
    """metric -> the per-load distribution of the hindsight single-baseline pick
    (ratios.baseline_floor): what a perfect selector of stock policies would score."""
    return {m: distribution([x.ratio for r in results for x in r.floor[m]]) for m in METRICS}


@dataclass(frozen=True, slots=True)
class WorstCase:
    result: WorkflowResult
    metric: str
    at: Ratio  # the worst load's per-load ratio

    @property
    def name(self) -> str:
        return self.result.gen.workflow.name


def worst_cases(results: Sequence[WorkflowResult], policy: str, n: int) -> list[WorstCase]:
    """The `n` workflows whose worst per-load ratio (over both metrics) is highest."""
    cases = []
    for r in results:
        per_metric = [(m, worst_load(r.per_load[policy][m])) for m in METRICS]
        known = [(m, w) for m, w in per_metric if w is not None]
        if known:
            m, w = max(known, key=lambda mw: mw[1].ratio)
            cases.append(WorstCase(r, m, w))
    cases.sort(key=lambda c: (-c.at.ratio, c.result.gen.index))
    return cases[:n]


def _seed_avg(case: WorstCase, policy: str, key: str) -> float | None:
    vals = [by_load[case.at.load][policy][key] for by_load in case.result.runs.values()]
    return None if any(v is None for v in vals) else sum(vals) / len(vals)


def case_detail(case: WorstCase, policy: str) -> dict[str, Any]:
    """Seed-averaged diagnostics of the policy and the winning baseline at the worst load."""
    won = case.at.winner
    return {p: {k: _seed_avg(case, p, k) for k in KEPT_METRICS} for p in (policy, won) if p}


def replay_command(case: WorstCase, path: Path, config: SuiteConfig, policy: str) -> str:
    """Every arrival seed of the suite: the worst case's ratio is seed-averaged, so one seed's
    run does not reproduce it (`--seeds` runs each seed and prints each seed's table)."""
    seeds = sorted(config.seeds)
    seed_arg = f"--seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else f"--seed {seeds[0]}"
    return _bench_command(path, config, policy, case.at.load, seed_arg)


def _bench_command(path: Path, config: SuiteConfig, policy: str, load: float, seed_arg: str) -> str:
    """`topas bench` on one workflow as the suite ran it: its profile as given (a YAML path made
    absolute), KV budget, host tier and the replayed policies' options (the replay left these
    out, and a run with options or another tier did not reproduce)."""
    pols = tuple(dict.fromkeys((*config.baselines, policy)))
    profile = config.profile_arg or config.profile.name
    if Path(profile).suffix in (".yaml", ".yml"):
        profile = str(Path(profile).resolve())
    args = ["--workload", str(path), "--policies", ",".join(pols), "--load", f"{load:g}",
            "--tasks", str(config.tasks), *seed_arg.split(), "--profile", profile]
    if config.kv_budget is not None:
        args += ["--kv-budget", str(config.kv_budget)]
    tier = config.host_tier
    if tier is False:
        args.append("--no-host-tier")
    elif tier is True:
        args += ["--host-tier", "all"]
    elif tier is not None:
        args += ["--host-tier", tier.label]
    for name, opts in options_record(config.policy_options).items():
        if name in pols:
            args += [a for k, v in opts.items() for a in ("--policy-opt", f"{name}.{k}={v}")]
    return "topas bench " + shlex.join(args)


def write_worst(cases: Sequence[WorstCase], directory: Path, config: SuiteConfig, policy: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, case in enumerate(cases, 1):
        path = directory / f"{case.name}.yaml"
        header = (f"Worst case #{rank} of a random suite for {policy}: {case.metric} ratio "
                  f"{case.at.ratio:.3f} to {case.at.winner} at load {case.at.load:g} "
                  f"(seeds {','.join(map(str, config.seeds))}, {config.tasks} tasks, profile "
                  f"{config.profile.name}).\nReplay:\n  {replay_command(case, path, config, policy)}")
        path.write_text(workflow_to_yaml(case.result.gen.workflow, header))
        paths.append(path)
    return paths


@dataclass(frozen=True, slots=True)
class Failure:
    """A run that produced no metrics (e.g. the simulator found the policy stalled)."""

    result: WorkflowResult
    seed: int
    load: float
    policy: str
    error: str


def failures(results: Sequence[WorkflowResult]) -> list[Failure]:
    return [Failure(r, s, u, p, row["error"]) for r in results for s, by_load in r.runs.items()
            for u, by_policy in by_load.items() for p, row in by_policy.items() if row.get("error")]


def write_failed(fails: Sequence[Failure], directory: Path, config: SuiteConfig, policy: str) -> list[Path]:
    """The YAML of every workflow on which `policy` failed, with the failing run's replay
    (`directory` is created only then)."""
    paths: dict[str, Path] = {}
    for f in fails:
        name = f.result.gen.workflow.name
        if f.policy != policy or name in paths:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        path = paths[name] = directory / f"{name}.yaml"
        header = (f"{policy} FAILED on this random-suite workflow at load {f.load:g}, seed {f.seed}: {f.error}\n"
                  f"Replay:\n  {_bench_command(path, config, policy, f.load, f'--seed {f.seed}')}")
        path.write_text(workflow_to_yaml(f.result.gen.workflow, header))
    return list(paths.values())


def fmt_value(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def format_report(results: Sequence[WorkflowResult], config: SuiteConfig,
                  worst: Sequence[WorstCase], paths: Sequence[Path]) -> str:
    lines = [f"random suite: {len(results)} workflows x seeds {','.join(map(str, config.seeds))} x loads "
             f"{','.join(f'{u:g}' for u in config.loads)}, {config.tasks} tasks, profile {config.profile.name}, "
             f"KV budget {config.budget}; ratio = policy / best baseline ({', '.join(config.baselines)}); "
             f"loss = ratio > {LOSS_THRESHOLD}", ""]
    head = f"{'policy':<14}{'metric':<10}{'rule':<10}{'n':>5}{'min':>8}{'p10':>8}{'p50':>8}{'p90':>8}{'max':>8}{'>1.02':>7}"
    lines.append(head)
    rows = [(p, m, rule, d) for p in config.compared for m, rules in distributions(results, p).items()
            for rule, d in rules.items()]
    rows += [(FLOOR_LABEL, m, "per_load", d) for m, d in floor_distributions(results).items()]
    for p, m, rule, d in rows:
        lines.append(f"{p:<14}{m:<10}{rule:<10}{d.n:>5}{fmt_value(d.min):>8}{fmt_value(d.p10):>8}"
                     f"{fmt_value(d.p50):>8}{fmt_value(d.p90):>8}{fmt_value(d.max):>8}{d.losses:>7}")
    lines.append(f"{FLOOR_LABEL}: at each workflow and load the one baseline whose worse metric is "
                 "closest to the best baseline, picked with hindsight (a perfect selector of stock "
                 "policies); vs_lpm: per load, relative to LPM alone")
    if config.reuse is not None:
        lines.append(f"baselines' runs reused from {config.reuse}: {sum(r.reused for r in results)} of "
                     f"{len(results) * len(config.seeds) * len(config.loads) * len(config.baselines)}")
    fails = failures(results)
    if fails:
        lines += ["", f"FAILED runs ({len(fails)}; no metrics, not in the ratios above):"]
        lines += [f"  {f.result.gen.workflow.name} seed {f.seed} load {f.load:g} {f.policy}: {f.error}"
                  for f in fails]
    if worst:
        policy = primary(config)
        lines += ["", f"worst cases for {policy} (worst per-load ratio over mean/p99):"]
        for i, (case, path) in enumerate(zip(worst, paths or [None] * len(worst), strict=True), 1):
            paper = case.result.paper[policy]
            lines.append(f"{i}. {case.name} ({case.result.gen.shape}, {len(case.result.gen.workflow.agents)} agents, "
                         f"prefixes {case.result.gen.prefix_ratio:.2f}x budget): {case.metric} {case.at.ratio:.3f} "
                         f"vs {case.at.winner} at load {case.at.load:g}; paper rule mean "
                         f"{fmt_value(paper['mean_jct'].ratio)} p99 {fmt_value(paper['p99_jct'].ratio)}"
                         + (f" -> {path}" if path else ""))
            for p, d in case_detail(case, policy).items():
                lines.append("     " + f"{p:<12} " + "  ".join(f"{k}={fmt_value(v, '.3g')}" for k, v in d.items()))
    return "\n".join(lines)


def primary(config: SuiteConfig) -> str:
    """The policy the worst cases are about: `topas` when run, else the first judged one."""
    return "topas" if "topas" in config.compared else config.compared[0]


def _ratio_json(r: Ratio) -> dict[str, Any]:
    out: dict[str, Any] = {"ratio": r.ratio, "winner": r.winner, "winners": list(r.winners)}
    if r.ci95 is not None:
        out["ci95"] = list(r.ci95)
    if r.load is not None:
        out["load"] = r.load
    return out


def _workflow_json(r: WorkflowResult) -> dict[str, Any]:
    g = r.gen
    return {"index": g.index, "name": g.workflow.name, "shape": g.shape, "agents": len(g.workflow.agents),
            "stages": len(g.workflow.stages), "prefix_ratio": g.prefix_ratio,
            "workflow": workflow_to_dict(g.workflow),
            "runs": {str(s): {f"{u:g}": pol for u, pol in by_load.items()} for s, by_load in r.runs.items()},
            "paper": {p: {m: _ratio_json(x) for m, x in ms.items()} for p, ms in r.paper.items()},
            "per_load": {p: {m: [_ratio_json(x) for x in xs] for m, xs in ms.items()} for p, ms in r.per_load.items()},
            "vs_lpm": {p: {m: [_ratio_json(x) for x in xs] for m, xs in ms.items()} for p, ms in r.vs_lpm.items()},
            "baseline_floor": {m: [_ratio_json(x) for x in xs] for m, xs in r.floor.items()}}


def result_json(results: Sequence[WorkflowResult], config: SuiteConfig, worst: Sequence[WorstCase],
                paths: Sequence[Path]) -> dict[str, Any]:
    policy = primary(config)
    return {
        "suite": "random", "gen_seed": config.gen_seed, "seeds": list(config.seeds), "loads": list(config.loads),
        "tasks": config.tasks, "profile": config.profile.name, "profile_values": profile_record(config.profile),
        "kv_budget": config.budget,
        "host_tier": getattr(config.host_tier, "label", config.host_tier),
        "policies": list(config.policies),
        "policy_options": options_record(config.policy_options),
        "loss_threshold": LOSS_THRESHOLD,
        # --reuse: the file the baselines' runs came from, and how many (suite.reuse)
        "reused": None if config.reuse is None else {"file": str(config.reuse),
                                                     "runs": sum(r.reused for r in results)},
        "distribution": {p: {m: {k: d.as_dict() for k, d in rules.items()}
                             for m, rules in distributions(results, p).items()} for p in config.compared},
        "baseline_floor": {m: d.as_dict() for m, d in floor_distributions(results).items()},
        "failures": [{"workflow": f.result.gen.workflow.name, "shape": f.result.gen.shape, "seed": f.seed,
                      "load": f.load, "policy": f.policy, "error": f.error} for f in failures(results)],
        "worst": [{"workflow": c.name, "shape": c.result.gen.shape, "metric": c.metric, "load": c.at.load,
                   "ratio": c.at.ratio, "winner": c.at.winner, "detail": case_detail(c, policy),
                   "yaml": str(p) if p else None}
                  for c, p in zip(worst, list(paths) or [None] * len(worst), strict=True)],
        "workflows": [_workflow_json(r) for r in results],
    }
