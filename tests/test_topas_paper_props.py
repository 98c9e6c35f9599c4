"""Property tests for topas-paper: every decision is applicable, within the KV budget and the
K caps, never keeps an idle prefix, and is deterministic."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_topas_props import snapshots

from topas_agents.policies import make_policy
from topas_agents.policies.topas.paper_config import TOPAS_OPTIONS
from topas_agents.snapshot import check_decision, kv_after

ALL_OPTIONS = {"horizon": 0.3, "work_floor": 0.25, "size_weight": 1.0, "kv_exp": 0.0, "redo_prefill": 1,
               "pin_finishing": 1, "k_preempt": 4, "forfeit": 1, "keep_idle": 1}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.sampled_from([{}, {"M": 0}, {"K": 2}, {"K": 0}, ALL_OPTIONS, TOPAS_OPTIONS,
                                     {**TOPAS_OPTIONS, "K": 2}]))
def test_paper_decision_is_applicable_and_keeps_no_idle_prefix(s, options):
    policy = make_policy("topas-paper", options)
    d = policy.decide(s)
    check_decision(s, d)
    assert kv_after(s, d) <= s.kv_budget
    k = policy.config.K
    if k:
        assert len(d.admit) <= k and len(d.preempt) <= k
    if options.get("prefetch"):  # only a prefix a released stage needs, and never one admitted on
        assert not set(d.prefix_in) & {r.agent for r in s.waiting if r.rid in d.admit}
    else:
        assert not d.prefix_in  # no proactive prefetch
    kept = {r.agent for r in s.running if r.rid not in d.preempt} | {r.agent for r in s.waiting if r.rid in d.admit}
    kept |= set(d.prefix_in)
    on_gpu = {p.agent for p in s.prefixes if p.on_gpu}
    if options.get("keep_idle"):  # the option may keep an idle prefix a released stage needs
        assert set(d.prefix_out) <= on_gpu - kept
    else:
        assert on_gpu - kept == set(d.prefix_out)  # every resident prefix outside R' leaves


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(snapshots(), min_size=2, max_size=5))
def test_paper_policy_is_deterministic_across_a_sequence(seq):
    a, b = make_policy("topas-paper"), make_policy("topas-paper")
    for s in seq:
        da, db = a.decide(s), b.decide(s)
        check_decision(s, da)
        assert da == db
