"""Independent simulator runs (one policy on one trace) and their execution, serially or in a
process pool. Results are keyed by the job, never by completion order, so a bench gives the
same numbers whatever `--jobs` is (decision timings, which are wall-clock, excepted)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..costmodel import Profile
from ..errors import ConfigError, TopasError
from ..policies import Policy, make_live_policy, make_policy
from ..workflow import TaskPlan
from .progress import ProgressBar

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


def build_policy(name: str, options: Mapping[str, Any] | None = None, *, live: bool = False) -> Policy:
    """`make_policy` (`make_live_policy` with `live`: as a live engine builds it) with every
    failure turned into a one-line ConfigError."""
    opts = dict(options or {})
    try:
        return make_live_policy(name, opts) if live else make_policy(name, opts)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"policy '{name}' is not available (module '{exc.name}' is missing)") from None
    except (AttributeError, ImportError) as exc:
        raise ConfigError(f"policy '{name}' is not available ({exc})") from None
    except TopasError as exc:
        message = str(exc)  # named once: make_policy's own errors already start with the name
        raise ConfigError(message if message.startswith(f"policy '{name}'") else f"policy '{name}': {message}") from None


@dataclass(frozen=True, slots=True)
class RunJob:
    """One simulated run. `key` identifies it to the caller (config, point, policy)."""

    key: tuple[int, int, str]
    policy: str
    options: Mapping[str, Any]
    trace: tuple[TaskPlan, ...]
    profile: Profile
    kv_budget: int | None
    host_tier: bool
    check: bool
    task_jcts: bool


def finite(x: Any) -> Any:
    """JSON has no NaN/inf: report them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def execute(job: RunJob, backend: SimBackend | None = None,
            progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run one job; returns its result row (RESULT_KEYS, `prefix_recomputes`, `host_tier`,
    and `task_jcts` (seconds, arrival order) when asked)."""
    backend = backend or default_backend()
    policy = build_policy(job.policy, job.options)
    # The policy must see the tier it actually has (Topas prices a reload as a swap only
    # with a host copy), so the profile in its snapshots carries this run's setting.
    profile = replace(job.profile, host_tier=job.host_tier)
    try:
        run = backend.simulate(job.trace, policy, profile, kv_budget=job.kv_budget, host_tier=job.host_tier,
                               check=job.check, progress=progress)
    except TopasError as exc:
        raise ConfigError(f"{job.policy}: {exc}") from None
    metrics = run.as_dict()
    row = {k: finite(metrics[k]) for k in RESULT_KEYS}
    row["prefix_recomputes"] = getattr(run, "prefix_recomputes", metrics.get("prefix_recomputes"))
    row["host_tier"] = job.host_tier
    if job.task_jcts:
        row["task_jcts"] = [round(t.jct_s, 3) for t in run.tasks]
    return row


def _execute_in_worker(job: RunJob) -> dict[str, Any]:
    return execute(job)


class RunFailure(NamedTuple):
    """A run that ended in an error (`run_jobs(..., failures=...)`)."""

    key: tuple[int, int, str]
    policy: str
    error: str  # one line: the exception's type and message


def _failure(job: RunJob, exc: BaseException) -> RunFailure:
    text = str(exc) if isinstance(exc, TopasError) else f"{type(exc).__name__}: {exc}"
    text = (text.splitlines() or [type(exc).__name__])[0].removeprefix(f"{job.policy}: ")
    return RunFailure(job.key, job.policy, text)


def run_jobs(jobs: Sequence[RunJob], *, workers: int = 1, backend: SimBackend | None = None,
             progress: bool = False, failures: list[RunFailure] | None = None,
             ) -> dict[tuple[int, int, str], dict[str, Any]]:
    """Every job's row, by key. `workers > 1` runs them in a process pool (the default
    simulator only: an injected backend may not survive pickling, so it runs serially).
    With a `failures` list, a run that fails (a policy's bad decision, a stall, an exception
    of its own) is recorded there and the others go on; without one, it ends the bench."""
    total = sum(len(j.trace) for j in jobs)
    out: dict[tuple[int, int, str], dict[str, Any]] = {}
    with ProgressBar(total, enabled=progress) as bar:
        if workers <= 1 or backend is not None or len(jobs) <= 1:
            for job in jobs:
                label = f"{job.policy} ({len(job.trace)} tasks)"
                try:
                    out[job.key] = execute(job, backend, bar.run_callback(label))
                except Exception as exc:
                    if failures is None:
                        raise
                    failures.append(_failure(job, exc))
            return out
        pool = ProcessPoolExecutor(min(workers, len(jobs)))
        try:
            futures = {pool.submit(_execute_in_worker, job): job for job in jobs}
            for fut in as_completed(futures):
                job = futures[fut]
                try:
                    out[job.key] = fut.result()
                except Exception as exc:
                    if failures is None:
                        raise
                    failures.append(_failure(job, exc))
                bar.advance(len(job.trace))
        finally:  # on a failed run, do not wait for the rest of the bench
            pool.shutdown(wait=True, cancel_futures=True)
    return out
