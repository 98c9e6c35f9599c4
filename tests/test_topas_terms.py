"""Topas score terms and configuration, on hand-computed examples."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from test_topas_support import DAG4, PROFILE

from topas_agents.errors import ConfigError
from topas_agents.policies import make_policy
from topas_agents.policies.topas import TopasConfig, make_config
from topas_agents.policies.topas.terms import (
    CreditStore,
    aging,
    imminence,
    j_move,
    j_redo,
    load_cost,
    released_children,
    reload_cost,
)
from topas_agents.snapshot import PrefixView, RequestView


def test_aging_is_one_plus_rho_log():
    assert aging(0.0, 10.0, 1.0) == 1.0
    assert aging(10.0, 10.0, 1.0) == pytest.approx(1.0 + math.log(2.0))
    assert aging(30.0, 10.0, 0.5) == pytest.approx(1.0 + 0.5 * math.log(4.0))
    assert aging(1e6, 10.0, 0.0) == 1.0  # rho = 0: no aging


def test_j_move_serializes_link_transfers_smith_order():
    # two swap-ins of 0.04 s: one awaited by 2 tasks, one by 1 task. Smith's rule loads the
    # 2-task prefix first: 2 x 0.04 + 1 x (0.04 + 0.04) = 0.16 (the other order costs 0.20).
    assert j_move([(0.04, True, 1), (0.04, True, 2)]) == pytest.approx(0.16)
    # the k-th transfer waits for all earlier ones: three prefixes, one task each
    assert j_move([(0.1, True, 1), (0.1, True, 1), (0.1, True, 1)]) == pytest.approx(0.1 + 0.2 + 0.3)
    # recomputes are not on the link: each waiting task pays it once, nobody else waits
    assert j_move([(1.2, False, 3), (0.04, True, 1)]) == pytest.approx(3.6 + 0.04)
    # a prefix nobody waits for (proactive load) costs nothing
    assert j_move([(0.5, True, 0)]) == 0.0


def test_load_cost_by_location_and_host_tier():
    tokens = 4096
    gpu = PrefixView("a", tokens, "gpu", 0.0, 0)
    cpu = PrefixView("a", tokens, "cpu", 0.0, 0)
    none = PrefixView("a", tokens, "none", 0.0, 0)
    loading = PrefixView("a", tokens, "loading", 0.0, 0)
    assert load_cost(gpu, tokens, PROFILE) == (0.0, False)
    assert load_cost(loading, tokens, PROFILE) == (0.0, False)
    assert load_cost(cpu, tokens, PROFILE) == (pytest.approx(PROFILE.swap_s(tokens)), True)
    assert load_cost(none, tokens, PROFILE) == (pytest.approx(PROFILE.prefill_s(tokens)), False)
    no_host = replace(PROFILE, host_tier=False)
    assert load_cost(cpu, tokens, no_host) == (pytest.approx(no_host.prefill_s(tokens)), False)
    assert reload_cost(tokens, PROFILE) == pytest.approx(PROFILE.swap_s(tokens))
    assert reload_cost(tokens, no_host) == pytest.approx(no_host.prefill_s(tokens))
    # a 4k prefix swaps in ~50 ms but recomputes in over a second (cost facts)
    assert PROFILE.swap_s(tokens) < 0.06 < 1.0 < PROFILE.prefill_s(tokens)


def test_j_redo_prices_the_re_prefill_of_input_and_generated():
    r = RequestView("r", "t", "chain3", "s1", "a", 4096, 512, 256, 100, 0.0, 0.0)
    assert j_redo(r, PROFILE) == pytest.approx(PROFILE.prefill_s(612, 4096))
    fresh = RequestView("r", "t", "chain3", "s1", "a", 4096, 512, 256, 0, 0.0, 0.0)
    assert j_redo(fresh, PROFILE) < j_redo(r, PROFILE)


def test_credit_store_grant_revoke_sweep():
    store = CreditStore()
    store.grant("r1", 2.5)
    store.grant("r2", 1.0)
    assert store.get("r1") == 2.5 and len(store) == 2
    assert store.revoke("r1") == 2.5  # preempted: the credit is revoked (and gone)
    assert "r1" not in store and store.revoke("r1") == 0.0
    store.sweep(running=["r3"])  # r2 no longer running: it completed, its credit clears
    assert len(store) == 0


def test_released_children_fork_each_child_join_only_when_others_done():
    assert released_children(DAG4, "s_a", frozenset()) == ("s_b", "s_c")  # fork: both
    assert released_children(DAG4, "s_b", frozenset({"s_a"})) == ()  # join waits for s_c
    assert released_children(DAG4, "s_b", frozenset({"s_a", "s_c"})) == ("s_d",)
    assert released_children(DAG4, "s_d", frozenset({"s_a", "s_b", "s_c"})) == ()


def test_imminence_is_the_probability_of_finishing_within_the_horizon():
    assert imminence([1.0, 2.0, 3.0, 4.0], 2.5) == 0.5
    assert imminence([1.0], 0.5) == 0.0
    assert imminence([1.0], 1.0) == 1.0
    assert imminence([], 1.0) == 0.0


# ---------------------------------------------------------------- configuration


def test_make_config_converts_strings_and_numbers():
    cfg = make_config(beta="0.5", rho=2, k_admit="16", enum_agents=4.0)
    assert (cfg.beta, cfg.rho, cfg.k_admit, cfg.enum_agents) == (0.5, 2.0, 16, 4)
    assert isinstance(cfg.k_admit, int) and isinstance(cfg.rho, float)
    assert make_config() == TopasConfig()


@pytest.mark.parametrize("options, needle", [
    ({"bogus": 1}, "'bogus'"),
    ({"beta": "abc"}, "'beta'"),
    ({"k_admit": 0}, "'k_admit'"),
    ({"k_admit": "1.5"}, "'k_admit'"),
    ({"rho": -1}, "'rho'"),
    ({"enum_agents": 99}, "'enum_agents'"),
    ({"samples": True}, "'samples'"),
    ({"horizon": "nan"}, "'horizon'"),
])
def test_make_config_rejects_bad_options_naming_them(options, needle):
    with pytest.raises(ConfigError, match=needle):
        make_config(**options)


def test_config_is_frozen_and_slotted():
    cfg = TopasConfig()
    assert not hasattr(cfg, "__dict__")
    with pytest.raises(AttributeError):
        cfg.beta = 2.0  # type: ignore[misc]


def test_ablation_factories_differ_as_specified():
    full = make_policy("topas-core")
    base = make_policy("topas-base")
    noreuse = make_policy("topas-noreuse")
    noaging = make_policy("topas-noaging")
    assert (full.name, base.name, noreuse.name, noaging.name) == ("topas-core", "topas-base", "topas-noreuse",
                                                                  "topas-noaging")
    assert make_policy("topas").topas.config == full.config  # the recommended policy guards this core
    assert full.config.beta > 0 and full.config.rho > 0
    assert base.config.beta == 0 and base.config.rho == 0
    assert noreuse.config.beta == 0 and noreuse.config.rho == full.config.rho
    assert noaging.config.rho == 0 and noaging.config.beta == full.config.beta
    # everything else is the shared default
    for p in (base, noreuse, noaging):
        assert replace(p.config, beta=full.config.beta, rho=full.config.rho) == full.config
    # options override, through the registry too (CLI values arrive as strings)
    assert make_policy("topas-base", {"k_admit": "8"}).config.k_admit == 8
    with pytest.raises(ConfigError, match="'nope'"):
        make_policy("topas-noaging", {"nope": "1"})
