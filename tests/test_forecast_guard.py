"""The forecast guard (policies/forecast.py, forecast_run.py): options, rate estimates, forecast traces, the
switching rule, and that it is Topas, decision for decision, while no forecast says otherwise."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import wait

import pytest

from topas_agents.costmodel import load_profile
from topas_agents.errors import ConfigError
from topas_agents.policies import close_policy, forecast_run, make_live_policy, make_policy
from topas_agents.policies import forecast as fc
from topas_agents.policies.forecast_run import JctPair
from topas_agents.sim.driver import make_trace, simulate
from topas_agents.workflow import load_workflow as builtin_workflow

PROFILE = load_profile("a100-80g-qwen2.5-32b")


def test_options_are_validated_and_split():
    guard = make_policy("topas", {"forecast_margin": "0.1", "forecast_seeds": "5,6", "beta": "0.5"})
    assert guard.config.margin == 0.1 and guard.config.seeds == (5, 6)
    assert guard.topas.config.beta == 0.5  # the rest goes to Topas
    with pytest.raises(ConfigError, match="forecast margin"):
        make_policy("topas", {"forecast_margin": "1.5"})
    with pytest.raises(ConfigError, match="forecast option 'tasks'"):
        make_policy("topas", {"forecast_tasks": "many"})
    with pytest.raises(ConfigError, match="unknown policy 'nope'"):
        make_policy("topas", {"forecast_candidates": "lpm,nope"})
    with pytest.raises(ConfigError, match="unknown topas option 'bogus'.*the guard's own: core, forecast_candidates"):
        make_policy("topas", {"bogus": "1"})


@pytest.mark.parametrize(("option", "value", "match"), [
    # before: each was accepted and crashed a run at its first forecast with a bare
    # ValueError/OverflowError, or was silently truncated (8.9 -> 8)
    ("forecast_spread", float("nan"), "forecast option 'spread'"),
    ("forecast_spread", -5, "spread must be a finite number >= 0"),
    ("forecast_growth", float("nan"), "forecast option 'growth'"),
    ("forecast_growth", float("inf"), "forecast option 'growth'"),
    ("forecast_candidates", "", "at least one policy"),
    ("forecast_first", 8.9, "forecast option 'first'"),
    ("forecast_first", True, "forecast option 'first'"),
    ("forecast_seeds", "1,2.5", "forecast option 'seeds'"),
    ("forecast_tasks", 10**9, "tasks must be <= 10000"),
    ("forecast_max_calls", 0, "max_calls must be >= 1"),
])
def test_forecast_options_are_refused_at_construction(option, value, match):
    with pytest.raises(ConfigError, match=match):
        make_policy("topas", {option: value})


def test_a_forecast_trace_keeps_its_first_tasks_within_the_call_bound():
    # 120 tasks of a 200-stage workflow made every forecast take minutes
    from topas_agents.sim import make_trace
    from topas_agents.workflow import load_workflow

    chain = make_trace(load_workflow("chain3"), 120, 1.0, 0)  # 3 calls a task: 360 in all
    assert forecast_run.bounded_trace(chain, fc.ForecastConfig().max_calls) == chain  # under it: as is
    assert forecast_run.bounded_trace(chain, 90) == chain[:30]  # 30 tasks, 90 calls
    assert len(forecast_run.bounded_trace(chain, 3)) == forecast_run.MIN_FORECAST_TASKS


def test_core_option_picks_the_guarded_core():
    """`core` chooses which Topas the guard runs and forecasts; its own options reach it."""
    full = make_policy("topas", {"core": "topas-paper-full", "forecast_first": "4", "beta": "0.5"})
    assert full.active_name == "topas-paper-full" and full.topas.name == "topas-paper-full"
    assert full.topas.config.beta == 0.5 and full.config.first == 4
    assert make_policy("topas").active_name == "topas-core"
    with pytest.raises(ConfigError, match="core must be one of"):
        make_policy("topas", {"core": "lpm"})
    guard = make_policy("topas", {"core": "topas-paper-full", "forecast_first": "4"})
    assert len(_run(guard, tasks=12).tasks) == 12
    assert guard.history and all("topas-paper-full" in f.scores for f in guard.history)  # it is forecast too


def test_live_engines_forecast_in_the_background():
    assert make_live_policy("topas").config.mode == "background"
    assert make_policy("topas").config.mode == "inline"  # benches stay deterministic
    with pytest.raises(ConfigError, match="needs forecast_mode=background"):
        make_live_policy("topas", {"forecast_mode": "inline"})
    assert make_live_policy("lpm").name == "lpm"


def test_trace_rates_spread_over_the_rate_estimate():
    rates = {"w": forecast_run.Rate(0.5, 16)}
    cfg = fc.ForecastConfig(seeds=(0, 1, 2, 3))
    got = [forecast_run.trace_rates(rates, i, cfg)["w"] for i in range(4)]
    assert got == sorted(got) and got[0] < 0.5 < got[-1]
    assert got[0] * got[-1] == pytest.approx(0.25) and got[1] * got[2] == pytest.approx(0.25)  # symmetric in log
    # z = 1.15 at (3 + 0.5) / 4; relative error 1 / sqrt(16)
    assert got[-1] == pytest.approx(0.5 * 2.718281828 ** (1.1503 / 4), rel=1e-3)
    flat = fc.ForecastConfig(seeds=(0, 1), spread=0.0)
    assert [forecast_run.trace_rates(rates, i, flat)["w"] for i in range(2)] == [0.5, 0.5]


def test_forecast_trace_splits_tasks_by_rate():
    a, b = builtin_workflow("chain3"), builtin_workflow("dag4")
    trace = forecast_run.forecast_trace({"chain3": a, "dag4": b}, {"chain3": 0.3, "dag4": 0.1}, 40, seed=7)
    names = [p.workflow.name for p in trace]
    assert names.count("chain3") == 30 and names.count("dag4") == 10
    assert [p.arrival_s for p in trace] == sorted(p.arrival_s for p in trace)
    assert len({p.task_id for p in trace}) == 40


def _run(policy, load_rate=0.05, tasks=20, seed=3):
    wf = builtin_workflow("chain3")
    return simulate(make_trace(wf, tasks, load_rate, seed), policy, PROFILE)


def test_arrivals_checkpoints_double_and_rates_are_estimated(monkeypatch):
    seen = []

    def fake_scores(job):
        seen.append((sorted(job.workflows), dict(job.rates)))
        return {p: 1.0 for p in job.policies}

    monkeypatch.setattr(fc, "run_forecast", fake_scores)
    guard = make_policy("topas")
    _run(guard, tasks=20)
    assert [f.arrivals for f in guard.history] == [4, 8, 16]  # early 4, first 8, growth 2, 20 tasks
    assert all(f.chosen == "topas-core" for f in guard.history)  # ties never switch
    (names, rates) = seen[1]
    assert names == ["chain3"] and rates["chain3"].gaps == 7 and rates["chain3"].per_s > 0
    assert seen[0][1]["chain3"].gaps == 3


def test_switch_needs_the_margin_and_is_reversible(monkeypatch):
    script = iter([{"lpm": 0.995}, {"lpm": 0.9}, {"lpm": 1.2}])  # per checkpoint, vs topas 1.0

    def fake_scores(job):
        return {p: 1.0 for p in job.policies} | next(script)

    monkeypatch.setattr(fc, "run_forecast", fake_scores)
    guard = make_policy("topas", {"forecast_first": "4"})
    _run(guard, tasks=16)
    # 0.995 is inside the 1% margin: stay; 0.9 switches to LPM; then Topas at 1.0 < 1.2 x 0.99
    assert [f.chosen for f in guard.history] == ["topas-core", "lpm", "topas-core"]
    assert guard.active is guard.topas


def test_early_forecast_is_provisional_then_the_usual_schedule(monkeypatch):
    """forecast_early=4 (the default): a forecast at the 4th arrival switches only past early_margin (5%);
    the checkpoints at 8, 16 follow with the usual 1% margin."""
    script = iter([{"lpm": 0.96}, {"lpm": 0.98}, {"lpm": 1.2}])  # per checkpoint, vs topas 1.0
    margins = []

    def fake_scores(job):
        return {p: 1.0 for p in job.policies} | next(script)

    real_target = fc.switch_target

    def spy(scores, running, topas, margin):
        margins.append(margin)
        return real_target(scores, running, topas, margin)

    monkeypatch.setattr(fc, "run_forecast", fake_scores)
    monkeypatch.setattr(fc, "switch_target", spy)
    guard = make_policy("topas")  # forecast_early=4 is the default
    _run(guard, tasks=20)
    assert [f.arrivals for f in guard.history] == [4, 8, 16]
    assert margins == [0.05, 0.01, 0.01]
    # 0.96 is a 4% gain, inside the early 5%: stay; 0.98 clears 1% at the 8th; 1.2 goes back
    assert [f.chosen for f in guard.history] == ["topas-core", "lpm", "topas-core"]
    for bad in ({"forecast_early": "2"}, {"forecast_early_margin": "1"}):
        with pytest.raises(ConfigError, match="forecast early"):
            make_policy("topas", bad)
    late = make_policy("topas", {"forecast_early": "8"})  # not before the first: no early forecast
    monkeypatch.setattr(fc, "run_forecast", lambda job: {p: 1.0 for p in job.policies})
    _run(late, tasks=20)
    assert [f.arrivals for f in late.history] == [8, 16]
    off = make_policy("topas", {"forecast_early": "0"})
    _run(off, tasks=20)
    assert [f.arrivals for f in off.history] == [8, 16]


def test_a_forecast_trading_mean_for_p99_is_a_loss_by_default(monkeypatch):
    """The default score is the contract's: Topas 10% behind Parrot's mean JCT and 10% ahead of
    its p99 loses by 1.1x, so the guard runs Parrot. The combined score (the mean of the two
    ratios to Topas: 1.01 for Parrot) keeps Topas."""
    runs = {"topas-core": JctPair(110.0, 180.0), "fcfs": JctPair(150.0, 260.0), "lpm": JctPair(130.0, 220.0),
            "parrot": JctPair(100.0, 200.0), "las": JctPair(160.0, 300.0), "spf": JctPair(120.0, 240.0)}
    monkeypatch.setattr(forecast_run, "_simulate_trace", lambda job, i, seed: {p: runs[p] for p in job.policies})
    guard = make_policy("topas", {"forecast_first": "4"})
    _run(guard, tasks=6)
    first = guard.history[0]
    assert first.scores["topas-core"] == pytest.approx(1.1) and first.scores["parrot"] == 1.0
    assert first.chosen == "parrot" and guard.active_name == "parrot"
    combined = make_policy("topas", {"forecast_first": "4", "forecast_score": "combined"})
    _run(combined, tasks=6)
    assert combined.history[0].scores["parrot"] == pytest.approx((100 / 110 + 200 / 180) / 2)
    assert combined.history[0].chosen == "topas-core"


def test_guard_is_topas_while_topas_is_chosen(monkeypatch):
    monkeypatch.setattr(fc, "run_forecast", lambda job: {p: 1.0 for p in job.policies})
    plain = _run(make_policy("topas-core"), load_rate=0.08)
    guarded = _run(make_policy("topas"), load_rate=0.08)
    assert [t.jct_s for t in guarded.tasks] == [t.jct_s for t in plain.tasks]


def test_forecast_scores_rank_simulated_schedules():
    """Real forecasts: Topas scores 1 by construction and every candidate gets a finite score."""
    guard = make_policy("topas", {"forecast_seeds": "0", "forecast_tasks": "8",
                                        "forecast_candidates": "lpm,fcfs"})
    run = _run(guard, load_rate=0.08, tasks=12)
    assert len(run.tasks) == 12
    (first, *_) = guard.history
    assert first.scores["topas-core"] == 1.0 and set(first.scores) == {"topas-core", "lpm", "fcfs"}
    assert all(0.0 < v < float("inf") for v in first.scores.values())
    assert guard.active_name == guard.history[-1].chosen


def test_scores_combined_and_regret_on_hand_computed_runs():
    """Two traces; topas, lpm (best mean) and parrot (best p99) trade mean for p99.
    combined: per trace the mean of the two ratios to topas, averaged over traces.
    regret: each metric's ratio to the best candidate (lpm, parrot), averaged over traces,
    then the larger of the two."""
    inf = float("inf")
    runs = [{"topas-core": JctPair(100.0, 200.0), "lpm": JctPair(90.0, 240.0), "parrot": JctPair(110.0, 180.0)},
            {"topas-core": JctPair(100.0, 200.0), "lpm": JctPair(80.0, 220.0), "parrot": JctPair(inf, inf)}]
    combined = forecast_run._combined_scores(runs, "topas-core")
    assert combined["topas-core"] == 1.0
    assert combined["lpm"] == pytest.approx(((0.9 + 1.2) / 2 + (0.8 + 1.1) / 2) / 2)
    assert combined["parrot"] == inf
    regret = forecast_run._regret_scores(runs, ("lpm", "parrot"))
    # trace 1: best mean 90 (lpm), best p99 180 (parrot); trace 2: 80 and 220 (lpm; parrot failed).
    assert regret["topas-core"] == pytest.approx(max((100 / 90 + 100 / 80) / 2, (200 / 180 + 200 / 220) / 2))
    assert regret["lpm"] == pytest.approx(max(1.0, (240 / 180 + 1.0) / 2))
    assert regret["parrot"] == inf
    # Every candidate failed on a trace: its reference is the best run there (topas).
    assert forecast_run._regret_scores([{"topas-core": JctPair(10.0, 20.0), "lpm": JctPair(inf, inf)}], ("lpm",))["topas-core"] == 1.0
    with pytest.raises(ConfigError, match="forecast score"):
        make_policy("topas", {"forecast_score": "best"})
    assert make_policy("topas", {"forecast_score": "regret"}).config.score == "regret"


def test_background_forecast_lands_at_a_later_decision():
    """A real worker process: the run goes on while it simulates; its scores apply later."""
    guard = make_policy("topas", {"forecast_mode": "background", "forecast_seeds": "0", "forecast_early": "0",
                                  "forecast_tasks": "6", "forecast_candidates": "lpm"})
    run = _run(guard, load_rate=0.08, tasks=10)
    assert len(run.tasks) == 10 and guard.errors == []
    guard.wait(timeout_s=120)
    assert guard._pending is not None and guard._pending.future.done()
    os.kill(guard._worker.pid, signal.SIGINT)  # Ctrl-C reaches the process group: the parent stops it
    time.sleep(0.5)
    assert guard._worker.alive()
    _run(guard, load_rate=0.08, tasks=1, seed=4)  # the next decision applies it
    (landed,) = guard.history  # (no early forecast here: one checkpoint in flight at a time)
    # submitted at the 8th arrival (7 gaps); applied at the second run's first decision, whose
    # task (an id of the first run, no longer live) is an 11th arrival
    assert landed.rates["chain3"].gaps == 7 and landed.arrivals == 11
    assert set(landed.scores) == {"topas-core", "lpm"} and landed.scores["topas-core"] == 1.0


def test_close_stops_a_forecast_in_flight():
    """An engine done with the policy stops its worker, a long forecast in flight included
    (otherwise the interpreter waits for that forecast at exit)."""
    guard = make_policy("topas", {"forecast_mode": "background", "forecast_tasks": "5000",
                                  "forecast_candidates": "lpm"})
    _run(guard, load_rate=0.08, tasks=10)
    assert guard._pending is not None and not guard._pending.future.done()
    worker = guard._worker
    assert worker.alive()
    started = time.monotonic()
    guard.close()
    assert not worker.alive() and time.monotonic() - started < 30
    assert guard._worker is None and guard._pending is None
    close_policy(guard)  # twice is harmless, as is closing a policy that holds nothing
    close_policy(make_policy("lpm"))


def _kill_worker(guard) -> None:
    os.kill(guard._worker.pid, signal.SIGKILL)
    wait([guard._pending.future], timeout=60)
    assert guard._pending.future.done()


def test_a_dead_forecast_worker_is_replaced_once_and_never_stops_decide(caplog):
    """Before: a worker that died (the OOM killer, a kill) broke the process pool; the next
    checkpoint's submit raised BrokenProcessPool out of decide(), stopping the engine's scheduler."""
    guard = make_policy("topas", {"forecast_mode": "background", "forecast_tasks": "5000",
                                  "forecast_candidates": "lpm", "forecast_early": "0"})
    try:
        _run(guard, load_rate=0.08, tasks=10)  # checkpoint at 8 arrivals: a long forecast in flight
        _kill_worker(guard)
        run = _run(guard, load_rate=0.08, tasks=10, seed=5)  # applies the failure, then checkpoint 16
        assert len(run.tasks) == 10 and guard.errors and guard.errors[0].startswith("ForecastWorkerDied")
        assert guard._pending is not None  # a new worker took the checkpoint at 16 arrivals
        _kill_worker(guard)
        run = _run(guard, load_rate=0.08, tasks=30, seed=6)  # past the checkpoint at 32
        assert len(run.tasks) == 30 and len(guard.errors) == 2
        assert guard._worker is None and guard._pending is None  # no third worker
        assert "died 2 times, so forecasts stop" in caplog.text
        assert guard.active is guard.topas and not guard.history
    finally:
        guard.close()


SCRIPT_WITHOUT_MAIN_GUARD = """
import sys
from topas_agents.costmodel import load_profile
from topas_agents.policies import make_policy
from topas_agents.sim.driver import make_trace, simulate
from topas_agents.workflow import load_workflow
print("top-level ran", file=sys.stderr)
guard = make_policy("topas", {"forecast_mode": "background", "forecast_seeds": "0", "forecast_early": "0",
                              "forecast_tasks": "6", "forecast_candidates": "lpm"})
profile = load_profile("a100-80g-qwen2.5-32b")
simulate(make_trace(load_workflow("chain3"), 10, 0.08, 3), guard, profile)
guard.wait(timeout_s=120)
simulate(make_trace(load_workflow("chain3"), 1, 0.08, 4), guard, profile)
guard.close()
print("forecasts", len(guard.history), "errors", len(guard.errors))
"""


def test_a_script_without_the_main_guard_runs_once_and_gets_its_forecast(tmp_path):
    """Before: the worker was a spawned process pool, which re-imports the caller's __main__:
    a script without `if __name__ == "__main__":` ran again inside the worker (here: its own
    simulation; in a user's script, its server and calls), and the worker never started."""
    import subprocess
    import sys

    script = tmp_path / "embedded.py"
    script.write_text(SCRIPT_WITHOUT_MAIN_GUARD)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("top-level ran") == 1, done.stderr[-2000:]
    assert "forecasts 1 errors 0" in done.stdout


def test_the_worker_takes_a_large_job_without_blocking_and_returns_its_error():
    """A job larger than a pipe's buffer is written by a thread (decide() must not wait for the
    worker's start-up), and a forecast that raises comes back as its exception."""
    from topas_agents.policies.forecast_worker import ForecastWorker

    worker = ForecastWorker()
    try:
        os.kill(worker.pid, signal.SIGSTOP)  # a worker that reads nothing yet (a slow start-up)
        started = time.monotonic()
        future = worker.submit(b"x" * (8 << 20))  # 8 MiB, far over a pipe's 64 KiB; not a ForecastJob
        assert time.monotonic() - started < 5.0 and not future.done()
        os.kill(worker.pid, signal.SIGCONT)
        exc = future.exception(timeout=120)
        assert isinstance(exc, Exception) and not isinstance(exc, fc.ForecastWorkerDied)
        assert worker.alive()  # an error in a forecast is not a death
    finally:
        worker.close()
    assert not worker.alive()


def test_the_worker_ignores_the_working_directory(tmp_path, monkeypatch):
    """A server started from a folder holding another `topas_agents` (an older checkout) must
    not hand that one to the worker (`-c` and `-m` put the working directory first)."""
    from topas_agents.policies.forecast_worker import ForecastWorker

    shadow = tmp_path / "topas_agents"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the shadowing package was imported')\n")
    monkeypatch.chdir(tmp_path)
    worker = ForecastWorker()
    try:
        exc = worker.submit(b"not a job").exception(timeout=120)
        assert isinstance(exc, AttributeError)  # the real run_forecast ran, and raised on the bytes
    finally:
        worker.close()


def test_a_server_keeps_serving_when_its_forecast_worker_is_killed():
    """Before: the next checkpoint raised BrokenProcessPool out of decide(); the sim server's
    engine loop then marked the engine failed and answered every later call with 503."""
    import httpx

    from topas_agents.server import ServerConfig, start_server_in_thread

    config = ServerConfig(time_scale=200.0, workflows=("chain3",),
                          policy_options=(("forecast_tasks", "5000"), ("forecast_candidates", "lpm")))
    with start_server_in_thread(config) as server, httpx.Client(base_url=server.base_url, timeout=60) as client:
        guard = server.service.engine.policy

        def run_task(i: int) -> list[int]:
            return [client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                "topas": {"task_id": f"t{i}", "stage": s, "agent": a, "workflow": "chain3"}}).status_code
                for s, a in (("s1", "a"), ("s2", "b"), ("s3", "c"))]

        for i in range(6):
            assert run_task(i) == [200] * 3
        deadline = time.monotonic() + 60
        while guard._worker is None and time.monotonic() < deadline:  # the early checkpoint (4th task)
            time.sleep(0.05)
        os.kill(guard._worker.pid, signal.SIGKILL)
        for i in range(6, 20):  # past the checkpoints at 8 and 16 arrivals
            assert run_task(i) == [200] * 3
        assert guard.errors and guard.errors[0].startswith("ForecastWorkerDied")


def test_the_worker_exits_when_its_parent_dies():
    """A replica or SGLang scheduler killed with SIGKILL leaves no forecast worker behind: the
    worker reads the end of its stdin and exits."""
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", (
        "from topas_agents.policies.forecast_worker import ForecastWorker; import time; "
        "w = ForecastWorker(); print(w.pid, flush=True); time.sleep(120)")], stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(parent.stdout.readline())
        assert not _exited(worker_pid)
        parent.kill()
        parent.wait(30)
        deadline = time.monotonic() + 30
        while not _exited(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _exited(worker_pid), f"the forecast worker {worker_pid} outlived its parent"
    finally:
        parent.kill()
        parent.stdout.close()


def _exited(pid: int) -> bool:
    """Gone, or a zombie (exited; whoever adopted the orphan has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_serve_rejects_an_inline_guard_with_one_line(capsys):
    from topas_agents.cli import main

    assert main(["serve", "--engine", "sim", "--policy", "topas", "--policy-opt", "forecast_mode=inline",
                 "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "needs forecast_mode=background" in err and err.count("\n") == 1


def _jcts(run):
    return [t.jct_s for t in run.tasks]


def test_scheduled_policy_runs_each_stint_from_its_arrival_count():
    """forecast_switch=modelled simulates the guard's schedule so far, then a candidate: one
    stint is that policy alone, a stint that never starts changes nothing, and a switch
    mid-run gives a run that is neither policy's alone."""
    S = forecast_run.Stint
    lpm, core = _run(make_policy("lpm"), load_rate=0.2), _run(make_policy("topas-core"), load_rate=0.2)
    sched = forecast_run.ScheduledPolicy
    assert _jcts(_run(sched((S(0, "lpm"),), "topas-core", None), load_rate=0.2)) == _jcts(lpm)
    assert _jcts(_run(sched((S(0, "topas-core"),), "topas-core", None), load_rate=0.2)) == _jcts(core)
    never = sched((S(0, "topas-core"), S(10_000, "lpm")), "topas-core", None)
    assert _jcts(_run(never, load_rate=0.2)) == _jcts(core)
    assert _jcts(lpm) != _jcts(core)  # else the next check says nothing
    # on this trace the two diverge after the 12th arrival: a switch at the 16th mixes them
    mixed = sched((S(0, "topas-core"), S(16, "lpm")), "topas-core", None)
    run = _run(mixed, load_rate=0.2)
    assert mixed.active.__class__ is make_policy("lpm").__class__ and len(run.tasks) == 20
    assert _jcts(run) not in (_jcts(lpm), _jcts(core))
    assert mixed.name == "topas-core@0+lpm@16"


def test_modelled_switch_forecasts_the_schedule_so_far(monkeypatch):
    jobs = []
    script = iter([{"lpm": 0.9}, {"lpm": 1.0}, {"lpm": 1.0}])

    def fake_scores(job):
        jobs.append(job)
        return {p: 1.0 for p in job.policies} | next(script)

    monkeypatch.setattr(fc, "run_forecast", fake_scores)
    guard = make_policy("topas", {"forecast_switch": "modelled", "forecast_early": "0", "forecast_first": "4"})
    _run(guard, tasks=20)
    assert [j.at for j in jobs] == [4, 8, 16]
    S = forecast_run.Stint
    assert jobs[0].stints == (S(0, "topas-core"),)
    assert jobs[1].stints == jobs[2].stints == (S(0, "topas-core"), S(4, "lpm"))
    assert guard.stints == [S(0, "topas-core"), S(4, "lpm")]
    assert jobs[0].config.switch == "modelled"


def test_modelled_forecast_simulates_the_switch(monkeypatch):
    """A real modelled forecast: every candidate's run starts as the schedule so far."""
    built = []
    real = forecast_run.ScheduledPolicy

    class Recording(real):
        def __init__(self, stints, topas, options):
            built.append(stints)
            super().__init__(stints, topas, options)

    S = forecast_run.Stint
    config = fc.ForecastConfig(candidates=("lpm",), seeds=(0,), tasks=8, switch="modelled")
    job = forecast_run.ForecastJob({"chain3": builtin_workflow("chain3")}, {"chain3": forecast_run.Rate(0.08, 7)},
                                   PROFILE, PROFILE.kv_budget_tokens, ("topas-core", "lpm"), {}, config,
                                   (S(0, "topas-core"),), 4)
    monkeypatch.setattr(forecast_run, "ScheduledPolicy", Recording)
    scores = forecast_run.run_forecast(job)
    assert built == [(S(0, "topas-core"), S(4, "topas-core")), (S(0, "topas-core"), S(4, "lpm"))]
    assert set(scores) == {"topas-core", "lpm"} and all(0 < v < float("inf") for v in scores.values())


def test_switch_option_is_validated():
    with pytest.raises(ConfigError, match="forecast switch must be fresh or modelled, got 'later'"):
        make_policy("topas", {"forecast_switch": "later"})
