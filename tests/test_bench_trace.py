"""Trace JSONL format: write -> load round trips, DAG reconstruction, line-numbered errors."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest

from topas_agents.bench import (
    BenchConfig,
    load_trace,
    lower_bound,
    redraw_arrivals,
    run_bench,
    write_trace_record,
)
from topas_agents.bench.trace import FIELDS, TraceRecord
from topas_agents.costmodel import load_profile
from topas_agents.errors import ConfigError
from topas_agents.workflow import load_workflow

HAVE_SIM = importlib.util.find_spec("topas_agents.sim") is not None


def rec(task="t1", wf="chain3", stage="s1", agent="a", prefix=4096, inp=500, out=200, t0=100.0, t1=101.0, rnd=0):
    return {"task_id": task, "workflow": wf, "stage": stage, "agent": agent, "prefix_tokens": prefix,
            "input_tokens": inp, "output_tokens": out, "t_submit": t0, "t_done": t1, "round": rnd}


def chain3_task(task, start, prefix_a=4096):
    return [rec(task, stage="s1", agent="a", prefix=prefix_a, t0=start, t1=start + 1),
            rec(task, stage="s2", agent="b", inp=510, out=250, t0=start + 1, t1=start + 2),
            rec(task, stage="s3", agent="c", inp=520, out=260, t0=start + 2, t1=start + 3)]


def write(path: Path, records) -> Path:
    with path.open("w") as fh:
        for r in records:
            write_trace_record(fh, **r)
    return path


def test_record_fields_are_the_documented_ones():
    assert FIELDS == ("task_id", "workflow", "stage", "agent", "prefix_tokens", "input_tokens",
                      "output_tokens", "t_submit", "t_done", "round")
    buf = io.StringIO()
    out = write_trace_record(buf, **rec())
    assert isinstance(out, TraceRecord)
    assert json.loads(buf.getvalue()) == {**rec(), "t_submit": 100.0, "t_done": 101.0}
    assert buf.getvalue().endswith("\n") and buf.getvalue().count("\n") == 1


def test_known_workflow_round_trip(tmp_path):
    path = write(tmp_path / "t.jsonl", chain3_task("x", 50.0) + chain3_task("y", 60.5, prefix_a=5000))
    plans = load_trace(path)
    assert [p.task_id for p in plans] == ["x", "y"]
    assert [p.arrival_s for p in plans] == [0.0, 10.5]  # shifted to start at 0
    wf = plans[0].workflow
    assert wf.name == "chain3" and wf.topo_order == ("s1", "s2", "s3")
    assert wf.prefix_tokens("a") == 5000  # the largest recorded prefix replaces the estimate
    assert wf.prefix_tokens("b") == 4096
    assert plans[1].rounds["s3"][0].input_tokens == 520 and plans[1].rounds["s3"][0].output_tokens == 260
    assert plans[0].workflow is plans[1].workflow  # one Workflow per name


def test_known_dag_keeps_its_edges_and_recorded_rounds(tmp_path):
    records = [rec("t", "dag4", "s_a", "a", t0=0, t1=1),
               rec("t", "dag4", "s_b", "b", t0=1, t1=2, rnd=0), rec("t", "dag4", "s_b", "b", t0=3, t1=4, rnd=1),
               rec("t", "dag4", "s_c", "c", t0=1, t1=2),
               rec("t", "dag4", "s_d", "d", inp=800, t0=4, t1=5)]
    (plan,) = load_trace(write(tmp_path / "d.jsonl", records))
    assert plan.workflow.stage("s_d").after == ("s_b", "s_c")
    assert len(plan.rounds["s_b"]) == 2 and plan.rounds["s_d"][0].input_tokens == 800


def test_unknown_workflow_becomes_a_chain_in_first_seen_order(tmp_path):
    records = [
        rec("t1", "mine", "plan", "boss", prefix=300, inp=40, out=20, t0=0, t1=1),
        rec("t1", "mine", "code", "dev", prefix=500, inp=60, out=30, t0=1, t1=2, rnd=0),
        rec("t1", "mine", "code", "dev", prefix=500, inp=80, out=10, t0=5, t1=6, rnd=1),  # 3 s tool gap
        rec("t2", "mine", "plan", "boss", prefix=300, inp=50, out=20, t0=3, t1=4),
        rec("t2", "mine", "code", "dev", prefix=500, inp=70, out=30, t0=4, t1=5, rnd=0),
        rec("t2", "mine", "code", "dev", prefix=500, inp=70, out=30, t0=6, t1=7, rnd=1),  # 1 s gap
        rec("t2", "mine", "code", "dev", prefix=500, inp=70, out=30, t0=7, t1=8, rnd=2),  # 0 s gap
    ]
    plans = load_trace(write(tmp_path / "m.jsonl", records))
    wf = plans[0].workflow
    assert wf.name == "mine" and wf.topo_order == ("plan", "code")
    assert wf.stage("code").after == ("plan",)
    code = wf.stage("code")
    assert (code.requests.lo, code.requests.hi) == (2, 3)
    assert (code.input_tokens.lo, code.input_tokens.hi) == (60, 80)
    assert code.tool_wait_s == pytest.approx((3 + 1 + 0) / 3)
    assert wf.prefix_tokens("dev") == 500
    assert [p.arrival_s for p in plans] == [0.0, 3.0]


def test_unknown_workflow_variants_and_unlabelled(tmp_path):
    records = [rec("a", None, "only", "x", prefix=10, t0=0, t1=1),
               rec("b", None, "first", "x", prefix=10, t0=1, t1=2),
               rec("b", None, "second", "y", prefix=20, t0=2, t1=3)]
    plans = load_trace(write(tmp_path / "u.jsonl", records))
    names = {p.task_id: p.workflow.name for p in plans}
    assert names == {"a": "unlabelled", "b": "unlabelled#2"}
    assert plans[1].workflow.topo_order == ("first", "second")


def test_rate_redraws_poisson_arrivals_in_recorded_order(tmp_path):
    path = write(tmp_path / "t.jsonl", [r for i in range(6) for r in chain3_task(f"t{i}", 10.0 * i)])
    a = load_trace(path, rate=2.0, seed=7)
    b = load_trace(path, rate=2.0, seed=7)
    assert [p.arrival_s for p in a] == [p.arrival_s for p in b]
    assert [p.task_id for p in a] == [f"t{i}" for i in range(6)]
    assert all(x < y for x, y in zip([p.arrival_s for p in a], [p.arrival_s for p in a][1:], strict=False))
    assert [p.arrival_s for p in load_trace(path, rate=2.0, seed=8)] != [p.arrival_s for p in a]
    # one arrival process per seed: the simulator's own traces draw the same times
    from topas_agents.sim import make_trace
    from topas_agents.workflow import load_workflow

    assert [p.arrival_s for p in a] == [p.arrival_s for p in make_trace(load_workflow("chain3"), 6, 2.0, 7)]
    assert len(load_trace(path, max_tasks=4)) == 4
    with pytest.raises(ConfigError, match="rate must be a positive number"):
        redraw_arrivals(a, 0.0, 1)


def _lines(*objs) -> str:
    return "\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs) + "\n"


GOOD = rec()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (_lines(GOOD, "{not json"), ":2: invalid JSON"),
        (_lines("[1, 2]"), ":1: expected a JSON object"),
        (_lines({k: v for k, v in GOOD.items() if k != "agent"}), ":1: missing field 'agent'"),
        (_lines({**GOOD, "extra": 1}), ":1: unknown field 'extra'"),
        (_lines({**GOOD, "input_tokens": 0}), ":1: field 'input_tokens': expected an integer >= 1"),
        (_lines({**GOOD, "output_tokens": 2.5}), ":1: field 'output_tokens': expected an integer"),
        (_lines({**GOOD, "prefix_tokens": True}), ":1: field 'prefix_tokens'"),
        (_lines({**GOOD, "round": -1}), ":1: field 'round': expected an integer >= 0"),
        (_lines({**GOOD, "task_id": ""}), ":1: field 'task_id': expected a non-empty string"),
        (_lines({**GOOD, "workflow": 3}), ":1: field 'workflow': expected a non-empty string or null"),
        (_lines({**GOOD, "t_submit": "soon"}), ":1: field 't_submit': expected a finite number"),
        (json.dumps(GOOD).replace('"t_submit": 100.0', '"t_submit": NaN') + "\n",
         ":1: field 't_submit': expected a finite number"),
        (_lines({**GOOD, "t_done": 99.0}), ":1: field 't_done': 99.0 is before t_submit 100.0"),
        (_lines(GOOD, "", GOOD), ":3: task 't1' stage 's1' round 0 already recorded at line 1"),
        (_lines({**GOOD, "round": 1}), ":1: task 't1' stage 's1' has rounds [1], expected 0..0"),
        (_lines({**GOOD, "stage": "s9"}), ":1: workflow 'chain3' has no stage 's9'"),
        (_lines({**GOOD, "agent": "b"}), ":1: stage 's1' of workflow 'chain3' is run by agent 'a', not 'b'"),
        (_lines(GOOD), "task 't1' has no records for stages ['s2', 's3'] of workflow 'chain3'"),
        (_lines(*chain3_task("t1", 0)[:2], {**chain3_task("t1", 0)[2], "workflow": "dag4"}),
         ":3: task 't1' has workflow 'dag4' here but 'chain3' at line 1"),
        (_lines({**GOOD, "workflow": "new"}, {**GOOD, "workflow": "new", "agent": "z", "round": 1}),
         "stage 's1' is run by several agents ['a', 'z']"),
        ("\n\n", "no records"),
    ],
)
def test_errors_name_the_line_and_field(tmp_path, text, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_trace(path)
    assert needle in str(exc.value)
    assert str(exc.value).startswith(str(path))
    assert "\n" not in str(exc.value)


def test_unreadable_trace(tmp_path):
    with pytest.raises(ConfigError, match="cannot read trace"):
        load_trace(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="cannot read trace"):
        load_trace(tmp_path)


def test_writer_refuses_bad_records():
    buf = io.StringIO()
    with pytest.raises(ConfigError, match="trace record: field 'output_tokens'"):
        write_trace_record(buf, **{**GOOD, "output_tokens": 0})
    with pytest.raises(ConfigError, match="trace record: missing field 'round'"):
        write_trace_record(buf, **{k: v for k, v in GOOD.items() if k != "round"})
    assert buf.getvalue() == ""


@pytest.mark.skipif(not HAVE_SIM, reason="topas_agents.sim (the simulator) is not importable yet")
def test_replay_through_the_simulator(tmp_path):
    path = write(tmp_path / "t.jsonl", [r for i in range(5) for r in chain3_task(f"t{i}", 40.0 * i)])
    recorded = load_trace(path)
    cfg = BenchConfig(policies=("fcfs", "lpm"), profile=load_profile(), recorded=recorded,
                      workload="t.jsonl", tasks=len(recorded))
    res = run_bench(cfg)
    (pt,) = res["points"]
    assert pt["load"] is None and pt["rate"] == pytest.approx(4 / 160.0)  # observed rate
    assert res["workload"] == "t.jsonl" and res["tasks"] == 5
    lb = lower_bound(recorded, load_profile())
    for row in pt["results"].values():
        assert lb.mean_jct <= row["mean_jct"]
    loads = run_bench(BenchConfig(policies=("fcfs",), profile=load_profile(), recorded=recorded, loads=(0.2, 0.4)))
    assert [p["load"] for p in loads["points"]] == [0.2, 0.4]
    assert loads["points"][0]["rate"] < loads["points"][1]["rate"]


def test_chain3_capacity_for_recorded_matches_workflow_scale(tmp_path):
    from topas_agents.bench import capacity_of_tasks, capacity_rps

    path = write(tmp_path / "t.jsonl", [r for i in range(5) for r in chain3_task(f"t{i}", 40.0 * i)])
    cap_rec = capacity_of_tasks(load_trace(path), load_profile())
    cap_wf = capacity_rps(load_workflow("chain3"), load_profile())
    assert cap_rec == pytest.approx(cap_wf, rel=0.1)  # sizes within 2% of chain3's fixed ones
