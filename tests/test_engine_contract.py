"""The core engine contract (topas_agents.engine) and task tracker (topas_agents.task_tracker)."""

from __future__ import annotations

import inspect

import pytest

import topas_agents.sim as sim
from topas_agents import engine as contract
from topas_agents.errors import TaskError, TopasError, UnknownStageError, UnknownTaskError
from topas_agents.server.api_errors import from_task_error
from topas_agents.task_tracker import TaskTracker
from topas_agents.workflow import load_workflow


def _members(proto: type) -> set[str]:
    names = set(getattr(proto, "__annotations__", {}))
    names |= {n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")}
    return names


def test_sim_engine_offers_every_member_of_the_engine_protocol() -> None:
    members = _members(contract.Engine)
    assert {"submit", "cancel", "advance", "next_event_time", "snapshot", "stats", "now", "on_finish"} <= members
    eng = sim.SimEngine(sim_profile(), _Never(), kv_budget=1000)
    missing = sorted(m for m in members if not hasattr(eng, m))
    assert missing == []


def test_sim_reexports_the_core_request_type_and_errors() -> None:
    # `from topas_agents.sim import EngineRequest` is documented usage: it must be the core type.
    assert sim.EngineRequest is contract.EngineRequest
    assert sim.OverBudgetError is contract.OverBudgetError and sim.RequestError is contract.RequestError
    assert issubclass(contract.OverBudgetError, TopasError)


def test_tracker_raises_core_errors_that_the_server_maps() -> None:
    tr = TaskTracker(idle_timeout_s=0.0, max_history=10)
    with pytest.raises(UnknownTaskError) as unknown:
        tr.stage_done("missing", "s1", 0.0, 0.0)
    tr.commit_call("t", "s1", load_workflow("chain3"), "chain3", False, 0.0, 0.0)
    with pytest.raises(UnknownStageError) as stage:
        tr.stage_done("t", "nope", 0.0, 0.0)
    for exc, status in ((unknown.value, 404), (stage.value, 400)):
        assert isinstance(exc, TaskError) and not hasattr(exc, "status")  # no HTTP in the core
        assert from_task_error(exc).status == status


def sim_profile():  # noqa: ANN201
    from topas_agents.costmodel import load_profile

    return load_profile()


class _Never:
    name = "never"

    def decide(self, snap):  # noqa: ANN001, ANN201
        from topas_agents.snapshot import Decision

        return Decision()
