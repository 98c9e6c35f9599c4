"""Built-in workload sizing: MetaGPT prefixes from the recorded traces, the paper's operating
points as loads, the long-context workloads and the 72B-FP8 H200 profile they target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topas_agents.bench.capacity import capacity_rps
from topas_agents.bench.work import check_fits
from topas_agents.costmodel import load_profile
from topas_agents.errors import ConfigError
from topas_agents.policies import make_policy
from topas_agents.sim import make_trace, simulate
from topas_agents.workflow import builtin_workflows, load_workflow

TRACES = Path(__file__).resolve().parents[1] / "datasets" / "traces"
A100 = load_profile()
H200_32B = load_profile("h200-qwen2.5-32b")
H200_72B = load_profile("h200-qwen2.5-72b-fp8")
LONG = ("coding-swarm", "coding-waves")


def recorded_prefixes(name: str) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for line in (TRACES / name).read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["agent"], set()).add(rec["prefix_tokens"])
    return out


# ---------------------------------------------------------------------------- MetaGPT


@pytest.mark.parametrize("workload", ["metagpt-sop", "metagpt-tl"])
def test_metagpt_specialist_prefixes_are_the_recorded_metagpt_082_ones(workload: str) -> None:
    wf = load_workflow(workload)
    rec = recorded_prefixes("metagpt-sop-echo.jsonl")
    for agent in ("product_manager", "architect", "project_manager"):
        assert {wf.prefix_tokens(agent)} == rec[agent]
    # WriteCode and WriteCodeReview templates both stay resident for the engineer's file loop.
    assert wf.prefix_tokens("engineer") == sum(rec["engineer"])


def test_paper_operating_points_as_loads_on_the_a100() -> None:
    tl = 0.0175 / capacity_rps(load_workflow("metagpt-tl"), A100)
    sop = 0.15 / capacity_rps(load_workflow("metagpt-sop"), A100)
    assert 0.3 <= tl <= 0.5  # Fig. 5's ablation point: the contended end of the defaults
    assert tl <= max(load_workflow("metagpt-tl").loads) + 0.01
    assert sop > 1.0  # the overhead run's rate is an overload with MetaGPT-sized documents (README)


# ---------------------------------------------------------------------------- long context


@pytest.mark.parametrize("workload", LONG)
def test_long_context_workloads_are_built_in_and_sized_for_the_h200(workload: str) -> None:
    assert workload in builtin_workflows()
    wf = load_workflow(workload)
    assert wf.description and list(wf.loads) == sorted(wf.loads) and all(0 < u < 1 for u in wf.loads)
    assert 16 <= len(wf.agents) <= 32
    assert all(8192 <= a.prefix_tokens <= 16384 for a in wf.agents)
    assert max(s.input_tokens.hi for s in wf.stages) >= 24_000  # histories carried across rounds
    for profile in (H200_32B, H200_72B):
        check_fits(wf, profile.kv_budget_tokens)
    with pytest.raises(ConfigError, match="cannot hold stage"):
        check_fits(wf, A100.kv_budget_tokens)
    prefixes = sum(a.prefix_tokens for a in wf.agents)
    assert prefixes >= 0.9 * H200_72B.kv_budget_tokens  # residency is contended on the 72B profile
    assert prefixes >= 0.6 * H200_32B.kv_budget_tokens


def test_coding_waves_second_wave_is_pipelined_on_neighbouring_explorers() -> None:
    wf = load_workflow("coding-waves")
    assert wf.stage("i01_implement").after == ("e01_explore", "e02_explore")
    assert max(wf.depth.values()) == 3 and len(wf.stage("merge").after) == 15
    assert sum(a.prefix_tokens for a in wf.agents) > H200_32B.kv_budget_tokens


@pytest.mark.parametrize("policy", ["lpm-gated", "kvflow"])
def test_long_context_workload_runs_on_the_72b_profile(policy: str) -> None:
    wf = load_workflow("coding-swarm")
    trace = make_trace(wf, 3, 0.5 * capacity_rps(wf, H200_72B), 0)
    res = simulate(trace, make_policy(policy), H200_72B, check=True)
    assert len(res.tasks) == 3 and res.stats.prefix_swaps_in + res.stats.prefix_recomputes > 0


# ---------------------------------------------------------------------------- 72B-FP8 profile


def test_72b_fp8_profile_follows_its_derivation() -> None:
    p = H200_72B
    assert p.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # K,V x layers x KV heads x head_dim x bf16
    weights = 70.2e9 * 1 + 2 * 152_064 * 8192 * 2  # FP8 body, bf16 embeddings
    static = 0.9 * 143_771 * 2**20  # the fraction that gives the 32B H200 profile its 267k
    assert p.kv_budget_tokens == pytest.approx((static - weights) / p.kv_bytes_per_token, rel=0.01)
    assert p.tm_s > H200_32B.tm_s and p.tc_s_per_token > H200_32B.tc_s_per_token
    # Batch-1 decode of a 72B FP8 model on one H200: 40-55 tokens/s.
    assert 1 / 55 <= p.decode_step_s(1, 2000) <= 1 / 40
