"""`topas run sop|tl` end to end through the CLI (embedded simulator or --server URL)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from topas_agents.bench.trace import load_trace
from topas_agents.cli import main
from topas_agents.integrations.metagpt.environment import metagpt_available

if not metagpt_available():
    pytest.skip("metagpt is not installed", allow_module_level=True)

pytestmark = pytest.mark.metagpt
FAST = ["--time-scale", "400", "--parse-retries", "1"]


def test_run_sop_prompt_prints_a_json_summary_and_writes_json_and_trace(tmp_path, capsys):
    out, trace = tmp_path / "out.json", tmp_path / "t.jsonl"
    rc = main(["run", "sop", "--prompt", "Create a snake game.", "--root", str(tmp_path / "mg"), "--json", str(out),
               "--trace", str(trace), "--task-id-prefix", "sop", *FAST])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    doc = json.loads(captured.out)  # stdout is exactly one JSON document (MetaGPT's prints go to stderr)
    (task,) = doc["tasks"]
    assert doc["workflow"] == "metagpt-sop-noqa" and doc["jct_unit"] == "simulated seconds"
    assert task["success"] and task["error"] is None
    assert task["stages"] == ["write_prd", "write_design", "write_tasks", "write_code"]
    assert task["calls"] == 7 and task["jct_s"] > 0
    art = Path(task["artifacts"])  # the generated repo: <root>/workspace/<project>/, MetaGPT's layout
    assert art.parent == tmp_path / "mg" / "workspace" and (art / art.name).is_dir()
    note = "templates from the simulated engine's echo responder, not real code"
    assert task["artifacts_note"] == note  # said next to the path: the files are not real code
    assert f"artifacts of sop-0: {art} ({note})" in captured.err
    assert json.loads(out.read_text())["details"][0]["server"]["calls"] == 7
    (plan,) = load_trace(trace)
    assert plan.task_id == "sop-0" and sum(len(r) for r in plan.rounds.values()) == 7


def test_run_tl_dataset(tmp_path, capsys):
    rc = main(["run", "tl", "--dataset", "softwaredev", "--limit", "1", "--root", str(tmp_path),
               "--task-id-prefix", "tl", *FAST])
    assert rc == 0
    (task,) = json.loads(capsys.readouterr().out)["tasks"]
    assert task["task_id"] == "tl-sd00" and task["calls"] == 12
    assert task["stages"][0] == "tl1" and task["stages"][-1] == "tl5"


def test_without_mmdc_diagrams_are_written_as_sources_with_no_shell_noise(tmp_path, capfd, monkeypatch):
    # MetaGPT's default renderer spawned a shell per diagram that printed 'no mermaid' to the
    # terminal (twice per SOP task) when Node's mermaid-cli is not installed
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                                                if not (Path(d) / "mmdc").exists()))
    rc = main(["run", "sop", "--prompt", "Create a snake game.", "--root", str(tmp_path / "mg"),
               "--task-id-prefix", "sop", *FAST])
    captured = capfd.readouterr()
    assert rc == 0, captured.err[-2000:]
    assert "no mermaid" not in captured.err
    (task,) = json.loads(captured.out)["tasks"]
    assert sorted(p.parent.name for p in Path(task["artifacts"]).glob("resources/*/*.mmd")) == [
        "competitive_analysis", "data_api_design", "seq_flow"]  # the diagrams' sources, as before
    from topas_agents.integrations.metagpt.context import mermaid_config

    assert mermaid_config().engine == "none"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mmdc").write_text("#!/bin/sh\n")
    (fake / "mmdc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    assert mermaid_config().engine == "nodejs"  # installed: MetaGPT renders as it would


def test_a_failed_task_against_an_external_server_exits_1(tmp_path, capsys):
    from topas_agents.integrations.metagpt.server_api import embedded_server

    with embedded_server(responder="lorem", time_scale=400) as handle:  # replies MetaGPT cannot parse
        rc = main(["run", "sop", "--prompt", "Create a snake game.", "--server", handle.url, "--root",
                   str(tmp_path), "--parse-retries", "1", "--task-id-prefix", "sop"])
    captured = capsys.readouterr()
    assert rc == 1
    (task,) = json.loads(captured.out)["tasks"]
    assert not task["success"] and "JSONDecodeError" in task["error"]
    assert "FAILED sop-0" in captured.err


@pytest.mark.parametrize("argv, message", [
    (["run", "tl", "--prompt", "x", "--qa"], "--qa"),
    (["run", "sop", "--prompt", "x", "--limit", "2"], "--limit"),
    (["run", "sop", "--prompt", "  "], "--prompt"),
    (["run", "sop"], "--prompt"),
    (["run", "dag", "--prompt", "x"], "invalid choice"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert main([*argv, "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_max_tokens_flag_maps_to_run_options():
    from topas_agents.errors import ConfigError
    from topas_agents.integrations.metagpt.cli_support import max_tokens_options

    assert max_tokens_options(None, external=False) == {"send_max_tokens": False}  # simulator samples
    assert max_tokens_options(None, external=True) == {"send_max_tokens": True}  # MetaGPT's 4096
    assert max_tokens_options(0, external=True) == {"send_max_tokens": False}
    assert max_tokens_options(512, external=False) == {"send_max_tokens": True, "max_tokens": 512}
    with pytest.raises(ConfigError):
        max_tokens_options(-1, external=False)


def _dead_url() -> str:
    """A loopback URL nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_a_dead_server_is_a_one_line_error_before_any_call(tmp_path, capsys):
    rc = main(["run", "sop", "--prompt", "Create a snake game.", "--server", _dead_url(), "--root", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot reach the server" in err
    assert "Traceback" not in err


def test_a_base_url_without_v1_is_a_one_line_error_before_any_call(tmp_path, capsys):
    """The probe took any answer: MetaGPT then retried 404s for seconds and the task failed."""
    from topas_agents.server import ServerConfig, start_server_in_thread

    with start_server_in_thread(ServerConfig(time_scale=400)) as handle:
        root = handle.url.removesuffix("/v1")
        t0 = time.monotonic()
        rc = main(["run", "sop", "--prompt", "Create a snake game.", "--server", root, "--root", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and f"{root}/models (HTTP 404) lists no model" in err and "ends in /v1" in err, err[-1000:]
    assert time.monotonic() - t0 < 10 and "Traceback" not in err


def test_a_server_that_dies_mid_run_fails_the_run_in_seconds(tmp_path, capsys):
    """MetaGPT's nested retries (6 x 6 attempts, 1-60 s apart) took 209 s to give up on a server
    that died mid-run; a connection error that a probe confirms is ServerGoneError, not retried."""
    import threading

    import httpx

    from topas_agents.server import ServerConfig, start_server_in_thread

    handle = start_server_in_thread(ServerConfig(time_scale=20, workflows=("metagpt-tl",)))

    def stop_after_some_calls() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if httpx.get(f"{handle.url}/topas/stats").json()["requests"]["calls_by_status"]:
                break
            time.sleep(0.1)
        handle.stop()

    killer = threading.Thread(target=stop_after_some_calls)
    killer.start()
    t0 = time.monotonic()
    try:
        rc = main(["run", "tl", "--dataset", "softwaredev", "--limit", "1", "--server", handle.url,
                   "--root", str(tmp_path)])  # MetaGPT's own retry settings, as a user runs it
    finally:
        killer.join()
        handle.stop()
    err = capsys.readouterr().err
    assert rc == 1 and "stopped answering" in err, err[-2000:]
    assert time.monotonic() - t0 < 60


def test_a_server_refusing_the_key_is_a_one_line_error(tmp_path, capsys):
    from topas_agents.server import ServerConfig, start_server_in_thread

    with start_server_in_thread(ServerConfig(api_keys=("secret-key",), time_scale=400)) as handle:
        rc = main(["run", "sop", "--prompt", "x", "--server", handle.url, "--root", str(tmp_path)])
        # before: "refused the API key" when none was given, which sent the user after a wrong key
        assert rc == 2 and "refused a call without an API key (give --api-key KEY" in capsys.readouterr().err
        rc = main(["run", "sop", "--prompt", "x", "--server", handle.url, "--root", str(tmp_path), "--api-key", "nope"])
        assert rc == 2 and "refused the API key (HTTP 401)" in capsys.readouterr().err
        rc = main(["run", "sop", "--prompt", "Create a snake game.", "--server", handle.url, "--root", str(tmp_path),
                   "--api-key", "secret-key", "--parse-retries", "1", "--task-id-prefix", "sop"])
        captured = capsys.readouterr()
        assert rc == 0, captured.err[-2000:]
        doc = json.loads(captured.out)
        (task,) = doc["tasks"]
        assert task["success"] and task["calls"] == 7
        # a --server on the simulated engine reports JCT in its own clock, and its files are templates
        assert doc["jct_unit"] == "simulated seconds" and "echo responder" in task["artifacts_note"]
        stats = handle.service.tracker  # the server saw the task under the key's namespace, done by the client
        assert any(t.endswith("/sop-0") and s.done_reason == "explicit" for t, s in stats.finished.items())


def test_two_runs_get_distinct_task_ids(tmp_path, capsys):
    ids = []
    for i in range(2):
        rc = main(["run", "sop", "--prompt", "Create a snake game.", "--root", str(tmp_path / str(i)), *FAST])
        assert rc == 0
        (task,) = json.loads(capsys.readouterr().out)["tasks"]
        ids.append(task["task_id"])
    assert ids[0] != ids[1] and all(t.startswith("sop-") and t.endswith("-0") for t in ids)


def test_server_info_gives_the_jct_unit_and_the_artifacts_note():
    from topas_agents.integrations.metagpt.server_api import ServerInfo

    plain = ServerInfo()  # not a Topas server (no /v1/topas/stats): wall clock, maybe real code
    assert (plain.jct_unit, plain.clock_scale, plain.artifacts_note) == ("wall seconds", 1.0, None)
    sim = ServerInfo(engine="sim", responder="echo", time_scale=50.0)
    assert sim.jct_unit == "simulated seconds" and sim.clock_scale == 50.0
    assert sim.artifacts_note == "templates from the simulated engine's echo responder, not real code"
    assert ServerInfo(engine="sim", responder="replay", time_scale=1.0).artifacts_note is None  # recorded replies
    assert ServerInfo(engine="sglang", time_scale=1.0).artifacts_note is None


async def test_the_server_watch_tells_a_dead_server_from_a_blip():
    from topas_agents.integrations.metagpt.server_gone import ServerGoneError, ServerWatch
    from topas_agents.server import ServerConfig, start_server_in_thread

    watch, blip = ServerWatch(), ConnectionError("reset")
    with start_server_in_thread(ServerConfig(time_scale=400)) as handle:
        assert await watch.after_connection_error(handle.url, blip) is blip  # the probe connects
        watch.check(handle.url)
    gone = await watch.after_connection_error(handle.url + "/", blip)  # stopped: nothing listens
    assert isinstance(gone, ServerGoneError) and "stopped answering" in str(gone)
    with pytest.raises(ServerGoneError):
        watch.check(handle.url)  # every later call, at once
    watch.forget(handle.url)
    watch.check(handle.url)
    # a mark lasts GONE_FOR_S: then a call tries again (a server restarted on that URL is used)
    from topas_agents.integrations.metagpt.server_gone import GONE_FOR_S

    now = [0.0]
    timed = ServerWatch(clock=lambda: now[0])
    await timed.after_connection_error(handle.url, blip)
    now[0] = GONE_FOR_S - 0.1
    with pytest.raises(ServerGoneError):
        timed.check(handle.url)
    now[0] = GONE_FOR_S
    timed.check(handle.url)


@pytest.mark.parametrize("argv", [
    ["run", "sop", "--prompt", "x", "--max-tokens", "-5"],
    ["run", "sop", "--prompt", "x", "--task-id-prefix", " "],
    ["eval", "softwaredev", "--limit", "1", "--max-tokens", "-1"],
])
def test_bad_run_and_eval_options_are_refused_before_metagpt_loads(argv, capsys, monkeypatch):
    # they were refused only after MetaGPT had loaded and the embedded server had started (~12 s)
    import topas_agents.integrations.metagpt.environment as environment

    monkeypatch.setattr(environment, "prepare_metagpt", lambda *a, **k: pytest.fail("MetaGPT loaded"))
    assert main(argv) == 2 and "error:" in capsys.readouterr().err


def test_qa_without_a_sandbox_is_refused_before_metagpt_loads(capsys, monkeypatch):
    import topas_agents.integrations.metagpt.environment as environment
    import topas_agents.integrations.metagpt.sandbox as sandbox

    monkeypatch.setattr(sandbox, "sandbox_available", lambda: False)
    monkeypatch.setattr(environment, "prepare_metagpt", lambda *a, **k: pytest.fail("MetaGPT loaded"))
    assert main(["run", "sop", "--prompt", "x", "--qa"]) == 2
    assert "needs a working bubblewrap" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["eval", "softwaredev", "--rate", "1", "--server", "http://127.0.0.1:9/v1", "--policies", "fcfs,lpm"],
    ["eval", "softwaredev", "--rate", "1", "--server", "http://127.0.0.1:9/v1", "--time-scale", "3"],
    ["run", "sop", "--prompt", "x", "--server", "http://127.0.0.1:9/v1", "--policy", "lpm"],
    ["run", "sop", "--prompt", "x", "--server", "http://127.0.0.1:9/v1", "--kv-budget", "5000"],
])
def test_embedded_server_flags_with_server_are_refused(argv, capsys):
    # silently ignored before: the server runs its own policy and clock
    assert main(argv) == 2 and "applies to the embedded server only" in capsys.readouterr().err
