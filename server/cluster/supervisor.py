"""The replica supervisor: a replica process that dies is restarted on its own port, within the
bounds of `RestartPolicy`, and given back the workflows registered at run time.

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
    """What the supervisor did about one death of replica `replica` (1-based)."""

    replica: int
    attempt: int  # restarts of this replica within the window, this one included
    outcome: Outcome
    exit_code: int | None  # of the process that died
    old_pid: int
    new_pid: int | None
    reregistered: int  # run-time workflows re-sent and accepted (200/201)
    detail: str
    wall_time: float  # time.time() when the outcome was known

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Supervisor:
    """Watches `replicas` (the handle's list, updated in place with each new Child)."""

    def __init__(self, config: ClusterConfig, replicas: list[Child], *, log_dir: Path,
                 argv: Callable[[int, Sequence[str]], Sequence[str]], env: Callable[[int], Mapping[str, str]],
                 registrations: Callable[[], Sequence[Registration]] = tuple,
                 on_event: Callable[[RestartEvent], None] | None = None) -> None:
        self.config, self.replicas, self.log_dir = config, replicas, log_dir
        self._argv, self._env, self._registrations, self._on_event = argv, env, registrations, on_event
        self.events: list[RestartEvent] = []
        self._history: dict[int, list[float]] = {}  # replica -> monotonic restart times
        self._given_up: set[int] = set()
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="topas-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the cluster stops its children, so none is restarted)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def wait_for(self, count: int, timeout_s: float) -> list[RestartEvent]:
        """Block until at least `count` events happened or `timeout_s` passed; the events."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while len(self.events) < count and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return list(self.events)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop.wait(self.config.restart.poll_interval_s):
            for i, child in enumerate(list(self.replicas), start=1):
                if self._stop.is_set():
                    return
                if i in self._given_up or child.alive():
                    continue
                try:
                    self._recover(i, child)
                except Exception as exc:  # never let the thread die: its children would (PDEATHSIG)
                    log.exception("replica-%d: restart failed", i)
                    self._record(RestartEvent(i, 0, "failed", child.proc.returncode, child.pid, None, 0,
                                              f"{type(exc).__name__}: {exc}", time.time()))

    def _recent(self, i: int) -> list[float]:
        now = time.monotonic()
        kept = [t for t in self._history.get(i, []) if now - t < self.config.restart.window_s]
        self._history[i] = kept
        return kept

    def _recover(self, i: int, dead: Child) -> None:
        policy = self.config.restart
        code = dead.proc.returncode
        recent = self._recent(i)
        if len(recent) >= policy.max_restarts:
            self._given_up.add(i)
            self._record(RestartEvent(i, len(recent), "gave_up", code, dead.pid, None, 0,
                                      f"{len(recent)} restarts within {policy.window_s:g} s; left down",
                                      time.time()))
            return
        if self._stop.wait(policy.backoff_s(len(recent))):
            return
        dead.signal_group(signal.SIGKILL)  # whatever it spawned (SGLang's schedulers) may still hold the port or GPU
        dead.close_log()
        recent.append(time.monotonic())
        extra = [a for path in self._startup_workflows() for a in ("--workflow", path)]
        child = start_child(dead.name, self._argv(i, extra), log_dir=self.log_dir, env=self._env(i), append=True)
        self.replicas[i - 1] = child
        url = self.config.replica_urls[i - 1]
        if not self._wait_healthy(child, url):
            if self._stop.is_set():
                return  # the cluster is stopping; it stops the new child too
            detail = (f"exited with {child.proc.returncode}" if not child.alive()
                      else f"not healthy within {self.config.startup_timeout_s:g} s")
            if child.alive():
                child.kill()  # the next poll sees it dead and tries again (within the bounds)
            self._record(RestartEvent(i, len(recent), "failed", code, dead.pid, child.pid, 0, detail, time.time()))
            return
        accepted, total = self._reregister(url)
        self._record(RestartEvent(i, len(recent), "restarted", code, dead.pid, child.pid, accepted,
                                  f"healthy; {accepted}/{total} run-time workflows re-registered", time.time()))

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

    def _wait_healthy(self, child: Child, url: str) -> bool:
        deadline = time.monotonic() + self.config.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while child.alive() and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{url}/health").status_code == 200:
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
            log.log(level, "replica-%d (pid %d, exit %s): %s, %s", event.replica, event.old_pid,
                    event.exit_code, event.outcome, event.detail)
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()
        if self._on_event is not None:
            with contextlib.suppress(Exception):
                self._on_event(event)
