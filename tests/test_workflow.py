"""Workflow model: validation names the bad field; built-in workloads load; sampling."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.errors import WorkflowError
from topas_agents.workflow import (
    builtin_workflows,
    load_workflow,
    parse_workflow,
    sample_task,
)

BASE = {
    "name": "w",
    "agents": [{"name": "a", "prefix_tokens": 100}, {"name": "b", "prefix_tokens": 200}],
    "stages": [
        {"name": "s1", "agent": "a", "input_tokens": 10, "output_tokens": 5},
        {"name": "s2", "agent": "b", "after": ["s1"], "requests": [1, 3], "input_tokens": [5, 9],
         "output_tokens": 4, "tool_wait_s": 0.5},
    ],
}


def _with(path: str, value) -> dict:
    """BASE with one field replaced; `path` like 'stages.1.requests' (value None: delete)."""
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    key = int(last) if last.isdigit() else last
    if value is None:
        del node[key]
    else:
        node[key] = value
    return data


def test_base_parses():
    wf = parse_workflow(BASE)
    assert wf.topo_order == ("s1", "s2")
    assert wf.successors == {"s1": ("s2",), "s2": ()}
    assert wf.roots == ("s1",)
    assert wf.depth == {"s1": 0, "s2": 1}
    assert wf.stage("s2").requests.lo == 1 and wf.stage("s2").requests.hi == 3
    assert wf.prefix_tokens("b") == 200
    assert wf.loads == (0.3, 0.6, 0.9)
    assert wf.ready_stages(set()) == ("s1",)
    assert wf.ready_stages({"s1"}) == ("s2",)


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("stages.1.agent", "zz", "stages[1] (s2).agent: unknown agent 'zz'"),
        ("stages.1.after", ["nope"], "stages[1] (s2).after: unknown stage 'nope'"),
        ("stages.1.after", ["s2"], "a stage cannot depend on itself"),
        ("stages.1.after", ["s1", "s1"], "stages[1] (s2).after: stage 's1' listed twice"),
        ("stages.1.after", [1], "stages[1] (s2).after: expected a list of stage names"),
        ("stages.1.requests", [3, 1], "stages[1] (s2).requests: need 1 <= lo <= hi"),
        ("stages.1.requests", 0, "stages[1] (s2).requests: need 1 <= lo <= hi"),
        ("stages.1.requests", [1, 2, 3], "stages[1] (s2).requests: expected an integer or [lo, hi]"),
        ("stages.1.input_tokens", "many", "stages[1] (s2).input_tokens: expected an integer or [lo, hi]"),
        ("stages.1.input_tokens", True, "stages[1] (s2).input_tokens: expected an integer"),
        ("stages.1.output_tokens", 2.5, "stages[1] (s2).output_tokens: expected an integer"),
        ("stages.1.output_tokens", [0, 4], "stages[1] (s2).output_tokens: need 1 <= lo <= hi"),
        ("stages.1.tool_wait_s", -1, "stages[1] (s2).tool_wait_s: expected a finite number >= 0"),
        ("stages.1.tool_wait_s", float("nan"), "stages[1] (s2).tool_wait_s"),
        ("stages.1.tool_wait_s", float("inf"), "stages[1] (s2).tool_wait_s"),
        ("stages.1.tool_wait_s", "slow", "stages[1] (s2).tool_wait_s"),
        ("stages.1.output_tokens", None, "stages[1]: missing field 'output_tokens'"),
        ("stages.1.colour", "red", "stages[1]: unknown field 'colour'"),
        ("stages.1.name", "", "stages[1].name: expected a non-empty string"),
        ("stages.1.name", "s1", "stages: duplicate stage 's1'"),
        # names are what labels carry: the label's rules (no control characters, no whitespace
        # at either end), or the stage could never be named by a call
        ("stages.1.name", "s2 ", "stages[1].name: starts or ends with whitespace"),
        ("agents.0.name", "a\tb", "agents[0].name: contains a control character"),
        ("agents.1.name", "a", "agents: duplicate agent 'a'"),
        ("agents.0.prefix_tokens", -5, "agents[0].prefix_tokens: expected an integer >= 0"),
        ("agents.0.prefix_tokens", "4k", "agents[0].prefix_tokens: expected an integer >= 0"),
        ("agents.0.size", 1, "agents[0]: unknown field 'size'"),
        ("agents", [], "agents: expected a non-empty list"),
        ("stages", {}, "stages: expected a non-empty list"),
        ("stages.0", "s1", "stages[0]: expected a mapping"),
        ("name", 7, "name: expected a non-empty string"),
        ("loads", [0.5, -1], "loads: expected a non-empty list of positive numbers"),
        ("loads", [], "loads: expected a non-empty list"),
        ("loads", [float("inf")], "loads:"),
        ("description", ["x"], "description: expected a string"),
        ("extra", 1, "workflow: unknown field 'extra'"),
        ("agents", None, "workflow: missing field 'agents'"),
    ],
)
def test_validation_names_the_field(path, value, needle):
    with pytest.raises(WorkflowError) as exc:
        parse_workflow(_with(path, value), "src.yaml")
    msg = str(exc.value)
    assert msg.startswith("src.yaml: ")
    assert needle in msg
    assert "\n" not in msg


def test_cycle_is_reported_with_its_stages():
    # the stages of one actual cycle, in dependency order; it listed every stage left unsorted
    # by name, downstream ones too (12 stages after a cycle hid it behind "...")
    data = _with("stages.0.after", ["s2"])
    with pytest.raises(WorkflowError, match=r"stages: dependency cycle s2 -> s1 -> s2$"):
        parse_workflow(data)
    data["stages"] += [{"name": f"d{i:02d}", "agent": data["stages"][1]["agent"], "after": ["s2"],
                        "input_tokens": 1, "output_tokens": 1} for i in range(12)]
    with pytest.raises(WorkflowError, match=r"stages: dependency cycle s2 -> s1 -> s2$"):
        parse_workflow(data)


def test_non_string_keys_do_not_crash_the_error_path():
    data = copy.deepcopy(BASE)
    data["stages"][0][1] = "x"
    data["stages"][0][True] = "y"
    with pytest.raises(WorkflowError, match=r"unknown field '1'"):
        parse_workflow(data)


def test_top_level_not_a_mapping():
    with pytest.raises(WorkflowError, match="workflow: expected a mapping, got list"):
        parse_workflow([1, 2])


def test_yaml_syntax_error_names_the_line(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nagents: [\n  {name: a, prefix_tokens: 1\nstages: []\n")
    with pytest.raises(WorkflowError, match=r"bad.yaml: invalid YAML at line \d+"):
        load_workflow(path)


@pytest.mark.parametrize("text", [
    "name: z\nagents: [{name: a, prefix_tokens: 1}]\nname: y\n"
    "stages: [{name: s, agent: a, input_tokens: 1, output_tokens: 1}]\n",
    "name: z\nagents: [{name: a, prefix_tokens: 1, prefix_tokens: 9}]\n"
    "stages: [{name: s, agent: a, input_tokens: 1, output_tokens: 1}]\n",
    '{"name": "z", "agents": [{"name": "a", "prefix_tokens": 1}], "name": "y", '
    '"stages": [{"name": "s", "agent": "a", "input_tokens": 1, "output_tokens": 1}]}',
], ids=["yaml-top", "yaml-nested", "json"])
def test_a_repeated_key_is_an_error_not_the_last_one_winning(tmp_path: Path, text: str):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(WorkflowError, match="duplicate key '(name|prefix_tokens)'"):
        load_workflow(path)
    # the same keys in different mappings are fine
    path.write_text(text.replace("name: y", "description: y").replace(", prefix_tokens: 9", "")
                    .replace('"name": "y"', '"description": "y"'))
    assert load_workflow(path).name == "z"


def test_file_errors(tmp_path: Path):
    with pytest.raises(WorkflowError, match="workflow file not found"):
        load_workflow(tmp_path / "missing.yaml")
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    with pytest.raises(WorkflowError, match="cannot read workflow file"):
        load_workflow(folder)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(WorkflowError, match="cannot read workflow file"):
        load_workflow(binary)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(WorkflowError, match="expected a mapping, got NoneType"):
        load_workflow(empty)
    with pytest.raises(WorkflowError, match=r"unknown workflow 'nope' \(built-in: .*chain3"):
        load_workflow("nope")


EXPECTED = {"chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl"}


def test_builtins_present():
    assert set(builtin_workflows()) >= EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_loads(name):
    wf = load_workflow(name)
    assert wf.name == name
    assert wf.description
    assert all(0 < u < 1 for u in wf.loads)
    assert list(wf.loads) == sorted(wf.loads)
    # Every call fits the default A100 budget (17.5k tokens) with its prefix.
    for s in wf.stages:
        assert wf.prefix_tokens(s.agent) + s.input_tokens.hi + s.output_tokens.hi <= 17_500


def test_metagpt_sop_shape():
    wf = load_workflow("metagpt-sop")
    assert [wf.stage(s).agent for s in wf.topo_order] == [
        "product_manager", "architect", "project_manager", "engineer", "qa_engineer"]
    assert max(wf.depth.values()) == 4  # a chain
    code, qa = wf.stage("write_code"), wf.stage("qa")
    # the sizes belong to the dataset (datasets/workloads/README.md); only the shape is fixed here
    assert code.requests.hi > code.requests.lo >= 1  # one Engineer call per file, several files
    assert qa.requests.hi >= qa.requests.lo >= 1 and qa.tool_wait_s > 0
    assert all(a.prefix_tokens > 0 for a in wf.agents)


def test_metagpt_tl_shape():
    wf = load_workflow("metagpt-tl")
    order = wf.topo_order
    assert len(order) == 9 and max(wf.depth.values()) == 8
    assert [wf.stage(s).agent for s in order] == [
        "team_leader", "product_manager", "team_leader", "architect", "team_leader",
        "project_manager", "team_leader", "engineer", "team_leader"]
    assert [s for s in order if wf.stage(s).agent == "team_leader"] == ["tl1", "tl2", "tl3", "tl4", "tl5"]
    assert wf.prefix_tokens("team_leader") == max(a.prefix_tokens for a in wf.agents)


def test_sample_task_is_seeded_and_in_range():
    wf = load_workflow("dag10wide")
    a = sample_task(wf, "t", 1.0, random.Random(5))
    b = sample_task(wf, "t", 1.0, random.Random(5))
    assert a == b
    assert tuple(a.rounds) == wf.topo_order
    for name, rounds in a.rounds.items():
        st_ = wf.stage(name)
        assert st_.requests.lo <= len(rounds) <= st_.requests.hi
        for r in rounds:
            assert st_.input_tokens.lo <= r.input_tokens <= st_.input_tokens.hi
            assert st_.output_tokens.lo <= r.output_tokens <= st_.output_tokens.hi


@st.composite
def random_dags(draw):
    """A random valid workflow: stage i may depend on any earlier stages."""
    n = draw(st.integers(1, 8))
    stages = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, max(0, i - 1)), unique=True, max_size=i)) if i else []
        stages.append({"name": f"s{i}", "agent": "a", "after": [f"s{d}" for d in deps],
                       "input_tokens": [1, 9], "output_tokens": 3})
    order = draw(st.permutations(stages))  # declaration order must not matter
    return {"name": "r", "agents": [{"name": "a", "prefix_tokens": 0}], "stages": list(order)}


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_topo_order_respects_dependencies(data):
    wf = parse_workflow(data)
    pos = {s: i for i, s in enumerate(wf.topo_order)}
    assert sorted(pos) == sorted(s["name"] for s in data["stages"])
    for s in wf.stages:
        assert all(pos[d] < pos[s.name] for d in s.after)
        assert wf.depth[s.name] == 1 + max((wf.depth[d] for d in s.after), default=-1)


def test_a_workflow_file_of_any_name_is_read(tmp_path) -> None:
    # a JSON file (YAML reads it) or an upper-case suffix was refused as "unknown workflow"
    doc = {"name": "j", "agents": [{"name": "a", "prefix_tokens": 10}],
           "stages": [{"name": "s", "agent": "a", "input_tokens": 8, "output_tokens": 4}]}
    for name in ("wf.json", "WF.YAML", "workflow"):
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        assert load_workflow(str(path)).name == "j"
    with pytest.raises(WorkflowError, match="unknown workflow 'nope.json'"):
        load_workflow("nope.json")
    assert load_workflow("chain3").name == "chain3"
