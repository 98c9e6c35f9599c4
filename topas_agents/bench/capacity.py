"""Engine capacity for a workflow, so `--load U` means the same thing for any workflow.

    capacity (tasks/s) = 1 / E[W],   W = sum over the task's calls of `work.call_work_s`

W is the least GPU-seconds a task can cost on this profile and KV budget: every call at the
fullest batch the budget allows with its agent prefix resident (prefill tokens in the
fullest possible step, decode steps shared by `batch_cap` requests), no swaps, no
recomputation. It is the same quantity the lower bound's work bound serves, so offered load

    U = rate x E[W]

is the utilisation of that ideal fluid server: at U >= 1 no scheduler can keep up, and real
policies saturate below 1 because batches are not always full and prefixes move. E[W] is
averaged over `CAPACITY_SAMPLES` tasks drawn with a fixed seed (not the bench's --seed), so
a load maps to the same rate for every seed and the mapping is linear, hence monotone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ..costmodel import Profile
from ..workflow import TaskPlan, Workflow, sample_task
from .work import check_fits, min_request_kv, task_work_s, workflow_min_request_kv

CAPACITY_SAMPLES = 256
_CAPACITY_SEED = 20240601


def mean_task_work_s(tasks: Sequence[TaskPlan], profile: Profile, kv_budget: int,
                     min_kv: int | None = None) -> float:
    """Mean least GPU-seconds per task over `tasks`."""
    if not tasks:
        raise ValueError("no tasks")
    kv = min_request_kv(tasks) if min_kv is None else min_kv
    return sum(task_work_s(profile, kv_budget, t, kv) for t in tasks) / len(tasks)


def capacity_rps(wf: Workflow, profile: Profile, kv_budget: int | None = None) -> float:
    """Tasks per second an ideal scheduler could sustain on `wf` (module docstring)."""
    budget = profile.kv_budget_tokens if kv_budget is None else kv_budget
    check_fits(wf, budget)
    rng = random.Random(_CAPACITY_SEED)
    sample = [sample_task(wf, f"cap{i}", 0.0, rng) for i in range(CAPACITY_SAMPLES)]
    return _capacity(sample, mean_task_work_s(sample, profile, budget, workflow_min_request_kv(wf)), profile)


def capacity_of_tasks(tasks: Sequence[TaskPlan], profile: Profile, kv_budget: int | None = None) -> float:
    """Capacity for recorded tasks (a replayed trace): 1 / their mean least work."""
    budget = profile.kv_budget_tokens if kv_budget is None else kv_budget
    return _capacity(tasks, mean_task_work_s(tasks, profile, budget), profile)


def _capacity(tasks: Sequence[TaskPlan], work_s: float, profile: Profile) -> float:
    """1 / the busier of the two serial servers a task passes: the engine (its least work)
    and the front end (`call_overhead_s` per call, FIFO in the simulator's driver). Without
    the front end, a profile with a 5 s overhead called a front end loaded at 300% `--load 0.5`."""
    calls = sum(len(rounds) for t in tasks for rounds in t.rounds.values()) / len(tasks)
    return 1.0 / max(work_s, calls * profile.call_overhead_s)


def rate_for_load(load: float, capacity: float) -> float:
    """Arrival rate (tasks/s) that offers `load` x capacity."""
    return load * capacity
