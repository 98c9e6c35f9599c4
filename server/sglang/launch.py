"""`topas serve --engine sglang`: start SGLang's OpenAI server with the Topas plugin on.

    topas serve --engine sglang --policy topas --workflow chain3 -- --model-path DIR [sglang args]

`main(args, extra_argv)` validates the Topas side (policy and options, profile, workflows,
the plugin entry point being installed) so user errors exit 2 before SGLang starts, writes
the plugin configuration into the environment (`TOPAS_SGLANG_*`, see config.py), and runs
`python -m sglang.launch_server` with the remaining arguments, forwarding SIGINT/SIGTERM and
returning its exit status. `--host`/`--port`/`--log-level` of `topas serve` are passed on
unless the SGLang arguments set them; `--model-path` may come from either side.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path

from ...cli.args import check_output
from ...costmodel import DEFAULT_PROFILE, load_profile
from ...errors import ConfigError
from ...policies import make_live_policy
from ...workflow import load_workflow
from .config import ENV, PluginConfig, require_sglang

PLUGIN_NAME = "topas"
PLUGIN_TARGET = "topas_agents.server.sglang.plugin:register"


def _policy_options(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--policy-opt expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def build_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> PluginConfig:
    """The plugin configuration from `topas serve` arguments, validated (ConfigError et al.)."""
    env = os.environ if env is None else env
    config = PluginConfig(
        policy=args.policy,
        policy_options=_policy_options(getattr(args, "policy_opt", None) or ()),
        profile=getattr(args, "profile", None) or DEFAULT_PROFILE,
        workflows=tuple(getattr(args, "workflow", None) or ()),
        kv_budget=getattr(args, "kv_budget", None),
        decision_log=getattr(args, "decision_log", None) or env.get(ENV["decision_log"]) or None,
        task_idle_s=float(getattr(args, "task_idle_timeout", 300.0)),
    )
    # before SGLang loads a model for minutes: the plugin opens the log only inside it
    check_output("--decision-log", config.decision_log)
    make_live_policy(config.policy, config.policy_options)
    load_profile(config.profile)
    for wf in config.workflows:
        load_workflow(wf)
    return config


def _has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def build_command(args: argparse.Namespace, extra_argv: Sequence[str], api_keys: Sequence[str] = ()) -> list[str]:
    """SGLang's command line. `api_keys`: `topas serve`'s keys (--api-key, else $TOPAS_API_KEY),
    given to SGLang as its own --api-key; it checks one key, so tenants are --engine sim only."""
    extra = list(extra_argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    # -P (3.11+): keep the working directory off sys.path; from the repo root our top-level
    # datasets/ would shadow Hugging Face `datasets` inside SGLang and its spawned children.
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    cmd = [sys.executable, *safe, "-m", "sglang.launch_server"]
    model_path = getattr(args, "model_path", None)
    if model_path and not _has_flag(extra, "--model-path"):
        cmd += ["--model-path", str(model_path)]
    elif not _has_flag(extra, "--model-path") and not _has_flag(extra, "--model"):
        raise ConfigError("--engine sglang needs --model-path DIR (after `--`, with SGLang's arguments)")
    for flag, attr in (("--host", "host"), ("--port", "port"), ("--log-level", "log_level")):
        value = getattr(args, attr, None)
        if value is not None and not _has_flag(extra, flag):
            cmd += [flag, str(value)]
    keys = tuple(dict.fromkeys(api_keys))
    if len(keys) > 1:
        raise ConfigError("--engine sglang takes one --api-key: SGLang's server checks a single key "
                          "(one tenant per key is --engine sim only)")
    if keys:
        if _has_flag(extra, "--api-key"):
            raise ConfigError("give the API key once: --api-key, or SGLang's --api-key after `--`, not both")
        cmd += ["--api-key", keys[0]]
    return cmd + extra


def plugin_installed() -> bool:
    return any(ep.name == PLUGIN_NAME and ep.value == PLUGIN_TARGET
               for ep in entry_points(group="sglang.srt.plugins"))


def write_entry_point_shim(directory: str | Path) -> Path:
    """A minimal `.dist-info` declaring the plugin entry point; put the returned directory on
    PYTHONPATH where the installed package metadata lacks it (gpu_smoke.sh, tests)."""
    info = Path(directory) / "topas_sglang_plugin_shim-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: topas-sglang-plugin-shim\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[sglang.srt.plugins]\n{PLUGIN_NAME} = {PLUGIN_TARGET}\n")
    return info.parent


def build_env(config: PluginConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(config.to_env())
    allowed = env.get("SGLANG_PLUGINS", "").strip()
    if allowed and PLUGIN_NAME not in {p.strip() for p in allowed.split(",")}:
        env["SGLANG_PLUGINS"] = f"{allowed},{PLUGIN_NAME}"  # a whitelist must not drop us
    return env


def main(args: argparse.Namespace, extra_argv: Sequence[str], api_keys: Sequence[str] = ()) -> int:
    config = build_config(args)
    cmd = build_command(args, extra_argv, api_keys)
    require_sglang()
    if not plugin_installed():
        raise ConfigError(f"the '{PLUGIN_NAME}' SGLang plugin entry point is not installed in this "
                          f"environment (pyproject [project.entry-points.\"sglang.srt.plugins\"]; "
                          f"reinstall with `pip install -e .`)")
    proc = subprocess.Popen(cmd, env=build_env(config))

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
