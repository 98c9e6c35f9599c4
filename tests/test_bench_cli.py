"""`topas bench` end to end: table, --json, --plot, policy options, --trace, --decision-cost."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest

from topas_agents.cli import bench as bench_cli
from topas_agents.cli import main
from topas_agents.policies import register_policy
from topas_agents.policies.baselines import FCFS

pytestmark = pytest.mark.skipif(importlib.util.find_spec("topas_agents.sim") is None,
                                reason="topas_agents.sim (the simulator) is not importable yet")

SEEN_OPTIONS: list[dict] = []


class RecordingFCFS(FCFS):
    """FCFS that remembers the options its factory was given."""

    name = "t-opts"


def make_recording(**options):
    SEEN_OPTIONS.append(options)
    return RecordingFCFS()


register_policy("t-opts", f"{__name__}:make_recording")


def test_table_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "r" / "out.json", tmp_path / "p" / "out.png"
    rc = main(["bench", "--workload", "chain3", "--policies", "fcfs,lpm", "--rate", "0.05,0.15",
               "--tasks", "6", "--seed", "4", "--json", str(out), "--plot", str(png), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "chain3 on a100-80g-qwen2.5-32b: 6 tasks, seed 4, capacity" in text
    assert "rate 0.05 tasks/s: lower bound" in text and "rate 0.15 tasks/s" in text
    for col in ("mean JCT s", "p99 JCT s", "gap to LB", "mean batch", "swaps", "preempt", "decision ms"):
        assert col in text
    data = json.loads(out.read_text())
    assert list(data) == ["workload", "profile", "seed", "tasks", "capacity_rps", "host_tier", "policy_options",
                          "points", "summary"]
    assert data["seed"] == 4 and data["tasks"] == 6 and len(data["points"]) == 2
    assert list(data["summary"]) == ["fcfs", "lpm"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_columns_stay_aligned_for_a_long_policy_name(capsys):
    rc = main(["bench", "--workload", "chain3", "--policies", "lpm,topas-paper-tuned", "--rate", "0.05",
               "--tasks", "4", "--seed", "0", "--no-progress"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy"))
    rows = lines[header:header + 3]
    assert rows[1].startswith("lpm ") and rows[2].startswith("topas-paper-tuned ")
    # every column right-aligned under its header: the rows have the header's width
    assert len({len(row) for row in rows}) == 1
    summary = [line for line in lines if line.startswith("  lpm") or line.startswith("  topas-paper-tuned")]
    assert len(summary) == 2 and summary[0].index("mean JCT") == summary[1].index("mean JCT")


def test_the_table_says_what_a_guarded_policys_decision_time_holds(capsys):
    """`topas` decides behind its forecast guard, whose simulations run inside decide() in the
    simulator: its decision ms read ~150 ms beside 0.03 ms with nothing to say why."""
    def table(policies: str) -> str:
        assert main(["bench", "--workload", "chain3", "--policies", policies, "--rate", "0.1",
                     "--tasks", "4", "--seed", "0", "--no-progress"]) == 0
        return capsys.readouterr().out

    assert "decision ms of topas: each decide() call with its forecast guard's simulations" in table("lpm,topas")
    assert "forecast guard" not in table("lpm,topas-core")


def test_load_and_profile_options(tmp_path, capsys):
    out = tmp_path / "o.json"
    rc = main(["bench", "--workload", "dag4", "--policies", "fcfs", "--load", "0.2", "--tasks", "4",
               "--profile", "h100-80g-qwen2.5-32b", "--kv-budget", "30000", "--no-host-tier", "--check",
               "--json", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["profile"] == "h100-80g-qwen2.5-32b" and data["points"][0]["load"] == 0.2


def test_policy_opt_and_config_reach_the_factory(tmp_path, capsys):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("t-opts: {alpha: 1, beta: [1, 2]}\nfcfs: {}\ntopas: {beta: 0.1}\n")
    SEEN_OPTIONS.clear()
    rc = main(["bench", "--workload", "chain3", "--policies", "t-opts", "--rate", "0.1", "--tasks", "2",
               "--policy-config", str(cfg), "--policy-opt", "t-opts.alpha=0.5",
               "--policy-opt", "t-opts.name=x", "--policy-opt", "t-opts.flag=true", "--no-progress"])
    assert rc == 0
    assert SEEN_OPTIONS and all(o == {"alpha": 0.5, "beta": [1, 2], "name": "x", "flag": True}
                                for o in SEEN_OPTIONS)


def test_trace_replay(tmp_path, capsys):
    from topas_agents.bench import write_trace_record

    path = tmp_path / "calls.jsonl"
    with path.open("w") as fh:
        for i in range(3):
            for k, (stage, agent) in enumerate((("s1", "a"), ("s2", "b"), ("s3", "c"))):
                write_trace_record(fh, task_id=f"t{i}", workflow="chain3", stage=stage, agent=agent,
                                   prefix_tokens=4096, input_tokens=512, output_tokens=256,
                                   t_submit=30.0 * i + k, t_done=30.0 * i + k + 1, round=0)
    out = tmp_path / "o.json"
    assert main(["bench", "--trace", str(path), "--policies", "fcfs", "--rate", "0.05,0.1",
                 "--json", str(out), "--no-progress"]) == 0
    data = json.loads(out.read_text())
    assert data["workload"] == "calls.jsonl" and data["tasks"] == 3
    assert [p["rate"] for p in data["points"]] == [0.05, 0.1]


def test_decision_cost_with_a_stand_in_module(tmp_path, capsys, monkeypatch):
    fake = types.ModuleType("fake_microbench")
    calls = []

    def run_decision_benchmark(policies, n_agents=50, n_waiting=1000, seed=0, profile=None, options=None):
        calls.append((policies, n_agents, n_waiting, seed, profile, options))
        return {p: {"decision_ms_mean": 1.0} for p in policies}

    fake.run_decision_benchmark = run_decision_benchmark
    monkeypatch.setitem(sys.modules, "fake_microbench", fake)
    monkeypatch.setattr(bench_cli, "MICROBENCH", "fake_microbench")
    out = tmp_path / "d.json"
    assert main(["bench", "--decision-cost", "--policies", "fcfs,lpm", "--json", str(out),
                 "--profile", "h100-80g-qwen2.5-32b"]) == 0
    assert calls == [(["fcfs", "lpm"], 50, 1000, 0, "h100-80g-qwen2.5-32b", {})]
    assert json.loads(capsys.readouterr().out) == json.loads(out.read_text())


def test_decision_cost_times_the_options_given(capsys):
    # --policy-opt was refused with --decision-cost: a configuration's cost could not be timed
    argv = ["bench", "--decision-cost", "--policies", "topas-core", "--seed", "1"]
    assert main([*argv, "--policy-opt", "topas-core.width=2", "--policy-opt", "topas-core.beta=0"]) == 0
    row = json.loads(capsys.readouterr().out)["topas-core"]
    assert row["options"] == {"width": 2, "beta": 0.0} and row["n"] == 200 and row["cpu_mean_ms"] > 0
    assert main([*argv, "--policy-opt", "topas-core.no_such_knob=1"]) == 2
    assert "no_such_knob" in capsys.readouterr().err


def test_decision_cost_without_the_module(capsys, monkeypatch):
    monkeypatch.setattr(bench_cli, "MICROBENCH", "topas_agents.no_such_microbench")
    assert main(["bench", "--decision-cost", "--policies", "fcfs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --decision-cost needs topas_agents.no_such_microbench") and err.count("\n") == 1


def test_docs_regenerates_page_json_and_plots(tmp_path, capsys):
    out = tmp_path / "site" / "results.md"
    rc = main(["docs", "--out", str(out), "--tasks", "3", "--seeds", "0,1", "--workloads", "chain3,metagpt-tl",
               "--policies", "fcfs,lpm,topas", "--no-ablation", "--jobs", "2", "--no-progress"])
    assert rc == 0
    page = out.read_text()
    assert page.startswith("# Results\n")
    assert f"Generated by `topas docs --out {out} --tasks 3 --seeds 0,1 --workloads chain3,metagpt-tl" in page
    assert "## Summary, host tier `all`" in page and "## Summary, host tier `paper`" in page
    assert "| [chain3](#chain3-all) | " in page and "| [metagpt-tl](#metagpt-tl-paper) | " in page
    assert "(results/metagpt-tl-paper.png)" in page and "*lower bound*" in page and "**topas**" in page
    assert "0.15/s (load 0.46)" in page  # the paper's Chain-3 rate is among the points
    for stem, tiers in (("chain3-all", [True, True, True]), ("metagpt-tl-paper", [False, False, True])):
        data = json.loads((out.parent / "results" / f"{stem}.json").read_text())
        assert data["seeds"] == [0, 1] and len(data["per_seed"]) == 2
        assert list(data["host_tier"]["policies"].values()) == tiers
        assert list(data["per_seed"][0]["points"][0]["results"]) == ["fcfs", "lpm", "topas"]
        assert data["over_seeds"]["topas"]["mean_jct_vs_best_baseline"]["n"] == 2
        assert (out.parent / "results" / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"


def test_docs_explicit_unbuildable_policy_is_one_line(tmp_path, capsys, monkeypatch):
    from topas_agents import policies

    monkeypatch.setitem(policies._REGISTRY, "t-broken", "topas_agents.no_such_module:make")
    rc = main(["docs", "--out", str(tmp_path / "r.md"), "--policies", "fcfs,t-broken", "--tasks", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: policy 't-broken' is not available") and err.count("\n") == 1


def test_seeds_without_a_baseline_report_no_comparator(capsys):
    """Regression: one non-baseline policy over seeds crashed while naming the best baseline."""
    rc = main(["bench", "--workload", "chain3", "--policies", "topas",
               "--seeds", "1,2", "--tasks", "3", "--load", "0.5", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "vs no baseline" in out
