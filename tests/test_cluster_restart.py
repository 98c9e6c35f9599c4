"""A dead replica is restarted: on its port, with the run-time workflows registered again, back
in smg's rotation; and a replica that keeps dying is given up on after the policy's bound."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from pathlib import Path

import httpx
import pytest

from topas_agents.errors import ConfigError
from topas_agents.server.cluster.config import ClusterConfig, RestartPolicy
from topas_agents.server.cluster.procs import start_child, stop_children
from topas_agents.server.cluster.supervisor import GATEWAY, GatewayWatch, Supervisor

needs_smg = pytest.mark.skipif(importlib.util.find_spec("smg") is None, reason="needs the [cluster] extra (smg)")

SERVE_ARGS = ("--workflow", "chain3", "--time-scale", "100", "--log-level", "warning")
PAIR = ("name: pair\nagents:\n  - {name: p, prefix_tokens: 100}\n  - {name: q, prefix_tokens: 100}\n"
        "stages:\n  - {name: one, agent: p, after: [], input_tokens: 10, output_tokens: 10}\n"
        "  - {name: two, agent: q, after: [one], input_tokens: 10, output_tokens: 10}\n")
FAST = RestartPolicy(backoff_initial_s=0.05, backoff_max_s=0.2, poll_interval_s=0.05)


def test_restart_policy_bounds():
    assert [FAST.backoff_s(k) for k in range(4)] == [0.05, 0.1, 0.2, 0.2]
    for bad in ({"max_restarts": -1}, {"window_s": 0}, {"backoff_initial_s": 9.0}, {"poll_interval_s": float("nan")}):
        with pytest.raises(ConfigError):
            RestartPolicy(**bad)


def test_replica_restarts_option():
    import argparse

    from topas_agents.server.cluster.cli import add_replica_options, restart_policy

    p = argparse.ArgumentParser()
    add_replica_options(p)
    assert restart_policy(p.parse_args([])) == RestartPolicy()
    assert restart_policy(p.parse_args(["--replica-restarts", "5"])).max_restarts == 5
    assert not restart_policy(p.parse_args(["--replica-restarts", "0"])).enabled
    with pytest.raises(SystemExit):
        p.parse_args(["--replica-restarts", "-1"])


@pytest.mark.parametrize(("process", "replica"), [("replica-1", 1), (GATEWAY, None)], ids=["replica", "smg"])
def test_a_process_that_keeps_dying_is_given_up(tmp_path, process, replica):
    # a replica or an "smg" that exits at once: every restart fails, then the supervisor stops
    # trying, within the same bounds for both; `gave_up("smg")` is what ends `topas serve
    # --replicas` (before, any smg death ended it at once)
    argv = (sys.executable, "-c", "import sys; sys.exit(3)")
    config = ClusterConfig(replicas=1, restart=RestartPolicy(max_restarts=2, backoff_initial_s=0.0,
                                                             poll_interval_s=0.05), startup_timeout_s=5)
    box = [start_child(process, argv, log_dir=tmp_path)]  # the handle's list, updated on a restart
    box[0].proc.wait(10)
    watch = None
    if process == GATEWAY:
        watch = GatewayWatch(current=lambda: box[0], replace=lambda child: box.__setitem__(0, child), argv=argv,
                             env={})
    sup = Supervisor(config, box if watch is None else [], log_dir=tmp_path, argv=lambda i, extra: argv,
                     env=lambda i: {}, gateway=watch)
    sup.start()
    try:
        events = sup.wait_for(3, timeout_s=30)
    finally:
        sup.stop()
        stop_children(box, 1.0)
    assert [(e.process, e.replica, e.outcome) for e in events] == [
        (process, replica, "failed"), (process, replica, "failed"), (process, replica, "gave_up")]
    assert [e.attempt for e in events] == [1, 2, 2]
    assert events[0].exit_code == 3 and "exited with 3" in events[0].detail
    assert len(sup.events) == 3  # given up: no further attempt, however long it watches
    other = "replica-1" if process == GATEWAY else GATEWAY
    assert sup.gave_up(process) and not sup.gave_up(other)


def _calls_on(url: str) -> int:
    """Chat calls the replica answered (its HTTP counters)."""
    http = httpx.get(f"{url}/v1/topas/stats").json()["requests"]["http"]
    return sum(row["count"] for row in http if "chat" in row["endpoint"])


@needs_smg
def test_killed_replica_comes_back_with_its_workflows():
    from topas_agents.server.cluster.launcher import free_base_port, run_replicas

    with run_replicas(3, port=free_base_port(6), serve_args=SERVE_ARGS, restart=FAST) as cluster:
        front = cluster.base_url
        assert httpx.post(front + "/v1/topas/workflows", content=PAIR).status_code == 201
        victim = 2
        url = cluster.config.replica_urls[victim - 1]
        old = cluster.replicas[victim - 1]
        old.kill()

        events = cluster.supervisor.wait_for(1, timeout_s=60)
        assert [(e.process, e.replica, e.outcome, e.old_pid) for e in events] == [
            (f"replica-{victim}", victim, "restarted", old.pid)]
        assert events[0].reregistered == 1
        new = cluster.replicas[victim - 1]
        assert new.pid == events[0].new_pid != old.pid and new.alive()
        assert httpx.get(url + "/health").status_code == 200
        assert {"chain3", "pair"} <= set(httpx.get(url + "/v1/topas/workflows").json()["workflows"])
        # the anonymous run-time workflow was on the new command line: registered before it listened
        assert new.argv[-2] == "--workflow" and "name: pair" in Path(new.argv[-1]).read_text()
        layout = httpx.get(front + "/v1/topas/cluster").json()
        assert [r["outcome"] for r in layout["restarts"]] == ["restarted"]

        # new tasks of the run-time workflow: each call succeeds; smg routes some to the restarted
        # replica once its health probe passes (bounded: health interval + breaker timeout)
        before = _calls_on(url)
        deadline = time.monotonic() + 60
        sent = 0
        with httpx.Client(timeout=30) as client:
            while _calls_on(url) == before and time.monotonic() < deadline:
                lab = {"task_id": f"back-{sent}", "stage": "one", "agent": "p", "workflow": "pair"}
                r = client.post(cluster.url + "/chat/completions", json={
                    "model": "m", "max_tokens": 4, "topas": lab,
                    "messages": [{"role": "user", "content": f"after restart {sent}"}]})
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"]
                sent += 1
        assert _calls_on(url) > before, f"no call reached the restarted replica in {sent} calls"
        assert len(cluster.restarts) == 1
    assert all(not child.alive() for child in cluster.children)


@needs_smg
def test_a_killed_gateway_is_restarted_and_a_call_sent_meanwhile_waits_for_it():
    from concurrent.futures import ThreadPoolExecutor

    from topas_agents.server.cluster.launcher import free_base_port, run_replicas

    def call(client: httpx.Client, k: int) -> httpx.Response:
        lab = {"task_id": f"g-{k}", "stage": "s1", "agent": "a", "workflow": "chain3"}
        return client.post(cluster.url + "/chat/completions", json={
            "model": "m", "max_tokens": 4, "topas": lab, "messages": [{"role": "user", "content": f"call {k}"}]})

    with run_replicas(2, port=free_base_port(5), serve_args=SERVE_ARGS, restart=FAST) as cluster, \
            httpx.Client(timeout=60) as client, ThreadPoolExecutor(4) as pool:
        assert call(client, 0).status_code == 200
        old = cluster.gateway
        old.kill()
        # sent while smg is down: before, a 502 at once ("gateway unreachable")
        pending = [pool.submit(call, client, k) for k in range(1, 5)]
        events = cluster.supervisor.wait_for(1, timeout_s=60)
        assert [(e.process, e.replica, e.outcome, e.old_pid) for e in events] == [
            (GATEWAY, None, "restarted", old.pid)]
        assert cluster.gateway.pid == events[0].new_pid != old.pid and cluster.gateway.alive()
        for fut in pending:
            r = fut.result(timeout=60)
            assert r.status_code == 200, r.text
        assert call(client, 9).status_code == 200
        layout = client.get(cluster.base_url + "/v1/topas/cluster").json()
        assert [(r["process"], r["outcome"]) for r in layout["restarts"]] == [(GATEWAY, "restarted")]
        # a gateway restart is not a replica restart: the replicas' counters did not begin again
        assert 'topas_replica_restarts_total{replica="1"} 0' in client.get(cluster.base_url + "/metrics").text
        assert client.get(cluster.base_url + "/health").status_code == 200
    assert all(not child.alive() for child in cluster.children)


@pytest.mark.parametrize(("temporary", "failing", "kept"), [
    (True, False, False),  # the launcher's own folder goes with a clean stop (hundreds piled up in /tmp)
    (True, True, True),  # a stop after an error keeps what explains it
    (False, False, True),  # a folder the caller gave (--log-dir) is theirs
])
def test_the_log_folder_outlives_the_cluster_only_when_it_may_be_needed(tmp_path, temporary, failing, kept):
    from topas_agents.server.cluster.launcher import ClusterHandle

    logs = tmp_path / "logs"
    logs.mkdir()
    gateway = start_child("smg", (sys.executable, "-c", "import time; time.sleep(30)"), log_dir=logs)
    handle = ClusterHandle(ClusterConfig(replicas=1), [], gateway, logs, temporary_logs=temporary)
    with pytest.raises(RuntimeError) if failing else contextlib.nullcontext(), handle:
        if failing:
            raise RuntimeError("smg exited")
    assert not gateway.alive() and logs.exists() == kept and handle.logs_kept == kept


def test_smg_is_restarted_while_a_replica_restart_waits_and_pause_keeps_what_was_restarted(tmp_path):
    # one thread did both: smg, dead while a replica's restart waited startup_timeout_s for it
    # to answer (SGLang: ~40 s), stayed down as long; and stopping the supervisor before the
    # front's drain ended its thread, whose children (PR_SET_PDEATHSIG) died with it
    sleeper = (sys.executable, "-c", "import time; time.sleep(120)")
    config = ClusterConfig(replicas=1, restart=RestartPolicy(backoff_initial_s=0.0, poll_interval_s=0.05),
                           startup_timeout_s=30)
    replicas = [start_child("replica-1", sleeper, log_dir=tmp_path)]
    box = [start_child(GATEWAY, sleeper, log_dir=tmp_path)]
    watch = GatewayWatch(current=lambda: box[0], replace=lambda child: box.__setitem__(0, child), argv=sleeper, env={})
    sup = Supervisor(config, replicas, log_dir=tmp_path, argv=lambda i, extra: sleeper, env=lambda i: {},
                     gateway=watch)
    sup.start()
    try:
        old_replica, old_gateway = replicas[0], box[0]
        old_replica.kill()
        deadline = time.monotonic() + 10
        while replicas[0] is old_replica and time.monotonic() < deadline:
            time.sleep(0.05)
        assert replicas[0] is not old_replica  # restarted; never healthy: its restart waits 30 s
        old_gateway.kill()
        deadline = time.monotonic() + 10
        while box[0] is old_gateway and time.monotonic() < deadline:
            time.sleep(0.05)
        assert box[0] is not old_gateway and box[0].alive()  # not after the replica's 30 s
        sup.pause()
        time.sleep(0.5)
        assert box[0].alive() and replicas[0].alive()  # paused: what it restarted still runs
    finally:
        stop_children([*replicas, *box], 2.0)
        sup.stop()
