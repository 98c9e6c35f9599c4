"""End to end: MetaGPT Teams (SOP and TeamLeader) on the embedded simulator, two tasks at
once, every call checked as the SERVER saw it (/v1/topas/stats); failures are reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from topas_agents.bench.trace import load_trace
from topas_agents.integrations.metagpt.environment import metagpt_available, prepare_metagpt

if not metagpt_available():
    pytest.skip("metagpt is not installed", allow_module_level=True)

pytestmark = pytest.mark.metagpt
SCALE = 400.0  # simulated seconds per wall second: LLM time is negligible, labels are the point
SOP_ORDER = ["write_prd", "write_design", "write_tasks"] + ["write_code"] * 4  # 2 files x (code + review)
TL_ORDER = ["tl1", "write_prd", "tl2", "write_design", "tl3", "write_tasks", "tl4"] + ["write_code"] * 4 + ["tl5"]


@pytest.fixture(scope="module")
def mg(tmp_path_factory: pytest.TempPathFactory):
    root = prepare_metagpt(tmp_path_factory.mktemp("mgroot"), log_level="ERROR").root
    from topas_agents.integrations.metagpt import recorder, runner, server_api

    return root, runner, server_api, recorder


async def _run(mg, tmp_path, workflow, prompts, responder="echo", **options):
    root, runner, server_api, recorder = mg
    with server_api.embedded_server(time_scale=SCALE, responder=responder) as handle:
        wf = runner.label_workflow(workflow, options.get("qa", False))
        assert server_api.register_workflow(handle.url, wf)
        opts = runner.RunOptions(base_url=handle.url, workflow=workflow, root=tmp_path, send_max_tokens=False,
                                 parse_retries=1, **options)
        rec = recorder.CallRecorder(recorder.scaled_clock(SCALE))
        specs = [runner.TaskSpec(f"{workflow}-{i}", p) for i, p in enumerate(prompts)]
        results = await runner.run_tasks(specs, opts, rec)
        stats = server_api.fetch_stats(handle.url)
    return wf, runner.attach_server_view(results, stats), stats, rec


def _server_calls(stats, task_id):
    return sorted((c for c in stats["calls"] if c["task_id"] == task_id), key=lambda c: c["arrival_s"])


def _check_labels(stats, wf, task_id, order):
    calls = _server_calls(stats, task_id)
    assert [c["stage"] for c in calls] == order
    for c in calls:
        assert c["label_source"] == "body" and c["prefix_source"] == "label" and c["status"] == "ok"
        assert c["label"]["task_id"] == task_id and c["label"]["workflow"] == wf.name
        assert c["label"]["stage"] == c["stage"] and c["agent"] == wf.stage(c["stage"]).agent
        assert c["label"]["prefix_tokens"] == c["prefix_tokens"] > 0
    task = next(t for t in stats["tasks"]["items"] if t["task_id"] == task_id)
    assert task["done"] and task["done_reason"] == "explicit" and task["jct_s"] > 0
    return calls


def _check_overlap(stats, a, b):
    ca, cb = _server_calls(stats, a), _server_calls(stats, b)
    assert cb[0]["arrival_s"] < ca[-1]["finish_s"] and ca[0]["arrival_s"] < cb[-1]["finish_s"]


async def test_sop_two_concurrent_tasks_every_call_labelled(mg, tmp_path):
    wf, results, stats, rec = await _run(mg, tmp_path, "sop", ["Create a snake game.", "Create a 2048 game."])
    assert wf.name == "metagpt-sop-noqa"
    assert all(c["label"] is not None for c in stats["calls"])  # nothing unlabelled reached the server
    for r in results:
        assert r.success, r.error
        assert list(r.stages) == ["write_prd", "write_design", "write_tasks", "write_code"]
        assert r.calls_per_stage == {"write_prd": 1, "write_design": 1, "write_tasks": 1, "write_code": 4}
        assert r.unmatched_prompts == 0 and r.jct_s and r.jct_s > 0
        assert sorted(p.name for p in Path(r.artifacts).rglob("*.py")) == ["game.py", "main.py"]
        assert Path(r.artifacts).parent == tmp_path / "workspace"  # <root>/workspace/<project>/, not nested
        assert (Path(r.artifacts) / Path(r.artifacts).name).is_dir()  # MetaGPT's source package inside
        calls = _check_labels(stats, wf, r.task_id, SOP_ORDER)
        assert r.server["calls"] == len(calls) == r.calls
    _check_overlap(stats, "sop-0", "sop-1")
    assert results[0].artifacts != results[1].artifacts
    # the same stage sends the same static prefix in both tasks (per-agent prefix first)
    by_task = {t: {c["stage"]: c["prefix_tokens"] for c in _server_calls(stats, t)} for t in ("sop-0", "sop-1")}
    assert by_task["sop-0"]["write_prd"] == by_task["sop-1"]["write_prd"] > 500


async def test_tl_star_two_concurrent_tasks_every_call_labelled(mg, tmp_path):
    wf, results, stats, rec = await _run(mg, tmp_path, "tl", ["Create a snake game.", "Create a gomoku game."])
    assert wf.name == "metagpt-tl"
    for r in results:
        assert r.success, r.error
        assert list(r.stages) == ["tl1", "write_prd", "tl2", "write_design", "tl3", "write_tasks", "tl4",
                                  "write_code", "tl5"]
        _check_labels(stats, wf, r.task_id, TL_ORDER)
    _check_overlap(stats, "tl-0", "tl-1")
    trace = tmp_path / "tl.jsonl"
    from topas_agents.integrations.metagpt.recorder import save_trace

    assert save_trace(trace, rec.records) == 2 * len(TL_ORDER)
    plans = load_trace(trace)  # the built-in metagpt-tl DAG, recorded sizes
    assert {p.workflow.name for p in plans} == {"metagpt-tl"} and len(plans) == 2


async def test_garbage_replies_fail_the_task_and_it_is_reported(mg, tmp_path):
    wf, results, stats, rec = await _run(mg, tmp_path, "sop", ["Create a snake game."], responder="lorem")
    (r,) = results
    assert not r.success
    assert "Team.run returned None" in r.error and "JSONDecodeError" in r.error
    assert r.stages == ("write_prd",)
    assert r.server["done"]  # the server was told the task is over
    # ... and that it failed: no JCT (it was counted as a finished, short task)
    assert (r.server["done_reason"], r.jct_s) == ("failed", None)


async def test_running_out_of_rounds_is_a_failure(mg, tmp_path):
    wf, results, stats, rec = await _run(mg, tmp_path, "sop", ["Create a snake game."], n_round=2)
    (r,) = results
    assert not r.success and "did not finish within 2 rounds" in r.error
    assert r.calls_per_stage == {"write_prd": 1, "write_design": 1}


async def test_team_run_raising_is_a_failure(mg, tmp_path, monkeypatch):
    from metagpt.team import Team

    async def boom(self, *args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Team, "run", boom)
    wf, results, stats, rec = await _run(mg, tmp_path, "tl", ["Create a snake game."])
    (r,) = results
    assert not r.success and r.error == "RuntimeError: disk full" and r.calls == 0


async def test_qa_runs_generated_code_only_in_the_sandbox(mg, tmp_path, capfd, monkeypatch):
    import tempfile

    system_tmp = tmp_path / "system-tmp"  # where tempfile would put anything "temporary"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-user-secret-5e1d")  # a secret of the user's environment
    wf, results, stats, rec = await _run(mg, tmp_path / "root", "sop", ["Create a snake game."], qa=True)
    (r,) = results
    assert r.success, r.error
    assert wf.name == "metagpt-sop" and r.calls_per_stage["qa"] >= 2
    assert {c["agent"] for c in _server_calls(stats, r.task_id) if c["stage"] == "qa"} == {"qa_engineer"}
    art = Path(r.artifacts)  # the project is where MetaGPT users look: <root>/workspace/<project>/
    assert art.parent == tmp_path / "root" / "workspace" and (art / ".git").is_dir()
    assert (art / art.name).is_dir() and any((art / "tests").glob("test_*.py"))
    assert list(system_tmp.iterdir()) == []  # nothing in the system temp dir
    assert not (tmp_path / "root" / "sandbox").exists()  # the task's sandbox is gone
    assert "No module named pip" in capfd.readouterr().err  # RunCode's pip installs fail in the sandbox
    # MetaGPT logs a failed command's environment whole: the sandbox's own, not a copy of the
    # user's (every QA run printed it, API keys included)
    from topas_agents.integrations.metagpt.sandbox import SandboxContext

    env = SandboxContext(sandbox_dir=str(tmp_path / "box")).new_environ()
    assert sorted(env) == ["HOME", "LANG", "PATH", "TMPDIR"] and "sk-user-secret-5e1d" not in str(env)
    assert env["PATH"].startswith(f"{tmp_path / 'box' / 'bin'}:")


async def test_a_failed_qa_task_removes_its_sandbox(mg, tmp_path, monkeypatch):
    from metagpt.team import Team

    seen = []

    async def boom(self, *args, **kwargs):
        seen.extend((tmp_path / "sandbox").iterdir())  # the sandbox exists while the team runs
        raise RuntimeError("disk full")

    monkeypatch.setattr(Team, "run", boom)
    wf, results, stats, rec = await _run(mg, tmp_path, "sop", ["Create a snake game."], qa=True)
    (r,) = results
    assert not r.success and r.error == "RuntimeError: disk full"
    assert len(seen) == 1 and seen[0].name.startswith("topas-qa-")
    assert not (tmp_path / "sandbox").exists()
