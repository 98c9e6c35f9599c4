"""Workflow parsing bounds: `after` accepts only what means dependencies,
and duplicate stages or too many edges are refused as the stages are read, before an aliased
`after` list is scanned again for every stage."""

from __future__ import annotations

import pytest

from topas_agents import workflow_parse
from topas_agents.errors import WorkflowError
from topas_agents.workflow_parse import WorkflowLimits, load_yaml_data, parse_workflow

LIMITS = WorkflowLimits(max_edges=1000)  # small: the tests count the work done per edge


def _doc(second_stage: dict) -> dict:
    first = {"name": "s1", "agent": "a", "input_tokens": 1, "output_tokens": 1}
    second = {"name": "s2", "agent": "a", "input_tokens": 1, "output_tokens": 1, **second_stage}
    return {"name": "w", "agents": [{"name": "a", "prefix_tokens": 1}], "stages": [first, second]}


# ---------------------------------------------------------------- 8: what `after` may be

@pytest.mark.parametrize("after", [0, False, {}, "", 1.5, True, {"s1": 1}])
def test_after_that_is_not_stage_names_is_an_error_naming_the_field(after):
    with pytest.raises(WorkflowError, match=r"stages\[1\] \(s2\)\.after: expected a list of stage names"):
        parse_workflow(_doc({"after": after}))


@pytest.mark.parametrize(("stage", "after"), [
    ({}, ()), ({"after": None}, ()), ({"after": []}, ()), ({"after": "s1"}, ("s1",)), ({"after": ["s1"]}, ("s1",)),
])
def test_missing_null_a_list_or_one_name_are_dependencies(stage, after):
    assert parse_workflow(_doc(stage)).stage("s2").after == after


# ---------------------------------------------------------------- 6: early duplicate and edge checks

def _aliased(n_after: int, n_copies: int, distinct_names: bool) -> str:
    """A stage whose `after` lists `n_after` names, repeated by YAML aliases: as `n_copies`
    copies of the whole stage, or (distinct_names) as stages that share only the list."""
    names = ",".join(f"s{i}" for i in range(n_after))
    head = "name: bomb\nagents: [{name: a, prefix_tokens: 1}]\nstages:\n"
    if distinct_names:
        first = f"  - {{name: t0, agent: a, input_tokens: 1, output_tokens: 1, after: &deps [{names}]}}\n"
        rest = "".join(f"  - {{name: t{i}, agent: a, input_tokens: 1, output_tokens: 1, after: *deps}}\n"
                       for i in range(1, n_copies))
    else:
        first = f"  - &st {{name: s, agent: a, input_tokens: 1, output_tokens: 1, after: [{names}]}}\n"
        rest = "  - *st\n" * (n_copies - 1)
    return head + first + rest


@pytest.fixture
def scanned(monkeypatch) -> list[int]:
    """Lengths of the `after` lists scanned for duplicates (the per-edge work of parsing)."""
    sizes: list[int] = []
    real = workflow_parse._first_duplicate

    def counting(names):
        sizes.append(len(names))
        return real(names)

    monkeypatch.setattr(workflow_parse, "_first_duplicate", counting)
    return sizes


def test_a_repeated_stage_is_refused_before_its_after_list_is_read_again(scanned):
    data = load_yaml_data(_aliased(LIMITS.max_edges, 400, distinct_names=False))
    with pytest.raises(WorkflowError, match="stages: duplicate stage 's'"):
        parse_workflow(data, limits=LIMITS)
    assert sum(scanned) <= LIMITS.max_edges + 1  # the first stage's list, plus the one agent


def test_the_edge_total_is_refused_before_the_next_list_is_read(scanned):
    data = load_yaml_data(_aliased(LIMITS.max_edges, 400, distinct_names=True))
    with pytest.raises(WorkflowError, match=f"stages: more than {LIMITS.max_edges} dependencies in all"):
        parse_workflow(data, limits=LIMITS)
    assert sum(scanned) <= LIMITS.max_edges + 1


def test_edges_up_to_the_limit_still_parse():
    chain = [{"name": f"s{i}", "agent": "a", "after": [f"s{i - 1}"] if i else [], "input_tokens": 1,
              "output_tokens": 1} for i in range(LIMITS.max_edges + 1)]
    doc = {"name": "w", "agents": [{"name": "a", "prefix_tokens": 1}], "stages": chain}
    assert len(parse_workflow(doc, limits=WorkflowLimits(max_edges=1000, max_stages=2000)).stages) == 1001
    with pytest.raises(WorkflowError, match="dependencies in all"):
        parse_workflow({**doc, "stages": [*chain, {**chain[1], "name": "extra"}]},
                       limits=WorkflowLimits(max_edges=1000, max_stages=2000))
