"""`--reuse FILE`: a suite takes the baselines' runs from an earlier JSON of the same suite
instead of rerunning them, gives the same verdict as a full run, and refuses a file of
another suite with a one-line ConfigError."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from topas_agents.cli import main
from topas_agents.errors import ConfigError
from topas_agents.suite import run_suite_cli
from topas_agents.suite import runner as suite_runner


def _args(tmp: Path, name: str = "out.json", **over) -> argparse.Namespace:
    base = dict(suite="random", workflows=2, worst_dir=str(tmp / "worst"), seeds=(0,), seed=0, load=(0.5,),
                tasks=8, profile="a100-80g-qwen2.5-32b", kv_budget=None, policies=("lpm", "topas-core"),
                json=str(tmp / name), no_progress=True)
    return argparse.Namespace(**{**base, **over})


@pytest.fixture()
def full_run(tmp_path: Path) -> Path:
    assert run_suite_cli(_args(tmp_path, "full.json")) == 0
    return tmp_path / "full.json"


def _recording_bench(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    asked: list[tuple[str, ...]] = []
    real = suite_runner._bench

    def bench(job, config, policies, loads):
        asked.append(tuple(policies))
        return real(job, config, policies, loads)

    monkeypatch.setattr(suite_runner, "_bench", bench)
    return asked


def test_reused_baselines_are_not_rerun_and_the_verdict_is_the_same(
        full_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    asked = _recording_bench(monkeypatch)
    assert run_suite_cli(_args(tmp_path, "reused.json", reuse=str(full_run))) == 0
    assert asked == [("topas-core",), ("topas-core",)]  # one job per workflow, the judged policy only
    assert f"baselines' runs reused from {full_run}: 2 of 2" in capsys.readouterr().out
    full, reused = (json.loads((tmp_path / n).read_text()) for n in ("full.json", "reused.json"))
    assert reused["reused"] == {"file": str(full_run), "runs": 2}
    assert full["reused"] is None
    for a, b in zip(full["workflows"], reused["workflows"], strict=True):
        assert a["runs"] == b["runs"]  # the simulator is deterministic: same runs, same order
        assert list(b["runs"]["0"]["0.5"]) == ["lpm", "topas-core"]
        assert a["per_load"] == b["per_load"] and a["paper"] == b["paper"]
    assert full["distribution"] == reused["distribution"]


def test_runs_missing_from_the_file_are_made(full_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _recording_bench(monkeypatch)
    run_suite_cli(_args(tmp_path, "more.json", reuse=str(full_run), seeds=(0, 1)))
    # seed 0's lpm runs come from the file; seed 1 was never run there
    assert sorted(asked) == sorted([("topas-core",)] * 2 + [("lpm", "topas-core")] * 2)
    assert json.loads((tmp_path / "more.json").read_text())["reused"]["runs"] == 2


def _tampered(full_run: Path, tmp_path: Path, change) -> str:
    doc = json.loads(full_run.read_text())
    change(doc)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(("over", "match"), [
    ({"suite_seed": 7}, "gen_seed is 0, this suite's is 7"),
    ({"tasks": 9}, "tasks is 8, this suite's is 9"),
    ({"kv_budget": 20000}, "kv_budget"),
    ({"profile": "h200-qwen2.5-32b"}, "profile"),
])
def test_another_suites_file_is_refused(full_run: Path, tmp_path: Path, over: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        run_suite_cli(_args(tmp_path, "x.json", reuse=str(full_run), **over))
    assert not (tmp_path / "x.json").exists()


def test_a_profile_with_the_same_name_and_other_values_is_refused(full_run: Path, tmp_path: Path) -> None:
    """Only the name was compared: a calibrated or edited profile keeps its file's name, and a 5x
    slower GPU named like the A100 reused the A100's baselines (every verdict wrong)."""
    import yaml

    from topas_agents.costmodel import load_profile

    src = Path(__file__).parents[1] / "topas_agents" / "profiles" / "a100-80g-qwen2.5-32b.yaml"
    data = yaml.safe_load(src.read_text())
    data["tm_s"] = 0.2
    slow = tmp_path / "edited" / "a100-80g-qwen2.5-32b.yaml"
    slow.parent.mkdir()
    slow.write_text(yaml.safe_dump(data))
    assert load_profile(slow).name == "a100-80g-qwen2.5-32b" and load_profile(slow).tm_s == 0.2
    with pytest.raises(ConfigError, match="differs from this suite's in tm_s"):
        run_suite_cli(_args(tmp_path, "x.json", reuse=str(full_run), profile=str(slow)))
    # a file written before the values were stored: a built-in's name stands for its values
    old = _tampered(full_run, tmp_path, lambda doc: doc.pop("profile_values"))
    assert run_suite_cli(_args(tmp_path, "y.json", reuse=old)) == 0
    with pytest.raises(ConfigError, match="differs from this suite's in tm_s"):
        run_suite_cli(_args(tmp_path, "z.json", reuse=old, profile=str(slow)))


def test_host_tier_setups_that_give_the_baselines_the_same_tier_are_reusable(tmp_path: Path) -> None:
    """The labels were compared: the default (the profile's tier, on for the A100) and `all`,
    or `none` and `paper`, give every baseline the same tier and their runs are the same."""
    from topas_agents.bench.hosttier import ALL, NONE, PAPER

    assert run_suite_cli(_args(tmp_path, "none.json", host_tier=NONE)) == 0
    assert run_suite_cli(_args(tmp_path, "paper.json", host_tier=PAPER, reuse=str(tmp_path / "none.json"))) == 0
    with pytest.raises(ConfigError, match="host tier"):
        run_suite_cli(_args(tmp_path, "all.json", host_tier=ALL, reuse=str(tmp_path / "none.json")))
    assert run_suite_cli(_args(tmp_path, "default.json")) == 0
    assert run_suite_cli(_args(tmp_path, "all2.json", host_tier=ALL, reuse=str(tmp_path / "default.json"))) == 0


def test_changed_workflow_or_options_are_refused(full_run: Path, tmp_path: Path) -> None:
    def grow_prefix(doc: dict) -> None:
        doc["workflows"][1]["workflow"]["agents"][0]["prefix_tokens"] += 1

    def other_options(doc: dict) -> None:
        doc["policy_options"] = {"lpm": {"something": "1"}}

    with pytest.raises(ConfigError, match="rand0-001-.* is not the workflow this suite generates"):
        run_suite_cli(_args(tmp_path, reuse=_tampered(full_run, tmp_path, grow_prefix)))
    with pytest.raises(ConfigError, match=r"lpm ran with options \{'something': '1'\}, here \{\}"):
        run_suite_cli(_args(tmp_path, reuse=_tampered(full_run, tmp_path, other_options)))


@pytest.mark.parametrize(("content", "match"), [
    (None, "cannot read it"),
    ("{not json", "not JSON"),
    ('{"suite": "random"}', "not a random-suite JSON"),
    ('[1, 2]', "not a random-suite JSON"),
])
def test_unreadable_files_are_refused(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "in.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        run_suite_cli(_args(tmp_path, reuse=str(path)))


def test_errored_baseline_rows_are_rerun(full_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail_lpm(doc: dict) -> None:
        doc["workflows"][0]["runs"]["0"]["0.5"]["lpm"] = {"error": "stalled"}

    asked = _recording_bench(monkeypatch)
    run_suite_cli(_args(tmp_path, "again.json", reuse=_tampered(full_run, tmp_path, fail_lpm)))
    assert sorted(asked) == [("lpm", "topas-core"), ("topas-core",)]


def test_cli_refuses_reuse_without_a_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--workload", "chain3", "--tasks", "2", "--reuse", str(tmp_path / "x.json")]) == 2
    assert ("--reuse has no effect with the simulated --workload/--trace bench; it applies to --suite"
            in capsys.readouterr().err)


def test_cli_flag_reaches_the_suite(full_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _recording_bench(monkeypatch)
    argv = ["bench", "--suite", "random", "--workflows", "2", "--seeds", "0", "--load", "0.5", "--tasks", "8",
            "--policies", "lpm,topas-core", "--worst-dir", str(tmp_path / "w"), "--jobs", "1", "--no-progress",
            "--reuse", str(full_run), "--json", str(tmp_path / "cli.json")]
    assert main(argv) == 0
    assert asked == [("topas-core",), ("topas-core",)]
    assert json.loads((tmp_path / "cli.json").read_text())["reused"]["runs"] == 2
