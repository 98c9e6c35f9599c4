"""`run_replicas`: N Topas replicas, smg in front of them and the Topas front, started and
stopped together. `serve_replicas` is the blocking form behind `topas serve --replicas N`.

    with run_replicas(3, port=18000, serve_args=("--workflow", "chain3", "--time-scale", "50")) as c:
        client = openai.OpenAI(base_url=c.url, api_key="unused")   # c.url: the front's /v1
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from topas_agents.errors import ConfigError, TopasError

from ..config import ServerConfig
from ..sglang.config import require_sglang
from .commands import replica_argv, replica_env, smg_argv, smg_env, smg_version
from .config import ClusterConfig, GatewaySettings
from .drain import DrainingFront
from .front import Front, build_front
from .procs import Child, start_child, stop_children
from .supervisor import GATEWAY, GatewayWatch, RestartEvent, Supervisor

# After the front's drain, uvicorn gives calls left in flight this long before cancelling them,
# and the front's thread gets a little more to close.
_AFTER_DRAIN_S = 3
_FRONT_EXIT_SLACK_S = _AFTER_DRAIN_S + 2.0
# After a forced stop (a second Ctrl-C) the children get this long after SIGTERM.
_FORCED_STOP_S = 2.0


@dataclass
class ClusterHandle:
    """A running cluster. `url` is the OpenAI base URL of the front (…/v1)."""

    config: ClusterConfig
    replicas: list[Child]
    gateway: Child
    log_dir: Path
    supervisor: Supervisor | None = None  # restarts dead replicas and smg (None: config.restart.enabled off)
    # log_dir is the launcher's own temporary folder: removed by a clean stop (one that follows
    # no exception and no replica death); every run left one in /tmp, hundreds of them
    temporary_logs: bool = False
    _front: uvicorn.Server | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _forced: bool = field(default=False, repr=False)

    @property
    def restarts(self) -> list[RestartEvent]:
        """What the supervisor did, in order (also on the front's GET /v1/topas/cluster)."""
        return list(self.supervisor.events) if self.supervisor is not None else []

    @property
    def url(self) -> str:
        return f"{self.config.front_url}/v1"

    @property
    def base_url(self) -> str:
        return self.config.front_url

    @property
    def children(self) -> list[Child]:
        # smg first: it stops taking calls while the replicas drain what they have
        return [self.gateway, *self.replicas]

    def stop(self, keep_logs: bool = False) -> None:
        """Stop the front (calls in flight through it get `drain_timeout_s` to finish), then smg
        and every replica (drain, then SIGKILL what is left). `force()` cuts both waits short.
        A temporary log folder goes too, unless `keep_logs` or a replica died meanwhile."""
        if self._stopped:
            return
        self._stopped = True
        if self.supervisor is not None:  # first: nothing is restarted while they stop
            self.supervisor.pause()
        if self._front is not None and self._thread is not None:
            self._front.should_exit = True
            self._thread.join(self.config.drain_timeout_s + _FRONT_EXIT_SLACK_S)
        stop_children(self.children, _FORCED_STOP_S if self._forced else self.config.stop_timeout_s)
        if self.supervisor is not None:  # last: the children it restarted die with its threads
            self.supervisor.stop()
        if self.temporary_logs and not keep_logs and not self.restarts:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    @property
    def logs_kept(self) -> bool:
        """Whether the log folder outlives the cluster (given by the caller, or kept by `stop`)."""
        return self.log_dir.exists()

    def force(self) -> None:
        """A second Ctrl-C: end the front's drain now and give the children a short stop."""
        self._forced = True
        if self._front is not None:
            self._front.force_exit = True

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop(keep_logs=exc_type is not None)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux default if unreadable)."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def free_base_port(span: int, host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port P with P..P+span-1 all free now (tests; a race with other processes remains).

    Drawn below the ephemeral range: a port inside it can be taken, between this check and the
    bind, by any outgoing connection of the run itself (measured: smg lost its port so in CI)."""
    import random

    rng = random.Random()
    top = max(1024 + span + 1, min(_ephemeral_range()[0], 65536) - span)
    for _ in range(tries):
        base = rng.randrange(max(1024, min(20000, top - 4096)), top)
        if all(_port_free(host, base + k) for k in range(span)):
            return base
    raise TopasError(f"no block of {span} free ports found on {host}")


def _check_ports(config: ClusterConfig) -> None:
    ports = [config.port, *(config.replica_port(i) for i in range(1, config.replicas + 1)),
             config.smg_port, config.smg_metrics_port]
    busy = [p for p in ports if not _port_free(config.host, p)]
    if busy:
        raise ConfigError(f"ports in use on {config.host}: {', '.join(map(str, busy))} "
                          f"(the cluster needs {ports[0]}..{ports[-1]})")


def _wait_ready(children: Sequence[Child], urls: Sequence[str], deadline: float, what: str) -> None:
    pending = dict(zip(urls, children, strict=True))
    with httpx.Client(timeout=2.0) as client:
        while pending:
            for url, child in list(pending.items()):
                if not child.alive():
                    raise TopasError(f"{what} {child.name} exited with {child.proc.returncode}:\n{child.tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url).status_code == 200:
                        del pending[url]
            if pending and time.monotonic() > deadline:
                names = ", ".join(c.name for c in pending.values())
                raise TopasError(f"{what} not ready in time: {names}")
            if pending:
                time.sleep(0.2)


def _wait_gateway(config: ClusterConfig, gateway: Child, deadline: float) -> None:
    """smg answers /v1/models once it has registered its workers."""
    with httpx.Client(timeout=2.0) as client:
        while True:
            if not gateway.alive():
                raise TopasError(f"smg exited with {gateway.proc.returncode}:\n{gateway.tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = client.get(f"{config.smg_url}/v1/models")
                if r.status_code == 200 and r.json().get("data"):
                    return
            if time.monotonic() > deadline:
                raise TopasError(f"smg not ready in time:\n{gateway.tail()}")
            time.sleep(0.2)


def _start_front(config: ClusterConfig) -> tuple[uvicorn.Server, threading.Thread, Front]:
    app = build_front(config)
    front: Front = app.state.front
    # after the drain (drain.py), uvicorn gives what is left (a call without a body yet) this
    # long, then cancels it
    server = DrainingFront(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                          timeout_keep_alive=ServerConfig().keep_alive_s,  # as a replica's
                                          access_log=False, log_config=None, lifespan="on", backlog=4096,
                                          timeout_graceful_shutdown=_AFTER_DRAIN_S),
                           front.drain, config.drain_timeout_s)
    thread = threading.Thread(target=server.run, name=f"topas-front-{config.port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise TopasError(f"the front failed to start on {config.host}:{config.port}")
        time.sleep(0.01)
    return server, thread, front


def start_cluster(config: ClusterConfig, *, log_dir: Path | None = None,
                  on_restart: Callable[[RestartEvent], None] | None = None) -> ClusterHandle:
    """Start the replicas, then smg, then the front, then the supervisor (a replica that dies
    is restarted, `config.restart`; `on_restart` hears each outcome); on any failure stop
    what started."""
    smg_version()
    if config.engine == "sglang":
        require_sglang()
    _check_ports(config)
    temporary = log_dir is None
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="topas-cluster-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    started: list[Child] = []
    try:
        for i in range(1, config.replicas + 1):
            started.append(start_child(f"replica-{i}", replica_argv(config, i), log_dir=log_dir,
                                       env=replica_env(config, i)))
        deadline = time.monotonic() + config.startup_timeout_s
        _wait_ready(started, [f"{u}/health" for u in config.replica_urls], deadline, "replica")
        gateway = start_child(GATEWAY, smg_argv(config), log_dir=log_dir, env=smg_env(config))
        started.append(gateway)
        _wait_gateway(config, gateway, deadline)
        handle = ClusterHandle(config, started[:-1], gateway, log_dir, temporary_logs=temporary)
        handle._front, handle._thread, front = _start_front(config)
    except BaseException:
        stop_children(started, 5.0)
        raise
    if config.restart.enabled:
        watch = GatewayWatch(current=lambda: handle.gateway, replace=lambda child: setattr(handle, "gateway", child),
                             argv=smg_argv(config), env=smg_env(config))
        handle.supervisor = Supervisor(config, handle.replicas, log_dir=log_dir,
                                       argv=lambda i, extra: _restart_argv(config, i, extra),
                                       env=lambda i: replica_env(config, i),
                                       registrations=front.registrations, on_event=on_restart, gateway=watch)
        front.restart_events = handle.supervisor.events
        handle.supervisor.start()
    return handle


def _restart_argv(config: ClusterConfig, i: int, extra_serve_args: Sequence[str]) -> tuple[str, ...]:
    """Replica i's command line with more `topas serve` options (before any `--`)."""
    return replica_argv(replace(config, serve_args=(*config.serve_args, *extra_serve_args)), i)


def run_replicas(replicas: int, *, port: int = 8000, host: str = "127.0.0.1", engine: str = "sim",
                 router_policy: str = "task", serve_args: Sequence[str] = (), engine_args: Sequence[str] = (),
                 gpu_ids: Sequence[str] = (), extra_smg_args: Sequence[str] = (),
                 gateway: GatewaySettings | None = None, startup_timeout_s: float = 60.0,
                 log_dir: str | Path | None = None,
                 on_restart: Callable[[RestartEvent], None] | None = None, **config_kw: Any) -> ClusterHandle:
    """Plain-argument entry point: build the ClusterConfig and start the cluster."""
    config = ClusterConfig(replicas=replicas, port=port, host=host, engine=engine,  # type: ignore[arg-type]
                           router_policy=router_policy,  # type: ignore[arg-type]
                           serve_args=tuple(serve_args), engine_args=tuple(engine_args),
                           gpu_ids=tuple(gpu_ids), extra_smg_args=tuple(extra_smg_args),
                           gateway=gateway or GatewaySettings(), startup_timeout_s=startup_timeout_s,
                           **config_kw)
    return start_cluster(config, log_dir=Path(log_dir) if log_dir is not None else None, on_restart=on_restart)


def serve_replicas(replicas: int, **kw: Any) -> int:
    """Blocking: run the cluster until SIGINT/SIGTERM, then stop everything (`topas serve --replicas`)."""
    stop = threading.Event()
    running: list[ClusterHandle] = []

    def on_signal(*_: object) -> None:
        if stop.is_set():  # the second: the drain is cut short
            for cluster in running:
                cluster.force()
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        def report(e: RestartEvent) -> None:
            print(f"topas: {e.process} (pid {e.old_pid}, exit {e.exit_code}) {e.outcome}: {e.detail}",
                  flush=True)

        cluster = run_replicas(replicas, on_restart=report, **kw)
        running.append(cluster)
        with cluster:
            c = cluster.config
            kept = "" if not cluster.temporary_logs else " (removed on a clean stop; --log-dir DIR keeps them)"
            print(f"topas: {c.replicas} {c.engine} replicas behind smg {smg_version()} "
                  f"(policy {c.router_policy}); OpenAI base URL {cluster.url}; logs in {cluster.log_dir}{kept}",
                  flush=True)
            while not stop.wait(0.5):
                if not cluster.gateway.alive() and (cluster.supervisor is None or cluster.supervisor.gave_up(GATEWAY)):
                    raise TopasError(f"smg exited with status {cluster.gateway.proc.returncode}; its log "
                                     f"({cluster.log_dir / 'smg.log'}) ends:\n{cluster.gateway.tail()}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for cluster in running:
            if cluster.temporary_logs and cluster.logs_kept:
                print(f"topas: logs kept in {cluster.log_dir}", flush=True)
    return 0
