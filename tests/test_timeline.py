"""Timelines (issue #13): the simulator's optional recorder, the Perfetto trace and Gantt PNG
(topas_agents/bench/timeline.py), `topas bench --timeline` and GET /v1/topas/timeline."""

from __future__ import annotations

import json
from collections import defaultdict

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topas_agents.bench.timeline import perfetto_trace, window, write_gantt, write_trace
from topas_agents.cli import main
from topas_agents.costmodel import DEFAULT_PROFILE, load_profile
from topas_agents.errors import ConfigError
from topas_agents.policies import make_policy
from topas_agents.sim import RecorderConfig, TimelineRecorder, make_trace, simulate
from topas_agents.workflow import load_workflow

PNG = b"\x89PNG\r\n\x1a\n"
EPS = 1e-6  # microseconds: trace timestamps are rounded to nanoseconds


def _run(workload: str, policy: str, tasks: int, rate: float, config: RecorderConfig | None = None,
         kv_budget: int | None = None, seed: int = 0):
    trace = make_trace(load_workflow(workload), tasks, rate, seed)
    rec = TimelineRecorder(config)
    result = simulate(trace, make_policy(policy, {}), load_profile(DEFAULT_PROFILE), kv_budget=kv_budget,
                      recorder=rec)
    return trace, result, rec


@pytest.fixture(scope="module")
def tl_run():
    # metagpt-tl at this rate on the default profile's budget makes Topas preempt and swap.
    trace, result, rec = _run("metagpt-tl", "topas", 10, 0.05)
    return trace, result, rec.timeline(result.stats.now)


def _by_thread(doc: dict, ph: str) -> dict[tuple[int, int], list[dict]]:
    out: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == ph and "tid" in e:
            out[(e["pid"], e["tid"])].append(e)
    return out


def test_recording_leaves_the_run_unchanged(tl_run) -> None:
    trace, result, _ = tl_run
    plain = simulate(trace, make_policy("topas", {}), load_profile(DEFAULT_PROFILE))
    assert plain == result  # RunResult equality ignores wall-clock decision timings
    assert plain.stats == result.stats


def test_trace_is_valid_perfetto(tl_run) -> None:
    trace, result, tl = tl_run
    doc = json.loads(json.dumps(perfetto_trace(tl)))  # JSON-serialisable, no NaN
    assert result.preemptions > 0 and result.prefix_swaps > 0  # the checks below are not vacuous
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = _by_thread(doc, "X")
    expected = {f"{tp.task_id}/{stage}/{k}" for tp in trace for stage, rounds in tp.rounds.items()
                for k in range(len(rounds))}
    seen = {e["args"]["rid"] for key, evs in spans.items() if key[0] != 0 for e in evs}
    assert seen == expected and len(expected) == result.requests
    for key, evs in spans.items():
        assert key in names
        evs.sort(key=lambda e: e["ts"])
        for e in evs:
            assert e["dur"] >= 0 and e["ts"] >= 0
        if key[0] == 0:
            continue  # the host link: FIFO transfers, checked below
        for a, b in zip(evs, evs[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"] + EPS, (a, b)  # one request's phases never overlap
        assert {e["name"] for e in evs} >= {"prefill"}
    budget = tl.kv_budget
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"kv_used", "batch"}
    for e in counters:
        if e["name"] == "kv_used":
            assert 0 <= e["args"]["kv_used"] <= budget and e["args"]["kv_budget"] == budget
        else:
            assert 0 <= e["args"]["decoding"] <= e["args"]["running"]
    instants = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert sum(e["name"] == "preempt" for e in instants) == result.preemptions
    assert sum(e["name"].startswith("swap_") for e in instants) == result.prefix_swaps
    tasks = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert tasks == {"engine"} | {f"task {tp.task_id} (metagpt-tl)" for tp in trace}


def test_request_timelines_are_contiguous(tl_run) -> None:
    _, result, tl = tl_run
    assert sum(len(r.preemptions) for r in tl.requests) == result.preemptions
    for r in tl.requests:
        assert r.end == "finished"
        assert r.spans[0].start_s == r.arrival_s and r.spans[-1].end_s == r.end_s
        assert r.spans[0].phase == "queued"
        for a, b in zip(r.spans, r.spans[1:], strict=False):
            assert a.start_s <= a.end_s == b.start_s and a.phase != b.phase
        assert [s.phase for s in r.spans].count("preempted") == len(r.preemptions)
        assert [s.start_s for s in r.spans if s.phase == "preempted"] == list(r.preemptions)


def test_gantt_png(tl_run, tmp_path) -> None:
    _, _, tl = tl_run
    out = write_gantt(tl, tmp_path / "g" / "run.gantt.png", max_tasks=4)
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 5000
    trace_out = write_trace(tl, tmp_path / "run.trace.json", meta={"policy": "topas"})
    assert json.loads(trace_out.read_text())["otherData"]["policy"] == "topas"


def test_first_tasks_bound() -> None:
    trace, result, rec = _run("metagpt-tl", "topas", 10, 0.05, RecorderConfig(first_tasks=3))
    tl = rec.timeline(rec.last_end_s)
    first = sorted(trace, key=lambda tp: tp.arrival_s)[:3]
    assert {r.task_id for r in tl.requests} == {tp.task_id for tp in first}
    assert rec.closed  # all three done: sampling stopped
    assert max(s.t_s for s in tl.samples) <= rec.last_end_s
    assert all(r.end == "finished" for r in tl.requests)


def test_keep_requests_and_window() -> None:
    _, _, rec = _run("chain3", "fcfs", 6, 0.5, RecorderConfig(keep_requests=5, keep_samples=7))
    tl = rec.timeline(rec.last_end_s)
    assert len(tl.requests) == 5 and len(tl.samples) <= 7
    assert [r.arrival_s for r in tl.requests] == sorted(r.arrival_s for r in tl.requests)
    cut = window(tl, 2)
    assert [r.rid for r in cut.requests] == [r.rid for r in tl.requests[-2:]]
    t0 = min(r.arrival_s for r in cut.requests)
    assert all(s.t_s > t0 for s in cut.samples[1:])
    keep_one = tl.requests[0].task_id
    mine = window(tl, None, keep=lambda name: name == keep_one, rename=str.upper)
    assert mine.requests and {r.task_id for r in mine.requests} == {keep_one.upper()}


def test_recorder_config_rejects_zero() -> None:
    with pytest.raises(ConfigError, match="first_tasks"):
        RecorderConfig(first_tasks=0)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["fcfs", "lpm", "topas"]), seed=st.integers(0, 50),
       rate=st.sampled_from([0.05, 0.5, 2.0]), budget=st.sampled_from([None, 24000]))
def test_spans_partition_each_request(policy: str, seed: int, rate: float, budget: int | None) -> None:
    _, result, rec = _run("dag4", policy, 4, rate, kv_budget=budget, seed=seed)
    tl = rec.timeline(result.stats.now)
    assert len(tl.requests) == result.requests
    assert sum(len(r.preemptions) for r in tl.requests) == result.preemptions
    for r in tl.requests:
        for a, b in zip(r.spans, r.spans[1:], strict=False):
            assert a.start_s <= a.end_s == b.start_s
    assert all(0 <= s.kv_used <= tl.kv_budget for s in tl.samples)


# ---------------------------------------------------------------------- CLI


def test_bench_timeline_files(tmp_path, capsys) -> None:
    out, js = tmp_path / "tl", tmp_path / "b.json"
    rc = main(["bench", "--workload", "chain3", "--policies", "fcfs,topas", "--load", "0.5", "--tasks", "5",
               "--seeds", "3,1", "--timeline", str(out), "--timeline-tasks", "3", "--json", str(js), "--no-progress"])
    assert rc == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["chain3-fcfs-0.5.gantt.png", "chain3-fcfs-0.5.trace.json",
                     "chain3-topas-0.5.gantt.png", "chain3-topas-0.5.trace.json"]
    first = json.loads(js.read_text())["per_seed"][0]
    assert first["seed"] == 3  # timelines are of the first seed given
    bench = first["points"][0]["results"]
    for policy in ("fcfs", "topas"):
        doc = json.loads((out / f"chain3-{policy}-0.5.trace.json").read_text())
        assert doc["otherData"]["run"]["mean_jct"] == bench[policy]["mean_jct"]  # the same run
        assert doc["otherData"]["seed"] == 3
        assert doc["otherData"]["tasks"] == 3 and doc["otherData"]["tasks_run"] == 5
        assert (out / f"chain3-{policy}-0.5.gantt.png").read_bytes()[:8] == PNG


def test_points_that_round_alike_get_their_own_files(tmp_path, capsys) -> None:
    """Names kept 6 significant digits: two rates 1e-7 apart wrote one file, the second over the
    first, while the count said 4 files."""
    from topas_agents.bench.timeline import point_label

    assert (point_label(0.6, 1.0), point_label(None, 0.0175)) == ("0.6", "r0.0175")
    out = tmp_path / "tl"
    assert main(["bench", "--workload", "chain3", "--policies", "fcfs", "--rate", "0.1234567,0.1234568",
                 "--tasks", "3", "--timeline", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.glob("*.trace.json")) == ["chain3-fcfs-r0.1234567.trace.json",
                                                                 "chain3-fcfs-r0.1234568.trace.json"]
    assert "timelines: 4 files" in capsys.readouterr().err


def test_bench_timeline_rejects_suite_and_orphan_option(capsys) -> None:
    assert main(["bench", "--suite", "random", "--timeline", "x", "--no-progress"]) == 2
    assert "--timeline needs the simulated single-engine bench" in capsys.readouterr().err
    assert main(["bench", "--workload", "chain3", "--timeline-tasks", "3", "--no-progress"]) == 2
    assert "--timeline-tasks needs --timeline" in capsys.readouterr().err


# ---------------------------------------------------------------------- server


@pytest.fixture(scope="module")
def server():
    from topas_agents.server import ServerConfig, start_server_in_thread

    handle = start_server_in_thread(ServerConfig(time_scale=200.0, workflows=("chain3",), drain_timeout_s=2.0))
    yield handle
    handle.stop()


def _chat(server, task: str, stage: str, agent: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "Plan a todo app"}], "max_tokens": 16,
            "topas": {"task_id": task, "stage": stage, "agent": agent, "workflow": "chain3"}}
    r = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_timeline_endpoint(server) -> None:
    wf = load_workflow("chain3")
    stages = [(s.name, s.agent) for s in wf.stages]
    rids = [_chat(server, "tl-1", *stages[0]), _chat(server, "tl-2", *stages[0])]
    r = httpx.get(f"{server.base_url}/v1/topas/timeline", params={"format": "perfetto"}, timeout=10)
    assert r.status_code == 200
    doc = r.json()
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] != 0]
    assert {e["args"]["rid"] for e in spans} >= set(rids)
    assert {e["name"] for e in spans} >= {"prefill"}
    assert doc["otherData"]["source"] == "live engine"
    one = httpx.get(f"{server.base_url}/v1/topas/timeline", params={"n": "1"}, timeout=10).json()
    assert {e["args"]["rid"] for e in one["traceEvents"] if e["ph"] == "X" and e["pid"] != 0} == {rids[-1]}


def test_timeline_is_encoded_off_the_event_loop(server, monkeypatch) -> None:
    # a document of a few MB was built in a thread but encoded on the loop every call shares
    import threading

    from fastapi.responses import JSONResponse

    _chat(server, "tl-enc", *[(s.name, s.agent) for s in load_workflow("chain3").stages][0])
    encoded_in: list[str] = []
    render = JSONResponse.render

    def recording(self, content):
        encoded_in.append(threading.current_thread().name)
        return render(self, content)

    monkeypatch.setattr(JSONResponse, "render", recording)
    r = httpx.get(f"{server.base_url}/v1/topas/timeline", timeout=10)
    assert r.status_code == 200 and r.json()["traceEvents"]
    loop_thread = server._thread.name
    assert encoded_in and loop_thread not in encoded_in


@pytest.mark.parametrize("params, param", [({"format": "svg"}, "format"), ({"n": "0"}, "n"),
                                           ({"n": "abc"}, "n"), ({"n": "2001"}, "n"), ({"n": "-3"}, "n")])
def test_timeline_endpoint_bad_params(server, params: dict, param: str) -> None:
    r = httpx.get(f"{server.base_url}/v1/topas/timeline", params=params, timeout=10)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_timeline_is_per_tenant() -> None:
    from topas_agents.server import ServerConfig, start_server_in_thread

    handle = start_server_in_thread(ServerConfig(time_scale=200.0, workflows=("chain3",), drain_timeout_s=2.0,
                                                 api_keys=("k-one", "k-two")))
    try:
        stage = load_workflow("chain3").stages[0]
        for key, task in (("k-one", "mine"), ("k-two", "theirs")):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                    "topas": {"task_id": task, "stage": stage.name, "agent": stage.agent, "workflow": "chain3"}}
            r = httpx.post(f"{handle.url}/chat/completions", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        url = f"{handle.base_url}/v1/topas/timeline"
        assert httpx.get(url, timeout=10).status_code == 401
        doc = httpx.get(url, headers={"Authorization": "Bearer k-one"}, timeout=10).json()
        procs = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
        assert procs == {"engine", "task mine (chain3)"}  # unqualified, and not the other tenant's
        agents = {e["cat"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] != 0}
        assert agents == {stage.agent}
    finally:
        handle.stop()


class _NoTimelineEngine:
    """A SimEngine without timeline support (an engine the route cannot record)."""

    set_recorder = None


def test_timeline_needs_a_recording_engine() -> None:
    from topas_agents.server import ServerConfig, start_server_in_thread
    from topas_agents.server.engine_factory import sim_engine_factory
    from topas_agents.sim import SimEngine

    class Engine(_NoTimelineEngine, SimEngine):
        pass

    def factory(config, workflows):
        engine, req = sim_engine_factory(config, workflows)
        engine.__class__ = Engine
        return engine, req

    handle = start_server_in_thread(ServerConfig(drain_timeout_s=2.0), engine_factory=factory)
    try:
        r = httpx.get(f"{handle.base_url}/v1/topas/timeline", timeout=10)
        assert r.status_code == 404 and "simulated engine" in r.json()["error"]["message"]
        assert httpx.get(f"{handle.base_url}/v1/topas/timeline", params={"n": "x"}, timeout=10).status_code == 400
    finally:
        handle.stop()
