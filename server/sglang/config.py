"""Plugin configuration: read once from the environment at the entry point.

SGLang spawns its scheduler and detokenizer processes, and each re-runs the plugin entry
point, so configuration travels in environment variables (the launcher sets them; the
children inherit them). With `TOPAS_SGLANG_POLICY` unset or empty the plugin does nothing.

| variable                      | meaning                                                  |
|-------------------------------|----------------------------------------------------------|
| TOPAS_SGLANG_POLICY           | policy name (topas, fcfs, lpm, parrot, las, spf, ...)    |
| TOPAS_SGLANG_POLICY_OPTIONS   | JSON object of policy options (`{"beta": "0.5"}`)        |
| TOPAS_SGLANG_PROFILE          | cost profile name or YAML path (default: the package's)  |
| TOPAS_SGLANG_WORKFLOWS        | workflow names / YAML paths, separated by os.pathsep     |
| TOPAS_SGLANG_KV_BUDGET        | Snapshot KV budget in tokens (default: the pool; above   |
|                               | it the policy over-commits and SGLang retracts on decode)|
| TOPAS_SGLANG_DECISION_LOG     | JSONL file receiving every non-empty decision            |
| TOPAS_SGLANG_REDECIDE_S       | re-run the policy at least this often while requests wait (default 0.5) |
| TOPAS_SGLANG_TASK_IDLE_S      | conclude a task after this long without calls (default 300) |
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ...costmodel import DEFAULT_PROFILE
from ...errors import ConfigError

PREFIX = "TOPAS_SGLANG_"
ENV = {
    "policy": PREFIX + "POLICY",
    "policy_options": PREFIX + "POLICY_OPTIONS",
    "profile": PREFIX + "PROFILE",
    "workflows": PREFIX + "WORKFLOWS",
    "kv_budget": PREFIX + "KV_BUDGET",
    "decision_log": PREFIX + "DECISION_LOG",
    "redecide_s": PREFIX + "REDECIDE_S",
    "task_idle_s": PREFIX + "TASK_IDLE_S",
}


# `topas serve --engine sglang` flags that set these (an error names both: the user typed the
# flag; SGLang's processes read the variable)
_FLAGS = {"policy": "--policy", "kv_budget": "--kv-budget", "task_idle_s": "--task-idle-timeout"}


def _source(name: str) -> str:
    return f"{_FLAGS[name]} ({ENV[name]})" if name in _FLAGS else ENV[name]


@dataclass(frozen=True, slots=True)
class PluginConfig:
    policy: str
    policy_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    profile: str = DEFAULT_PROFILE
    workflows: tuple[str, ...] = ()
    kv_budget: int | None = None
    decision_log: str | None = None
    redecide_s: float = 0.5
    task_idle_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.policy:
            raise ConfigError(f"{_source('policy')} must name a policy")
        if self.kv_budget is not None and self.kv_budget <= 0:
            raise ConfigError(f"{_source('kv_budget')} must be a positive integer, got {self.kv_budget}")
        for name in ("redecide_s", "task_idle_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{_source(name)} must be a finite number >= 0, got {value}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PluginConfig | None:
        """The configuration in `env` (default os.environ); None when the plugin is off."""
        env = os.environ if env is None else env
        policy = env.get(ENV["policy"], "").strip()
        if not policy:
            return None
        return cls(
            policy=policy,
            policy_options=MappingProxyType(_json_object(env.get(ENV["policy_options"], ""))),
            profile=env.get(ENV["profile"], "").strip() or DEFAULT_PROFILE,
            workflows=tuple(w for w in env.get(ENV["workflows"], "").split(os.pathsep) if w.strip()),
            kv_budget=_number(env, "kv_budget", int),
            decision_log=env.get(ENV["decision_log"], "").strip() or None,
            redecide_s=_number(env, "redecide_s", float, 0.5),
            task_idle_s=_number(env, "task_idle_s", float, 300.0),
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce this configuration (for the launcher)."""
        out = {
            ENV["policy"]: self.policy,
            ENV["policy_options"]: json.dumps(dict(self.policy_options), sort_keys=True),
            ENV["profile"]: self.profile,
            ENV["workflows"]: os.pathsep.join(self.workflows),
            ENV["redecide_s"]: repr(self.redecide_s),
            ENV["task_idle_s"]: repr(self.task_idle_s),
        }
        if self.kv_budget is not None:
            out[ENV["kv_budget"]] = str(self.kv_budget)
        if self.decision_log is not None:
            out[ENV["decision_log"]] = self.decision_log
        return out


def _json_object(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{ENV['policy_options']} is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{ENV['policy_options']} must be a JSON object, got {type(value).__name__}")
    return value


def _number(env: Mapping[str, str], name: str, kind: type, default: Any = None) -> Any:
    text = env.get(ENV[name], "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{ENV[name]} must be {kind.__name__}, got {text!r}") from None


def require_sglang() -> None:
    """ConfigError naming the fix when SGLang (or the tokenizer library it brings) is not
    installed: the plugin's own entry point ships with topas-agents, so its presence says
    nothing about SGLang, and `python -m sglang.launch_server` would fail with a bare exit 1."""
    missing = [m for m in ("sglang", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"--engine sglang needs {' and '.join(missing)}, which this environment lacks; "
                          "install them with `pip install -e \".[sglang]\"` (SGLang 0.5.23; docs/sglang.md)")
