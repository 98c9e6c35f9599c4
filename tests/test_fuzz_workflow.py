"""Fuzzing the workflow loader (issue 11): any text or mapping gives a Workflow or a one-line
WorkflowError, never another exception; the linear topological sort gives exactly the order
of the former level-by-level passes."""

from __future__ import annotations

import json

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.errors import WorkflowError
from topas_agents.workflow import load_yaml_data, parse_workflow

FUZZ = settings(max_examples=200, deadline=None, derandomize=True)


def _levels_reference(stages: list[dict]) -> list[str]:
    """The former O(n^2) `_topo_sort`: repeated passes, declaration order within a pass."""
    order, done, pending = [], set(), list(stages)
    while pending:
        ready = [s for s in pending if all(d in done for d in s["after"])]
        assert ready
        for s in ready:
            order.append(s["name"])
            done.add(s["name"])
        pending = [s for s in pending if s["name"] not in done]
    return order


@st.composite
def dags(draw) -> dict:
    n = draw(st.integers(1, 25))
    perm = draw(st.permutations(range(n)))  # declaration order differs from the DAG's order
    stages = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        stages.append({"name": f"s{i}", "agent": "a", "after": [f"s{d}" for d in deps], "input_tokens": 1,
                       "output_tokens": 1})
    return {"name": "dag", "agents": [{"name": "a", "prefix_tokens": 1}], "stages": [stages[i] for i in perm]}


@FUZZ
@given(doc=dags())
def test_topo_order_matches_the_level_by_level_reference(doc):
    wf = parse_workflow(doc)
    assert list(wf.topo_order) == _levels_reference(doc["stages"])
    pos = {name: i for i, name in enumerate(wf.topo_order)}
    assert all(pos[d] < pos[s.name] for s in wf.stages for d in s.after)


@FUZZ
@given(doc=dags(), a=st.integers(0, 24), b=st.integers(0, 24))
def test_an_added_back_edge_is_a_cycle_error_or_valid(doc, a, b):
    stages = doc["stages"]
    names = [s["name"] for s in stages]
    src, dst = f"s{a}", f"s{b}"
    if src not in names or dst not in names or src == dst:
        return
    for s in stages:
        if s["name"] == src and dst not in s["after"]:
            s["after"] = [*s["after"], dst]
    try:
        wf = parse_workflow(doc)
    except WorkflowError as exc:
        assert "cycle" in str(exc) and "\n" not in str(exc)
    else:
        pos = {name: i for i, name in enumerate(wf.topo_order)}
        assert all(pos[d] < pos[s.name] for s in wf.stages for d in s.after)


SCALAR = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.sampled_from(
    ["\ud800", "a", "s0", 10**4000])
ANY = st.recursive(SCALAR, lambda k: st.lists(k, max_size=4) | st.dictionaries(st.text(max_size=10), k, max_size=4),
                   max_leaves=15)
STAGE = st.fixed_dictionaries({"name": st.sampled_from(["s0", "s1", "s2"]) | SCALAR,
                               "agent": st.sampled_from(["a"]) | SCALAR,
                               "input_tokens": st.integers(-2, 5) | ANY, "output_tokens": st.integers(-2, 5) | ANY},
                              optional={"after": st.lists(st.sampled_from(["s0", "s1", "s2"]), max_size=3) | ANY,
                                        "requests": st.integers(-2, 2000) | ANY, "tool_wait_s": SCALAR})
DOC = st.fixed_dictionaries({"name": SCALAR, "agents": st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["a"]) | SCALAR, "prefix_tokens": st.integers(-1, 2 * 10**6) | SCALAR}), max_size=2) | ANY,
    "stages": st.lists(STAGE, max_size=4) | ANY}, optional={"loads": ANY, "rates": ANY, "description": ANY, "x": ANY})


@FUZZ
@given(doc=DOC | ANY)
def test_any_mapping_is_a_workflow_or_a_one_line_error(doc):
    try:
        wf = parse_workflow(doc)
    except WorkflowError as exc:
        msg = str(exc)
        assert "\n" not in msg and len(msg) < 1000
        msg.encode("utf-8")  # printable and JSON-encodable: no lone surrogates
    else:
        assert len(wf.topo_order) == len(wf.stages)
        assert all(1 <= s.requests.lo <= s.requests.hi <= 1000 for s in wf.stages)


@FUZZ
@given(text=st.text(max_size=200) | DOC.map(lambda d: json.dumps(d, default=str)) | st.sampled_from(
    ["[" * 5000, "- " * 5000 + "x", "&a [*a, *a]", "!!python/object/apply:os.system ['true']", "{a: 1, a: 2}",
     "? [1]\n: x", "a: " + "9" * 5000]))
def test_any_text_is_data_or_a_one_line_error(text):
    try:
        data = load_yaml_data(text)
    except WorkflowError as exc:
        assert "\n" not in str(exc)
        return
    try:
        parse_workflow(data)
    except WorkflowError as exc:
        assert "\n" not in str(exc)


def test_yaml_dump_round_trip_of_a_builtin():
    from topas_agents.workflow import load_workflow, workflow_mapping

    wf = load_workflow("metagpt-sop")
    assert parse_workflow(load_yaml_data(yaml.safe_dump(workflow_mapping(wf)))) == wf
