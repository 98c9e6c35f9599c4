"""`run_bench`: every policy on the same arrival trace at each operating point, plus the
oracle lower bound, as one JSON-ready dict (schema in `docs` and `topas bench --help`);
`run_seeds`: the same over several seeds with the paper rule's mean and 95% CI over seeds;
`run_many`: several benches' runs in one process pool (`topas docs`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..costmodel import Profile
from ..errors import ConfigError
from ..workflow import TaskPlan, Workflow
from .aggregate import over_seeds, paper_rule
from .capacity import capacity_of_tasks, capacity_rps, rate_for_load
from .hosttier import HostTier, resolve_host_tier
from .jobs import RESULT_KEYS, RunFailure, RunJob, SimBackend, build_policy, default_backend, finite, run_jobs
from .lower_bound import lower_bound
from .options import options_record
from .protocol import LIMITS, check_range
from .trace import redraw_arrivals
from .work import check_fits

__all__ = ["RESULT_KEYS", "BenchConfig", "SimBackend", "build_policy", "capacity_for", "default_backend",
           "plan_points", "run_bench", "run_many", "run_seeds", "summarize"]


@dataclass(frozen=True)
class BenchConfig:
    """What to run. Give `workflow` (synthetic Poisson traces) or `recorded` (a replayed
    trace, `workload` then names it). Give `rates` or `loads`, or neither: the workflow's
    default loads (recorded traces: their own arrivals). `extra_rates` are added to the
    loads' points (the paper's stated operating points). `host_tier`: a `HostTier` setup,
    a bool for every policy, or None for the profile's setting. `task_jcts`: put every
    task's JCT in the results (for CDFs)."""

    policies: tuple[str, ...]
    profile: Profile
    workflow: Workflow | None = None
    recorded: tuple[TaskPlan, ...] | None = None
    workload: str | None = None
    rates: tuple[float, ...] = ()
    loads: tuple[float, ...] = ()
    extra_rates: tuple[float, ...] = ()
    tasks: int = 100
    seed: int = 0
    kv_budget: int | None = None
    host_tier: HostTier | bool | None = None
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    check: bool = False
    task_jcts: bool = False

    @property
    def budget(self) -> int:
        return self.profile.kv_budget_tokens if self.kv_budget is None else self.kv_budget

    @property
    def name(self) -> str:
        if self.workload:
            return self.workload
        return self.workflow.name if self.workflow else "trace"

    @property
    def host_setup(self) -> HostTier:
        return resolve_host_tier(self.host_tier, self.profile.host_tier)


@dataclass(frozen=True, slots=True)
class Point:
    rate: float
    load: float | None
    trace: tuple[TaskPlan, ...]


def validate_config(config: BenchConfig) -> None:
    """ConfigError (one line) for a bench configuration that cannot run, before any runs."""
    if (config.workflow is None) == (config.recorded is None):
        raise ConfigError("give exactly one of a workflow or a recorded trace")
    if config.rates and config.loads:
        raise ConfigError("give rates or loads, not both")
    if not config.policies:
        raise ConfigError("no policies to run")
    if config.tasks <= 0:
        raise ConfigError(f"tasks must be positive, got {config.tasks}")
    check_range((config.tasks,), LIMITS.tasks, "tasks")
    check_range(config.rates + config.extra_rates, LIMITS.rate, "rate", " tasks/s")
    check_range(config.loads, LIMITS.load, "load")
    if config.workflow is not None and not (config.loads or config.rates):
        # the workflow file's own `loads:` stand in for --load: the same range (1e-300 never
        # finished, 1e18 reported JCTs below the lower bound)
        check_range(config.workflow.loads, LIMITS.load, f"workflow {config.workflow.name!r} `loads:`")
    if config.budget <= 0:
        raise ConfigError(f"KV budget must be positive, got {config.budget}")
    if config.workflow is not None:
        check_fits(config.workflow, config.budget)
    else:  # recorded calls: each must fit as recorded (their stage ranges come from the records)
        for wf in {id(t.workflow): t.workflow for t in config.recorded or ()}.values():
            check_fits(wf, config.budget)
    for name in config.policies:  # fail before any simulation, not halfway through
        build_policy(name, config.policy_options.get(name))


def plan_points(config: BenchConfig, backend: SimBackend) -> list[Point]:
    """The operating points and their traces (one trace per rate, shared by all policies)."""
    if config.recorded is not None:
        tasks = config.recorded[: config.tasks]
        if not (config.rates or config.loads or config.extra_rates):
            span = tasks[-1].arrival_s - tasks[0].arrival_s
            rate = (len(tasks) - 1) / span if len(tasks) > 1 and span > 0 else math.nan
            return [Point(rate, None, tuple(tasks))]
        points = []
        if config.loads:
            cap = capacity_of_tasks(tasks, config.profile, config.budget)
            points += [Point(rate_for_load(u, cap), u, redraw_arrivals(tasks, rate_for_load(u, cap), config.seed))
                       for u in config.loads]
        points += [Point(r, None, redraw_arrivals(tasks, r, config.seed)) for r in config.rates + config.extra_rates]
        return _sorted_unique(points) if config.extra_rates else points
    wf = config.workflow
    assert wf is not None
    if config.rates:
        pairs = [(r, None) for r in config.rates]
    else:
        cap = capacity_rps(wf, config.profile, config.budget)
        pairs = [(rate_for_load(u, cap), u) for u in (config.loads or wf.loads)]
    pairs += [(r, None) for r in config.extra_rates]
    points = [Point(r, u, tuple(backend.make_trace(wf, config.tasks, r, config.seed))) for r, u in pairs]
    return _sorted_unique(points) if config.extra_rates else points


def _sorted_unique(points: list[Point]) -> list[Point]:
    """Points by rate, a stated rate equal to a load's rate counted once (the load's)."""
    seen: dict[float, Point] = {}
    for p in points:
        seen.setdefault(round(p.rate, 12), p)
    return sorted(seen.values(), key=lambda p: p.rate)


def _point_jobs(index: tuple[int, int], point: Point, config: BenchConfig) -> list[RunJob]:
    setup = config.host_setup
    return [RunJob((*index, name), name, dict(config.policy_options.get(name) or {}), point.trace,
                   config.profile, config.kv_budget, setup.has(name), config.check, config.task_jcts)
            for name in config.policies]


def _point_doc(point: Point, config: BenchConfig, rows: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    lb = lower_bound(point.trace, config.profile, config.budget)
    results: dict[str, Any] = {}
    for name in rows:
        row = dict(rows[name])
        mean = row["mean_jct"]
        row["gap"] = finite(mean / lb.mean_jct - 1) if lb.mean_jct > 0 and mean is not None else None
        results[name] = row
    return {"rate": finite(point.rate), "load": point.load,
            "lower_bound": {k: finite(v) for k, v in lb.as_dict().items()}, "results": results}


def summarize(points: Sequence[Mapping[str, Any]], policies: Sequence[str]) -> dict[str, Any]:
    """The paper rule (`aggregate.paper_rule`, section V-A) over one seed's points: per policy
    the mean over points of mean/p99 JCT and ratios of those averages to the baseline with the
    lowest average (`best_baseline` for mean JCT, `best_baseline_p99` for p99)."""
    return paper_rule(points, policies)


def _header(config: BenchConfig, tasks: int) -> dict[str, Any]:
    return {"workload": config.name, "profile": config.profile.name, "tasks": tasks,
            "capacity_rps": finite(capacity_for(config)),
            "host_tier": {"setup": config.host_setup.label,
                          "policies": config.host_setup.per_policy(config.policies)},
            "policy_options": options_record(config.policy_options)}


def run_many(configs: Sequence[BenchConfig], *, backend: SimBackend | None = None, jobs: int = 1,
             progress: bool = False, keep_going: bool = False) -> list[dict[str, Any]]:
    """`run_bench` of each config, all runs in one pool of `jobs` workers; same order.
    `keep_going`: a policy whose run fails anywhere is left out of every point and summary,
    and each document lists its runs that failed under `failures` (else the first failure
    ends the bench, and every finished run was lost with it)."""
    for config in configs:
        validate_config(config)
    maker = backend or default_backend()
    plans = [plan_points(c, maker) for c in configs]
    work = [job for i, (c, pts) in enumerate(zip(configs, plans, strict=True))
            for j, pt in enumerate(pts) for job in _point_jobs((i, j), pt, c)]
    failures: list[RunFailure] | None = [] if keep_going else None
    rows = run_jobs(work, workers=jobs, backend=backend, progress=progress, failures=failures)
    failed = {f.policy for f in failures or ()}
    docs = []
    for i, (config, points) in enumerate(zip(configs, plans, strict=True)):
        kept = tuple(n for n in config.policies if n not in failed)
        pts = [_point_doc(pt, config, {n: rows[(i, j, n)] for n in kept}) for j, pt in enumerate(points)]
        head = _header(config, len(points[0].trace))
        doc = {"workload": head.pop("workload"), "profile": head.pop("profile"), "seed": config.seed,
               **head, "points": pts, "summary": summarize(pts, kept) if kept else {}}
        if failures:
            doc["failures"] = [{"policy": f.policy, "seed": config.seed, "rate": finite(points[f.key[1]].rate),
                                "load": points[f.key[1]].load, "error": f.error}
                               for f in sorted(failures) if f.key[0] == i]
        docs.append(doc)
    return docs


def run_bench(config: BenchConfig, *, backend: SimBackend | None = None, progress: bool = False,
              jobs: int = 1, keep_going: bool = False) -> dict[str, Any]:
    """Run every policy at every point; returns the bench JSON document."""
    return run_many([config], backend=backend, jobs=jobs, progress=progress, keep_going=keep_going)[0]


def seeds_document(config: BenchConfig, per_seed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One JSON over seeds: per-seed points and summaries, and `over_seeds` (per policy the
    paper-rule ratios' mean over seeds with a 95% t interval; see `aggregate`)."""
    head = _header(config, per_seed[0]["tasks"])
    doc = {"workload": head.pop("workload"), "profile": head.pop("profile"),
           "seeds": [d["seed"] for d in per_seed], **head,
           "per_seed": [{"seed": d["seed"], "points": d["points"], "summary": d["summary"]} for d in per_seed],
           "over_seeds": over_seeds([d["summary"] for d in per_seed])}
    failures = [f for d in per_seed for f in d.get("failures", ())]
    if failures:
        doc["failures"] = failures
    return doc


def run_seeds(config: BenchConfig, seeds: Sequence[int], *, backend: SimBackend | None = None,
              jobs: int = 1, progress: bool = False, keep_going: bool = False) -> dict[str, Any]:
    """`run_bench` at each seed (each its own traces), as one `seeds_document`."""
    if not seeds:
        raise ConfigError("no seeds to run")
    per_seed = run_many([replace(config, seed=s) for s in seeds], backend=backend, jobs=jobs, progress=progress,
                        keep_going=keep_going)
    return seeds_document(config, per_seed)


def capacity_for(config: BenchConfig) -> float:
    """The capacity `--load` is relative to, for display."""
    if config.recorded is not None:
        return capacity_of_tasks(config.recorded[: config.tasks], config.profile, config.budget)
    assert config.workflow is not None
    return capacity_rps(config.workflow, config.profile, config.budget)
