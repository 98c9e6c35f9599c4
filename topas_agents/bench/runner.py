"""`run_bench`: every policy on the same arrival trace at each operating point, plus the
oracle lower bound, as one JSON-ready dict (schema in `docs` and `topas bench --help`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..costmodel import Profile
from ..errors import ConfigError, TopasError
from ..policies import BASELINES, Policy, make_policy
from ..workflow import TaskPlan, Workflow
from .capacity import capacity_of_tasks, capacity_rps, rate_for_load
from .lower_bound import lower_bound
from .progress import ProgressBar
from .trace import redraw_arrivals
from .work import check_fits

RESULT_KEYS = ("mean_jct", "p99_jct", "first_task_s", "throughput_rps", "mean_batch",
               "prefix_swaps", "preemptions", "decision_ms_mean", "decision_ms_p99")


@dataclass(frozen=True, slots=True)
class SimBackend:
    """The simulator entry points (injectable so the bench logic is testable alone)."""

    make_trace: Callable[..., tuple[TaskPlan, ...]]
    simulate: Callable[..., Any]


def default_backend() -> SimBackend:
    try:
        from ..sim import make_trace, simulate
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("topas_agents.sim"):
            raise ConfigError("the simulator (topas_agents.sim) is not available in this install") from None
        raise
    return SimBackend(make_trace, simulate)


@dataclass(frozen=True)
class BenchConfig:
    """What to run. Give `workflow` (synthetic Poisson traces) or `recorded` (a replayed
    trace, `workload` then names it). Give `rates` or `loads`, or neither: the workflow's
    default loads (recorded traces: their own arrivals)."""

    policies: tuple[str, ...]
    profile: Profile
    workflow: Workflow | None = None
    recorded: tuple[TaskPlan, ...] | None = None
    workload: str | None = None
    rates: tuple[float, ...] = ()
    loads: tuple[float, ...] = ()
    tasks: int = 100
    seed: int = 0
    kv_budget: int | None = None
    host_tier: bool | None = None
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    check: bool = False

    @property
    def budget(self) -> int:
        return self.profile.kv_budget_tokens if self.kv_budget is None else self.kv_budget

    @property
    def name(self) -> str:
        if self.workload:
            return self.workload
        return self.workflow.name if self.workflow else "trace"


@dataclass(frozen=True, slots=True)
class Point:
    rate: float
    load: float | None
    trace: tuple[TaskPlan, ...]


def build_policy(name: str, options: Mapping[str, Any] | None = None) -> Policy:
    """`make_policy` with every failure turned into a one-line ConfigError."""
    opts = dict(options or {})
    try:
        return make_policy(name, opts)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"policy '{name}' is not available yet (module '{exc.name}' is missing)") from None
    except AttributeError as exc:
        raise ConfigError(f"policy '{name}' is not available yet ({exc})") from None
    except TopasError as exc:
        raise ConfigError(f"policy '{name}': {exc}") from None
    except (TypeError, ValueError) as exc:  # factories reject unknown/ill-typed options so
        raise ConfigError(f"policy '{name}' options {opts}: {exc}") from None


def _validate(config: BenchConfig) -> None:
    if (config.workflow is None) == (config.recorded is None):
        raise ConfigError("give exactly one of a workflow or a recorded trace")
    if config.rates and config.loads:
        raise ConfigError("give rates or loads, not both")
    if not config.policies:
        raise ConfigError("no policies to run")
    if config.tasks <= 0:
        raise ConfigError(f"tasks must be positive, got {config.tasks}")
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
        if config.rates:
            return [Point(r, None, redraw_arrivals(tasks, r, config.seed)) for r in config.rates]
        if config.loads:
            cap = capacity_of_tasks(tasks, config.profile, config.budget)
            return [Point(rate_for_load(u, cap), u, redraw_arrivals(tasks, rate_for_load(u, cap), config.seed))
                    for u in config.loads]
        span = tasks[-1].arrival_s - tasks[0].arrival_s
        rate = (len(tasks) - 1) / span if len(tasks) > 1 and span > 0 else math.nan
        return [Point(rate, None, tuple(tasks))]
    wf = config.workflow
    assert wf is not None
    if config.rates:
        pairs = [(r, None) for r in config.rates]
    else:
        cap = capacity_rps(wf, config.profile, config.budget)
        pairs = [(rate_for_load(u, cap), u) for u in (config.loads or wf.loads)]
    return [Point(r, u, tuple(backend.make_trace(wf, config.tasks, r, config.seed))) for r, u in pairs]


def _finite(x: Any) -> Any:
    """JSON has no NaN/inf: report them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _run_point(point: Point, config: BenchConfig, backend: SimBackend, bar: ProgressBar) -> dict[str, Any]:
    lb = lower_bound(point.trace, config.profile, config.budget)
    results: dict[str, Any] = {}
    for name in config.policies:
        policy = build_policy(name, config.policy_options.get(name))
        run = backend.simulate(point.trace, policy, config.profile, kv_budget=config.kv_budget,
                               host_tier=config.host_tier, check=config.check,
                               progress=bar.run_callback(f"{name} @ {point.rate:.3g}/s"))
        metrics = run.as_dict()
        row = {k: _finite(metrics[k]) for k in RESULT_KEYS}
        mean = metrics["mean_jct"]
        row["gap"] = _finite(mean / lb.mean_jct - 1) if lb.mean_jct > 0 else None
        results[name] = row
    return {"rate": _finite(point.rate), "load": point.load,
            "lower_bound": {k: _finite(v) for k, v in lb.as_dict().items()}, "results": results}


def _avg(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals and len(vals) == len(values) else None


def summarize(points: Sequence[Mapping[str, Any]], policies: Sequence[str]) -> dict[str, Any]:
    """Per policy: mean over points of mean/p99 JCT, and ratios to the best baseline for that
    metric (`best_baseline`: lowest average mean JCT; `best_baseline_p99`: lowest average p99)."""
    avg = {p: {"mean_jct": _avg([pt["results"][p]["mean_jct"] for pt in points]),
               "p99_jct": _avg([pt["results"][p]["p99_jct"] for pt in points])} for p in policies}
    best: dict[str, str | None] = {}
    for key in ("mean_jct", "p99_jct"):
        ranked = [b for b in BASELINES if b in avg and avg[b][key] is not None]
        best[key] = min(ranked, key=lambda b, k=key: avg[b][k]) if ranked else None
    out: dict[str, Any] = {}
    for p, a in avg.items():
        ratio = {}
        for key in ("mean_jct", "p99_jct"):
            ref = avg[best[key]][key] if best[key] else None
            ratio[key] = a[key] / ref if a[key] is not None and ref else None
        out[p] = {**a, "best_baseline": best["mean_jct"], "best_baseline_p99": best["p99_jct"],
                  "mean_jct_vs_best_baseline": ratio["mean_jct"],
                  "p99_jct_vs_best_baseline": ratio["p99_jct"]}
    return out


def run_bench(config: BenchConfig, *, backend: SimBackend | None = None,
              progress: bool = False) -> dict[str, Any]:
    """Run every policy at every point; returns the bench JSON document."""
    _validate(config)
    backend = backend or default_backend()
    points = plan_points(config, backend)
    total = sum(len(p.trace) for p in points) * len(config.policies)
    with ProgressBar(total, enabled=progress) as bar:
        rows = [_run_point(p, config, backend, bar) for p in points]
    return {"workload": config.name, "profile": config.profile.name, "seed": config.seed,
            "tasks": len(points[0].trace), "points": rows, "summary": summarize(rows, config.policies)}


def capacity_for(config: BenchConfig) -> float:
    """The capacity `--load` is relative to, for display."""
    if config.recorded is not None:
        return capacity_of_tasks(config.recorded[: config.tasks], config.profile, config.budget)
    assert config.workflow is not None
    return capacity_rps(config.workflow, config.profile, config.budget)
