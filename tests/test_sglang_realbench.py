"""topas_agents.realbench pieces that need no server (the real runs are in
test_sglang_launch.py / test_sglang_policies.py, which use the same client)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from topas_agents.cli.calibrate import (
    PREFILL_WORDS,
    CallBurst,
    burst_size,
    call_overhead,
    decode_tc,
    fit_profile,
    prefill_sizes,
    slope,
    write_profile,
)
from topas_agents.costmodel import load_profile
from topas_agents.realbench.client import TaskResult, chat_body
from topas_agents.realbench.engine import scaled_workflow
from topas_agents.realbench.fidelity import fidelity, task_errors
from topas_agents.realbench.runner import (
    Failure,
    build_calls,
    sample_tasks,
    simulate_policies,
    summarize,
    summary_line,
)
from topas_agents.workflow import load_workflow, parse_workflow


def test_scaled_workflow_is_a_valid_workflow_with_shrunk_sizes() -> None:
    wf = load_workflow("chain3")
    small = parse_workflow(scaled_workflow(wf, 0.05))
    assert small.name == wf.name and small.topo_order == wf.topo_order
    assert parse_workflow(scaled_workflow(wf, 1.0)) == wf  # unscaled: the same definition (a server takes it as a repeat)
    assert [a.prefix_tokens for a in small.agents] == [205, 205, 205]  # 4096 * 0.05
    assert small.stage("s1").output_tokens.lo == 13 and small.stage("s1").input_tokens.lo == 26


def test_calls_follow_the_sampled_plan_with_exact_lengths() -> None:
    wf = parse_workflow(scaled_workflow(load_workflow("chain3"), 0.05))
    tasks = sample_tasks(wf, 3, rate=2.0, seed=1)
    assert [t.arrival_s for t in tasks] == sorted(t.arrival_s for t in tasks)
    calls = build_calls(tasks[0], 0.5, ignore_eos=False)
    assert list(calls) == ["s1", "s2", "s3"]
    c = calls["s1"][0]
    assert c.max_tokens == 13 and c.label.task_id == tasks[0].task_id and c.label.workflow == "chain3"
    assert len(c.system.split()) == 7 + 102  # "You are agent a of workflow chain3." + 205 tokens * 0.5
    body = chat_body("m", c)
    assert body["min_tokens"] == body["max_tokens"] == 13 and "ignore_eos" not in body
    assert body["topas"]["stage"] == "s1" and body["messages"][0]["role"] == "system"
    assert chat_body("m", build_calls(tasks[0], 0.5, ignore_eos=True)["s1"][0])["ignore_eos"] is True


def test_simulating_the_same_trace_gives_jct_per_policy() -> None:
    wf = parse_workflow(scaled_workflow(load_workflow("chain3"), 0.05))
    tasks = sample_tasks(wf, 4, rate=2.0, seed=0)
    sim = simulate_policies(tasks, ["lpm", "topas"], load_profile(), kv_tokens=1200)
    assert set(sim) == {"lpm", "topas"} and all(0 < r["mean_jct"] <= r["p99_jct"] for r in sim.values())


def test_summary_counts_failed_tasks_as_incomplete() -> None:
    done = [TaskResult(f"t{i}", 0.0, float(i + 1), ()) for i in range(3)]
    r = summarize([*done, RuntimeError("HTTP 500")], 4, {"decisions": 7, "preemptions": 1, "errors": 0})
    assert (r.tasks, r.tasks_completed, r.decisions, r.preemptions, r.plugin_errors) == (4, 3, 7, 1, 0)
    assert r.failures == (Failure(None, "RuntimeError: HTTP 500"),)  # said on stderr and in the JSON
    assert r.mean_jct == 2.0 and 2.9 < r.p99_jct <= 3.0
    assert math.isnan(summarize([], 1, None).mean_jct) and summarize([], 1, None).decisions is None


def test_the_printed_summary_leaves_out_counts_the_server_does_not_report() -> None:
    done = [TaskResult(f"t{i}", 0.0, float(i + 1), ()) for i in range(2)]
    ours = summary_line("topas", summarize(done, 2, {"decisions": 7, "preemptions": 1, "errors": 0}))
    assert ours.endswith("2/2 tasks, decisions 7, preemptions 1, plugin errors 0")
    # a `topas serve` or another endpoint (`--server`): no decision log to read, no "None"s
    theirs = summary_line("server", summarize(done, 2, None))
    assert theirs.endswith("2/2 tasks") and "None" not in theirs


def test_calibration_fit_writes_a_loadable_profile(tmp_path: Path) -> None:
    prefill = [(150, 0.017), (500, 0.022), (2000, 0.048), (4000, 0.078)]
    decode = [(1, 0.0028), (2, 0.0029), (4, 0.0034), (8, 0.0037)]
    assert 1.5e-5 < slope(prefill) < 1.7e-5 and slope([(1, 1.0), (1, 2.0)]) == 1e-9
    assert prefill_sizes(None) == PREFILL_WORDS and prefill_sizes(1000) == (8, 50)
    assert all(n * 5 <= 8192 // 2 for n in prefill_sizes(8192)) and len(prefill_sizes(8192)) >= 2
    profile = fit_profile(load_profile(), "cpu-tiny", "m", 8192, prefill, decode)
    out = tmp_path / "cpu-tiny.yaml"
    write_profile(out, profile, "http://x/v1", "base", prefill, decode)
    loaded = load_profile(out)
    assert loaded == profile and (loaded.tm_s, loaded.kv_budget_tokens, loaded.overhead_s) == (0.0028, 8192, 0.0)
    assert "# decode step (batch, s): (1, 0.00280)" in out.read_text()


def test_call_overhead_is_the_median_latency_beyond_modelled_prefill(tmp_path: Path) -> None:
    prefill = [(150, 0.017), (500, 0.022), (2000, 0.048), (4000, 0.078)]
    decode = [(1, 0.0028), (2, 0.0029), (4, 0.0034), (8, 0.0037)]
    bare = fit_profile(load_profile(), "cpu-tiny", "m", 8192, prefill, decode)
    assert bare.call_overhead_s == 0.0  # no minimal calls measured: nothing assumed
    singles = [CallBurst(1, 20, bare.prefill_s(20) + x) for x in (0.05, 0.04, 0.30)]
    assert math.isclose(call_overhead(bare, singles), 0.05, rel_tol=1e-9)  # no bursts: the singles' median
    # a burst of k is k front-end services plus one prefill of all its tokens; the median burst wins
    bursts = [CallBurst(8, 160, bare.prefill_s(160) + 8 * x) for x in (0.02, 0.03, 0.5)]
    profile = fit_profile(load_profile(), "cpu-tiny", "m", 8192, prefill, decode, singles + bursts)
    assert math.isclose(profile.call_overhead_s, 0.03, rel_tol=1e-9)
    assert call_overhead(bare, [CallBurst(1, 20, bare.prefill_s(20) / 2)]) == 0.0  # clamped, never negative
    assert burst_size(None) == 16 and burst_size(1000) == 11 and burst_size(10) == 2
    out = tmp_path / "p.yaml"
    write_profile(out, profile, "http://x/v1", "base", prefill, decode, singles + bursts)
    assert load_profile(out) == profile and "-> call_overhead_s 0.0300" in out.read_text()


def test_fidelity_reports_mean_and_per_task_errors_and_ranking() -> None:
    real = {"lpm": {"a": 1.0, "b": 3.0}, "topas": {"a": 1.0, "b": 2.0}}
    sim = {"lpm": {"a": 1.05, "b": 2.85}, "topas": {"a": 0.5, "b": 1.5}}
    f = fidelity(real, sim, {"lpm": {"a": 0.2, "b": 0.6}, "topas": {"a": 0.2, "b": 0.4}})
    lpm = f["policies"]["lpm"]
    assert math.isclose(lpm["mean_jct_rel_error"], (1.95 - 2.0) / 2.0)
    assert math.isclose(lpm["rel_error_without_call_overhead"], (0.4 - 2.0) / 2.0)
    assert (lpm["task_rel_error"]["n"], lpm["task_rel_error"]["within_goal"]) == (2, 2)
    assert f["ranking"] == {"real": ["topas", "lpm"], "sim": ["topas", "lpm"], "matches": True}
    assert f["goal"]["means_within"] is False and f["goal"]["met"] is False  # topas is 33% low
    assert task_errors({"a": 1.0}, {}) == {"n": 0}  # a task the simulator did not finish
    # nothing compared (the real run was named "server"): no verdict; all([]) said "met"
    none = fidelity({"server": {"a": 1.0}}, sim)
    assert none["policies"] == {} and none["goal"]["met"] is None and none["ranking"]["matches"] is None


def test_tc_comes_from_the_prefill_slope_or_if_noise_hid_it_from_decode_batches() -> None:
    decode = [(1, 0.0044), (2, 0.0055), (4, 0.0079), (8, 0.0092)]  # measured on 2 shared CPU cores
    gpu_like = fit_profile(load_profile(), "p", "m", 8192, [(150, 0.017), (4000, 0.078)], decode)
    assert math.isclose(gpu_like.tc_s_per_token, slope([(150, 0.017), (4000, 0.078)]))
    flat = fit_profile(load_profile(), "p", "m", 1000, [(12, 0.030), (60, 0.029)], decode)  # slope < 0: noise
    tc = decode_tc(0.0044, decode)
    assert flat.tc_s_per_token == tc and 0.9e-3 < tc < 1.3e-3
    assert math.hypot(0.0044, 8 * tc) == pytest.approx(0.0092, rel=0.1)  # the fit reproduces batch 8
    assert decode_tc(0.0044, [(1, 0.0044)]) == 0.0 and decode_tc(0.01, [(2, 0.001)]) == 0.0  # nothing to fit
