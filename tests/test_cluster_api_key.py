"""A cluster whose replicas require an API key: smg gets the key to probe them (without it
smg never registered a keyed replica and `topas serve --replicas N --api-key K` did not start),
the front checks it first on every endpoint but /health, and calls with it work end to end."""

from __future__ import annotations

import importlib.util
import sys

import httpx
import pytest

from topas_agents.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("smg") is None, reason="needs the [cluster] extra (smg)")

KEY = "k-cluster-test"
SERVE_ARGS = ("--workflow", "chain3", "--time-scale", "100", "--log-level", "warning")


@pytest.fixture(scope="module")
def cluster():
    from topas_agents.server.cluster.launcher import free_base_port, run_replicas

    handle = run_replicas(2, port=free_base_port(5), serve_args=SERVE_ARGS, api_key=KEY, startup_timeout_s=60)
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


def _serve(argv: list[str], monkeypatch) -> dict:
    """`topas serve ARGV` as far as the cluster launcher: the arguments it got."""
    from topas_agents.cli import main
    from topas_agents.server.cluster import launcher

    seen: dict = {}
    monkeypatch.setattr(launcher, "serve_replicas", lambda replicas, **kw: seen.update(kw) or 0)
    assert main(["serve", "--replicas", "2", *argv]) == 0
    return seen


@pytest.mark.parametrize("flag", ["--api-key", "--api-k", "--api"])
def test_the_key_comes_from_the_cli_edge_however_the_flag_is_spelled(flag, monkeypatch):
    # argparse takes an abbreviation; a search of the replicas' options for "--api-key" missed
    # it, so the replicas required a key that smg and the front did not have
    monkeypatch.delenv("TOPAS_API_KEY", raising=False)
    kw = _serve(["--workflow", "chain3", flag, "k1"], monkeypatch)
    assert kw["api_key"] == "k1" and "k1" not in kw["serve_args"]
    assert not [a for a in kw["serve_args"] if a.startswith("--api")]
    assert _serve(["--api-key", "a", "--api-k=a"], monkeypatch)["api_key"] == "a"  # the same key twice: one
    assert _serve([], monkeypatch)["api_key"] is None  # then $TOPAS_API_KEY, read by the launcher


def test_two_keys_are_refused_before_anything_starts(monkeypatch, capsys):
    from topas_agents.cli import main
    from topas_agents.server.cluster import launcher

    monkeypatch.setattr(launcher, "serve_replicas", lambda *a, **kw: pytest.fail("started"))
    assert main(["serve", "--replicas", "2", "--api-key", "a", "--api-k=b"]) == 2
    assert "--replicas takes one --api-key" in capsys.readouterr().err


@pytest.mark.parametrize("arg", [("--api-key", "k"), ("--api-key=k",), ("--api-k", "k"), ("--api=k",)])
def test_a_key_among_the_replicas_options_is_refused(arg):
    # from Python the key is ClusterConfig.api_key; in serve_args smg and the front never saw it
    from topas_agents.server.cluster.config import ClusterConfig

    with pytest.raises(ConfigError, match=r"ClusterConfig\(api_key=...\)"):
        ClusterConfig(serve_args=("--workflow", "chain3", *arg))
    with pytest.raises(ConfigError, match="--api-key must be non-empty printable ASCII"):
        ClusterConfig(api_key=" k")


def test_smg_gets_the_replicas_key(monkeypatch):
    from topas_agents.server.cluster.commands import SMG_KEY_ENV, smg_argv, smg_env
    from topas_agents.server.cluster.config import ClusterConfig

    monkeypatch.delenv("TOPAS_API_KEY", raising=False)
    keyed = ClusterConfig(api_key="k1")
    assert smg_env(keyed) == {SMG_KEY_ENV: "k1"} and "k1" not in " ".join(smg_argv(keyed))
    assert smg_env(ClusterConfig()) == {} and smg_argv(ClusterConfig())[1:3] == ("-m", "smg")
    monkeypatch.setenv("TOPAS_API_KEY", "from-env")  # a replica given no key reads it itself
    assert smg_env(ClusterConfig()) == {SMG_KEY_ENV: "from-env"}


def test_replicas_get_the_key_in_their_environment(monkeypatch):
    from topas_agents.server.cluster.commands import replica_argv, replica_env
    from topas_agents.server.cluster.config import ClusterConfig

    monkeypatch.delenv("TOPAS_API_KEY", raising=False)
    c = ClusterConfig(replicas=2, api_key="k1", serve_args=("--workflow", "chain3"))
    argv = replica_argv(c, 2)
    assert "k1" not in " ".join(argv) and argv[-2:] == ("--workflow", "chain3")
    assert replica_env(c, 2) == {"TOPAS_API_KEY": "k1"}
    assert replica_env(ClusterConfig(), 1) == {}


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/cmdline")
def test_the_key_is_on_no_command_line(cluster):
    # argv is world-readable (`ps`): a key there was every local user's; the environment is the owner's
    children = [*cluster.replicas, cluster.gateway]
    lines = {c.name: _cmdline(c.proc.pid) for c in children}
    assert all(lines.values()) and not [name for name, line in lines.items() if KEY in line], lines
    # what a child prints (SGLang: its arguments, the key among them) is its owner's only
    logs = sorted(cluster.log_dir.glob("*.log"))
    assert {p.stem for p in logs} >= {"smg", "replica-1", "replica-2"}
    assert {oct(p.stat().st_mode & 0o777) for p in logs} == {"0o600"}
    assert not [p.name for p in logs if KEY in p.read_text(errors="replace")]  # nor in what they print
