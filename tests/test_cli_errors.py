"""Every malformed input to `topas bench` / `topas docs` prints exactly one line
`error: ...` naming the problem and exits 2, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from topas_agents.cli import main

BENCH = ["bench", "--no-progress"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    out = {}
    (tmp_path / "dir.yaml").mkdir()
    out["dir"] = str(tmp_path / "dir.yaml")
    for name, text in {
        "syntax.yaml": "name: x\nagents: [\n",
        "cycle.yaml": ("name: c\nagents: [{name: a, prefix_tokens: 1}]\nstages:\n"
                       "  - {name: s1, agent: a, after: [s2], input_tokens: 1, output_tokens: 1}\n"
                       "  - {name: s2, agent: a, after: [s1], input_tokens: 1, output_tokens: 1}\n"),
        "badfield.yaml": ("name: c\nagents: [{name: a, prefix_tokens: 1}]\n"
                          "stages: [{name: s, agent: a, input_tokens: [9, 2], output_tokens: 1}]\n"),
        "cfg_syntax.yaml": "fcfs: {\n",
        "cfg_list.yaml": "- fcfs\n",
        "cfg_unknown.yaml": "nosuch: {}\n",
        "cfg_opts.yaml": "fcfs: [1, 2]\n",
        "trace.jsonl": '{"task_id": "t"}\n',
        "profile.yaml": "name: p\n",
    }.items():
        (tmp_path / name).write_text(text)
        out[name.split(".")[0]] = str(tmp_path / name)
    return out


CASES = [
    # (argv, a phrase the one-line message must contain)
    (["--workload", "nope"], "unknown workflow 'nope'"),
    (["--workload", "missing.yaml"], "workflow file not found: missing.yaml"),
    (["--workload", "{dir}"], "cannot read workflow file"),
    (["--workload", "{syntax}"], "invalid YAML at line"),
    (["--workload", "{cycle}"], "dependency cycle s2 -> s1 -> s2"),
    (["--workload", "{badfield}"], "stages[0] (s).input_tokens: need 1 <= lo <= hi"),
    (["--workload", "chain3", "--policies", "fcfs,nosuch"], "argument --policies: unknown policy 'nosuch'"),
    (["--workload", "chain3", "--policies", "fcfs,,lpm"], "argument --policies: empty name"),
    (["--workload", "chain3", "--policies", "fcfs,fcfs"], "argument --policies: 'fcfs' given twice"),
    (["--workload", "chain3", "--rate", "-1"], "argument --rate: must be a positive finite number, got '-1'"),
    (["--workload", "chain3", "--rate", "abc"], "argument --rate: expected positive numbers"),
    (["--workload", "chain3", "--rate", "0.1,"], "argument --rate: expected positive numbers"),
    (["--workload", "chain3", "--rate", "0"], "argument --rate: must be a positive finite number, got '0'"),
    (["--workload", "chain3", "--rate", "inf"], "argument --rate: must be a positive finite number"),
    (["--workload", "chain3", "--load", "-0.5"], "argument --load: must be a positive finite number"),
    (["--workload", "chain3", "--load", "heavy"], "argument --load: expected positive numbers"),
    (["--workload", "chain3", "--rate", "1", "--load", "1"], "argument --load: not allowed with argument --rate"),
    (["--workload", "chain3", "--tasks", "0"], "argument --tasks: expected a positive integer, got '0'"),
    (["--workload", "chain3", "--tasks", "-3"], "argument --tasks: expected a positive integer"),
    (["--workload", "chain3", "--tasks", "ten"], "argument --tasks: expected a positive integer"),
    (["--workload", "chain3", "--seed", "x"], "argument --seed: expected an integer >= 0"),
    (["--workload", "chain3", "--kv-budget", "0"], "argument --kv-budget: expected a positive integer"),
    (["--workload", "chain3", "--policies", "fcfs", "--kv-budget", "3000"],
     "KV budget 3000 tokens cannot hold stage 's1'"),
    (["--workload", "chain3", "--profile", "nope"], "unknown profile 'nope'"),
    (["--workload", "chain3", "--profile", "{profile}"], "missing fields"),
    (["--workload", "chain3", "--trace", "x.jsonl"], "argument --trace: not allowed with argument --workload"),
    ([], "give --workload NAME|PATH.yaml"),
    (["--workload", "chain3", "--policy-opt", "fcfs.x"], "--policy-opt 'fcfs.x': expected POLICY.KEY=VALUE"),
    (["--workload", "chain3", "--policy-opt", "fcfs=1"], "expected POLICY.KEY=VALUE"),
    (["--workload", "chain3", "--policy-opt", "fcfs.1x=1"], "expected POLICY.KEY=VALUE"),
    (["--workload", "chain3", "--policies", "fcfs", "--policy-opt", "lpm.x=1"],
     "policy 'lpm' is not in --policies (fcfs)"),
    (["--workload", "chain3", "--policies", "fcfs", "--policy-opt", "fcfs.x=[1"], "cannot parse value '[1'"),
    (["--workload", "chain3", "--policies", "fcfs", "--policy-opt", "fcfs.window=3"],
     "policy 'fcfs' has no option 'window' (its options: none)"),
    (["--workload", "chain3", "--policies", "topas", "--policy-opt", "topas.beta=.inf"],
     "topas option 'beta' must be a finite number, got inf"),
    (["--workload", "chain3", "--policy-config", "missing.yaml"], "--policy-config missing.yaml: cannot read"),
    (["--workload", "chain3", "--policy-config", "{cfg_syntax}"], "invalid YAML at line"),
    (["--workload", "chain3", "--policy-config", "{cfg_list}"], "expected a mapping of policy name -> options"),
    (["--workload", "chain3", "--policy-config", "{cfg_unknown}"], "unknown policy 'nosuch'"),
    (["--workload", "chain3", "--policy-config", "{cfg_opts}"], "options of 'fcfs' must be a mapping"),
    (["--trace", "missing.jsonl"], "cannot read trace missing.jsonl"),
    (["--trace", "{trace}"], ":1: missing field 'workflow'"),
    (["--workload", "chain3", "--policies", "fcfs", "--tasks", "1", "--rate", "1", "--json", "/proc/no/such.json"],
     "--json /proc/no/such.json: cannot write"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--workload", "chain3", "--json", "{trace}/x.json"], "is a file, not a directory"),
    (["--workload", "chain3", "--json", ""], "--json: empty path"),
    (["--workload", "chain3", "--plot", "{dir}"], "is a directory"),
    (["--suite", "random", "--workflows", "1", "--policies", "fcfs,topas", "--worst-dir", "{trace}/w"],
     "--worst-dir"),
    (["--workload", "chain3", "--replicas", "2", "--json", "{trace}/x.json"], "is a file, not a directory"),
    (["--workload", "chain3", "--replicas", "2", "--scaling", "topas+task", "--p99-target", "-1"],
     "argument --p99-target: expected a positive number"),
    (["--workload", "chain3", "--router", "task"], "--router applies to the simulated cluster only"),
    (["--workload", "chain3", "--tasks-per-replica", "3"], "--tasks-per-replica applies to the simulated cluster"),
    (["--workload", "chain3", "--replicas", "2", "--p99-target", "5"], "--p99-target applies to --scaling only"),
    (["--workload", "chain3", "--replicas", "2,2"], "a replica count is given twice"),
    (["--workload", "chain3", "--replicas", "2", "--tasks-per-replica", "0"],
     "argument --tasks-per-replica: expected a positive integer"),
    (["--workload", "chain3", "--policies", "fcfs", "--tasks", "1", "--server", "http://127.0.0.1:9/v1"],
     "cannot reach the server at http://127.0.0.1:9/v1"),
    # the real-engine bench's own checks were exit 1 without "error: "
    (["--workload", "chain3", "--engine", "sglang"], "--engine sglang needs --model-path DIR"),
    (["--workload", "chain3", "--server", "http://127.0.0.1:9/v1", "--scale", "2"], "need 0 < --scale <= 1"),
    # read as plain floats/ints: a 0 or NaN timeout, a 0 words-per-token ratio reached the run
    (["--workload", "chain3", "--server", "http://127.0.0.1:9/v1", "--timeout", "nan"],
     "argument --timeout: expected a positive number"),
    (["--workload", "chain3", "--server", "http://127.0.0.1:9/v1", "--words-per-token", "0"],
     "argument --words-per-token: expected a positive number"),
    (["--workload", "chain3", "--engine", "sglang", "--kv-tokens", "-5"], "argument --kv-tokens: expected a positive"),
]


def _fmt(argv: list[str], files: dict[str, str]) -> list[str]:
    return [a.format(**files) for a in argv]


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[" ".join(a) or "<none>" for a, _ in CASES])
def test_bench_errors_are_one_line(argv, needle, files, capsys):
    rc = main(BENCH + _fmt(argv, files))
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert needle in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["docs", "--tasks", "0"], "argument --tasks: expected a positive integer"),
        (["docs", "--workloads", "chain3,nope"], "unknown workflow 'nope'"),
        (["docs", "--policies", "fcfs,zz"], "unknown policy 'zz'"),
        (["docs", "--out", "{dir}"], "--out"),
        (["nosuch"], "invalid choice: 'nosuch'"),
        (["run", "sop", "--prompt", "x", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["eval", "softwaredev", "--rate", "0.05", "--tasks", "100000000"],
         "argument --tasks: expected an integer in [1, 100000]"),
        # a key no HTTP header can carry: was a UnicodeEncodeError traceback at the first call
        (["run", "sop", "--prompt", "x", "--server", "http://127.0.0.1:9/v1", "--api-key", "cl\u00e9"],
         "--api-key must be non-empty printable ASCII"),
        (["eval", "softwaredev", "--rate", "0.05", "--server", "http://127.0.0.1:9/v1", "--api-key", " k"],
         "--api-key must be non-empty printable ASCII"),
        (["metagpt", "config", "--base-url", "http://127.0.0.1:9/v1", "--root", "{dir}", "--api-key", "k\u00fc"],
         "--api-key must be non-empty printable ASCII"),
        # an empty model id fell back to the default without a word; a padded one matched no model
        (["run", "sop", "--prompt", "x", "--model", ""], "argument --model: expected a non-empty printable name"),
        (["eval", "softwaredev", "--rate", "0.05", "--model", " m"], "argument --model: expected a non-empty"),
        (["metagpt", "config", "--base-url", "http://127.0.0.1:9/v1", "--root", "{dir}", "--model", ""],
         "argument --model: expected a non-empty"),
        (["calibrate", "--server", "http://127.0.0.1:9/v1", "--out", "p.yaml", "--model", "m\t"],
         "argument --model: expected a non-empty"),
        (["bench", "--server", "http://127.0.0.1:9/v1", "--model", ""], "argument --model: expected a non-empty"),
        (["serve", "--model-name", ""], "argument --model-name: expected a non-empty"),
    ],
)
def test_other_errors_are_one_line(argv, needle, files, capsys):
    rc = main(_fmt(argv, files))
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert needle in err


@pytest.mark.parametrize(("module", "argv", "needle"), [
    ("topas_agents.sim.speed", ["--workload", "nope"], "unknown workflow 'nope'"),
    ("topas_agents.bench.accuracy", ["--workloads", "nope"], "unknown workflow 'nope'"),
    ("topas_agents.bench.microbench", ["--profile", "nope"], "unknown profile 'nope'"),
    ("topas_agents.realbench.runner", ["--server", "http://127.0.0.1:9/v1", "--tasks", "1"], "cannot reach"),
])
def test_module_entry_points_report_one_line(module, argv, needle):
    # `python -m ...` tools the docs name: each was a traceback, exit 1
    proc = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and needle in proc.stderr


def test_installed_script_reports_one_line():
    script = Path(sys.executable).parent / "topas"
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    proc = subprocess.run([str(script), "bench", "--workload", "chain3", "--rate", "abc"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == ("error: topas bench: argument --rate: expected positive numbers separated "
                           "by commas, got 'abc'\n")


def test_workflow_limits_are_one_line_cli_errors(tmp_path, capsys):
    """Issue 11: `requests: [1, 1000000]` is refused by the limits wherever workflows load."""
    path = tmp_path / "huge.yaml"
    path.write_text("name: h\nagents: [{name: a, prefix_tokens: 1}]\n"
                    "stages: [{name: s, agent: a, requests: [1, 1000000], input_tokens: 1, output_tokens: 1}]\n")
    assert main(["bench", "--workload", str(path), "--tasks", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "requests: need 1 <= lo <= hi <= 1000" in err
    assert main(["serve", "--workflow", str(path), "--port", "0"]) == 2
    assert "requests: need 1 <= lo <= hi <= 1000" in capsys.readouterr().err


def test_a_missing_optional_dependency_names_the_extra(monkeypatch, capsys):
    import sys

    from topas_agents import cli

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the [bench] extra were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)

    def needs_plot(args):
        import matplotlib.pyplot  # noqa: F401

    monkeypatch.setattr(cli, "build_parser", lambda only=None: _ParserStub(needs_plot))
    assert cli.main(["bench"]) == 2
    assert "pip install 'topas-agents[bench]'" in capsys.readouterr().err


class _ParserStub(argparse.ArgumentParser):
    """A parser whose every parse yields a `bench` command running `run`."""

    def __init__(self, run):
        super().__init__()
        self.run = run

    def parse_args(self, args=None, namespace=None):
        return argparse.Namespace(command="bench", run=self.run)


@pytest.mark.parametrize("argv", [
    ["bench", "--workload", "chain3", "--json", "{trace}/x.json"],
    ["bench", "--suite", "random", "--worst-dir", "{trace}/w"],
    ["bench", "--workload", "chain3", "--replicas", "2", "--json", "{trace}/x.json"],
], ids=["bench", "suite", "replicas"])
def test_bench_outputs_are_checked_before_the_run(argv, files, monkeypatch, capsys):
    """A run can take hours: an output that cannot be written fails before it, not after."""
    from topas_agents.cli import bench

    def ran(*_a, **_k):
        raise AssertionError("the run started before its outputs were checked")

    monkeypatch.setattr(bench, "resolve_args", ran)
    assert main(_fmt(argv, files)) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


def test_a_plot_without_a_suffix_is_checked_and_written_where_it_goes(tmp_path, capsys):
    # matplotlib writes `out.png` for `--plot out`: the check looked at `out`, so a directory
    # named out.png failed only after the run, and the path written was never said
    (tmp_path / "p.png").mkdir()
    argv = ["bench", "--workload", "chain3", "--policies", "fcfs", "--tasks", "3", "--load", "0.5", "--no-progress"]
    assert main([*argv, "--plot", str(tmp_path / "p")]) == 2
    assert "p.png: is a directory" in capsys.readouterr().err
    assert main([*argv, "--plot", str(tmp_path / "q")]) == 0
    assert f"plot: {tmp_path / 'q.png'}" in capsys.readouterr().err and (tmp_path / "q.png").is_file()


@pytest.mark.parametrize("argv", [
    ["run", "sop", "--prompt", "x", "--json", "{trace}/x.json"],
    ["run", "sop", "--prompt", "x", "--trace", "{trace}/t.jsonl"],
    ["eval", "softwaredev", "--rate", "0.05", "--policies", "fcfs", "--limit", "1", "--trace-dir", "{trace}/t"],
    ["eval", "softwaredev", "--rate", "0.05", "--policies", "fcfs", "--limit", "1", "--plot", "{trace}/p"],
], ids=["run-json", "run-trace", "eval-trace-dir", "eval-plot"])
def test_run_and_eval_outputs_are_checked_before_any_task(argv, files, monkeypatch, capsys):
    pytest.importorskip("metagpt")
    from topas_agents.integrations.metagpt import environment

    def ran(*_a, **_k):
        raise AssertionError("MetaGPT was prepared before the outputs were checked")

    monkeypatch.setattr(environment, "prepare_metagpt", ran)
    assert main(_fmt(argv, files)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "is a file, not a directory" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "chain3", "--scale", "0.1"], "--scale has no effect with the simulated"),
    (["--workload", "chain3", "--sim"], "--sim has no effect with the simulated"),
    (["--workload", "chain3", "--workflows", "3"], "--workflows has no effect with the simulated"),
    (["--workload", "chain3", "--suite-seed", "3"], "--suite-seed has no effect"),
    (["--suite", "random", "--rate", "0.5"], "--rate has no effect with --suite (use --load"),
    (["--suite", "random", "--plot", "x.png"], "--plot has no effect with --suite"),
    (["--workload", "chain3", "--replicas", "2", "--tasks", "10"], "(use --tasks-per-replica)"),
    (["--workload", "chain3", "--replicas", "2", "--host-tier", "all"], "--host-tier has no effect with --replicas"),
    (["--decision-cost", "--workload", "chain3"], "--workload has no effect with --decision-cost"),
    (["--server", "http://127.0.0.1:9/v1", "--seeds", "0,1"], "--seeds has no effect with a real engine"),
    (["--server", "http://127.0.0.1:9/v1", "--policy-opt", "topas.rho=2"], "--policy-opt has no effect"),
    (["--server", "http://127.0.0.1:9/v1", "--rate", "0.1,0.2"], "one --rate"),
])
def test_a_flag_the_bench_mode_ignores_is_an_error(argv, message, capsys):
    """A flag that would be silently ignored in the mode the bench runs in is a one-line
    error (exit 2) naming it, before anything runs or connects."""
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [
    ["--workload", "chain3", "--engine", "sim"],  # the default, named
    ["--workload", "chain3", "--seed", "0", "--no-progress", "--kv-budget", "20000"],
    ["--suite", "random", "--workflows", "3", "--suite-seed", "2", "--seeds", "1,2", "--protocol", "paper"],
    ["--workload", "chain3", "--replicas", "2", "--tasks-per-replica", "5", "--seeds", "0,1", "--jobs", "2"],
    ["--decision-cost", "--policies", "topas", "--profile", "h200-qwen2.5-32b", "--seed", "1"],
    ["--decision-cost", "--policies", "topas", "--policy-opt", "topas.rho=2", "--policy-config", "c.yaml"],
    ["--server", "http://127.0.0.1:9/v1", "--workload", "chain3", "--tasks", "2", "--rate", "0.3", "--sim"],
])
def test_flags_each_bench_mode_reads_pass_the_check(argv):
    from topas_agents.cli import build_parser
    from topas_agents.cli.args import given_options
    from topas_agents.cli.bench_modes import check_mode_flags

    args = build_parser("bench").parse_args(["bench", *argv])
    args.given = given_options(build_parser("bench"), ["bench", *argv])
    assert args.given == {a for a in argv if a.startswith("--")}
    check_mode_flags(args)  # raises ConfigError if a flag the mode reads were refused
