"""Random-suite generator: valid DAGs of every shape that fit the budget and round-trip
through YAML (`load_workflow` reads back exactly the generated workflow)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.bench.work import check_fits
from topas_agents.errors import ConfigError
from topas_agents.suite.generate import (
    DEFAULT_GEN,
    MIN_BUDGET,
    generate_suite,
    generate_workflow,
    workflow_to_yaml,
)
from topas_agents.suite.shapes import MAX_AGENTS, SHAPES, build_skeleton
from topas_agents.workflow import load_workflow

SEEDS = st.integers(0, 10**6)
INDEX = st.integers(0, 500)
BUDGETS = st.one_of(st.just(17500), st.integers(MIN_BUDGET, 200_000))


@settings(max_examples=150, deadline=None)
@given(seed=SEEDS, index=INDEX, budget=BUDGETS)
def test_generated_workflow_is_valid_fits_and_round_trips(seed: int, index: int, budget: int) -> None:
    g = generate_workflow(seed, index, budget)
    wf = g.workflow
    check_fits(wf, budget)  # every stage fits the budget alone
    assert 2 <= len(wf.agents) <= MAX_AGENTS
    assert {s.agent for s in wf.stages} == {a.name for a in wf.agents}  # no idle agent
    lo_in, hi_in = DEFAULT_GEN.input_tokens
    lo_out, hi_out = DEFAULT_GEN.output_tokens
    for s in wf.stages:
        assert lo_in <= s.input_tokens.lo <= s.input_tokens.hi <= hi_in
        assert lo_out <= s.output_tokens.lo <= s.output_tokens.hi <= hi_out
    assert all(1 <= a.prefix_tokens <= DEFAULT_GEN.prefix_tokens[1] for a in wf.agents)
    assert g.prefix_ratio == pytest.approx(sum(a.prefix_tokens for a in wf.agents) / budget)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "wf.yaml"
        path.write_text(workflow_to_yaml(wf, "a header\nover two lines"))
        assert load_workflow(path) == wf


@settings(max_examples=200, deadline=None)
@given(seed=SEEDS, shape=st.sampled_from(SHAPES))
def test_skeletons_are_acyclic_and_use_every_agent(seed: int, shape) -> None:
    skel = build_skeleton(shape, random.Random(seed))
    assert 2 <= skel.n_agents <= MAX_AGENTS
    assert {s.agent for s in skel.stages} == set(range(skel.n_agents))
    for i, s in enumerate(skel.stages):
        assert all(0 <= d < i for d in s.after)  # only earlier stages: acyclic by construction
        assert len(set(s.after)) == len(s.after)


@settings(max_examples=60, deadline=None)
@given(seed=SEEDS)
def test_shapes_have_their_structure(seed: int) -> None:
    rng = random.Random(seed)
    star = build_skeleton("star", rng)
    assert [s.agent for s in star.stages][::2] == [0] * (len(star.stages) // 2 + 1)  # centre alternates
    debate = build_skeleton("debate", rng)
    turns = [s.agent for s in debate.stages if s.agent < 2]
    assert turns == [i % 2 for i in range(len(turns))] and len(turns) >= 4
    react = build_skeleton("react", rng)
    assert all(s.react for s in react.stages)
    diamond = build_skeleton("diamond", rng)
    assert any(len(s.after) >= 2 for s in diamond.stages)  # a join
    loop = build_skeleton("loop", rng)
    assert len(loop.stages) > loop.n_agents  # the body's agents recur


def test_react_shape_has_rounds_and_tool_waits() -> None:
    for i in range(6):
        wf = generate_workflow(3, i, 17500, shape="react").workflow
        assert all(s.requests.hi > 1 and s.tool_wait_s > 0 for s in wf.stages)


def test_suite_is_deterministic_covers_every_shape_and_extends() -> None:
    small = generate_suite(len(SHAPES), 7, 17500, loads=(0.2, 0.5))
    assert small == generate_suite(len(SHAPES), 7, 17500, loads=(0.2, 0.5))
    assert generate_suite(len(SHAPES) + 3, 7, 17500, loads=(0.2, 0.5))[: len(SHAPES)] == small
    assert {g.shape for g in small} == set(SHAPES)
    assert all(g.workflow.loads == (0.2, 0.5) for g in small)
    assert generate_suite(3, 8, 17500) != generate_suite(3, 7, 17500)


def test_prefix_pressure_spans_under_and_over_the_budget() -> None:
    ratios = [g.prefix_ratio for g in generate_suite(40, 0, 17500)]
    assert min(ratios) < 1 < max(ratios)


def test_budget_too_small_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at least"):
        generate_workflow(0, 0, MIN_BUDGET - 1)
