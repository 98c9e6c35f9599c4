"""`python -m topas_agents.suite.handover`: policy A until the k-th arrival, then B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topas_agents import policies
from topas_agents.cli import main as cli_main
from topas_agents.suite import handover

# dag4 at load 0.9, 12 tasks: FCFS and LPM give different JCTs here (77.99 s and 70.07 s).
BENCH = ["--workload", "dag4", "--load", "0.9", "--seed", "3", "--tasks", "12", "--no-progress"]


def _mean_jcts(path: Path) -> dict[str, float]:
    doc = json.loads(path.read_text())
    (point,) = doc["points"]
    return {name: row["mean_jct"] for name, row in point["results"].items()}


def test_handover_bounds_are_the_policies_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Handing over at the first arrival is B alone; after the last arrival, A alone."""
    monkeypatch.setattr(policies, "_REGISTRY", dict(policies._REGISTRY))  # the names stay in this test
    out, alone = tmp_path / "handover.json", tmp_path / "alone.json"
    code = handover.main(["--first", "fcfs", "--then", "lpm", "--at", "1,1000", "--", *BENCH, "--json", str(out)])
    assert code == 0
    assert cli_main(["bench", *BENCH, "--policies", "fcfs", "--json", str(alone)]) == 0
    got, fcfs = _mean_jcts(out), _mean_jcts(alone)["fcfs"]
    assert got["lpm"] != fcfs  # the bounds below tell the two policies apart
    assert got[handover.handover_name("fcfs", "lpm", 1)] == got["lpm"]
    assert got[handover.handover_name("fcfs", "lpm", 1000)] == fcfs


@pytest.mark.parametrize(
    "args, message",
    [
        (["--first", "nope"], "unknown policy 'nope'"),
        (["--at", "2,x"], "--at takes comma-separated arrival counts"),
        (["--at", "0"], "--at counts must be >= 1"),
        (["--", "--policies", "lpm"], "give no --policies after --"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args, message, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        handover.main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
