"""The cluster's supervisor: a replica process that dies is restarted on its own port, within the
bounds of `RestartPolicy`, and given back the workflows registered at run time; a dead smg is
restarted on its ports within the same bounds.

smg keeps the dead worker in its list (it was started with `--worker-urls`); its health checks
(every `GatewaySettings.health_check_interval_secs`) and circuit breaker (re-probed after
`cb_timeout_duration_secs`) put the restarted replica back into rotation once it answers.

Workflows given with `--workflow` are in the replica's command line, so a restart registers them
again. Those registered at run time through the front (`POST /v1/topas/workflows`) are recorded
by the front (`Registration`: the body and the caller's Authorization, since uploads live in the
caller's tenant namespace). Anonymous ones (no Authorization: the shared namespace, as
`--workflow`) are written to files and added to the new process's command line, so they are
registered before it answers at all. Every one is also re-sent, in order, once the new process
answers /health (an identical definition is a no-op there); for a tenant's upload that is the
only way, and smg only sends the replica calls after its next health probe, so it normally
comes first.

The supervisor's thread starts the new processes itself: PR_SET_PDEATHSIG (procs.py) fires when
the starting thread exits, and this thread lives as long as the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import httpx

from .config import ClusterConfig
from .procs import Child, start_child

log = logging.getLogger("topas.cluster")

Outcome = Literal["restarted", "failed", "gave_up"]


@dataclass(frozen=True, slots=True)
class Registration:
    """One successful `POST /v1/topas/workflows` through the front, to replay on a restart."""

    body: bytes
    authorization: str | None


@dataclass(frozen=True, slots=True)
class RestartEvent:
    """What the supervisor did about one death of a child process: a replica or smg."""

    process: str  # the child's name: "replica-<i>" or "smg"
    replica: int | None  # 1-based; None for the gateway
    attempt: int  # restarts of this process within the window, this one included
    outcome: Outcome
    exit_code: int | None  # of the process that died
    old_pid: int
    new_pid: int | None
    reregistered: int  # run-time workflows re-sent and accepted (200/201); 0 for smg
    detail: str
    wall_time: float  # time.time() when the outcome was known

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class GatewayWatch:
    """How the supervisor reaches smg: the current child (the handle's), where a restarted one
    goes, and smg's command line and environment (unchanged across restarts: its worker URLs
    are the replicas' fixed ports)."""

    current: Callable[[], Child]
    replace: Callable[[Child], None]
    argv: Sequence[str]
    env: Mapping[str, str]


GATEWAY = "smg"


class Supervisor:
    """Watches `replicas` (the handle's list, updated in place with each new Child) and, given
    `gateway`, smg itself. A dead smg is restarted the same way (same bounds, same backoff):
    without it every call through the front failed until someone restarted the whole cluster,
    replicas and their warm caches included."""

    def __init__(self, config: ClusterConfig, replicas: list[Child], *, log_dir: Path,
                 argv: Callable[[int, Sequence[str]], Sequence[str]], env: Callable[[int], Mapping[str, str]],
                 registrations: Callable[[], Sequence[Registration]] = tuple,
                 on_event: Callable[[RestartEvent], None] | None = None,
                 gateway: GatewayWatch | None = None) -> None:
        self.config, self.replicas, self.log_dir = config, replicas, log_dir
        self._argv, self._env, self._registrations, self._on_event = argv, env, registrations, on_event
        self._gateway = gateway
        self.events: list[RestartEvent] = []
        self._history: dict[str, list[float]] = {}  # process name -> monotonic restart times
        self._given_up: set[str] = set()
        self._stop = threading.Event()
        self._released = threading.Event()
        self._changed = threading.Condition()
        # smg has a thread of its own: a replica's restart waits up to startup_timeout_s for
        # it to answer (SGLang: about 40 s), and smg, dead meanwhile, waited with it
        self._threads = [threading.Thread(target=self._loop, args=(self._replica_pass,), name="topas-supervisor",
                                          daemon=True)]
        if gateway is not None:
            self._threads.append(threading.Thread(target=self._loop, args=(self._gateway_pass,),
                                                  name="topas-supervisor-smg", daemon=True))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def pause(self) -> None:
        """Stop restarting anything, and keep the threads: a child they started is SIGTERMed
        when its starting thread ends (PR_SET_PDEATHSIG), and a cluster stopping after a
        restart lost the new smg before the front's drain (a stream in flight was cut)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop watching and end the threads: after the cluster has stopped the children."""
        self._stop.set()
        self._released.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()

    def wait_for(self, count: int, timeout_s: float) -> list[RestartEvent]:
        """Block until at least `count` events happened or `timeout_s` passed; the events."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while len(self.events) < count and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return list(self.events)

    def gave_up(self, process: str) -> bool:
        """Whether `process` ("replica-<i>" or "smg") is left down for good."""
        return process in self._given_up

    # ------------------------------------------------------------------ the loop

    def _loop(self, one_pass: Callable[[], None]) -> None:
        while not self._stop.wait(self.config.restart.poll_interval_s):
            one_pass()
        self._released.wait()  # the children this thread started live as long as it does (pause)

    def _replica_pass(self) -> None:
        for i, child in enumerate(list(self.replicas), start=1):
            self._watch(child, i, lambda dead, i=i: self._recover_replica(i, dead))

    def _gateway_pass(self) -> None:
        assert self._gateway is not None
        self._watch(self._gateway.current(), None, self._recover_gateway)

    def _watch(self, child: Child, replica: int | None, recover: Callable[[Child], None]) -> None:
        if self._stop.is_set() or child.name in self._given_up or child.alive():
            return
        try:
            recover(child)
        except Exception as exc:  # never let the thread die: its children would (PDEATHSIG)
            log.exception("%s: restart failed", child.name)
            self._record(RestartEvent(child.name, replica, 0, "failed", child.proc.returncode, child.pid, None, 0,
                                      f"{type(exc).__name__}: {exc}", time.time()))

    def _recent(self, name: str) -> list[float]:
        now = time.monotonic()
        kept = [t for t in self._history.get(name, []) if now - t < self.config.restart.window_s]
        self._history[name] = kept
        return kept

    def _begin(self, dead: Child, replica: int | None) -> int | None:
        """The bounded part shared by every child: give up past the bound, else back off, clear
        what the dead process left, and count the attempt. The attempt's number, or None."""
        policy = self.config.restart
        recent = self._recent(dead.name)
        if len(recent) >= policy.max_restarts:
            self._given_up.add(dead.name)
            self._record(RestartEvent(dead.name, replica, len(recent), "gave_up", dead.proc.returncode, dead.pid,
                                      None, 0, f"{len(recent)} restarts within {policy.window_s:g} s; left down",
                                      time.time()))
            return None
        if self._stop.wait(policy.backoff_s(len(recent))):
            return None
        dead.signal_group(signal.SIGKILL)  # whatever it spawned (SGLang's schedulers) may still hold the port or GPU
        dead.close_log()
        recent.append(time.monotonic())
        return len(recent)

    def _not_ready(self, dead: Child, replica: int | None, attempt: int, child: Child) -> None:
        if self._stop.is_set():
            return  # the cluster is stopping; it stops the new child too
        detail = (f"exited with {child.proc.returncode}" if not child.alive()
                  else f"not ready within {self.config.startup_timeout_s:g} s")
        if child.alive():
            child.kill()  # the next poll sees it dead and tries again (within the bounds)
        self._record(RestartEvent(dead.name, replica, attempt, "failed", dead.proc.returncode, dead.pid,
                                  child.pid, 0, detail, time.time()))

    def _recover_replica(self, i: int, dead: Child) -> None:
        attempt = self._begin(dead, i)
        if attempt is None:
            return
        extra = [a for path in self._startup_workflows() for a in ("--workflow", path)]
        child = start_child(dead.name, self._argv(i, extra), log_dir=self.log_dir, env=self._env(i), append=True)
        self.replicas[i - 1] = child
        url = self.config.replica_urls[i - 1]
        if not self._wait_ready(child, f"{url}/health", lambda r: r.status_code == 200):
            self._not_ready(dead, i, attempt, child)
            return
        accepted, total = self._reregister(url)
        self._record(RestartEvent(dead.name, i, attempt, "restarted", dead.proc.returncode, dead.pid, child.pid,
                                  accepted, f"healthy; {accepted}/{total} run-time workflows re-registered",
                                  time.time()))

    def _recover_gateway(self, dead: Child) -> None:
        """smg on its own ports with its own command line: its worker list is the replicas'
        fixed URLs, so it finds them again (a restarted replica included); task affinity starts
        afresh, and a task whose next call lands elsewhere is rebuilt there from its labels,
        as after a replica death (docs/cluster.md, Failover)."""
        assert self._gateway is not None
        attempt = self._begin(dead, None)
        if attempt is None:
            return
        child = start_child(dead.name, self._gateway.argv, log_dir=self.log_dir, env=self._gateway.env, append=True)
        self._gateway.replace(child)
        if not self._wait_ready(child, f"{self.config.smg_url}/v1/models", _serves_models):
            self._not_ready(dead, None, attempt, child)
            return
        self._record(RestartEvent(dead.name, None, attempt, "restarted", dead.proc.returncode, dead.pid, child.pid,
                                  0, "serving; its workers registered", time.time()))

    def _startup_workflows(self) -> list[str]:
        """`--workflow` values for the anonymous run-time registrations: a built-in's name, or a
        file in the log directory that `load_workflow` (what the replica runs on it) accepts;
        any other is left to the POST after /health, never risking the replica's start."""
        from topas_agents.errors import WorkflowError
        from topas_agents.workflow import builtin_workflows, load_workflow

        out: list[str] = []
        folder = self.log_dir / "runtime-workflows"
        for k, reg in enumerate(self._registrations()):
            if reg.authorization:
                continue
            text = reg.body.decode("utf-8", errors="replace")
            if text.strip() in builtin_workflows():
                out.append(text.strip())
                continue
            folder.mkdir(exist_ok=True)
            path = folder / f"{k}.yaml"
            path.write_text(text)
            try:
                load_workflow(path)
            except (WorkflowError, OSError, ValueError):
                continue
            out.append(str(path))
        return out

    def _wait_ready(self, child: Child, url: str, ready: Callable[[httpx.Response], bool]) -> bool:
        deadline = time.monotonic() + self.config.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while child.alive() and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if ready(client.get(url)):
                        return True
                if self._stop.wait(0.1):
                    return False
        return False

    def _reregister(self, url: str) -> tuple[int, int]:
        regs = list(self._registrations())
        accepted = 0
        with httpx.Client(timeout=self.config.control_timeout_s) as client:
            for reg in regs:
                headers = {"Authorization": reg.authorization} if reg.authorization else None
                try:
                    r = client.post(f"{url}/v1/topas/workflows", content=reg.body, headers=headers)
                except httpx.HTTPError as exc:
                    log.warning("re-registering a workflow on %s failed: %s", url, exc)
                    continue
                if r.status_code in (200, 201):
                    accepted += 1
                else:
                    log.warning("re-registering a workflow on %s: HTTP %d %s", url, r.status_code, r.text[:200])
        return accepted, len(regs)

    def _record(self, event: RestartEvent) -> None:
        if self._on_event is None:  # a listener says it itself (`topas serve` printed each failure twice)
            level = logging.INFO if event.outcome == "restarted" else logging.WARNING
            log.log(level, "%s (pid %d, exit %s): %s, %s", event.process, event.old_pid,
                    event.exit_code, event.outcome, event.detail)
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()
        if self._on_event is not None:
            with contextlib.suppress(Exception):
                self._on_event(event)


def _serves_models(r: httpx.Response) -> bool:
    """smg answers /v1/models with a model once it has registered a worker."""
    try:
        body = r.json() if r.status_code == 200 else None
    except ValueError:
        return False
    return isinstance(body, dict) and bool(body.get("data"))
