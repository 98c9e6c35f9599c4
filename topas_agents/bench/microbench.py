"""Decision-cost microbenchmark: many tasks of several workflows, ~50 agents, ~1000 waiting.

A tiny deterministic world evolves between decisions (admitted requests start running, a few
running ones finish and release their successors, new tasks arrive to keep the waiting queue
full), so per-task caches behave as they do in a real run. Only `decide()` is timed.

    python -m topas_agents.bench.microbench [--agents 50] [--waiting 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ..costmodel import Profile, load_profile
from ..snapshot import Decision, PrefixView, RequestView, Snapshot, StageDone, TaskView, check_decision
from ..workflow import TaskPlan, Workflow, parse_workflow, sample_task
from .aggregate import percentile

_SHAPES = ("chain", "fork", "diamonds", "wide", "ladder")


def _workflow(k: int, n_agents: int, rng: random.Random) -> Workflow:
    """A synthetic workflow of `n_agents` distinct agents in one of a few DAG shapes."""
    shape = _SHAPES[k % len(_SHAPES)]
    names = [f"w{k}s{j}" for j in range(n_agents)]
    after: list[list[str]] = []
    for j in range(n_agents):
        if j == 0:
            deps = []
        elif shape == "chain":
            deps = [names[j - 1]]
        elif shape == "fork":  # 0 -> {1..n-2} -> n-1
            deps = [names[0]] if j < n_agents - 1 else names[1:-1]
        elif shape == "diamonds":  # pairs of parallel stages between joins
            deps = [names[j - 1]] if j % 3 == 0 else [names[3 * (j // 3)]]
            if j % 3 == 0 and j >= 3:
                deps = [names[j - 2], names[j - 1]]
        elif shape == "wide":  # two levels of fan-out
            deps = [names[0]] if j <= 3 else [names[1 + (j % 3)]]
        else:  # ladder: each stage after the two before it
            deps = names[max(0, j - 2):j]
        after.append(deps)
    data = {
        "name": f"bench{k}-{shape}",
        "agents": [{"name": f"w{k}a{j}", "prefix_tokens": rng.choice([1024, 2048, 3072, 4096])}
                   for j in range(n_agents)],
        "stages": [{"name": names[j], "agent": f"w{k}a{j}", "after": after[j], "requests": [1, 3],
                    "input_tokens": [256, 1024], "output_tokens": [64, 384]} for j in range(n_agents)],
    }
    return parse_workflow(data, "microbench")


@dataclass
class _Task:
    plan: TaskPlan
    done: set[str] = field(default_factory=set)
    rounds: dict[str, int] = field(default_factory=dict)  # rounds finished per active stage
    attained: dict[str, float] = field(default_factory=dict)
    view: TaskView | None = None  # cached until the task changes (as the simulator does)


class _World:
    def __init__(self, workflows: list[Workflow], profile: Profile, n_waiting: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.wfs = workflows
        self.profile = profile
        self.n_waiting = n_waiting
        self.now = 0.0
        self.tasks: dict[str, _Task] = {}
        self.waiting: dict[str, RequestView] = {}
        self.running: dict[str, RequestView] = {}
        self.loc = {a.name: "cpu" for wf in workflows for a in wf.agents}
        self.tokens = {a.name: a.prefix_tokens for wf in workflows for a in wf.agents}
        self.events: list[StageDone] = []
        self._next = 0
        while len(self.waiting) < n_waiting:
            self._arrive(self.now - self.rng.uniform(0, 300))

    def _arrive(self, at: float) -> None:
        wf = self.rng.choice(self.wfs)
        tid = f"t{self._next}"
        self._next += 1
        task = self.tasks[tid] = _Task(sample_task(wf, tid, at, self.rng))
        for stage in wf.topo_order:  # random progress: some stages already done
            if self.rng.random() < 0.3 and stage in wf.ready_stages(task.done):
                task.done.add(stage)
        for stage in wf.ready_stages(task.done):
            self._issue(tid, stage)

    def _issue(self, tid: str, stage: str) -> None:
        task = self.tasks[tid]
        wf = task.plan.workflow
        rnd = task.rounds.setdefault(stage, 0)
        plan = task.plan.rounds[stage][rnd]
        agent = wf.stage(stage).agent
        rid = f"{tid}.{stage}.{rnd}"
        self.waiting[rid] = RequestView(
            rid, tid, wf.name, stage, agent, self.tokens[agent], plan.input_tokens, plan.output_tokens,
            0, self.now, task.plan.arrival_s, round=rnd,
        )
        task.attained.setdefault(stage, 0.0)
        task.view = None

    def snapshot(self) -> Snapshot:
        pins: dict[str, int] = {}
        for r in self.running.values():
            pins[r.agent] = pins.get(r.agent, 0) + 1
        prefixes = tuple(
            PrefixView(a, self.tokens[a], loc, 0.0, pins.get(a, 0)) for a, loc in sorted(self.loc.items())
        )
        for t in self.tasks.values():
            if t.view is None:
                t.view = TaskView(t.plan.task_id, t.plan.workflow.name, t.plan.arrival_s, frozenset(t.done),
                                  tuple(sorted(t.attained.items())), sum(t.attained.values()))
        tasks = tuple(t.view for t in self.tasks.values())
        events, self.events = tuple(self.events), []
        return Snapshot(
            self.now, self.profile.kv_budget_tokens, tuple(self.waiting.values()), tuple(self.running.values()),
            prefixes, tasks, self.profile, MappingProxyType({w.name: w for w in self.wfs}), events,
        )

    def apply(self, d: Decision) -> None:
        for rid in d.preempt:
            r = self.running.pop(rid)
            self.waiting[rid] = replace(r, preemptions=r.preemptions + 1)
            self.tasks[r.task_id].view = None
        for a in d.prefix_out:
            self.loc[a] = "cpu"
        for a in d.prefix_in:
            self.loc[a] = "gpu"
        for rid in d.admit:
            r = self.waiting.pop(rid)
            self.running[rid] = r
            self.loc[r.agent] = "gpu"

    def step(self, dt: float, tokens: int) -> None:
        """Advance `dt` seconds: running requests decode `tokens` each; finished ones leave."""
        self.now += dt
        for rid, r in list(self.running.items()):
            r = self.running[rid] = replace(r, generated=min(r.max_new_tokens, r.generated + tokens),
                                            service_s=r.service_s + dt)
            task = self.tasks[r.task_id]
            task.attained[r.stage] += dt
            task.view = None
            if r.generated >= r.max_new_tokens:
                self._finish(self.running.pop(rid))
        while len(self.waiting) < self.n_waiting:
            self._arrive(self.now)

    def _finish(self, r: RequestView) -> None:
        task = self.tasks[r.task_id]
        task.view = None
        wf = task.plan.workflow
        task.rounds[r.stage] += 1
        if task.rounds[r.stage] < len(task.plan.rounds[r.stage]):
            self._issue(r.task_id, r.stage)
            return
        service = task.attained.pop(r.stage)
        task.done.add(r.stage)
        self.events.append(StageDone(r.task_id, wf.name, r.stage, r.agent, max(service, 0.1),
                                     task.rounds[r.stage], self.now))
        if len(task.done) == len(wf.stages):
            del self.tasks[r.task_id]
            return
        for stage in wf.ready_stages(task.done):
            if stage not in task.attained:
                self._issue(r.task_id, stage)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _p99(xs: list[float]) -> float:
    return percentile(xs, 99) if xs else 0.0


def _world(n_agents: int, n_waiting: int, seed: int, profile: Profile) -> _World:
    rng = random.Random(seed)
    per_wf = 10
    wfs = [_workflow(k, min(per_wf, n_agents - k * per_wf), rng) for k in range((n_agents + per_wf - 1) // per_wf)]
    return _World(wfs, profile, n_waiting, seed)


def run_decision_benchmark(policies: list[str], n_agents: int = 50, n_waiting: int = 1000, seed: int = 0,
                           *, decisions: int = 200, warmup: int = 20, profile: str | None = None,
                           check: bool = False, options: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    """Per-decision time of each policy: {"policy": {"mean_ms", "p99_ms", "n", "cpu_mean_ms",
    "cpu_p99_ms", "running_mean", "waiting_mean", "profile", "warmup", "options", "gc_mean_ms",
    "gc_full"}} (the last two: garbage collection inside the timed decisions, see `_GcMeter`).
    `options`: each policy's options ({policy: {key: value}}, as `topas bench --policy-opt`
    gives them), so a configuration's cost can be timed, not only the defaults'. `running_mean` and
    `waiting_mean`: mean numbers of running and waiting requests over the timed decisions (how
    full the batch and the queue the policy reasons about were).
    `warmup` untimed decisions come first. The world starts cold: over the first few hundred
    decisions the observed request service (hence Topas's horizon) still grows, and the queue
    grows past `n_waiting` as finished stages release successors (about 1.5x at the steady
    state), so a larger warmup times a longer queue, not just a warmer policy."""
    from ..policies import close_policy
    from .jobs import build_policy

    prof = load_profile(profile) if profile else load_profile()
    out: dict[str, dict] = {}
    for name in policies:
        world = _world(n_agents, n_waiting, seed, prof)
        # built as a live engine builds it: `topas` forecasts in a worker process, not in decide()
        opts = dict((options or {}).get(name, {}))
        policy = build_policy(name, opts, live=True)
        times: list[float] = []
        cpu: list[float] = []
        running: list[float] = []
        waiting: list[float] = []
        collector = _GcMeter()
        with collector:
            for i in range(warmup + decisions):
                snap = world.snapshot()
                collector.timing = i >= warmup
                c0 = time.thread_time()
                t0 = time.perf_counter()
                decision = policy.decide(snap)
                elapsed = time.perf_counter() - t0
                cpu_s = time.thread_time() - c0
                collector.timing = False
                if check:
                    check_decision(snap, decision)
                if i >= warmup:
                    times.append(elapsed * 1e3)
                    cpu.append(cpu_s * 1e3)
                    running.append(len(snap.running))
                    waiting.append(len(snap.waiting))
                world.apply(decision)
                # ~45 ms decode steps: a decision every ~4 steps, as at a busy engine's events
                world.step(0.2, 4)
        close_policy(policy)  # a forecast still in flight would hold the interpreter at exit
        out[name] = {"mean_ms": _mean(times), "p99_ms": _p99(times), "n": len(times),
                     # CPU time of the deciding thread: robust to other processes on the core
                     "cpu_mean_ms": _mean(cpu), "cpu_p99_ms": _p99(cpu),
                     "running_mean": _mean(running), "waiting_mean": _mean(waiting), "profile": prof.name,
                     "warmup": warmup, "options": opts, **collector.record(len(times))}
    return out


class _GcMeter:
    """Garbage collections that ran inside timed decisions. They are part of the times above
    (an engine's deciding thread pays them too), but the allocations that trigger them are the
    whole process's, the world's included, and a full collection walks every live object: this
    says how much of a figure they are (`gc_mean_ms`: their time per timed decision; `gc_full`:
    how many were full, generation-2, collections)."""

    def __init__(self) -> None:
        self.timing = False
        self._start = 0.0
        self._total_s = 0.0
        self._full = 0

    def __enter__(self) -> _GcMeter:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict) -> None:
        if not self.timing:
            return
        if phase == "start":
            self._start = time.thread_time()
            return
        self._total_s += time.thread_time() - self._start
        self._full += info.get("generation") == 2

    def record(self, decisions: int) -> dict:
        return {"gc_mean_ms": self._total_s * 1e3 / decisions if decisions else 0.0, "gc_full": self._full}


def main(argv: list[str] | None = None) -> int:
    from ..cli.args import non_negative_int, positive_int
    from .options import parse_policy_list

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="topas")
    ap.add_argument("--agents", type=positive_int, default=50)
    ap.add_argument("--waiting", type=positive_int, default=1000)
    ap.add_argument("--decisions", type=positive_int, default=200)
    ap.add_argument("--warmup", type=non_negative_int, default=20,
                    help="untimed decisions first (default 20; see run_decision_benchmark)")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--profile", default=None, help="cost profile name or YAML (default: the default profile)")
    ap.add_argument("--check", action="store_true", help="check_decision every decision (not timed)")
    args = ap.parse_args(argv)
    res = run_decision_benchmark(list(parse_policy_list(args.policies)), args.agents, args.waiting, args.seed,
                                 decisions=args.decisions, warmup=args.warmup, profile=args.profile,
                                 check=args.check)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    from ..cli.args import run_module

    run_module(main)
