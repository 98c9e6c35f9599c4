"""`topas serve`: the OpenAI-compatible server (docs/server.md).

    topas serve --engine sim [--policy topas] [--workflow chain3] [--time-scale 10]
    topas serve --engine sglang ...   (the SGLang adapter; extra args go to SGLang)
"""

from __future__ import annotations

import argparse
import importlib

from ..errors import ConfigError


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
                   help="simulated seconds per wall-clock second (>1 runs faster)")
    p.add_argument("--workflow", action="append", default=[], metavar="NAME|PATH.yaml",
                   help="register a workflow at start (repeatable)")
    p.add_argument("--responder", default="echo", help="response text: echo | lorem | replay")
    p.add_argument("--replay-file", default=None, help="JSONL of recorded responses for --responder replay")
    p.add_argument("--model-name", default="topas-sim", help="model id reported by /v1/models")
    p.add_argument("--task-idle-timeout", type=float, default=300.0, metavar="S",
                   help="conclude a task after S wall seconds without calls (0: never)")
    p.add_argument("--drain-timeout", type=float, default=10.0, metavar="S",
                   help="on shutdown, let in-flight calls finish for S seconds")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("extra_argv", nargs=argparse.REMAINDER,
                   help="after `--`: arguments passed through to SGLang (--engine sglang only)")
    p.set_defaults(run=run)


def _run_sglang(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        launch = importlib.import_module("topas_agents.server.sglang.launch")
    except ImportError as exc:
        raise ConfigError(f"--engine sglang is unavailable ({exc}); install it with "
                          "`pip install -e .[sglang]` or use `make test-sglang`'s venv") from None
    return int(launch.main(args, extra) or 0)


def run(args: argparse.Namespace) -> int:
    extra = list(args.extra_argv or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    if args.engine == "sglang":
        return _run_sglang(args, extra)
    if extra:
        raise ConfigError(f"unexpected arguments for --engine sim: {' '.join(extra)}")
    from ..costmodel import DEFAULT_PROFILE
    from ..server.config import ServerConfig, parse_policy_options
    from ..server.runner import run_server

    config = ServerConfig(
        engine="sim", host=args.host, port=args.port, policy=args.policy,
        policy_options=parse_policy_options(args.policy_opt), profile=args.profile or DEFAULT_PROFILE,
        kv_budget=args.kv_budget, time_scale=args.time_scale, workflows=tuple(args.workflow),
        responder=args.responder, replay_file=args.replay_file, model_name=args.model_name,
        task_idle_timeout_s=args.task_idle_timeout, drain_timeout_s=args.drain_timeout,
        log_level=args.log_level,
    )
    return run_server(config)
