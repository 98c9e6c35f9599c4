"""`topas eval softwaredev`: arrivals, task specs, statistics, and a small run per policy."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from topas_agents.cli import main
from topas_agents.errors import ConfigError
from topas_agents.integrations.metagpt.environment import metagpt_available
from topas_agents.integrations.metagpt.softwaredev import load_softwaredev


def test_softwaredev_has_the_11_published_prompts():
    prompts = load_softwaredev()
    assert [p.id for p in prompts] == list(range(11))
    assert prompts[0].name == "Snake game" and prompts[0].task_id == "sd00"
    assert len(load_softwaredev(3)) == 3
    with pytest.raises(ConfigError):
        load_softwaredev(0)


def test_softwaredev_loader_rejects_bad_files(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": 1, "name": "a"}\n')
    with pytest.raises(ConfigError, match="p.jsonl:1"):
        load_softwaredev(path=bad)
    bad.write_text('{"id": 1, "name": "a", "prompt": "x"}\n{"id": 1, "name": "b", "prompt": "y"}\n')
    with pytest.raises(ConfigError, match="duplicate"):
        load_softwaredev(path=bad)


if metagpt_available():
    metagpt_only = pytest.mark.metagpt
else:
    metagpt_only = pytest.mark.skip(reason="metagpt is not installed")


@pytest.fixture(scope="module")
def ev(tmp_path_factory: pytest.TempPathFactory):
    from topas_agents.integrations.metagpt.environment import prepare_metagpt

    prepare_metagpt(tmp_path_factory.mktemp("mgroot"), log_level="ERROR")
    from topas_agents.integrations.metagpt import evaluation

    return evaluation


@metagpt_only
def test_poisson_arrivals_and_cycled_specs(ev):
    from topas_agents.sim.driver import poisson_arrivals

    a = ev.eval_arrivals(2000, 0.5, seed=3)
    assert a[0] == 0 and a == sorted(a) and a == ev.eval_arrivals(2000, 0.5, seed=3)
    # the simulator's arrival process of the same seed, moved to start at once
    sim = poisson_arrivals(2000, 0.5, seed=3)
    assert a == pytest.approx([t - sim[0] for t in sim]) and ev.eval_arrivals(0, 0.5, seed=3) == []
    gaps = [y - x for x, y in zip(a, a[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(2.0, rel=0.1)
    specs = ev.make_specs(load_softwaredev(2), 5)
    assert [s.task_id for s in specs] == ["sd00", "sd01", "sd00r1", "sd01r1", "sd00r2"]
    assert specs[2].prompt == specs[0].prompt


@metagpt_only
def test_summary_counts_failures_and_excludes_them_from_jct(ev):
    from topas_agents.integrations.metagpt.runner import TaskResult

    def res(tid, ok, jct):
        return TaskResult(tid, "", "w", ok, None if ok else "boom", (), {}, 3, {}, 0, 0.0, "", 1.0, jct)

    s = ev.summarize([res("a", True, 10.0), res("b", True, 30.0), res("c", False, 1.0)])
    assert (s["tasks"], s["succeeded"], s["failed"]) == (3, 2, 1)
    # the project's one percentile (numpy's linear definition): 10 + 0.99 * (30 - 10) = 29.8
    assert s["mean_jct_s"] == 20.0 and abs(s["p99_jct_s"] - 29.8) < 1e-9 and s["calls"] == 9
    with pytest.raises(ConfigError):
        ev.EvalConfig(rate=0)


PNG = b"\x89PNG\r\n\x1a\n"


def test_jct_cdf_and_bar_plots_are_pngs_and_tolerate_failed_tasks(tmp_path):
    from topas_agents.bench.plots import plot_jct_bars, plot_jct_cdf

    cdf = plot_jct_cdf({"fcfs": [30.0, 10.0, None], "topas": [9.0, 12.0, 20.0], "lpm": [None]},
                       tmp_path / "a" / "cdf.png", title="t", unit="simulated s")
    bars = plot_jct_bars({"fcfs": {"mean_jct_s": 20.0, "p99_jct_s": 29.8},
                          "lpm": {"mean_jct_s": None, "p99_jct_s": None}}, tmp_path / "bars.png")
    for path in (cdf, bars):
        assert path.read_bytes().startswith(PNG) and path.stat().st_size > 5000
    with pytest.raises(ConfigError, match="--plot"):
        plot_jct_cdf({"fcfs": [1.0]}, tmp_path / "bars.png" / "x.png")  # a file where a dir must be


def test_a_long_plot_title_is_wrapped_to_the_figure():
    # the bar chart's title lost its end past the figure's edge ("...(embedded, time scale 200")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from topas_agents.bench.plots import _fitted

    title = ("SoftwareDev on metagpt-sop-noqa: 11 tasks per policy\n"
             "Poisson rate 0.05 tasks/simulated s, seed 0 (embedded, time scale 200)")
    fig = Figure(figsize=(5.0, 4.2), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    text = fig.subplots().set_title(_fitted(title, 5.0), fontsize=9)
    canvas.draw()
    box = text.get_window_extent(canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width
    assert _fitted(title, 5.0).split() == title.split()  # wrapped, nothing lost


@metagpt_only
def test_eval_cli_runs_each_policy_on_the_same_arrivals(tmp_path, capsys):
    out = tmp_path / "eval.json"
    rc = main(["eval", "softwaredev", "--workflow", "sop", "--rate", "0.5", "--policies", "fcfs,topas",
               "--limit", "2", "--time-scale", "400", "--parse-retries", "1", "--root", str(tmp_path),
               "--json", str(out), "--no-progress", "--trace-dir", str(tmp_path / "traces"),
               "--plot", str(tmp_path / "plots")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    lines = captured.out.splitlines()
    assert lines[0].startswith("policy") and {ln.split()[0] for ln in lines[2:]} == {"fcfs", "topas"}
    doc = json.loads(out.read_text())
    assert doc["workflow"] == "metagpt-sop-noqa" and doc["tasks"] == 2 and doc["server"] == "embedded"
    for policy in ("fcfs", "topas"):
        entry = doc["policies"][policy]
        assert entry["summary"]["succeeded"] == 2 and entry["summary"]["calls"] == 14
        assert entry["summary"]["mean_jct_s"] > 0
        assert [r["task_id"] for r in entry["results"]] == ["sd00", "sd01"]
        assert (tmp_path / "traces" / f"{policy}.jsonl").exists()
        # every task's JCT, in task order, so the CDF can be redrawn from the JSON
        assert len(entry["jcts_s"]) == doc["tasks"] and entry["jcts_s"] == [r["jct_s"] for r in entry["results"]]
        assert all(j > 0 for j in entry["jcts_s"])
    assert "echo responder, not real code" in doc["artifacts_note"]
    for name in ("jct_cdf.png", "jct_summary.png"):
        assert (tmp_path / "plots" / name).read_bytes().startswith(PNG)
        assert f"plot: {tmp_path / 'plots' / name}" in captured.err


@metagpt_only
def test_eval_cli_rejects_unknown_policies(capsys):
    assert main(["eval", "softwaredev", "--rate", "1", "--policies", "fcfs,nope"]) == 2
    assert "nope" in capsys.readouterr().err


@metagpt_only
def test_eval_against_a_dead_server_fails_at_once(tmp_path, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    rc = main(["eval", "softwaredev", "--rate", "1", "--limit", "1", "--server", url, "--root", str(tmp_path),
               "--no-progress"])
    assert rc == 2 and "cannot reach the server" in capsys.readouterr().err


@metagpt_only
def test_eval_exits_1_when_a_task_fails(tmp_path, capsys):
    from topas_agents.integrations.metagpt.server_api import embedded_server

    with embedded_server(responder="lorem", time_scale=400) as handle:  # replies MetaGPT cannot parse
        rc = main(["eval", "softwaredev", "--rate", "1", "--limit", "1", "--server", handle.url, "--root",
                   str(tmp_path), "--parse-retries", "1", "--no-progress", "--json", str(tmp_path / "e.json")])
    captured = capsys.readouterr()
    assert rc == 1 and "1 task(s) failed" in captured.err
    # a failed task has no JCT anywhere in the JSON (its row had the client's span as one)
    (row,) = json.loads((tmp_path / "e.json").read_text())["policies"]["external"]["results"]
    assert not row["success"] and row["jct_s"] is None
    assert captured.out.splitlines()[2].split()[:3] == ["external", "1", "0"]  # policy, tasks, ok
    # which task and why, without a rerun with --json (it said only "see --json for errors")
    (line,) = [x for x in captured.err.splitlines() if x.startswith("FAILED ")]
    assert re.match(r"FAILED external sop-[0-9a-f]{8}-sd00: ", line) and "JSONDecodeError" in line, line


@metagpt_only
def test_eval_twice_against_one_server_uses_new_task_ids(tmp_path, capsys):
    """The second evaluation reused the dataset ids: the server had closed those tasks, so every
    call was a 409, and the failed rows carried the first run's JCTs."""
    from topas_agents.integrations.metagpt.server_api import embedded_server

    with embedded_server(time_scale=400) as handle:
        runs = []
        for i in range(2):
            out = tmp_path / f"eval{i}.json"
            rc = main(["eval", "softwaredev", "--rate", "1", "--limit", "1", "--server", handle.url, "--root",
                       str(tmp_path), "--parse-retries", "1", "--no-progress", "--json", str(out)])
            assert rc == 0, capsys.readouterr().err[-2000:]
            runs.append(json.loads(out.read_text())["policies"]["external"]["results"])
        named = tmp_path / "named.json"
        assert main(["eval", "softwaredev", "--rate", "1", "--limit", "1", "--server", handle.url, "--root",
                     str(tmp_path), "--parse-retries", "1", "--no-progress", "--task-id-prefix", "mine",
                     "--json", str(named)]) == 0
    ids = [r[0]["task_id"] for r in runs]
    assert ids[0] != ids[1] and all(re.fullmatch(r"sop-[0-9a-f]{8}-sd00", t) for t in ids)
    assert all(r[0]["success"] and r[0]["jct_s"] > 0 for r in runs)
    assert json.loads(named.read_text())["policies"]["external"]["results"][0]["task_id"] == "mine-sd00"
