"""The command lines a cluster runs: one `topas serve` per replica and `smg launch`."""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib import metadata
from pathlib import PurePath

from topas_agents.errors import ConfigError

from .config import KEYED_POLICIES, ROUTE_KEY_HEADER, ClusterConfig

# The smg release the cluster is tested with (pyproject's [cluster] extra pins it).
TESTED_SMG = "1.13.0"

# The cluster's API key never goes on a child's command line: argv is world-readable (`ps`,
# /proc/PID/cmdline), a process's environment only to its owner. A replica reads
# $TOPAS_API_KEY (`topas serve`'s own rule). smg reads its key from no environment variable,
# so a keyed smg starts through this bootstrap, which adds `--api-key` in-process.
SMG_KEY_ENV = "TOPAS_SMG_API_KEY"
_SMG_BOOTSTRAP = ("import os, sys; from smg.cli import main; "
                  f"main([*sys.argv[1:], '--api-key', os.environ['{SMG_KEY_ENV}']])")


def smg_version() -> str:
    """The installed smg version; ConfigError with the fix when it is missing."""
    if importlib.util.find_spec("smg") is None:
        raise ConfigError("--replicas needs SGLang's gateway `smg`; install it with "
                          f'`pip install -e ".[cluster]"` (smg=={TESTED_SMG}), or ".[sglang]" for '
                          "--engine sglang replicas (it includes smg)")
    try:
        return metadata.version("smg")
    except metadata.PackageNotFoundError:
        return "unknown"


def replica_argv(config: ClusterConfig, i: int) -> tuple[str, ...]:
    """`topas serve` for replica i (1-based), through this interpreter (the same install)."""
    serve_args = list(config.serve_args)
    if config.replicas > 1:
        for k, arg in enumerate(serve_args[:-1]):
            if arg == "--decision-log":
                serve_args[k + 1] = replica_log_path(serve_args[k + 1], i)
    argv = [sys.executable, "-m", "topas_agents.server", "--engine", config.engine,
            "--host", config.host, "--port", str(config.replica_port(i)), *serve_args]
    if config.engine_args:
        argv += ["--", *config.engine_args]
    return tuple(argv)


def replica_log_path(path: str, i: int) -> str:
    """Replica i's own decision log: `run/decisions.jsonl` -> `run/decisions.replica-1.jsonl`.
    One file per replica says which scheduler decided what (a shared file would interleave
    all of them, told apart only by process ids)."""
    p = PurePath(path)
    return str(p.with_name(f"{p.stem}.replica-{i}{p.suffix}")) if p.name else f"{path}.replica-{i}"


def replica_env(config: ClusterConfig, i: int) -> dict[str, str]:
    """The cluster's key as $TOPAS_API_KEY; --engine sglang: one GPU per replica (the given
    ids, else GPU i-1)."""
    env = {}
    if (key := cluster_api_key(config)) is not None:
        env["TOPAS_API_KEY"] = key
    if config.engine == "sglang":
        env["CUDA_VISIBLE_DEVICES"] = config.gpu_ids[i - 1] if config.gpu_ids else str(i - 1)
    return env


def smg_env(config: ClusterConfig) -> dict[str, str]:
    """What `smg_argv`'s bootstrap reads: the cluster's key, where there is one."""
    key = cluster_api_key(config)
    return {SMG_KEY_ENV: key} if key is not None else {}


def cluster_api_key(config: ClusterConfig) -> str | None:
    """The key the replicas require: `config.api_key`, else $TOPAS_API_KEY, which a replica
    reads itself when it is given none (`topas serve`'s rule; replicas inherit the launcher's
    environment). smg needs it to probe keyed replicas (without it smg never registered them,
    and `topas serve --replicas N --api-key K` did not start), and the front checks it."""
    if config.api_key is not None:
        return config.api_key
    return os.environ.get("TOPAS_API_KEY") or None


def smg_argv(config: ClusterConfig) -> tuple[str, ...]:
    g = config.gateway
    keyed = config.router_policy in KEYED_POLICIES
    keyed_gateway = cluster_api_key(config) is not None
    launch = ["-c", _SMG_BOOTSTRAP] if keyed_gateway else ["-m", "smg"]
    argv = [sys.executable, *launch, "launch",
            "--host", config.host, "--port", str(config.smg_port),
            "--prometheus-host", config.host, "--prometheus-port", str(config.smg_metrics_port),
            "--worker-urls", *config.replica_urls,
            "--policy", "manual" if keyed else config.router_policy,
            "--retry-max-retries", str(g.retry_max_retries),
            "--retry-initial-backoff-ms", str(g.retry_initial_backoff_ms),
            "--cb-failure-threshold", str(g.cb_failure_threshold),
            "--cb-timeout-duration-secs", str(g.cb_timeout_duration_secs),
            "--health-check-interval-secs", str(g.health_check_interval_secs),
            "--health-failure-threshold", str(g.health_failure_threshold),
            "--health-check-timeout-secs", str(g.health_check_timeout_secs),
            "--shutdown-grace-period-secs", str(g.shutdown_grace_period_secs),
            "--log-level", g.log_level]
    if keyed:
        argv += ["--routing-key-headers", ROUTE_KEY_HEADER, "--assignment-mode", g.assignment_mode,
                 "--max-idle-secs", str(g.sticky_key_idle_secs)]
    argv += list(config.extra_smg_args)
    return tuple(argv)
