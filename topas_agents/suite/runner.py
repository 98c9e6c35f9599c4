"""Run the suite: every policy on every generated workflow, at every load and seed.

One job is one `(workflow, seed)` pair: a `run_bench` over all loads and policies (the
policies share each load's arrival trace, as in `topas bench`). Jobs run in a process pool
when `jobs > 1`; results are keyed by `(workflow, seed)` and read back in that order, so the
output does not depend on the number of workers or on which finishes first.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..costmodel import Profile
from ..errors import ConfigError, TopasError
from ..policies import BASELINES
from ..workflow import Workflow
from .generate import GeneratedWorkflow, generate_suite
from .ratios import METRICS, Ratio, Runs, baseline_floor, paper_rule, per_load

# What the suite keeps of each bench row: the two JCT metrics it ranks by, and the three
# that explain a loss (did the policy preempt, move prefixes, or run smaller batches?).
KEPT_METRICS = ("mean_jct", "p99_jct", "preemptions", "prefix_swaps", "mean_batch")


@dataclass(frozen=True)
class SuiteConfig:
    workflows: int
    gen_seed: int  # draws the workflows; `seeds` draw arrivals and task sizes
    seeds: tuple[int, ...]
    loads: tuple[float, ...]
    tasks: int
    profile: Profile
    policies: tuple[str, ...]
    kv_budget: int | None = None
    host_tier: Any = None  # bench.hosttier.HostTier | bool | None, as BenchConfig takes it
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    jobs: int = 1
    progress: bool = False
    reuse: Path | None = None  # an earlier suite JSON whose baseline runs are taken (suite.reuse)
    profile_arg: str | None = None  # --profile as given (a name, or a YAML path): replay commands name it

    @property
    def budget(self) -> int:
        return self.profile.kv_budget_tokens if self.kv_budget is None else self.kv_budget

    @property
    def baselines(self) -> tuple[str, ...]:
        return tuple(p for p in self.policies if p in BASELINES)

    @property
    def compared(self) -> tuple[str, ...]:
        """The policies judged against the best baseline: every non-baseline one given."""
        return tuple(p for p in self.policies if p not in BASELINES)


@dataclass(frozen=True, slots=True)
class Job:
    index: int
    seed: int
    workflow: Workflow
    reused: Mapping[float, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)  # load -> baseline -> row

    def to_run(self, config: SuiteConfig) -> tuple[str, ...]:
        """The policies without a reused run at every load."""
        return tuple(p for p in config.policies if not all(p in self.reused.get(u, {}) for u in config.loads))


@dataclass(frozen=True)
class WorkflowResult:
    gen: GeneratedWorkflow
    runs: Runs  # seed -> load -> policy -> metric -> value
    paper: Mapping[str, Mapping[str, Ratio]]  # policy -> metric -> ratio
    per_load: Mapping[str, Mapping[str, tuple[Ratio, ...]]]  # policy -> metric -> one per load
    vs_lpm: Mapping[str, Mapping[str, tuple[Ratio, ...]]]  # the same, relative to LPM alone ({} without lpm)
    floor: Mapping[str, tuple[Ratio, ...]]  # metric -> one per load (ratios.baseline_floor)
    reused: int = 0  # how many of `runs` came from --reuse's file


def validate(config: SuiteConfig) -> None:
    if config.workflows <= 0:
        raise ConfigError(f"--workflows must be positive, got {config.workflows}")
    if not config.baselines:
        raise ConfigError(f"the suite compares against the best baseline: give one of {', '.join(BASELINES)}")
    if not config.compared:
        raise ConfigError("the suite needs a non-baseline policy to judge (e.g. topas)")
    if config.jobs <= 0:
        raise ConfigError(f"jobs must be positive, got {config.jobs}")
    if not config.seeds or not config.loads:
        raise ConfigError("the suite needs at least one seed and one load")


def _bench(job: Job, config: SuiteConfig, policies: tuple[str, ...], loads: tuple[float, ...]) -> dict:
    from ..bench.runner import BenchConfig, run_bench

    bench = BenchConfig(policies=policies, profile=config.profile, workflow=job.workflow, loads=loads,
                        tasks=config.tasks, seed=job.seed, kv_budget=config.kv_budget,
                        host_tier=config.host_tier, policy_options=config.policy_options)
    doc = run_bench(bench)
    return {float(pt["load"]): {p: {k: row[k] for k in KEPT_METRICS} for p, row in pt["results"].items()}
            for pt in doc["points"]}


def run_job(job: Job, config: SuiteConfig) -> dict[float, dict[str, dict[str, Any]]]:
    """One workflow at one seed: load -> policy -> kept metrics, in `config.policies` order.
    Reused runs are not rerun (a policy is run at every load unless it was reused at all of
    them). A run that fails (e.g. the simulator reports a stalled policy) does not sink the
    suite: the job is rerun one (load, policy) at a time (same traces: they depend on the seed
    and rate only) and each failed run is kept as `{"error": message}` with no metrics."""
    todo = job.to_run(config)
    ran = _run_policies(job, config, todo) if todo else {}
    return {u: {p: ran[u][p] if p in todo else dict(job.reused[u][p]) for p in config.policies}
            for u in config.loads}


def _run_policies(job: Job, config: SuiteConfig, policies: tuple[str, ...]) -> dict[float, dict[str, dict[str, Any]]]:
    try:
        return _bench(job, config, policies, config.loads)
    except Exception:  # a policy of the user's own may raise anything: one run fails, not the suite
        pass
    out: dict[float, dict[str, dict[str, Any]]] = {}
    for u in config.loads:
        for p in policies:
            try:
                row = _bench(job, config, (p,), (u,))[u][p]
            except Exception as exc:
                error = str(exc) if isinstance(exc, TopasError) else f"{type(exc).__name__}: {exc}"
                row = {**dict.fromkeys(KEPT_METRICS), "error": error}
            out.setdefault(u, {})[p] = row
    return out


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="run", desc="suite", file=sys.stderr, leave=False, dynamic_ncols=True)


def run_jobs(jobs: list[Job], config: SuiteConfig) -> dict[tuple[int, int], Any]:
    bar = _progress(len(jobs), config.progress)
    out: dict[tuple[int, int], Any] = {}
    try:
        if config.jobs == 1:
            for job in jobs:
                out[job.index, job.seed] = run_job(job, config)
                if bar is not None:
                    bar.update(1)
        else:
            with ProcessPoolExecutor(max_workers=config.jobs) as pool:
                futures = {pool.submit(run_job, job, config): job for job in jobs}
                for fut in as_completed(futures):
                    job = futures[fut]
                    out[job.index, job.seed] = fut.result()
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return out


def judge(gen: GeneratedWorkflow, runs: Runs, config: SuiteConfig, reused: int = 0) -> WorkflowResult:
    paper = {p: {m: paper_rule(runs, p, m, config.baselines) for m in METRICS} for p in config.compared}
    loads = {p: {m: per_load(runs, p, m, config.baselines) for m in METRICS} for p in config.compared}
    # The stock scheduler users swap out: "never slower than LPM" is the promise in its plainest form.
    vs_lpm = ({p: {m: per_load(runs, p, m, ("lpm",)) for m in METRICS} for p in config.compared}
              if "lpm" in config.baselines else {})
    return WorkflowResult(gen, runs, paper, loads, vs_lpm, baseline_floor(runs, config.baselines), reused)


def _reused_count(job: Job, config: SuiteConfig) -> int:
    todo = job.to_run(config)
    return sum(p not in todo for p in config.policies) * len(config.loads)


def run_suite(config: SuiteConfig) -> tuple[WorkflowResult, ...]:
    """Generate the workflows, run every job (less what `config.reuse` supplies), and judge
    each workflow."""
    validate(config)
    suite = generate_suite(config.workflows, config.gen_seed, config.budget, loads=config.loads)
    reused = {}
    if config.reuse is not None:
        from .reuse import load_reused

        reused = load_reused(config.reuse, config, suite)
    jobs = [Job(g.index, s, g.workflow, reused.get((g.index, s), {})) for g in suite for s in config.seeds]
    done = run_jobs(jobs, config)  # every job runs: the judged policies are never reused
    counts = {(j.index, j.seed): _reused_count(j, config) for j in jobs}
    return tuple(judge(g, {s: done[g.index, s] for s in sorted(config.seeds)}, config,
                       sum(counts[g.index, s] for s in config.seeds)) for g in suite)
