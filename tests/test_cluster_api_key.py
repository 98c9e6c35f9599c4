"""A cluster whose replicas require an API key: smg gets the key to probe them (without it
smg never registered a keyed replica and `topas serve --replicas N --api-key K` did not start),
the front checks it first on every endpoint but /health, and calls with it work end to end."""

from __future__ import annotations

import importlib.util

import httpx
import pytest

from topas_agents.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("smg") is None, reason="needs the [cluster] extra (smg)")

KEY = "k-cluster-test"
SERVE_ARGS = ("--workflow", "chain3", "--time-scale", "100", "--log-level", "warning", "--api-key", KEY)


@pytest.fixture(scope="module")
def cluster():
    from topas_agents.server.cluster.launcher import free_base_port, run_replicas

    handle = run_replicas(2, port=free_base_port(5), serve_args=SERVE_ARGS, startup_timeout_s=60)
    try:
        yield handle
    finally:
        handle.stop()


def _chat(base: str, task: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "topas": {"task_id": task, "stage": "s1", "agent": "a", "workflow": "chain3"}}
    return httpx.post(base + "/chat/completions", json=body, headers=headers, timeout=30)


def test_calls_with_the_key_are_served_and_stay_labelled(cluster):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert _chat(cluster.url, "keyed-1", auth).status_code == 200
    stats = httpx.get(cluster.url + "/topas/stats", params={"calls": 100}, headers=auth, timeout=30)
    assert stats.status_code == 200
    assert stats.json()["cluster"]["tasks"]["seen"] >= 1
    assert httpx.get(cluster.url + "/models", headers=auth, timeout=30).status_code == 200
    # openai's models.retrieve: was the front's own 404 (smg serves it)
    card = httpx.get(cluster.url + "/models/topas-sim", headers=auth, timeout=30)
    assert card.status_code == 200 and card.json()["id"] == "topas-sim"
    missing = httpx.get(cluster.url + "/models/nope", headers=auth, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/topas-sim", "/v1/topas/cluster", "/v1/topas/stats", "/v1/topas/workflows",
                                  "/v1/topas/timeline", "/metrics"])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", KEY])  # the last: no "Bearer" scheme
def test_the_front_refuses_a_missing_or_wrong_key(cluster, path, auth):
    headers = {"Authorization": auth} if auth else {}
    r = httpx.get(cluster.base_url + path, headers=headers, timeout=30)
    assert r.status_code == 401, (path, r.status_code, r.text)
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_the_key_is_checked_before_any_other_answer(cluster):
    long_id = "x" * 300  # longer than any label: the front answered its own 404 before the replicas' 401
    r = httpx.post(cluster.url + f"/topas/tasks/{long_id}/done", timeout=30)
    assert r.status_code == 401
    r = _chat(cluster.url, "nokey", {})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_health_needs_no_key(cluster):
    assert httpx.get(cluster.base_url + "/health", timeout=30).status_code == 200


def test_two_keys_are_refused_before_anything_starts():
    from topas_agents.server.cluster.config import ClusterConfig

    with pytest.raises(ConfigError, match="--replicas takes one --api-key"):
        ClusterConfig(serve_args=("--api-key", "a", "--api-key=b"))
    assert ClusterConfig(serve_args=("--api-key", "a", "--api-key", "a")).replica_api_keys == ("a", "a")


def test_smg_gets_the_replicas_key(monkeypatch):
    from topas_agents.server.cluster.commands import smg_argv
    from topas_agents.server.cluster.config import ClusterConfig

    monkeypatch.delenv("TOPAS_API_KEY", raising=False)
    argv = smg_argv(ClusterConfig(serve_args=("--api-key", "k1")))
    assert argv[argv.index("--api-key") + 1] == "k1"
    assert "--api-key" not in smg_argv(ClusterConfig())
    monkeypatch.setenv("TOPAS_API_KEY", "from-env")  # a replica given no key reads it itself
    argv = smg_argv(ClusterConfig())
    assert argv[argv.index("--api-key") + 1] == "from-env"
