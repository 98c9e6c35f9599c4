"""`topas serve --replicas N`: the options and the hand-off from `cli/serve.py`.

    from ..server.cluster.cli import add_replica_options, serve_from_args   # in cli/serve.py
    add_replica_options(p)                                                  # in add_parser
    if args.replicas > 1: return serve_from_args(args, extra)               # first thing in run
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from topas_agents.cli.args import int_between, non_negative_int
from topas_agents.errors import ConfigError

from .config import MAX_REPLICAS, ONE_API_KEY, ROUTER_POLICIES, RestartPolicy

_DEFAULT_RESTART = RestartPolicy()


def add_replica_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("many replicas (docs/cluster.md; needs smg: the [cluster] extra, or [sglang] with --engine sglang)")
    # Checked here, not only by ClusterConfig: N <= 1 takes the one-server path, which never
    # builds a ClusterConfig, so 0 or -2 would otherwise serve one engine without a word.
    g.add_argument("--replicas", type=int_between(1, MAX_REPLICAS), default=1, metavar="N",
                   help="run N replicas on ports PORT+1..PORT+N behind SGLang's gateway (smg), "
                   "with the Topas front on PORT (default 1: one server, no gateway)")
    g.add_argument("--router-policy", default="task", choices=ROUTER_POLICIES,
                   help="--replicas: task|agent = smg manual routing keyed by the label's task id|agent "
                   "(default task); the others are smg's own policies")
    g.add_argument("--gpu-ids", default=None, metavar="ID,ID,...",
                   help="--replicas with --engine sglang: one GPU id per replica (default 0..N-1)")
    g.add_argument("--replica-restarts", type=non_negative_int, default=_DEFAULT_RESTART.max_restarts, metavar="R",
                   help="--replicas: restart a replica that dies at most R times within "
                   f"{_DEFAULT_RESTART.window_s:g} s, then leave it down (default %(default)s; 0: never restart)")
    g.add_argument("--smg-arg", action="append", default=[], metavar="ARG",
                   help="--replicas: an extra argument for `smg launch` (repeatable, e.g. --smg-arg=--log-level=info)")
    g.add_argument("--log-dir", default=None, metavar="DIR",
                   help="--replicas: write each child's log to DIR/<name>.log and keep them (default: a temporary "
                   "folder, removed on a clean stop)")


# Options only --replicas N > 1 reads (flag -> argparse dest): with one server they did nothing.
REPLICA_ONLY = {"--router-policy": "router_policy", "--gpu-ids": "gpu_ids", "--replica-restarts": "replica_restarts",
                "--smg-arg": "smg_arg", "--log-dir": "log_dir"}


def _opt(out: list[str], flag: str, value: object) -> None:
    if value is not None:
        out += [flag, str(value)]


# Options only one engine reads (topas serve refuses them for the other): a replica gets them
# only when it runs that engine; the sim ones have defaults, so they were always passed and
# an SGLang replica refused to start.
_ENGINE_ONLY = {"sim": (("--time-scale", "time_scale"), ("--responder", "responder"), ("--replay-file", "replay_file"),
                        ("--model-name", "model_name"), ("--drain-timeout", "drain_timeout")),
                "sglang": (("--model-path", "model_path"), ("--decision-log", "decision_log"))}


def replica_serve_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The `topas serve` options every replica gets (the launcher adds engine, host, port;
    the key goes in the environment: `cluster_key`)."""
    out: list[str] = []
    engine = getattr(args, "engine", "sim")
    for flag, name in (("--policy", "policy"), ("--profile", "profile"), ("--kv-budget", "kv_budget"),
                       *_ENGINE_ONLY.get(engine, ()),
                       ("--task-idle-timeout", "task_idle_timeout"),
                       ("--log-level", "log_level")):
        _opt(out, flag, getattr(args, name, None))
    for flag, name in (("--policy-opt", "policy_opt"), ("--workflow", "workflow")):
        for value in getattr(args, name, None) or ():
            out += [flag, str(value)]
    return tuple(out)


def cluster_key(args: argparse.Namespace) -> str | None:
    """The cluster's one key, from `--api-key` as argparse parsed it (an abbreviation such as
    `--api-k` included); None without one (the replicas then read $TOPAS_API_KEY). Two
    different keys are refused (`ONE_API_KEY`)."""
    keys = list(dict.fromkeys(getattr(args, "api_key", None) or ()))
    if len(keys) > 1:
        raise ConfigError(ONE_API_KEY)
    return keys[0] if keys else None


def restart_policy(args: argparse.Namespace) -> RestartPolicy:
    """--replica-restarts R: R restarts per replica within the window; 0: none."""
    restarts = getattr(args, "replica_restarts", _DEFAULT_RESTART.max_restarts)
    return RestartPolicy(enabled=restarts > 0, max_restarts=restarts)


def serve_from_args(args: argparse.Namespace, engine_args: Sequence[str] = ()) -> int:
    """Blocking: the cluster for parsed `topas serve` arguments, until SIGINT/SIGTERM."""
    from .launcher import serve_replicas

    gpu_ids = tuple(x.strip() for x in args.gpu_ids.split(",")) if getattr(args, "gpu_ids", None) else ()
    restart = restart_policy(args)
    return serve_replicas(args.replicas, port=args.port, host=args.host, engine=args.engine,
                          router_policy=args.router_policy, serve_args=replica_serve_args(args),
                          api_key=cluster_key(args), engine_args=tuple(engine_args), gpu_ids=gpu_ids,
                          extra_smg_args=tuple(args.smg_arg or ()), restart=restart,
                          log_dir=getattr(args, "log_dir", None), **_front_drain(args))


def _front_drain(args: argparse.Namespace) -> dict[str, float]:
    """--drain-timeout also bounds the front's drain on stop (a sim replica's own drain too)."""
    value = getattr(args, "drain_timeout", None)
    return {"drain_timeout_s": float(value)} if value is not None else {}
