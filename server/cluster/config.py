"""`ClusterConfig`: N Topas replicas behind SGLang's gateway (`smg`) and the Topas front.

Port layout for `port=P`, `replicas=N` (all on `host`, loopback unless told otherwise):

    P          the Topas front: the one URL clients use (OpenAI API + cluster control plane)
    P+1..P+N   replica i (`topas serve --engine sim|sglang --port P+i`)
    P+N+1      smg (the gateway; usable directly by clients that send body AND header labels)
    P+N+2      smg's Prometheus exporter (smg binds 0.0.0.0:29000 unless told otherwise)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from topas_agents.cli.args import check_api_key
from topas_agents.errors import ConfigError

EngineKind = Literal["sim", "sglang"]
# task / agent: smg's `manual` policy keyed by the front's X-Topas-Route-Key header (the label's
# task id or agent); the others are smg's own policies, which see no key.
RouterPolicy = Literal["task", "agent", "cache_aware", "round_robin", "least_load", "random", "power_of_two"]
ROUTER_POLICIES: tuple[str, ...] = RouterPolicy.__args__  # type: ignore[attr-defined]
KEYED_POLICIES = ("task", "agent")
AssignmentMode = Literal["min_load", "min_group", "random"]
# The most replicas one launcher (or one simulated cluster) runs: each takes a port above the
# front's and, with --engine sglang, a GPU; 64 is past any single host.
MAX_REPLICAS = 64

# The header the front sets from the label; smg routes on it (--routing-key-headers).
ROUTE_KEY_HEADER = "X-Topas-Route-Key"
# smg flags the launcher sets that hold the cluster together (commands.smg_argv): where smg
# listens, its replicas, its policy and the route-key header. A later --smg-arg would override
# them (smg takes the last value) and the cluster failed only after the start-up timeout
# ("smg not ready" after 61 s for --port), or routed without the key. The gateway's tunables
# (GatewaySettings: retries, breaker, health probes, --log-level) may still be overridden.
SMG_FLAGS_SET_BY_LAUNCHER = ("--host", "--port", "--prometheus-host", "--prometheus-port",
                             "--worker-urls", "--policy", "--routing-key-headers", "--api-key")


# More than one distinct --api-key for one cluster (checked at the CLI edge, cli.py).
ONE_API_KEY = ("--replicas takes one --api-key: smg (1.13.0) holds a single key, which it uses to probe the "
               "replicas and checks every caller's bearer token against, so a second tenant's calls would be "
               "refused at the gateway; run one cluster per tenant")


def serve_arg_problem(arg: str) -> str | None:
    """Why a replica option in `serve_args` is refused, or None. The key goes in
    `ClusterConfig.api_key`: smg and the front need it too, and a search of `serve_args` for
    it missed an abbreviation `topas serve`'s argparse takes (`--api-k K`), so the replicas
    required a key that smg and the front lacked (smg then registered no replica)."""
    name = arg.split("=", 1)[0]
    if len(name) > 2 and name.startswith("--") and "--api-key".startswith(name):
        return (f"serve_args {arg!r} is --api-key: give the cluster's key as ClusterConfig(api_key=...) "
                "(run_replicas(api_key=...)); the launcher hands it to the replicas, smg and the front")
    return None


def smg_arg_problem(arg: str) -> str | None:
    """Why an extra `smg launch` argument is refused, or None. smg's argparse also takes an
    unambiguous prefix of a flag (--por for --port), so prefixes are refused too."""
    name = arg.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 4:
        return None
    taken = [flag for flag in SMG_FLAGS_SET_BY_LAUNCHER if flag.startswith(name)]
    if not taken:
        return None
    return (f"--smg-arg {arg!r} would override {taken[0]}, which the launcher sets "
            f"(the launcher sets {', '.join(SMG_FLAGS_SET_BY_LAUNCHER)}; use --port/--host/--router-policy)")


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """smg's failover knobs, chosen so that the first calls after a replica dies succeed
    (measured with smg 1.13.0 and sim replicas on loopback, docs/cluster.md)."""

    # A call to a dead worker fails at connect time; smg retries it on another worker after
    # 50 ms. 3 retries are enough for one dead replica and keep a hopeless call short.
    retry_max_retries: int = 3
    retry_initial_backoff_ms: int = 50
    # Open a dead worker's breaker after 2 failures so later keys stop trying it at all.
    cb_failure_threshold: int = 2
    # Probe a dead worker again after 5 s (default 60 s), so a restarted replica rejoins soon.
    cb_timeout_duration_secs: int = 5
    # Health probes every 2 s (default 60 s: a killed worker looked healthy for a minute).
    health_check_interval_secs: int = 2
    # A worker is unhealthy only after 3 missed probes of 5 s each. smg moves an unhealthy
    # worker's keys away and back once it answers again, so one slow probe splits every task
    # pinned there: with 1 probe of 2 s a busy CPU replica (2 cores shared with other jobs)
    # missed one and a task's stages ran on two replicas. A dead worker does not need the
    # probe: its calls fail at connect time and the retries and the breaker above re-home them.
    health_failure_threshold: int = 3
    health_check_timeout_secs: int = 5
    # New task keys go to the replica with the fewest requests in flight.
    assignment_mode: AssignmentMode = "min_load"
    # Keys of finished tasks are dropped after this long idle (default 4 h), keeping the map small.
    sticky_key_idle_secs: int = 600
    # smg's default is 180 s; our replicas drain on their own (ServerConfig.drain_timeout_s).
    shutdown_grace_period_secs: int = 2
    log_level: Literal["debug", "info", "warn", "error"] = "warn"


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How the launcher restarts a replica that died (supervisor.py)."""

    enabled: bool = True
    # At most 3 restarts of one replica within 300 s: a replica that keeps dying (bad flags, a
    # GPU fault, OOM at load) is left down and reported instead of crash-looping; smg already
    # routes around it, so giving up costs capacity, not calls.
    max_restarts: int = 3
    window_s: float = 300.0
    # Wait 0.5 s before the first restart, doubling per recent restart up to 8 s: enough for the
    # kernel to free the port and for a transient cause (memory pressure) to pass.
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    # How often liveness is checked (a poll of each child's exit status: no I/O).
    poll_interval_s: float = 0.5
    # How long the front holds a call that finds smg down (connection refused) while smg is
    # restarted: the first backoff (0.5 s) plus smg's start and worker registration (about
    # 1-2 s measured on loopback) fit with room for a second attempt; a longer outage is a 502.
    gateway_wait_s: float = 15.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be >= 0, got {self.max_restarts}")
        for name in ("window_s", "backoff_max_s", "poll_interval_s", "gateway_wait_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"restart {name} must be a positive number, got {value}")
        if not (math.isfinite(self.backoff_initial_s) and 0 <= self.backoff_initial_s <= self.backoff_max_s):
            raise ConfigError(f"restart backoff_initial_s must be in [0, backoff_max_s], got {self.backoff_initial_s}")

    def backoff_s(self, recent: int) -> float:
        """Delay before a restart when `recent` restarts already happened in the window."""
        return min(self.backoff_max_s, self.backoff_initial_s * 2 ** recent)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    replicas: int = 2
    port: int = 8000
    host: str = "127.0.0.1"
    engine: EngineKind = "sim"
    router_policy: RouterPolicy = "task"
    # Extra `topas serve` arguments for every replica (e.g. ("--workflow", "chain3")); the
    # launcher adds --engine, --host and --port. Not --api-key: that is `api_key`.
    serve_args: tuple[str, ...] = ()
    # The one key the replicas require, smg probes them with and the front checks (None: the
    # launcher's $TOPAS_API_KEY, if set; commands.cluster_api_key). Given to the children in
    # their environment, never on a command line.
    api_key: str | None = None
    # Arguments after `--` for --engine sglang replicas (the SGLang server's own).
    engine_args: tuple[str, ...] = ()
    # --engine sglang: GPU ids, one entry per replica (CUDA_VISIBLE_DEVICES); default i-1.
    gpu_ids: tuple[str, ...] = ()
    gateway: GatewaySettings = GatewaySettings()
    extra_smg_args: tuple[str, ...] = ()
    # Wall seconds to wait for every replica and smg to answer at start (SGLang loads weights).
    startup_timeout_s: float = 60.0
    # Wall seconds the front gives calls in flight through it to finish on stop, before smg and
    # the replicas are stopped (`--drain-timeout`; ServerConfig's default). smg's own grace
    # period is short, so stopping it with the replicas cut every relay after ~2 s.
    drain_timeout_s: float = 10.0
    # Wall seconds a replica gets to drain after SIGTERM before it is killed.
    stop_timeout_s: float = 15.0
    # Wall seconds the front waits on one control-plane call to one replica.
    control_timeout_s: float = 10.0
    # A replica that dies is restarted on its port, within bounds (RestartPolicy).
    restart: RestartPolicy = RestartPolicy()

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ConfigError(f"--replicas must be in 1..{MAX_REPLICAS}, got {self.replicas}")
        if not 1 <= self.port <= 65535 - self.replicas - 2:
            raise ConfigError(f"--port must leave room for {self.replicas + 2} ports above it, got {self.port}")
        if self.engine not in ("sim", "sglang"):
            raise ConfigError(f"--engine must be 'sim' or 'sglang', got {self.engine!r}")
        if self.router_policy not in ROUTER_POLICIES:
            raise ConfigError(f"--router-policy must be one of {', '.join(ROUTER_POLICIES)}, "
                              f"got {self.router_policy!r}")
        if self.gpu_ids and len(self.gpu_ids) != self.replicas:
            raise ConfigError(f"give one GPU id per replica ({self.replicas}), got {len(self.gpu_ids)}")
        for i, gpu in enumerate(self.gpu_ids, start=1):
            if not gpu.strip():  # "," passed the count check and gave CUDA_VISIBLE_DEVICES=""
                raise ConfigError(f"--gpu-ids: the GPU id of replica {i} is empty, got {','.join(self.gpu_ids)!r}")
        for arg in self.extra_smg_args:
            if (problem := smg_arg_problem(arg)) is not None:
                raise ConfigError(problem)
        for arg in self.serve_args:
            if (problem := serve_arg_problem(arg)) is not None:
                raise ConfigError(problem)
        if self.api_key is not None:
            check_api_key(self.api_key)
        for name in ("startup_timeout_s", "stop_timeout_s", "control_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a positive number, got {value}")
        if not (math.isfinite(self.drain_timeout_s) and self.drain_timeout_s >= 0):
            raise ConfigError(f"--drain-timeout must be a number >= 0, got {self.drain_timeout_s}")

    def replica_port(self, i: int) -> int:
        """Port of replica i, 1-based."""
        return self.port + i

    @property
    def replica_urls(self) -> tuple[str, ...]:
        return tuple(f"http://{self.host}:{self.replica_port(i)}" for i in range(1, self.replicas + 1))

    @property
    def smg_port(self) -> int:
        return self.port + self.replicas + 1

    @property
    def smg_metrics_port(self) -> int:
        return self.port + self.replicas + 2

    @property
    def smg_url(self) -> str:
        return f"http://{self.host}:{self.smg_port}"

    @property
    def front_url(self) -> str:
        return f"http://{self.host}:{self.port}"
