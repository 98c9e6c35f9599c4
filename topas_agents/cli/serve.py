"""`topas serve`: the OpenAI-compatible server (docs/server.md).

    topas serve --engine sim [--policy topas] [--workflow chain3] [--time-scale 10]
    topas serve --engine sglang ...   (the SGLang adapter; extra args go to SGLang)
    topas serve --replicas 4 [--router-policy task] ...   (N replicas behind SGLang's gateway)
"""

from __future__ import annotations

import argparse
import importlib
import os

from ..errors import ConfigError
from .args import check_api_key, model_name


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible API (simulated engine or SGLang)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("sim", "sglang"), default="sim")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--policy", default="topas", help="scheduling policy (topas_agents.policies registry)")
    p.add_argument("--policy-opt", action="append", default=[], metavar="K=V",
                   help="policy option (repeatable)")
    p.add_argument("--profile", default=None, help="cost profile name or YAML path")
    p.add_argument("--model-path", default=None, metavar="DIR",
                   help="--engine sglang: model directory (or give it after `--`)")
    p.add_argument("--decision-log", default=None, metavar="F.jsonl",
                   help="--engine sglang: append every scheduling decision to this JSONL file")
    p.add_argument("--kv-budget", type=int, default=None, help="KV budget in tokens (default: the profile's)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="--engine sim: simulated seconds per wall-clock second (default 1: real time, like a GPU "
                        "server, so clients' own time between calls counts as is; a MetaGPT SOP task then takes "
                        "~75 wall s. `topas run`/`topas eval` use 50 for their embedded server: use "
                        "--time-scale 50 here for quick MetaGPT runs)")
    p.add_argument("--workflow", action="append", default=[], metavar="NAME|PATH.yaml",
                   help="register a workflow at start (repeatable)")
    p.add_argument("--responder", default="echo", help="response text: echo | lorem | replay")
    p.add_argument("--replay-file", default=None, help="JSONL of recorded responses for --responder replay")
    p.add_argument("--model-name", type=model_name, default="topas-sim", help="model id reported by /v1/models")
    p.add_argument("--task-idle-timeout", type=float, default=300.0, metavar="S",
                   help="conclude a task after S wall seconds without calls (0: never)")
    p.add_argument("--drain-timeout", type=float, default=10.0, metavar="S",
                   help="on shutdown, let in-flight calls finish for S seconds")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health (repeatable: "
                        "one tenant per key; default: $TOPAS_API_KEY if set, else no authentication)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    from ..server.cluster.cli import add_replica_options

    add_replica_options(p)
    p.add_argument("extra_argv", nargs=argparse.REMAINDER,
                   help="after `--`: arguments passed through to SGLang (--engine sglang only)")
    p.set_defaults(run=run)


# Flags one engine reads and the other ignores (given in the wrong mode they did nothing, so
# the server started as if they were not given): flag -> (argparse dest, the engine that reads it).
ENGINE_ONLY = {
    "--time-scale": ("time_scale", "sim"),
    "--responder": ("responder", "sim"),
    "--replay-file": ("replay_file", "sim"),
    "--decision-log": ("decision_log", "sglang"),
    "--model-path": ("model_path", "sglang"),
    "--model-name": ("model_name", "sim"),
    "--drain-timeout": ("drain_timeout", "sim"),
}
# What SGLang's own server takes instead (an argument after `--`).
_SGLANG_OWN = {"--model-name": "--served-model-name NAME"}


def _given(args: argparse.Namespace, flag: str, dest: str) -> bool:
    """Whether `flag` was given: `args.given` (cli.args.given_options) when `main` set it, else
    a value other than the default None (a Namespace built by a test)."""
    given = getattr(args, "given", None)
    return flag in given if given is not None else getattr(args, dest, None) is not None


def check_mode_flags(args: argparse.Namespace) -> None:
    """ConfigError for a flag the chosen engine or responder does not read (as `topas bench`'s
    check_mode_flags): it would be a silent no-op."""
    for flag, (dest, engine) in ENGINE_ONLY.items():
        if args.engine != engine and _given(args, flag, dest):
            own = _SGLANG_OWN.get(flag) if args.engine == "sglang" else None
            hint = f"; SGLang's own is `-- {own}`" if own else ""
            raise ConfigError(f"{flag} applies to --engine {engine} only (this is --engine {args.engine}){hint}")
    if args.replicas == 1 and getattr(args, "given", None) is not None:  # defaults are not "given"
        from ..server.cluster.cli import REPLICA_ONLY

        flag = next((f for f, dest in REPLICA_ONLY.items() if _given(args, f, dest)), None)
        if flag is not None:
            raise ConfigError(f"{flag} applies to --replicas N (N > 1) only")
    if args.replay_file is not None and args.responder != "replay":
        raise ConfigError(f"--replay-file applies to --responder replay only (this is --responder {args.responder})")


def _run_sglang(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        launch = importlib.import_module("topas_agents.server.sglang.launch")
    except ImportError as exc:
        raise ConfigError(f"--engine sglang is unavailable ({exc}); install it with "
                          "`pip install -e .[sglang]` or use `make test-sglang`'s venv") from None
    return int(launch.main(args, extra, api_keys=_api_keys(args)) or 0)


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """`--api-key` values, else TOPAS_API_KEY (read here, at the CLI edge, only)."""
    if args.api_key:
        return tuple(args.api_key)
    env = os.environ.get("TOPAS_API_KEY")
    if env is None:
        return ()
    if not env.strip():  # a deploy script's `TOPAS_API_KEY=$SECRET` with SECRET unset served openly
        raise ConfigError("TOPAS_API_KEY is set but empty: give it a key, or unset it to serve without "
                          "authentication")
    return (check_api_key(env, "TOPAS_API_KEY"),)


def run(args: argparse.Namespace) -> int:
    extra = list(args.extra_argv or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    check_mode_flags(args)
    _api_keys(args)  # every mode: a cluster's replicas and smg read the same variable
    if args.replicas > 1:  # N replicas behind smg and the Topas front (docs/cluster.md)
        from ..server.cluster.cli import serve_from_args

        return serve_from_args(args, extra)
    if args.engine == "sglang":
        return _run_sglang(args, extra)
    if extra:
        raise ConfigError(f"unexpected arguments for --engine sim: {' '.join(extra)}")
    from ..costmodel import DEFAULT_PROFILE
    from ..server.config import ServerConfig, parse_policy_options
    from ..server.runner import run_server

    config = ServerConfig(
        api_keys=_api_keys(args),
        engine="sim", host=args.host, port=args.port, policy=args.policy,
        policy_options=parse_policy_options(args.policy_opt), profile=args.profile or DEFAULT_PROFILE,
        kv_budget=args.kv_budget, time_scale=args.time_scale, workflows=tuple(args.workflow),
        responder=args.responder, replay_file=args.replay_file, model_name=args.model_name,
        task_idle_timeout_s=args.task_idle_timeout, drain_timeout_s=args.drain_timeout,
        log_level=args.log_level,
    )
    return run_server(config)
