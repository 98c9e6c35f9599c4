"""topas-paper: each equation of section IV pinned on a small case computed by hand from the
paper's text (the computation is in each test's comment), not from the code."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_topas_support import PROFILE, req, snap, task, workflow

from topas_agents.policies.topas.paper_value import (
    NOTHING,
    RequestService,
    aging,
    j_move,
    j_redo,
    reuse_counts,
    t_decode,
    task_value,
    v_reuse,
)
from topas_agents.policies.topas.profiles import StageDist, crn_uniforms
from topas_agents.snapshot import StageDone

# a -> {b, c} -> d : a fork (b, c) and a join (d)
FORK = workflow("fork", [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])])


def dists(wf, values: dict[str, list[float]]) -> dict[str, StageDist]:
    return {s: StageDist(np.array(v, dtype=float), crn_uniforms(0, wf.name, s, 64)) for s, v in values.items()}


def test_eq4_residual_conditions_on_attained_service():
    # X uniform on {2, 4, 6}; e = 3 observed: Z = X - 3 | X > 3 is uniform on {1, 3}, E[Z] = 2.
    # An unstarted stage (e = 0) keeps X: E = 4.
    one = workflow("one", [("s", [])])
    d = dists(one, {"s": [2, 4, 6]})
    assert list(d["s"].residual_values(3.0)) == [1.0, 3.0]
    assert task_value(one, frozenset(), {"s": 3.0}, d, 256).expected() == pytest.approx(2.0)
    assert task_value(one, frozenset(), {}, d, 256).expected() == pytest.approx(4.0)


def test_eq5_expectation_is_outside_the_longest_path():
    # done = {a}; X_b in {1, 3} (1/2 each), X_c = 2, X_d = 1.  LP = max(Z_b, Z_c) + X_d.
    # E[LP] = 1/2 max(1, 2) + 1/2 max(3, 2) + 1 = 3.5, while max of means + 1 = 3.
    d = dists(FORK, {"a": [1], "b": [1, 3], "c": [2], "d": [1]})
    value = task_value(FORK, frozenset({"a"}), {}, d, 256)
    assert value.sources == ("b", "c")
    assert value.expected() == pytest.approx(3.5)


def test_eq6_eq7_sequential_marginals_sum_to_the_joint_reduction():
    # Same task; r_b has D = 1 (stage b), r_c has D = 2 (stage c).
    # L({}) = 3.5.  L({r_b}): Z_b -> [Z_b - 1]+ in {0, 2}: E[max(., 2)] + 1 = 3, Delta(r_b|{}) = 0.5.
    # L({r_c}): Z_c -> 0: E[max(Z_b, 0)] + 1 = 3, Delta(r_c|{}) = 0.5.
    # L({r_b, r_c}) = E[max([Z_b-1]+, 0)] + 1 = 2, so Delta(r_c | {r_b}) = 3 - 2 = 1 (complementary
    # branches: worth more together), and 0.5 + 1 = 1.5 = L({}) - L({r_b, r_c}) (eq 7).
    d = dists(FORK, {"a": [1], "b": [1, 3], "c": [2], "d": [1]})
    value = task_value(FORK, frozenset({"a"}), {}, d, 256)
    b, c = value.col["b"], value.col["c"]
    assert value.delta(NOTHING, b, 1.0) == pytest.approx(0.5)
    assert value.delta(NOTHING, c, 2.0) == pytest.approx(0.5)
    after_b = NOTHING.plus(b, 1.0)
    assert value.delta(after_b, c, 2.0) == pytest.approx(1.0)
    assert value.expected() - value.expected(after_b.plus(c, 2.0)) == pytest.approx(1.5)
    # a hypothetical completion updates the residual to [Z - D]+: two requests at one stage add up
    assert value.expected(NOTHING.plus(b, 1.0).plus(b, 1.0)) == pytest.approx(value.expected(NOTHING.plus(b, 2.0)))


def test_eq5_monte_carlo_branch_for_large_supports():
    # 3 stages x 64 distinct values: 64^3 points > exact_rows, so the CRN rows are used; for a
    # chain E[LP] = sum of the means whatever the coupling (each column is a stratified sample).
    chain = workflow("ch", [("x", []), ("y", ["x"]), ("z", ["y"])])
    vals = {s: list(np.arange(1, 65) * k) for s, k in (("x", 1.0), ("y", 2.0), ("z", 3.0))}
    value = task_value(chain, frozenset(), {}, dists(chain, vals), 256)
    assert len(value.w) == 64
    assert value.expected() == pytest.approx(32.5 * 6)


def test_eq5_exact_branch_on_a_chain_longer_than_numpy_grids_have_axes():
    # 40 stages, one value each (as before any history) and one with two: the product has 2
    # points, exact; E[LP] = sum of the values, + the two-point stage's mean (1 and 3: 2). A
    # grid over every stage raised ValueError past 32 axes (topas-paper failed any such run).
    names = [f"s{i}" for i in range(40)]
    chain = workflow("long", [(n, [names[i - 1]] if i else []) for i, n in enumerate(names)])
    vals = {n: [1.0] for n in names} | {"s7": [1.0, 3.0]}
    value = task_value(chain, frozenset(), {}, dists(chain, vals), 256)
    assert len(value.w) == 2 and value.w.sum() == pytest.approx(1.0)
    assert value.expected() == pytest.approx(39 * 1.0 + 2.0)


def test_d_hat_profiled_then_empirical_per_request():
    # Before any observation: T_prefill(|input|) + T_decode * max_new.
    # After stage completions with services 6 s (3 rounds) and 2 s (1 round): 8 s / 4 requests = 2 s.
    r = req("r", "t", "s1", "A1", inp=512, out=256)
    rs = RequestService()
    prior = PROFILE.prefill_s(512, 4096) + t_decode(r, PROFILE) * 256
    assert rs.estimate(r, PROFILE) == pytest.approx(prior)
    rs.observe([StageDone("t0", "chain3", "s1", "A1", 6.0, 3, 1.0), StageDone("t1", "chain3", "s1", "A1", 2.0, 1, 2.0)])
    assert rs.estimate(r, PROFILE) == pytest.approx(2.0)


def test_eq8_j_move_is_t_move_times_distinct_incoming_tasks():
    # mu/B_swap = kv_bytes_per_token / swap_bytes_per_s. R_in = {A} (1000 tokens), R_out = {B}
    # (2000 tokens): T_move = 3000 mu / B_swap; two distinct admitted tasks wait: J_move = 2 T_move.
    mu_b = PROFILE.kv_bytes_per_token / PROFILE.swap_bytes_per_s
    tokens = {"A": 1000, "B": 2000}
    assert j_move({"A"}, {"B"}, tokens, PROFILE, 2) == pytest.approx(2 * 3000 * mu_b)
    assert j_move({"A"}, {"B"}, tokens, PROFILE, 0) == 0.0  # resident admissions overlap the move


def test_eq9_j_redo_is_decode_time_of_generated_tokens():
    # y_r = 100 and 40 generated tokens: J_redo = T_decode (100 + 40) (same context here).
    r1 = req("r1", "t1", "s1", "A1", gen=100)
    r2 = req("r2", "t2", "s1", "A1", gen=40)
    assert j_redo([r1, r2], PROFILE) == pytest.approx(140 * PROFILE.decode_step_s(1, 4096 + 512))


def test_eq11_reuse_counts_fork_children_separately_and_join_when_others_done():
    # Task t1 runs stage a: its fork children b (agent B) and c (agent C) each count: n_B = n_C = 1.
    # Task t2 (a done, c done) runs b: the join d counts (its other predecessor c finished).
    # Task t3 (a done) runs b, c not finished: d does not count. n_D = 1 (t2 only).
    tasks = [task("t1", "fork"), task("t2", "fork", done={"a", "c"}), task("t3", "fork", done={"a"})]
    running = [req("r1", "t1", "a", "A", wf="fork"), req("r2", "t2", "b", "B", wf="fork"),
               req("r3", "t3", "b", "B", wf="fork")]
    s = snap(running=running, tasks=tasks, workflows=(FORK,))
    assert reuse_counts(s) == {"B": 1, "C": 1, "D": 1}
    # V_reuse = beta sum_{a in R'} n_a mu l_a / B_swap: R' = {B, D}, l = 1024, beta = 0.5
    mu_b = PROFILE.kv_bytes_per_token / PROFILE.swap_bytes_per_s
    tokens = {"A": 1024, "B": 1024, "C": 1024, "D": 1024}
    assert v_reuse({"B", "D"}, reuse_counts(s), tokens, PROFILE, 0.5) == pytest.approx(0.5 * 2 * 1024 * mu_b)


def test_eq11_join_with_two_running_predecessors_does_not_count():
    # b and c both running in t1: d has an unfinished predecessor besides each of them.
    s = snap(running=[req("r1", "t1", "b", "B", wf="fork"), req("r2", "t1", "c", "C", wf="fork")],
             tasks=[task("t1", "fork", done={"a"})], workflows=(FORK,))
    assert reuse_counts(s) == {}


def test_eq12_aging():
    # g = 1 + rho log(1 + (t - tau)/H_age): t - tau = H_age gives 1 + log 2; rho = 0.5, 3 H_age: 1 + 0.5 log 4.
    assert aging(10.0, 0.0, 10.0, 1.0) == pytest.approx(1 + math.log(2))
    assert aging(40.0, 10.0, 10.0, 0.5) == pytest.approx(1 + 0.5 * math.log(4))
    assert aging(5.0, 5.0, 10.0, 1.0) == 1.0
