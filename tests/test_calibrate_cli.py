"""`topas calibrate` against the embedded simulated server: a profile that loads, and bad
input refused in one line (exit 2) before any measuring."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from topas_agents.cli import main
from topas_agents.costmodel import load_profile
from topas_agents.server import ServerConfig, start_server_in_thread


@pytest.fixture(scope="module")
def server():
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, policy="lpm", task_idle_timeout_s=0.0))
    yield handle
    handle.stop()


def test_calibrate_writes_a_profile_that_loads(server, tmp_path, capsys):
    out = tmp_path / "sim.yaml"
    assert main(["calibrate", "--server", server.url, "--out", str(out), "--kv-budget", "20000"]) == 0
    # a time-scaled simulator serves faster than its model: the fit cannot reproduce it (said)
    assert "simulated server at --time-scale 200" in capsys.readouterr().err
    profile = load_profile(out)
    assert (profile.name, profile.model, profile.kv_budget_tokens) == ("sim", "topas-sim", 20000)
    # the fitted terms (noisy on a fast simulated server, so only their sanity is checked)
    for value in (profile.tm_s, profile.tc_s_per_token, profile.call_overhead_s):
        assert math.isfinite(value) and value >= 0


def test_decode_steps_are_counted_from_what_the_server_generated():
    """31 steps were assumed for a 32-token probe; the echo responder stops at 24 (min_tokens
    ignored): the step came out 25% short."""
    from topas_agents.cli.calibrate_probe import DECODE_TOKENS, BatchRun, _step_s
    from topas_agents.errors import ConfigError

    assert _step_s(BatchRun(1.2, 25), BatchRun(0.24, 1), "u") == pytest.approx(0.96 / 24)
    with pytest.raises(ConfigError, match=f"generated 3 tokens for a {DECODE_TOKENS}-token probe"):
        _step_s(BatchRun(0.3, 3), BatchRun(0.2, 1), "u")


@pytest.mark.parametrize(("options", "message"), [
    # the server's root, not its OpenAI base URL: was a KeyError traceback
    ({"--server": "{root}/nope", "--kv-budget": "1000"}, "lists no model"),
    # a directory as --out: was an IsADirectoryError traceback after the whole measurement
    ({"--out": "{tmp}", "--kv-budget": "1000"}, "is a directory"),
    # a zero budget wrote a profile that cannot admit anything
    ({"--kv-budget": "0"}, "--kv-budget"),
])
def test_bad_input_is_one_line_exit_2(server, tmp_path, capsys, options, message):
    given = {"--server": server.url, "--out": str(tmp_path / "p.yaml")} | options
    argv = ["calibrate"]
    for flag, value in given.items():
        argv += [flag, value.format(root=server.url.removesuffix("/v1"), tmp=tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "p.yaml").exists()


def test_the_budget_is_read_from_our_servers_stats(server, tmp_path):
    # before: the simulated server's budget (only in /v1/topas/stats) was not read, and
    # calibrate refused to run without --kv-budget
    out = tmp_path / "sim.yaml"
    assert main(["calibrate", "--server", server.url, "--out", str(out)]) == 0
    budget = httpx.get(server.base_url + "/v1/topas/stats?calls=0").json()["kv"]["budget"]
    assert load_profile(out).kv_budget_tokens == budget == load_profile("a100-80g-qwen2.5-32b").kv_budget_tokens


def test_a_cluster_fronts_budget_is_its_replicas_common_one():
    from topas_agents.cli.calibrate import _topas_budget

    def front(*budgets):
        return {"cluster": {"kv": {"budget": sum(b or 0 for b in budgets)}},
                "replicas": [{"replica": i + 1, "kv": None if b is None else {"used": 0, "budget": b}}
                             for i, b in enumerate(budgets)]}

    assert _topas_budget(front(9000, 9000, 9000)) == 9000  # a call runs on one replica: not the sum
    assert _topas_budget(front(9000, None)) == 9000  # a replica down: the others still say
    assert _topas_budget(front(9000, 12000)) is None  # replicas that differ: ask for --kv-budget
    assert _topas_budget({"kv": {"budget": True}}) is None and _topas_budget([]) is None


class _ModelsOnly(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that lists a model and reports no KV pool anywhere."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        found = self.path == "/v1/models"
        data = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]} if found else {}).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_server_that_reports_no_budget_is_asked_for_one_before_measuring(tmp_path, capsys):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _ModelsOnly)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        assert main(["calibrate", "--server", url, "--out", str(tmp_path / "p.yaml")]) == 2
    finally:
        httpd.shutdown()
        httpd.server_close()
    err = capsys.readouterr().err
    assert "pass --kv-budget" in err and err.count("\n") == 1
    assert not (tmp_path / "p.yaml").exists()


@pytest.fixture(scope="module")
def keyed():
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, policy="lpm", task_idle_timeout_s=0.0,
                                                 api_keys=("k-cal",)))
    yield handle
    handle.stop()


def test_a_keyed_server_is_calibrated_and_benchmarked_with_its_key(keyed, tmp_path, capsys, monkeypatch):
    # before: neither command could send a key; the 401 read "lists no model: give the server's
    # OpenAI base URL", which sent users after the wrong problem
    monkeypatch.delenv("TOPAS_API_KEY", raising=False)
    bench = ["bench", "--server", keyed.url, "--workload", "chain3", "--tasks", "2", "--policies", "lpm"]
    assert main(bench) == 2
    assert "refused a call without an API key (give --api-key KEY or set TOPAS_API_KEY)" in capsys.readouterr().err
    assert main([*bench, "--api-key", "wrong"]) == 2
    assert "refused the API key (HTTP 401)" in capsys.readouterr().err
    assert main([*bench, "--api-key", "k-cal"]) == 0
    assert "2/2 tasks" in capsys.readouterr().out
    out = tmp_path / "new" / "keyed.yaml"  # a folder that does not exist yet
    monkeypatch.setenv("TOPAS_API_KEY", "k-cal")
    assert main(["calibrate", "--server", keyed.url, "--out", str(out), "--kv-budget", "20000"]) == 0
    assert load_profile(out).kv_budget_tokens == 20000
    capsys.readouterr()
    # with --model the probe of /models is skipped: the budget read met the 401 first, and said
    # "the server does not report its KV pool size"
    assert main(["calibrate", "--server", keyed.url, "--out", str(out), "--api-key", "nope", "--model", "m"]) == 2
    assert "refused the API key (HTTP 401)" in capsys.readouterr().err
    assert main(["bench", "--engine", "sglang", "--model-path", str(tmp_path), "--api-key", "k"]) == 2
    assert "--api-key applies to --server" in capsys.readouterr().err


def test_bench_registers_its_workload_and_says_why_tasks_failed(tmp_path, capsys):
    # a server holding any workflow checks labels against them: after `topas run` had registered
    # metagpt-sop-noqa there, `topas bench --server --workload chain3` failed every task with a
    # 400 "unknown workflow", and said only "0/3 tasks" (exit 1)
    other = tmp_path / "chain3.yaml"  # another workflow under the name chain3, other stage names
    other.write_text("name: chain3\nagents: [{name: a, prefix_tokens: 64}]\n"
                     "stages: [{name: only, agent: a, input_tokens: 8, output_tokens: 4}]\n")
    bench = ["bench", "--workload", "chain3", "--tasks", "2", "--policies", "lpm"]
    note = "note: the server holds another definition of workflow 'chain3'"
    cases = ((("metagpt-sop",), [], 0, False),  # registered by the bench, then served
             (("chain3",), ["--scale", "1"], 0, False),  # the same definition: a repeat, nothing said
             (("chain3",), [], 0, True),  # the bench's is scaled (0.05 by default): said, then served
             ((str(other),), [], 1, True))  # said, and why each task failed
    for workflows, extra, rc, noted in cases:
        handle = start_server_in_thread(ServerConfig(time_scale=400.0, workflows=workflows))
        try:
            assert main([*bench, *extra, "--server", handle.url]) == rc
        finally:
            handle.stop()
        captured = capsys.readouterr()
        assert (note in captured.err) == noted
        if rc == 0:
            assert "2/2 tasks" in captured.out and "failed" not in captured.err
        else:
            assert "0/2 tasks" in captured.out
            # one line per distinct reason, with its count and the first failing call
            assert "server: 2 task(s) failed (first: chain3-0/s1#0): HTTP 400" in captured.err
            assert "workflow 'chain3' has no stage 's1'" in captured.err


@pytest.mark.parametrize("status, outcome", [(201, None), (200, None), (404, None), (405, None), (501, None),
                                             (409, "another definition"), (400, "refused"), (500, "refused")])
def test_registering_the_workload_by_answer(monkeypatch, status, outcome):
    # 404/405: plain SGLang or vLLM; 501: a cluster front over SGLang replicas (workflows at start)
    from topas_agents.errors import ConfigError
    from topas_agents.realbench import client

    monkeypatch.setattr(client.httpx, "post", lambda url, **kw: httpx.Response(status, text="no"))
    definition = {"name": "chain3"}
    if outcome == "refused":
        with pytest.raises(ConfigError, match=f"refused the bench's workflow 'chain3' \\(HTTP {status}\\)"):
            client.register_workload("http://127.0.0.1:9/v1", definition)
    elif outcome is None:
        assert client.register_workload("http://127.0.0.1:9/v1", definition) is None
    else:
        assert outcome in client.register_workload("http://127.0.0.1:9/v1", definition)


def test_bench_runs_against_one_server_do_not_reopen_each_others_tasks(server, capsys):
    """Every run labelled its tasks chain3-0, chain3-1, ...: a second run reopened the first
    run's tasks, whose JCT became the gap between the runs."""
    bench = ["bench", "--server", server.url, "--workload", "chain3", "--tasks", "2", "--policies", "lpm"]
    assert main(bench) == 0 and main(bench) == 0
    assert "2/2 tasks" in capsys.readouterr().out
    items = httpx.get(f"{server.base_url}/v1/topas/stats", timeout=10).json()["tasks"]["items"]
    bench_tasks = [t for t in items if t["workflow"] == "chain3"]
    assert len(bench_tasks) >= 4 and not [t["task_id"] for t in bench_tasks if t["reopened"]]


class _Chat(_ModelsOnly):
    """Lists a model and answers every chat call with the class's `status` and `body`."""

    status = 200
    body = b""

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


def _serve(handler: type[BaseHTTPRequestHandler]):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


def _one_line_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: calibrate: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("status", "body", "fault"), [
    # each of these 200s was a traceback: JSONDecodeError, KeyError, TypeError, ValueError
    (200, b"<html>busy</html>", "answered 200 with a body that is not JSON: <html>busy</html>"),
    (200, b'{"choices": []}', "answered 200 without a `usage` object"),
    (200, b'{"usage": null}', "answered 200 without a `usage` object"),
    (200, b"[1, 2]", "answered 200 without a `usage` object"),
    (200, b'{"usage": {"completion_tokens": 1}}', "answered 200 with no usage.prompt_tokens "),
    (200, b'{"usage": {"prompt_tokens": "12", "completion_tokens": 1}}', "with usage.prompt_tokens = '12' "),
    # a fraction was truncated silently, and a missing completion count was read as 0 steps
    (200, b'{"usage": {"prompt_tokens": 1.5}}', "usage.prompt_tokens = 1.5 and no usage.completion_tokens"),
    (200, b'{"usage": {"prompt_tokens": 3, "completion_tokens": -1}}', "usage.completion_tokens = -1"),
    # an error without a body said "HTTP 500 from URL: " and stopped
    (500, b"", "HTTP 500 from {url}: (empty body)"),
    (502, b"bad\ngateway", "HTTP 502 from {url}: bad gateway"),  # one line, whatever the body
])
def test_a_bad_answer_to_a_probe_is_one_line_naming_the_server(tmp_path, capsys, status, body, fault):
    handler = type("Answer", (_Chat,), {"status": status, "body": body})
    httpd, url = _serve(handler)
    out = tmp_path / "p.yaml"
    try:
        err = _one_line_error(["calibrate", "--server", url, "--out", str(out), "--kv-budget", "1000"], capsys)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert fault.format(url=url) in err and url in err
    assert not out.exists()


def test_a_server_that_never_answers_is_named_with_what_happened(tmp_path, capsys, monkeypatch):
    # an async httpx ReadTimeout has an empty message: the error read "cannot reach URL: "
    import socket

    from topas_agents.cli import calibrate_probe

    monkeypatch.setattr(calibrate_probe, "CALL_TIMEOUT_S", 0.3)
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    try:
        err = _one_line_error(["calibrate", "--server", url, "--out", str(tmp_path / "p.yaml"),
                               "--kv-budget", "1000", "--model", "m"], capsys)
    finally:
        listener.close()
    assert f"a probe call to {url} failed: ReadTimeout (no answer within 0.3 s)" in err


def test_every_probe_failure_says_what_happened():
    # an exception without a message is named by its type (an empty reason said nothing)
    from topas_agents.cli.calibrate_probe import CALL_TIMEOUT_S, failure

    url = "http://h/v1"
    expected = {httpx.ReadTimeout(""): f"a probe call to {url} failed: ReadTimeout (no answer within {CALL_TIMEOUT_S:g} s)",
                httpx.ConnectError(""): f"cannot reach {url}: ConnectError",
                httpx.RemoteProtocolError(" "): f"a probe call to {url} failed: RemoteProtocolError",
                httpx.ConnectError("refused\nby peer"): f"cannot reach {url}: ConnectError: refused by peer"}
    for exc, message in expected.items():
        assert str(failure(url, exc)) == f"calibrate: {message}"


def test_out_may_have_any_suffix(server, tmp_path, capsys):
    # `--profile` loads a file of any suffix; --out refused all but .yaml/.yml
    out = tmp_path / "gpu.profile"
    assert main(["calibrate", "--server", server.url, "--out", str(out), "--kv-budget", "20000"]) == 0
    assert f"wrote {out}:" in capsys.readouterr().out
    profile = load_profile(str(out))
    assert (profile.name, profile.kv_budget_tokens) == ("gpu", 20000)


def test_out_that_profile_would_read_as_a_built_in_is_refused_first(tmp_path, capsys, monkeypatch):
    from topas_agents.costmodel import DEFAULT_PROFILE

    monkeypatch.chdir(tmp_path)
    for given in (DEFAULT_PROFILE, f"./{DEFAULT_PROFILE}"):  # both load the built-in, not the file
        # nothing listens on port 9: the refusal comes before any call
        assert main(["calibrate", "--server", "http://127.0.0.1:9/v1", "--out", given, "--kv-budget", "100"]) == 2
        err = capsys.readouterr().err
        assert f"would load the built-in profile {DEFAULT_PROFILE}, not this file" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
