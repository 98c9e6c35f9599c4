"""The plugin entry point, its configuration, hook registration through the real
HookRegistry, and the `topas serve --engine sglang` launcher (command, env, validation)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("no_adapter")]
pytest.importorskip("sglang")

from sglang.srt.entrypoints.openai import protocol  # noqa: E402
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group  # noqa: E402
from test_sglang_fixtures import (  # noqa: E402
    HookRegistry,
    ScheduleBatch,
    SchedulePolicy,
    Scheduler,
    World,
    applied_hooks,
    make_req,
    no_adapter,  # noqa: F401 (fixture, used by marks)
    published,  # noqa: F401 (fixture, used by marks)
)

from topas_agents.errors import ConfigError, WorkflowError  # noqa: E402
from topas_agents.server.sglang import launch, plugin  # noqa: E402
from topas_agents.server.sglang.config import ENV, PluginConfig  # noqa: E402
from topas_agents.server.sglang.labels_http import request_models  # noqa: E402

TARGETS = {
    "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest": "REPLACE",
    "sglang.srt.entrypoints.openai.protocol.CompletionRequest": "REPLACE",
    "sglang.srt.entrypoints.openai.protocol.ResponsesRequest": "REPLACE",
    "sglang.srt.entrypoints.openai.serving_responses.OpenAIServingResponses.create_responses": "AROUND",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request": "BEFORE",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._convert_to_internal_request": "AFTER",
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._convert_to_internal_request":
        "AFTER",
    "sglang.srt.managers.io_struct.GenerateReqInput.__getitem__": "AFTER",
    "sglang.srt.managers.scheduler.Scheduler._create_generation_req": "AFTER",
    "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill": "AROUND",
    "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority": "AFTER",
    "sglang.srt.managers.schedule_batch.ScheduleBatch._get_decode_retraction_order": "AFTER",
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req": "AFTER",
}


@pytest.fixture
def registry(monkeypatch: Any) -> Any:
    """A clean view of HookRegistry registrations made during the test (restored after)."""
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    before = {k: list(v) for k, v in HookRegistry._hooks.items()}
    yield lambda: {t: [h for h in hooks if h not in before.get(t, [])] for t, hooks in HookRegistry._hooks.items()
                   if len(hooks) > len(before.get(t, []))}
    HookRegistry._hooks.clear()
    HookRegistry._hooks.update(before)


def test_entry_point_does_nothing_when_not_configured(registry: Any) -> None:
    plugin.register()
    assert registry() == {} and plugin.active() is None


def test_entry_point_registers_every_hook_when_configured(registry: Any, monkeypatch: Any, tmp_path: Any) -> None:
    log = tmp_path / "d.jsonl"
    monkeypatch.setenv(ENV["policy"], "lpm")
    monkeypatch.setenv(ENV["workflows"], "chain3")
    monkeypatch.setenv(ENV["decision_log"], str(log))
    plugin.register()
    added = registry()
    assert {t: hooks[0][0].name for t, hooks in added.items()} == TARGETS
    adapter = plugin.active()
    assert adapter is not None and adapter.policy.name == "lpm" and list(adapter.workflows) == ["chain3"]
    (loaded,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (loaded["event"], loaded["policy"], loaded["hooks"]) == ("loaded", "lpm", len(TARGETS))


@pytest.mark.parametrize(("var", "value", "needle"), [
    ("policy", "nosuch", "unknown policy 'nosuch'"),
    ("policy_options", "[1]", "must be a JSON object"),
    ("kv_budget", "lots", "TOPAS_SGLANG_KV_BUDGET must be int"),
    ("workflows", "nosuchflow", "unknown workflow 'nosuchflow'"),
])
def test_entry_point_refuses_a_bad_configuration(registry: Any, monkeypatch: Any, var: str, value: str,
                                                 needle: str) -> None:
    monkeypatch.setenv(ENV["policy"], "fcfs")
    monkeypatch.setenv(ENV[var], value)
    with pytest.raises(SystemExit, match=needle):  # SystemExit: SGLang must not carry on without us
        plugin.register()
    assert registry() == {} and plugin.active() is None


def test_sglang_discovers_the_entry_point(monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.syspath_prepend(str(launch.write_entry_point_shim(tmp_path)))
    importlib.invalidate_caches()
    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert found["topas"][0] is plugin.register
    assert launch.plugin_installed()


@pytest.mark.usefixtures("published")
def test_hooks_apply_through_hookregistry_and_are_inert_without_adapter() -> None:
    original_prefill = Scheduler.__dict__["get_new_batch_prefill"]
    with applied_hooks(plugin.hook_specs()):
        assert Scheduler.get_new_batch_prefill.__wrapped__ is original_prefill
        assert protocol.ChatCompletionRequest is request_models()[
            "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest"]
        # with nothing installed the wrapped SGLang code behaves exactly as before
        queue = [make_req(f"r{i}", range(i, i + 5)) for i in (3, 1, 2)]
        SchedulePolicy("fcfs", World().tree, False, False, False).calc_priority(queue)
        assert [r.rid for r in queue] == ["r3", "r1", "r2"]
        reqs = [make_req("a", range(10)), make_req("b", range(3))]
        assert ScheduleBatch._get_decode_retraction_order(reqs) == [1, 0]
        orig_calls = []
        assert plugin.around_prefill(lambda s, b: orig_calls.append((s, b)) or "plan", "S", "B") == "plan"
        assert orig_calls == [("S", "B")]
    assert Scheduler.__dict__["get_new_batch_prefill"] is original_prefill
    assert protocol.ChatCompletionRequest.__name__ == "ChatCompletionRequest"


def test_config_round_trips_through_the_environment() -> None:
    cfg = PluginConfig(policy="topas", policy_options={"beta": "0.5"}, profile="h200-qwen2.5-32b",
                       workflows=("chain3", "/x/y.yaml"), kv_budget=4096, decision_log="/tmp/d.jsonl",
                       redecide_s=0.25, task_idle_s=60.0)
    back = PluginConfig.from_env(cfg.to_env())
    assert back == PluginConfig(**{**{f: getattr(cfg, f) for f in cfg.__slots__}, "policy_options": back.policy_options})
    assert dict(back.policy_options) == {"beta": "0.5"}
    assert PluginConfig.from_env({}) is None and PluginConfig.from_env({ENV["policy"]: "  "}) is None


# ---------------------------------------------------------------------------- launcher


def serve_args(**over: Any) -> argparse.Namespace:
    """The Namespace `topas serve` (topas_agents/cli/serve.py) hands to launch.main."""
    base = {"engine": "sglang", "host": "127.0.0.1", "port": 8000, "policy": "topas", "policy_opt": [],
            "profile": None, "kv_budget": None, "time_scale": 1.0, "workflow": [], "responder": "echo",
            "replay_file": None, "model_name": "topas-sim", "task_idle_timeout": 300.0, "drain_timeout": 10.0,
            "log_level": "info", "extra_argv": []}
    return argparse.Namespace(**{**base, **over})


def test_launcher_builds_the_sglang_command() -> None:
    cmd = launch.build_command(serve_args(), ["--", "--model-path", "/m", "--port", "9", "--tp", "1"])
    assert cmd[:2] == [sys.executable, "-P"] and cmd[2:4] == ["-m", "sglang.launch_server"]
    assert cmd[4:] == ["--host", "127.0.0.1", "--log-level", "info", "--model-path", "/m", "--port", "9", "--tp", "1"]
    cmd = launch.build_command(serve_args(model_path="/m2"), [])
    assert cmd[4:8] == ["--model-path", "/m2", "--host", "127.0.0.1"]
    with pytest.raises(ConfigError, match="needs --model-path"):
        launch.build_command(serve_args(), ["--tp", "1"])


def test_launcher_validates_the_topas_side() -> None:
    cfg = launch.build_config(serve_args(policy="las", policy_opt=[], workflow=["chain3"], kv_budget=5000), {})
    assert (cfg.policy, cfg.workflows, cfg.kv_budget) == ("las", ("chain3",), 5000)
    with pytest.raises(ConfigError, match="unknown policy"):
        launch.build_config(serve_args(policy="nope"), {})
    with pytest.raises(ConfigError, match="key=value"):
        launch.build_config(serve_args(policy_opt=["beta"]), {})
    with pytest.raises(ConfigError, match="beta"):
        launch.build_config(serve_args(policy_opt=["beta=-1"]), {})
    with pytest.raises(WorkflowError, match="unknown workflow"):
        launch.build_config(serve_args(workflow=["nope"]), {})
    env = launch.build_env(cfg, {"SGLANG_PLUGINS": "smg-zmq", "PATH": "/bin"})
    assert env["SGLANG_PLUGINS"] == "smg-zmq,topas" and env[ENV["policy"]] == "las" and env["PATH"] == "/bin"
    assert launch.build_env(cfg, {})["TOPAS_SGLANG_WORKFLOWS"] == "chain3"


def test_launcher_main_runs_sglang_and_restores_signals(monkeypatch: Any, tmp_path: Any) -> None:
    seen: dict[str, Any] = {}

    class FakePopen:
        def __init__(self, cmd: list[str], env: dict[str, str], stdout: Any = None, stderr: Any = None) -> None:
            seen.update(cmd=cmd, env=env, piped=(stdout, stderr))

        def wait(self) -> int:
            seen["handler"] = signal.getsignal(signal.SIGTERM)  # forwarding while SGLang runs
            return 3

    monkeypatch.setattr(launch.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(launch, "plugin_installed", lambda: True)
    before = signal.getsignal(signal.SIGTERM)
    assert launch.main(serve_args(policy="fcfs"), ["--", "--model-path", str(tmp_path)]) == 3
    assert seen["env"][ENV["policy"]] == "fcfs" and "sglang.launch_server" in seen["cmd"]
    assert seen["piped"] == (None, None)  # no key: SGLang writes to our streams itself
    assert seen["handler"] is not before and signal.getsignal(signal.SIGTERM) is before
    monkeypatch.setattr(launch, "plugin_installed", lambda: False)
    with pytest.raises(ConfigError, match="entry point is not installed"):
        launch.main(serve_args(policy="fcfs"), ["--model-path", str(tmp_path)])
    assert os.environ.get(ENV["policy"]) is None  # configuration goes to the child only
