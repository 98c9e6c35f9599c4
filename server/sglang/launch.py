"""`topas serve --engine sglang`: start SGLang's OpenAI server with the Topas plugin on.

    topas serve --engine sglang --policy topas --workflow chain3 -- --model-path DIR [sglang args]

`main(args, extra_argv)` validates the Topas side (policy and options, profile, workflows,
the plugin entry point being installed) so user errors exit 2 before SGLang starts, writes
the plugin configuration into the environment (`TOPAS_SGLANG_*`, see config.py) and an API
key into an owner-only `--config` file (not the command line), and runs
`python -m sglang.launch_server` with the remaining arguments, forwarding SIGINT/SIGTERM and
returning its exit status (with a key, SGLang's output reaches ours with the key masked:
redact.py). `--host`/`--port`/`--log-level` of `topas serve` are passed on
unless the SGLang arguments set them; `--model-path` may come from either side.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import NamedTuple

import yaml

from ...bench.work import check_fits
from ...cli.args import check_output
from ...costmodel import DEFAULT_PROFILE, load_profile
from ...errors import ConfigError
from ...policies import make_live_policy
from ...workflow import load_workflow
from .config import ENV, PluginConfig, require_sglang
from .redact import start_copies

# The name of the SGLang config file (`--config`) that carries the API key: see move_api_key_to_config.
KEY_CONFIG_NAME = "topas-sglang-config.yaml"
# SGLang options whose values are secrets: kept off its command line and masked in its output.
SECRET_FLAGS = ("--api-key", "--admin-api-key")

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
    as SGLang's own --api-key (which `main` moves off the command line: move_api_key_to_config);
    SGLang checks one key, so tenants are --engine sim only."""
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
        cmd.append(f"--api-key={keys[0]}")  # one word: a key is a value even where it begins with '-'
    return cmd + extra


class SecretOption(NamedTuple):
    """A secret SGLang option on a command line: `cmd[start:stop]` is `FLAG VALUE` or `FLAG=VALUE`."""

    start: int
    stop: int
    flag: str
    value: str


def secret_options(cmd: Sequence[str]) -> list[SecretOption]:
    """The `SECRET_FLAGS` options of `cmd` that have a value. A flag with no value is left for
    SGLang's own parser to name."""
    out = []
    for i, arg in enumerate(cmd):
        for flag in SECRET_FLAGS:
            if arg == flag and i + 1 < len(cmd) and not cmd[i + 1].startswith("-"):
                out.append(SecretOption(i, i + 2, flag, cmd[i + 1]))
            elif arg.startswith(flag + "=") and len(arg) > len(flag) + 1:
                out.append(SecretOption(i, i + 1, flag, arg[len(flag) + 1:]))
    return out


def move_api_key_to_config(cmd: Sequence[str], directory: Path) -> list[str]:
    """`cmd` with its secret options (`--api-key KEY`, `--admin-api-key KEY`, either with `=`)
    moved into an SGLang `--config` YAML file written in `directory`, readable by its owner
    only. A command line is world-readable (`ps`, /proc/PID/cmdline); SGLang reads a key from
    no environment variable, but merges a YAML `--config` into its arguments. A `--config` the
    user gave is copied into that file (the same key in it as well is a ConfigError: one key)."""
    cmd = list(cmd)
    options = secret_options(cmd)
    if not options:
        return cmd
    flags = [o.flag for o in options]
    if len(set(flags)) < len(flags):
        twice = next(f for f in flags if flags.count(f) > 1)
        raise ConfigError(f"{twice} is given twice: SGLang would use only the last one")
    dropped = {i for o in options for i in range(o.start, o.stop)}
    cmd = [arg for i, arg in enumerate(cmd) if i not in dropped]
    settings: dict = {}
    if (j := _config_index(cmd)) is not None:
        settings = _user_config(Path(cmd[j + 1]))
        cmd = cmd[:j] + cmd[j + 2:]
    for option in options:
        name, underscored = _yaml_names(option.flag)  # SGLang turns each YAML key into `--KEY VALUE` verbatim
        if {name, underscored} & set(settings):
            what = "the API key" if option.flag == "--api-key" else f"the {name.replace('-', ' ')}"
            raise ConfigError(f"give {what} once: {option.flag}, or {underscored} in "
                              f"SGLang's --config file, not both")
        if option.value.startswith("-"):  # SGLang's --config parser would read it as an option
            raise ConfigError(f"the value of {option.flag} begins with '-': SGLang cannot take it "
                              f"from a config file, and a key on its command line is readable by "
                              f"every local user; choose a key that does not begin with '-'")
        settings[name] = option.value
    path = Path(directory) / KEY_CONFIG_NAME
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        yaml.safe_dump(settings, f)
    return [*cmd, "--config", str(path)]


def secrets_of(cmd: Sequence[str]) -> list[str]:
    """The secret values SGLang will see: its secret options on `cmd`, and those of a `--config`
    file of the user's (a file that cannot be read holds none here; SGLang names the problem)."""
    values = [o.value for o in secret_options(cmd)]
    if (j := _config_index(cmd)) is not None:
        try:
            settings = _user_config(Path(cmd[j + 1]))
        except ConfigError:
            settings = {}
        for flag in SECRET_FLAGS:
            for name in _yaml_names(flag):
                if isinstance(settings.get(name), (str, int)):
                    values.append(str(settings[name]))
    return values


def _config_index(cmd: Sequence[str]) -> int | None:
    """Where `--config FILE` is on `cmd` (the flag's index), if it is there with a file."""
    cmd = list(cmd)
    j = cmd.index("--config") if "--config" in cmd else None
    return j if j is not None and j + 1 < len(cmd) else None


def _yaml_names(flag: str) -> tuple[str, str]:
    """The two spellings an SGLang config file may use for `flag`: `api-key`, `api_key`."""
    return flag[2:], flag[2:].replace("-", "_")


def _user_config(path: Path) -> dict:
    """The mapping in the user's SGLang `--config` file (ConfigError naming what is wrong)."""
    try:
        settings = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"SGLang's --config {str(path)!r} could not be read: {exc}") from None
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise ConfigError(f"SGLang's --config {str(path)!r} must hold a mapping of options, "
                          f"got {type(settings).__name__}")
    return settings


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


def _known_budget(config: PluginConfig, extra_argv: Sequence[str]) -> int | None:
    """The KV budget before SGLang starts: `--kv-budget`, else SGLang's `--max-total-tokens`;
    None when the pool is sized from GPU memory at start-up."""
    if config.kv_budget is not None:
        return config.kv_budget
    args = list(extra_argv)
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--max-total-tokens" and i + 1 < len(args) else \
            arg.partition("=")[2] if arg.startswith("--max-total-tokens=") else None
        if value is not None:
            return int(value) if value.isdigit() and int(value) > 0 else None  # SGLang names a bad one
    return None


def check_workflows_fit(config: PluginConfig, extra_argv: Sequence[str]) -> None:
    """ConfigError (exit 2, before SGLang loads a model for minutes) when a `--workflow` has a
    call that can never fit the budget, as `--engine sim` refuses it: SGLang served it, and
    every forecast of the guard came out NaN."""
    budget = _known_budget(config, extra_argv)
    if budget is not None:
        for wf in config.workflows:
            check_fits(load_workflow(wf), budget)


def main(args: argparse.Namespace, extra_argv: Sequence[str], api_keys: Sequence[str] = ()) -> int:
    config = build_config(args)
    check_workflows_fit(config, extra_argv)
    cmd = build_command(args, extra_argv, api_keys)
    require_sglang()
    if not plugin_installed():
        raise ConfigError(f"the '{PLUGIN_NAME}' SGLang plugin entry point is not installed in this "
                          f"environment (pyproject [project.entry-points.\"sglang.srt.plugins\"]; "
                          f"reinstall with `pip install -e .`)")
    secrets = secrets_of(cmd)
    # the key's file lives as long as SGLang: removed with the directory when it exits
    with tempfile.TemporaryDirectory(prefix="topas-sglang-") as private:
        return _run(move_api_key_to_config(cmd, Path(private)), build_env(config), secrets)


# How long the output copies may finish after SGLang exits (a child of its that outlives it
# would keep the pipes open).
_OUTPUT_DRAIN_S = 5.0


def _run(cmd: Sequence[str], env: Mapping[str, str], secrets: Sequence[str] = ()) -> int:
    """Run SGLang, forwarding SIGINT/SIGTERM; its exit status. With `secrets`, its output goes
    through pipes to ours with each secret masked (redact.py: SGLang logs its keys)."""
    piped = subprocess.PIPE if secrets else None
    env = dict(env)
    if secrets:  # print() to a pipe is block-buffered: keep SGLang's output as prompt as on a terminal
        env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(list(cmd), env=env, stdout=piped, stderr=piped)
    copies = start_copies([(proc.stdout, _binary(sys.stdout)), (proc.stderr, _binary(sys.stderr))],
                          secrets) if secrets else []

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for copy in copies:
            copy.join(_OUTPUT_DRAIN_S)


def _binary(stream):
    """The byte stream under a text stream (sys.stdout), or the stream itself."""
    return getattr(stream, "buffer", stream)
