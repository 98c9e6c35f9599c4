"""`python -m topas_agents.bench.paper_options`: cumulative option sets of the paper core."""

from __future__ import annotations

import json

from topas_agents.bench import paper_options as po
from topas_agents.policies.topas.paper_config import TUNED_OPTIONS


def test_steps_accumulate_options_and_report_paper_rule_ratios(tmp_path, capsys):
    out = tmp_path / "steps.json"
    rc = po.main(["--tasks", "4", "--seeds", "0,1", "--workloads", "chain3", "--steps", "3", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == [s.name for s in po.STEPS[:3]] + ["topas-core"]
    assert rows[0]["options"] == {} and rows[1]["options"] == dict(TUNED_OPTIONS)
    assert rows[2]["options"] == {**TUNED_OPTIONS, **po.STEPS[2].adds}  # each step keeps the previous ones
    for row in rows:
        cell = row["workloads"]["chain3"]
        assert len(cell["mean"]["values"]) == 2 and cell["mean"]["mean"] > 0 and cell["best_baseline"]
    table = capsys.readouterr().out
    assert table.startswith("| options | chain3 mean / p99 |") and "| topas-core | " in table


def test_the_steps_end_at_every_option_at_topas_value():
    from topas_agents.policies import make_policy
    from topas_agents.policies.topas import make_paper_config
    from topas_agents.policies.topas.paper_config import TOPAS_OPTIONS

    options: dict = {}
    for step in po.STEPS:
        options.update(step.adds)
    assert options == TOPAS_OPTIONS
    assert make_policy("topas-paper-full").config == make_paper_config(**TOPAS_OPTIONS)


def test_bad_arguments_exit_2_with_a_message(capsys):
    assert po.main(["--steps", "99"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert po.main(["--seeds", "1,1"]) == 2
    assert "twice" in capsys.readouterr().err


def test_an_unwritable_json_fails_before_the_runs(tmp_path, capsys, monkeypatch):
    """The two bench CLIs check `--json` before a run of tens of minutes, not after it."""
    from topas_agents.bench import evaluate

    def no_runs(*args, **kwargs):
        raise AssertionError("ran before checking --json")

    monkeypatch.setattr(po, "run_steps", no_runs)
    monkeypatch.setattr(evaluate, "evaluate", no_runs)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert po.main(["--json", str(blocker / "out.json")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert evaluate.main(["--json", str(tmp_path)]) == 2  # a directory, not a file
    assert "is a directory" in capsys.readouterr().err
