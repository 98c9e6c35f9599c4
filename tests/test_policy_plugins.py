"""A policy of the user's own: by `module:factory` path or entry point, options typed as every
CLI gives them, Decisions checked for shape, and a live server that asks a stalled policy again."""

from __future__ import annotations

import contextlib
import sys
import textwrap
import threading
import time

import httpx
import openai
import pytest

from topas_agents import policies
from topas_agents.bench.options import load_policy_config
from topas_agents.errors import ConfigError, DecisionError
from topas_agents.policies import available_policies, is_known_policy, make_live_policy, make_policy
from topas_agents.server import ServerConfig, start_server_in_thread
from topas_agents.snapshot import Decision

MODULE = textwrap.dedent('''
    from topas_agents.policies.greedy import greedy_admit
    from topas_agents.snapshot import Decision


    class Recorder:
        name = "recorder"

        def __init__(self, **options):
            self.options = options

        def decide(self, snap):
            return greedy_admit(snap, snap.waiting)


    class Starve:
        name = "starve"

        def decide(self, snap):
            return Decision()


    class Window:
        """Hold every request until it has waited `hold_s` simulated seconds."""
        name = "window"

        def __init__(self, hold_s=5.0):
            self.hold_s = float(hold_s)

        def decide(self, snap):
            ready = [r for r in snap.waiting if snap.now - r.arrival_s >= self.hold_s]
            return greedy_admit(snap, ready)


    class Raises:
        name = "raises"

        def decide(self, snap):
            raise ZeroDivisionError("a bug of its own")


    def not_a_policy():
        return 42


    def picky(level=1):
        raise ValueError(f"level must be 1..3, got {level}")
''')


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    (tmp_path / "userpol.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)  # found from the working directory, as `topas` run there would
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield "userpol"
    sys.modules.pop("userpol", None)


def test_a_policy_by_module_path_needs_no_registration(user_module) -> None:
    assert is_known_policy("userpol:Recorder") and not is_known_policy("userpol")
    policy = make_policy("userpol:Recorder", {"flag": False})
    assert policy.name == "recorder" and policy.options == {"flag": False}


def test_a_policy_by_entry_point(user_module, monkeypatch, tmp_path) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))  # an installed package is importable
    monkeypatch.setattr(policies, "_entry_points", lambda: {"rec": "userpol:Recorder"})
    assert "rec" in available_policies() and make_policy("rec").name == "recorder"


def test_what_a_factory_gets_wrong_is_a_config_error_naming_the_policy(user_module) -> None:
    with pytest.raises(ConfigError, match="'userpol:not_a_policy': userpol:not_a_policy built a int, not a policy"):
        make_policy("userpol:not_a_policy")
    with pytest.raises(ConfigError, match="policy 'userpol:picky' options {'level': 9}: level must be 1..3"):
        make_policy("userpol:picky", {"level": 9})
    with pytest.raises(ConfigError, match="is not available"):
        make_policy("userpol:Missing")
    with pytest.raises(ConfigError, match="unknown policy 'nope'.*module:factory"):
        make_policy("nope")


def test_a_live_engine_gives_options_typed_as_the_bench_does(user_module) -> None:
    # `topas serve --policy-opt flag=false` gave the string 'false' (true in `if self.flag:`)
    policy = make_live_policy("userpol:Recorder", {"flag": "false", "n": "3", "name": "x"})
    assert policy.options == {"flag": False, "n": 3, "name": "x"}
    assert make_live_policy("lpm-gated", {"threshold": "3"}).name  # refused '3' before
    guard = make_live_policy("topas", {"forecast_seeds": "0", "forecast_candidates": "lpm,parrot"})
    try:  # one number for a list option (YAML reads "0" as 0) is a one-item list
        assert guard.config.seeds == (0,) and guard.config.candidates == ("lpm", "parrot")
    finally:
        guard.close()


def test_policy_config_sections_for_policies_not_run_are_dropped(tmp_path) -> None:
    path = tmp_path / "opts.yaml"
    path.write_text("lpm-gated: {threshold: 4}\ntopas-core: {beta: 0.5}\n")
    assert load_policy_config(path, ("fcfs", "topas-core")) == {"topas-core": {"beta": 0.5}}


def test_decision_fields_are_tuples_of_ids() -> None:
    assert Decision(admit=["a"], prefix_out=["x"]) == Decision(admit=("a",), prefix_out=("x",))
    for bad in ("rid", None, 3, {"a": 1}):
        with pytest.raises(DecisionError, match="Decision.admit must be a tuple of ids"):
            Decision(admit=bad)  # type: ignore[arg-type]


def _call(handle, task: str) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=20)
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          extra_body={"topas": {"task_id": task, "stage": "s", "agent": "a"}})


def test_a_live_server_asks_a_holding_policy_again_and_reports_a_stall(user_module, caplog) -> None:
    # the engine consulted the policy only at events: a policy that held requests for a
    # batching window, or admitted nothing, left its callers hanging with /health "ok"
    handle = start_server_in_thread(ServerConfig(time_scale=20.0, policy="userpol:Window",
                                                 policy_options=(("hold_s", "4"),)))
    try:
        t0 = time.monotonic()
        assert _call(handle, "w1").choices[0].message.content
        assert time.monotonic() - t0 >= 0.15  # held 4 simulated seconds (0.2 s at 20x)
    finally:
        handle.stop()
    handle = start_server_in_thread(ServerConfig(time_scale=20.0, policy="userpol:Starve", drain_timeout_s=0.5))
    waiting = threading.Thread(target=lambda: _ignore_errors(_call, handle, "s1"), daemon=True)
    try:
        waiting.start()  # held open: the stall lasts while a request waits (a caller that left ends it)
        deadline = time.monotonic() + 10
        while "stalled_s" not in (health := httpx.get(f"{handle.base_url}/health", timeout=10).json()):
            assert time.monotonic() < deadline, f"no stall reported: {health}"
            time.sleep(0.05)
        assert health["status"] == "ok" and health["stalled_s"] >= 0
    finally:
        handle.stop()
        waiting.join(10)
    assert "policy 'userpol:Starve' left 1 request(s) waiting" in caplog.text


def _ignore_errors(fn, *args) -> None:
    with contextlib.suppress(openai.OpenAIError):  # the server stops under it
        fn(*args)


def test_a_failing_policy_loses_no_other_results(user_module, tmp_path, capsys) -> None:
    # one run's error ended the bench and no JSON was written: hours of baselines lost
    import json

    from topas_agents.cli import main

    out = tmp_path / "b.json"
    rc = main(["bench", "--workload", "dag4", "--policies", "fcfs,userpol:Raises,userpol:Starve", "--tasks", "6",
               "--load", "0.5,0.9", "--no-progress", "--json", str(out)])
    err = capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert rc == 1 and [list(p["results"]) for p in doc["points"]] == [["fcfs"], ["fcfs"]]
    assert set(doc["summary"]) >= {"fcfs"} and "userpol:Raises" not in doc["summary"]
    assert {(f["policy"], f["load"]) for f in doc["failures"]} == {
        (p, u) for p in ("userpol:Raises", "userpol:Starve") for u in (0.5, 0.9)}
    assert "error: userpol:Raises (seed 0, load 0.5): ZeroDivisionError: a bug of its own" in err
    assert "stalled" in next(f["error"] for f in doc["failures"] if f["policy"] == "userpol:Starve")
