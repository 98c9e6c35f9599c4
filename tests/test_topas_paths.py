"""L = E[LP(G, Z)]: service profiles, residual conditioning, exact chains, DAG estimator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_topas_support import CHAIN3, PROFILE, done, workflow

from topas_agents.policies.topas import TopasConfig
from topas_agents.policies.topas.longest_path import PathEstimator
from topas_agents.policies.topas.profiles import ServiceProfiles, StageDist, crn_uniforms, prior_service_s

DIAMOND = workflow("diamond", [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])])


def _estimator(events=(), **cfg) -> tuple[ServiceProfiles, PathEstimator]:
    profiles = ServiceProfiles(TopasConfig(**cfg))
    profiles.observe(events)
    return profiles, PathEstimator(profiles)


def _learn(wf, samples: dict[str, list[float]]):
    return [done(f"h{i}", wf.name, stage, stage.upper(), x) for stage, xs in samples.items()
            for i, x in enumerate(xs)]


def test_prior_is_a_point_mass_at_the_profiled_estimate():
    est = prior_service_s(CHAIN3, "s1", PROFILE)
    assert est == pytest.approx(PROFILE.request_service_s(4096, 512, 256))
    profiles, paths = _estimator()
    dist = profiles.dist(CHAIN3, "s1", PROFILE)
    assert dist.point and dist.mean == pytest.approx(est)
    # chain, nothing done: L = sum of the three stage means (exact)
    model = paths.model(CHAIN3, PROFILE)
    tp = paths.task(model, frozenset(), {})
    assert tp.expected_path == pytest.approx(3 * est)
    assert tp.gain1(0, 2.0) == pytest.approx(2.0)  # a critical request: L drops by its service
    assert tp.gain1(0, 1e9) == pytest.approx(est)  # ...at most by what is left of the stage


def test_empirical_profile_replaces_the_prior_and_caps_history():
    profiles, _ = _estimator(_learn(CHAIN3, {"s1": [1.0, 2.0, 3.0, 4.0, 5.0]}), history=3)
    assert profiles.samples("chain3", "s1") == (3.0, 4.0, 5.0)
    dist = profiles.dist(CHAIN3, "s1", PROFILE)
    assert dist.mean == pytest.approx(4.0) and not dist.point


def test_residual_conditioning_z_is_x_minus_e_given_x_above_e():
    dist = StageDist(np.array([2.0, 4.0, 6.0, 8.0]), crn_uniforms(0, "w", "s", 64))
    support, mean, column = dist.residual(5.0)
    assert list(support) == [1.0, 3.0] and mean == pytest.approx(2.0)
    assert set(column) == {1.0, 3.0} and column.mean() == pytest.approx(2.0)  # stratified
    support, mean, _ = dist.residual(9.0)  # beyond every sample: a small positive point mass
    assert len(support) == 1 and 0 < mean < dist.mean


def test_chain_with_history_is_exact_sum_of_means_with_residual():
    hist = {"s1": [10.0, 20.0], "s2": [4.0, 6.0, 8.0], "s3": [1.0, 3.0]}
    profiles, paths = _estimator(_learn(CHAIN3, hist))
    model = paths.model(CHAIN3, PROFILE)
    # s1 done, s2 started with 5 s attained: Z2 = X2 - 5 | X2 > 5 -> {1, 3}, mean 2
    tp = paths.task(model, frozenset({"s1"}), {"s2": 5.0})
    assert tp.expected_path == pytest.approx(2.0 + 2.0)  # E[Z2] + E[X3]
    assert tp.work == pytest.approx(4.0)
    # serving s2 for 2 s: E[min(2, Z2)] = (1 + 2) / 2
    assert tp.gain1(0, 2.0) == pytest.approx(1.5)


def test_dag_point_masses_hand_computed_fork_join_and_sequential_marginals():
    events = _learn(DIAMOND, {"a": [3.0], "b": [10.0], "c": [6.0], "d": [5.0]})
    profiles, paths = _estimator(events)
    model = paths.model(DIAMOND, PROFILE)
    assert model.point
    tp = paths.task(model, frozenset({"a"}), {})
    b, c = tp.index["b"], tp.index["c"]
    assert tp.expected_path == pytest.approx(15.0)  # max(10, 6) + 5
    assert tp.work == pytest.approx(21.0)  # 10 + 6 + 5
    assert tp.gain(frozenset({(b, 3.0)})) == pytest.approx(3.0)  # b is critical
    assert tp.gain(frozenset({(c, 3.0)})) == pytest.approx(0.0)  # c is off the critical path
    assert tp.gain(frozenset({(b, 6.0)})) == pytest.approx(4.0)  # until c becomes critical
    both = tp.gain(frozenset({(b, 6.0), (c, 6.0)}))
    assert both == pytest.approx(6.0)  # max(4, 0) + 5 = 9
    # the second admission of the same task is valued given the first
    assert both - tp.gain(frozenset({(b, 6.0)})) == pytest.approx(2.0)
    # nothing done: one source whose tail forks; with point masses every sample is exact
    root = paths.task(model, frozenset(), {})
    assert root.expected_path == pytest.approx(3.0 + 10.0 + 5.0)


def _exact_diamond(xb, xc, xd) -> float:
    """E[max(B, C) + D] by enumerating independent empirical distributions."""
    return float(np.mean([max(b, c) for b, c in itertools.product(xb, xc)])) + float(np.mean(xd))


def test_dag_estimator_matches_exact_expectation_of_the_max():
    xb, xc, xd = [2.0, 4.0, 6.0, 8.0], [1.0, 3.0, 5.0, 9.0], [2.0, 4.0]
    events = _learn(DIAMOND, {"a": [1.0], "b": xb, "c": xc, "d": xd})
    exact = _exact_diamond(xb, xc, xd)
    naive = max(np.mean(xb), np.mean(xc)) + np.mean(xd)  # max of means: the wrong estimator
    assert exact > naive + 0.5
    for samples, tol in ((64, 0.05), (1024, 0.01)):
        profiles, paths = _estimator(events, samples=samples)
        tp = paths.task(paths.model(DIAMOND, PROFILE), frozenset({"a"}), {})
        assert tp.expected_path == pytest.approx(exact, rel=tol)
    # deterministic: same seed, same estimate; common random numbers across tasks
    _, paths2 = _estimator(events, samples=64)
    _, paths3 = _estimator(events, samples=64)
    l2 = paths2.task(paths2.model(DIAMOND, PROFILE), frozenset({"a"}), {}).expected_path
    l3 = paths3.task(paths3.model(DIAMOND, PROFILE), frozenset({"a"}), {}).expected_path
    assert l2 == l3


def test_task_paths_are_cached_by_task_state():
    profiles, paths = _estimator()
    model = paths.model(CHAIN3, PROFILE)
    one = paths.task(model, frozenset({"s1"}), {"s2": 1.0})
    assert paths.task(model, frozenset({"s1"}), {"s2": 1.0}) is one
    assert paths.task(model, frozenset({"s1"}), {"s2": 2.0}) is not one


def test_a_refresh_of_a_finished_stage_keeps_the_task_path_matrix():
    # Every stage learned (no point masses), then s1 alone refreshed: a task past s1 keeps its
    # matrix (it depends only on the stages it has not finished), one at s1 gets a new one.
    profiles, paths = _estimator(_learn(DIAMOND, {s: [1.0, 3.0] for s in "abcd"}))
    before = paths.model(DIAMOND, PROFILE)
    past_a = paths.task(before, frozenset({"a"}), {"b": 0.5})
    at_a = paths.task(before, frozenset(), {"a": 0.5})
    profiles.observe(_learn(DIAMOND, {"a": [5.0, 9.0]}))
    after = paths.model(DIAMOND, PROFILE)
    assert after is not before and after.dists["a"] is not before.dists["a"]
    assert after.dists["b"] is before.dists["b"]
    assert paths.task(after, frozenset({"a"}), {"b": 0.5}) is past_a
    assert paths.task(after, frozenset(), {"a": 0.5}) is not at_a
    # the kept matrix is exactly what the refreshed model builds
    rebuilt = PathEstimator(profiles).task(after, frozenset({"a"}), {"b": 0.5})
    assert (rebuilt.expected_path, rebuilt.work) == (past_a.expected_path, past_a.work)
    reds = frozenset({(0, 0.7), (1, 2.0)})
    assert rebuilt.gain(reds) == past_a.gain(reds)


def test_task_path_cache_is_trimmed_to_the_live_tasks():
    _, paths = _estimator()
    model = paths.model(CHAIN3, PROFILE)
    first = paths.task(model, frozenset({"s1"}), {"s2": 0.0})
    for i in range(1, 400):
        last = paths.task(model, frozenset({"s1"}), {"s2": float(i)})
    paths.begin(live_tasks=10)  # room for 2 x 10 + 256 states, least recently used go first
    assert paths.task(model, frozenset({"s1"}), {"s2": 399.0}) is last
    assert paths.task(model, frozenset({"s1"}), {"s2": 0.0}) is not first


def test_gain_memo_is_bounded_and_exact():
    profiles, paths = _estimator(_learn(DIAMOND, {s: [1.0, 2.0, 4.0] for s in "abcd"}))
    task = paths.task(paths.model(DIAMOND, PROFILE), frozenset({"a"}), {})
    reds = [frozenset({(0, 0.01 * i), (1, 0.02 * i)}) for i in range(600)]
    first = [task.gain(r) for r in reds]
    assert len(task._memo) <= 128
    fresh = PathEstimator(profiles).task(paths.model(DIAMOND, PROFILE), frozenset({"a"}), {})
    assert [fresh.gain(r) for r in reds] == first == [task.gain(r) for r in reds]
    assert task.gain1(1, 0.3) == fresh.gain(frozenset({(1, 0.3)}))
