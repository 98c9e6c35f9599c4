"""The work-conserving guard (policies/topas/guard.py): an idle GPU with work waiting."""

from __future__ import annotations

from pathlib import Path

from topas_agents.costmodel import load_profile
from topas_agents.policies import make_policy
from topas_agents.policies.topas.guard import work_conserving
from topas_agents.sim import make_trace, simulate
from topas_agents.snapshot import NOOP, Decision, PrefixView, RequestView, Snapshot, check_decision
from topas_agents.workflow import load_workflow

PROFILE = load_profile("a100-80g-qwen2.5-32b")


def _req(rid: str, agent: str, prefix: int, task_arrival: float) -> RequestView:
    return RequestView(rid=rid, task_id=rid, workflow=None, stage="s", agent=agent, prefix_tokens=prefix,
                       input_tokens=200, max_new_tokens=100, generated=0, arrival_s=task_arrival,
                       task_arrival_s=task_arrival)


def _snap(waiting: tuple[RequestView, ...]) -> Snapshot:
    # three idle 3000-token prefixes fill 9000 of a 10000 budget; the waiting agent needs 6000 + 300
    idle = tuple(PrefixView(f"idle{i}", 3000, "gpu", last_used_s=float(i), running=0) for i in range(3))
    big = PrefixView("big", 6000, "cpu", last_used_s=0.0, running=0)
    return Snapshot(now=10.0, kv_budget=10_000, waiting=waiting, running=(), prefixes=(*idle, big),
                    tasks=(), profile=PROFILE)


def test_an_empty_decision_with_idle_prefixes_in_the_way_becomes_an_admission() -> None:
    snap = _snap((_req("late", "big", 6000, 5.0), _req("early", "big", 6000, 1.0)))
    d = work_conserving(snap, NOOP)
    # 9000 + 6000 + 300 - 10000 = 5300 tokens to free: the two least recently used idle prefixes
    assert d.prefix_out == ("idle0", "idle1")
    # 10000 - 3000 - 6000 - 300 = 700 left: the second request (300) fits too, oldest task first
    assert d.admit == ("early", "late")
    check_decision(snap, d)


def test_the_guard_leaves_real_decisions_alone() -> None:
    snap = _snap((_req("a", "big", 6000, 1.0),))
    chosen = Decision(admit=("a",), prefix_out=("idle0", "idle1"))
    assert work_conserving(snap, chosen) is chosen
    assert work_conserving(_snap(()), NOOP) is NOOP


def test_topas_finishes_the_workflow_it_once_stalled_on() -> None:
    wf = load_workflow(str(Path(__file__).parent / "data" / "stall-chain.yaml"))
    trace = make_trace(wf, 20, 0.002, 101)
    run = simulate(trace, make_policy("topas"), PROFILE, check=True)
    assert len(run.tasks) == 20 and all(t.jct_s > 0 for t in run.tasks)
