"""Hand-made snapshots for the Topas tests (no tests here; imported by test_topas_*.py)."""

from __future__ import annotations

from types import MappingProxyType

from topas_agents.costmodel import load_profile
from topas_agents.snapshot import PrefixView, RequestView, Snapshot, StageDone, TaskView
from topas_agents.workflow import load_workflow, parse_workflow

PROFILE = load_profile()
CHAIN3 = load_workflow("chain3")
DAG4 = load_workflow("dag4")


def workflow(name: str, stages: list[tuple[str, list[str]]], prefix: int = 1024):
    """A workflow with one agent per stage (agent = stage name upper-cased)."""
    return parse_workflow({
        "name": name,
        "agents": [{"name": s.upper(), "prefix_tokens": prefix} for s, _ in stages],
        "stages": [{"name": s, "agent": s.upper(), "after": after, "input_tokens": 256, "output_tokens": 64}
                   for s, after in stages],
    })


def req(rid: str, task: str, stage: str, agent: str, *, wf: str | None = "chain3", prefix: int = 4096,
        inp: int = 512, out: int = 256, gen: int = 0, arrival: float = 0.0, task_arrival: float = 0.0,
        service: float = 0.0, preemptions: int = 0) -> RequestView:
    return RequestView(rid, task, wf, stage, agent, prefix, inp, out, gen, arrival, task_arrival,
                       service_s=service, preemptions=preemptions)


def task(tid: str, wf: str | None = "chain3", arrival: float = 0.0, done=(), active=()) -> TaskView:
    return TaskView(tid, wf, arrival, frozenset(done), tuple(active), sum(e for _, e in active))


def done(tid: str, wf: str, stage: str, agent: str, service: float, t: float = 0.0) -> StageDone:
    return StageDone(tid, wf, stage, agent, service, 1, t)


def snap(*, now: float = 0.0, budget: int = 17500, waiting=(), running=(), prefixes=None, tasks=(),
         workflows=(CHAIN3,), events=(), profile=PROFILE) -> Snapshot:
    """`prefixes`: {agent: (tokens, location)}; running requests pin theirs."""
    prefixes = prefixes or {}
    pins: dict[str, int] = {}
    for r in running:
        pins[r.agent] = pins.get(r.agent, 0) + 1
    views = tuple(PrefixView(a, tok, loc, 0.0, pins.get(a, 0)) for a, (tok, loc) in sorted(prefixes.items()))
    return Snapshot(now, budget, tuple(waiting), tuple(running), views, tuple(tasks), profile,
                    MappingProxyType({w.name: w for w in workflows}), tuple(events))
