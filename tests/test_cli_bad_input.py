"""Bad input to the CLI refused in one line, exit 2, before any work and leaving no file:
profiles, policy configs, traces, repeated list values, output suffixes and mode flags."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from topas_agents.cli import main
from topas_agents.costmodel import _PROFILE_DIR, DEFAULT_PROFILE

BASE_PROFILE = (_PROFILE_DIR / f"{DEFAULT_PROFILE}.yaml").read_text()
DEEP = "[" * 3000 + "]" * 3000


def _record(**over) -> dict:
    rec = {"task_id": "t1", "workflow": None, "stage": "s1", "agent": "a", "prefix_tokens": 100,
           "input_tokens": 10, "output_tokens": 10, "t_submit": 0.0, "t_done": 1.0, "round": 0}
    return rec | over


def _trace(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _fails(argv: list[str], capsys, message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err


def _profile(tmp_path: Path, text: str | bytes | None) -> str:
    path = tmp_path / "p.yaml"
    if text is None:
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def _field(name: str, value: str) -> str:
    return _fields(**{name: value})


def _fields(**values: str) -> str:
    """The base profile with these fields' values replaced."""
    lines = BASE_PROFILE.splitlines()
    return "\n".join(next((f"{k}: {v}" for k, v in values.items() if line.startswith(f"{k}:")), line)
                     for line in lines) + "\n"


@pytest.mark.parametrize(("text", "message"), [
    ("name: [\n", "invalid YAML at line"),
    (bytes(range(128, 256)), "cannot read profile file"),
    (None, "cannot read profile file"),
    (DEEP, "nested deeper"),
    (BASE_PROFILE + "tm_s: 0.05\n", "duplicate key 'tm_s'"),
    (_field("kv_budget_tokens", "17500.5"), "field 'kv_budget_tokens' must be an integer"),
    (_field("kv_budget_tokens", "true"), "field 'kv_budget_tokens' must be an integer"),
    (_field("name", "''"), "field 'name' must be a non-empty string"),
    (_field("tm_s", "1e308"), "tm_s must be at most 10 s"),
    # values each in range whose derived step times are not: an OverflowError traceback, a
    # simulator that never ended, a misleading "arrival rate must be > 0"
    (_field("kv_bytes_per_token", "1.0e300"), "a decode step over the whole KV budget"),
    (_fields(tm_s="0", tc_s_per_token="0", lm_head_s="0", overhead_s="0", hbm_bytes_per_s="1.0e100"),
     "a one-token forward step takes"),
    (_field("attn_flops_per_s", "1.0e-300"), "a prefill of 8192 tokens"),
    (_field("hbm_bytes_per_s", "1.0e-300"), "a decode step over the whole KV budget"),
    (_field("swap_bytes_per_s", "1.0e-300"), "moving the whole KV budget"),
])
def test_bad_profile_file(tmp_path, capsys, text, message):
    prof = _profile(tmp_path, text)
    _fails(["bench", "--workload", "chain3", "--policies", "fcfs", "--tasks", "2", "--profile", prof],
           capsys, message)
    _fails(["docs", "--quick", "--profile", prof, "--out", str(tmp_path / "d" / "r.md")], capsys, message)
    assert not (tmp_path / "d").exists()  # nothing created for a run that never started


@pytest.mark.parametrize("name", ["My.YAML", "my-gpu"])
def test_a_profile_file_of_any_suffix_loads(tmp_path, name):
    # "unknown profile" for an upper-case suffix or none (workflow files took either)
    from topas_agents.costmodel import load_profile

    (tmp_path / name).write_text(BASE_PROFILE)
    assert load_profile(tmp_path / name) == load_profile(_profile(tmp_path, BASE_PROFILE))


@pytest.mark.parametrize(("text", "message"), [
    (DEEP, "nested deeper"),
    ("topas: {beta: 1}\ntopas: {beta: 2}\n", "duplicate key 'topas'"),
])
def test_bad_policy_config(tmp_path, capsys, text, message):
    path = tmp_path / "pc.yaml"
    path.write_text(text)
    _fails(["bench", "--workload", "chain3", "--policies", "topas", "--tasks", "2", "--policy-config", str(path)],
           capsys, message)


@pytest.mark.parametrize(("lines", "message"), [
    (["[" * 100_000 + "]" * 100_000], ":1: invalid JSON: nested too deeply"),
    (['{"task_id": "t1", ' + json.dumps(_record())[1:]], ":1: duplicate key 'task_id'"),
    # arrivals 1e20 s apart: replayed "at 1e-20 tasks/s" with a JCT below the lower bound
    ([json.dumps(_record()), json.dumps(_record(task_id="t2", t_submit=1e20, t_done=1e20))],
     "field 't_submit': expected seconds within"),
    ([json.dumps(_record()), json.dumps(_record(task_id="t2", t_submit=1e9, t_done=1e9 + 1))],
     "a rate of 1e-09 tasks/s, below the supported 0.0001"),
    # a tool gap over the limit was reported as a workflow field the trace does not have
    ([json.dumps(_record()), json.dumps(_record(round=1, t_submit=10_000.0, t_done=10_001.0))],
     "t.jsonl:2: stage 's1' of workflow 'unlabelled': its rounds are 9999 s apart"),
])
def test_bad_trace(tmp_path, capsys, lines, message):
    _fails(["bench", "--trace", _trace(tmp_path, lines), "--policies", "fcfs"], capsys, message)


def test_seeds_over_a_recorded_trace_need_arrivals_to_draw(tmp_path, capsys):
    """Each seed replayed the same recorded run: identical runs shown as a zero-width CI."""
    trace = _trace(tmp_path, [json.dumps(_record()), json.dumps(_record(task_id="t2", t_submit=5.0, t_done=6.0))])
    _fails(["bench", "--trace", trace, "--seeds", "0,1", "--policies", "fcfs"], capsys, "add --rate or --load")


def test_far_arrivals_replay_when_redrawn(tmp_path, capsys):
    lines = [json.dumps(_record()), json.dumps(_record(task_id="t2", t_submit=1e9, t_done=1e9 + 1))]
    assert main(["bench", "--trace", _trace(tmp_path, lines), "--policies", "fcfs", "--rate", "0.1"]) == 0


def test_empty_trace_path_is_named(capsys):
    _fails(["bench", "--trace", "", "--policies", "fcfs"], capsys, "--trace: empty path")


def test_suite_reuse_deep_json(tmp_path, capsys):
    reuse = tmp_path / "r.json"
    reuse.write_text("[" * 100_000 + "]" * 100_000)
    _fails(["bench", "--suite", "random", "--workflows", "1", "--tasks", "5", "--reuse", str(reuse),
            "--worst-dir", str(tmp_path / "w")], capsys, "nested too deeply")


def test_plot_format_checked_before_the_run(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _fails(["bench", "--workload", "chain3", "--policies", "fcfs", "--tasks", "2", "--plot",
            str(tmp_path / "x.txt")], capsys, "format 'txt' is not supported")


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "--workload", "chain3", "--load", "0.3,0.3"], "0.3 is given twice"),
    (["bench", "--workload", "chain3", "--rate", "0.1,0.1"], "0.1 is given twice"),
    (["bench", "--workload", "chain3", "--replicas", "2", "--scaling", "fcfs+task,fcfs+task"],
     "a POLICY+ROUTER pair is given twice"),
    (["bench", "--workload", "chain3", "--replicas", "2", "--router", "task,task"], "a router is given twice"),
    (["docs", "--workloads", "chain3,chain3"], "--workloads: 'chain3' given twice"),
    (["serve", "--replay-file", "nosuch.jsonl"], "--replay-file applies to --responder replay only"),
    (["serve", "--decision-log", "d.jsonl"], "--decision-log applies to --engine sglang only"),
    (["serve", "--engine", "sglang", "--model-name", "m"],
     "--model-name applies to --engine sim only (this is --engine sglang); SGLang's own is `-- --served-model-name NAME`"),
    (["serve", "--engine", "sglang", "--drain-timeout", "5"], "--drain-timeout applies to --engine sim only"),
    # the tier went to nobody that ran, without a word
    (["bench", "--workload", "chain3", "--policies", "fcfs,lpm", "--host-tier", "topas"],
     "--host-tier topas: topas not among --policies (fcfs, lpm)"),
    (["bench", "--suite", "random", "--workflows", "100000"], "expected an integer in [1, 1000]"),
    # the server runs one policy: the others were ignored, and --sim compared none of them
    (["bench", "--server", "http://127.0.0.1:9/v1", "--policies", "fcfs,topas"], "--server runs the policy"),
    # a directory: figure_path wrote DIR.png beside it
    (["bench", "--workload", "chain3", "--policies", "fcfs", "--plot", "."], "--plot .: is a directory"),
])
def test_repeats_and_idle_flags(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("topas_agents.server.runner.run_server", lambda cfg: 0)  # a serve that starts: rc 0
    _fails(argv, capsys, message)
    assert list(tmp_path.iterdir()) == []


def test_calibrate_writes_nothing_when_the_profile_does_not_load(tmp_path):
    from topas_agents.cli.calibrate import write_profile
    from topas_agents.costmodel import load_profile
    from topas_agents.errors import ConfigError

    out = tmp_path / "slow.yaml"
    out.write_text("old")
    slow = dataclasses.replace(load_profile(), tm_s=99.0)
    with pytest.raises(ConfigError, match=f"{out}: tm_s must be at most"):
        write_profile(out, slow, "http://x/v1", "base", [(1, 0.1)], [(1, 0.1)])
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["slow.yaml"]


def test_docs_failed_run_leaves_no_empty_folder(tmp_path, capsys, monkeypatch):
    from topas_agents.errors import ConfigError

    def fail(*args, **kwargs):
        raise ConfigError("simulated failure")

    monkeypatch.setattr("topas_agents.bench.runner.run_many", fail)
    assert main(["docs", "--quick", "--workloads", "chain3", "--no-ablation", "--policies", "fcfs",
                 "--out", str(tmp_path / "site" / "r.md")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: simulated failure"
    assert list(tmp_path.iterdir()) == []
    _fails(["docs", "--out", str(tmp_path / "results")], capsys, "cannot be the results folder")


def test_output_checks_create_no_folder(tmp_path):
    from topas_agents.cli.args import check_output
    from topas_agents.errors import ConfigError

    check_output("--worst-dir", tmp_path / "a" / "b", "dir")
    check_output("--json", tmp_path / "c" / "d" / "r.json")
    assert list(tmp_path.iterdir()) == []  # the writers create folders when they write
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        check_output("--json", tmp_path / "f" / "g" / "r.json")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        check_output("--json", tmp_path / "dir.json")
    # tried, not read from the mode bits: as root both passed, and the write failed after the run
    with pytest.raises(ConfigError, match="cannot write"):
        check_output("--json", "/proc/no-such-dir/e.json")
    for long_name in ("a" * 300 + ".json", "b" * 300 + "/e.json"):  # a traceback, then after the run
        with pytest.raises(ConfigError, match="too long"):
            check_output("--json", tmp_path / long_name)
    (tmp_path / "kept.json").write_text("old")
    check_output("--json", tmp_path / "kept.json")
    assert (tmp_path / "kept.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "f", "kept.json"]  # no probe left


def test_suite_failed_before_writing_leaves_no_worst_dir(tmp_path, capsys):
    worst, out = tmp_path / "worst" / "cases", tmp_path / "out" / "s.json"
    _fails(["bench", "--suite", "random", "--workflows", "1", "--seeds", "1", "--load", "0.3",
            "--tasks", "4", "--worst-dir", str(worst), "--json", str(out),
            "--reuse", str(tmp_path / "missing.json")], capsys, "missing.json")
    assert [p.name for p in tmp_path.iterdir()] == []  # the outputs were checked, not created


def test_calibrate_writes_into_a_missing_folder(tmp_path):
    from topas_agents.cli.calibrate import write_profile
    from topas_agents.costmodel import load_profile

    out = tmp_path / "new" / "gpu.yaml"
    write_profile(out, load_profile(), "http://x/v1", "base", [(1, 0.1)], [(1, 0.1)])
    assert load_profile(out).kv_budget_tokens == load_profile().kv_budget_tokens


def test_sglang_decision_log_creates_its_folder(tmp_path):
    # `topas serve --engine sglang --decision-log new/d.jsonl` checks the path, creating nothing;
    # the plugin's log creates the folder when it opens the file
    from topas_agents.server.sglang.adapter import DecisionLog

    path = tmp_path / "new" / "d.jsonl"
    log = DecisionLog(str(path))
    log.write({"decision": 1})
    log.close()
    assert path.read_text() == '{"decision":1}\n'


def test_sglang_gets_one_api_key():
    # `topas serve --engine sglang --api-key K` served without a key: SGLang never got it
    import argparse

    from topas_agents.errors import ConfigError
    from topas_agents.server.sglang.launch import build_command

    args = argparse.Namespace(model_path="/m", host="127.0.0.1", port=9, log_level="info")
    cmd = build_command(args, [], api_keys=("k1",))
    assert cmd[-1] == "--api-key=k1"
    assert "--api-key" not in build_command(args, [])
    assert build_command(args, [], api_keys=("k1", "k1"))[-1] == "--api-key=k1"
    with pytest.raises(ConfigError, match="takes one --api-key"):
        build_command(args, [], api_keys=("k1", "k2"))
    with pytest.raises(ConfigError, match="give the API key once"):
        build_command(args, ["--", "--api-key", "k2"], api_keys=("k1",))


def test_sglang_gets_its_key_in_an_owner_only_config_file(tmp_path):
    # `ps` showed `--api-key K` on SGLang's command line to every local user
    import stat

    import yaml

    from topas_agents.errors import ConfigError
    from topas_agents.server.sglang.launch import move_api_key_to_config

    cmd = ["python", "-m", "sglang.launch_server", "--api-key", "123", "--port", "9"]
    assert move_api_key_to_config(cmd[:3], tmp_path) == cmd[:3]  # no key: unchanged, no file
    for no_value in (cmd[:4], [*cmd[:4], "--port", "9"]):  # SGLang's parser names the missing value
        assert move_api_key_to_config(no_value, tmp_path) == no_value
    moved = move_api_key_to_config(cmd, tmp_path)
    assert "123" not in moved and moved[:5] == ["python", "-m", "sglang.launch_server", "--port", "9"]
    path = Path(moved[-1])
    assert moved[-2] == "--config" and path.parent == tmp_path and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert yaml.safe_load(path.read_text()) == {"api-key": "123"}  # a string: SGLang passes `--api-key 123`
    user = tmp_path / "mine.yaml"
    user.write_text("mem_fraction_static: 0.5\nenable-metrics: true\n")
    (tmp_path / "b").mkdir()  # the file is created anew (O_EXCL): one directory per launch
    moved = move_api_key_to_config([*cmd, "--config", str(user)], tmp_path / "b")
    assert str(user) not in moved and moved.count("--config") == 1  # SGLang takes one --config
    assert yaml.safe_load(Path(moved[-1]).read_text()) == {"mem_fraction_static": 0.5, "enable-metrics": True,
                                                            "api-key": "123"}
    for text, match in (("api_key: other\n", "give the API key once"), ("- a\n", "must hold a mapping"),
                        ("a: [\n", "could not be read")):
        user.write_text(text)
        with pytest.raises(ConfigError, match=match):
            move_api_key_to_config([*cmd, "--config", str(user)], tmp_path / "c")


def test_a_path_is_never_read_as_a_built_in_name(tmp_path):
    # "/x/gpu" loaded /x/gpu.yaml (the built-in lookup joined a path onto the built-in folder)
    from topas_agents.costmodel import load_profile
    from topas_agents.errors import ConfigError, WorkflowError
    from topas_agents.workflow import load_workflow

    (tmp_path / "gpu.yaml").write_text(BASE_PROFILE)
    with pytest.raises(ConfigError, match="unknown profile"):
        load_profile(str(tmp_path / "gpu"))
    (tmp_path / "wf.yaml").write_text((Path(__file__).parent.parent / "datasets" / "workloads" / "chain3.yaml").read_text())
    with pytest.raises(WorkflowError, match="unknown workflow"):
        load_workflow(str(tmp_path / "wf"))


def test_a_file_system_without_a_name_limit_refuses_no_name(tmp_path, monkeypatch):
    # pathconf's -1 (no fixed limit) made every name "too long"
    import os

    from topas_agents.cli.args import check_output

    monkeypatch.setattr(os, "pathconf", lambda path, name: -1)
    check_output("--json", tmp_path / "r.json")
