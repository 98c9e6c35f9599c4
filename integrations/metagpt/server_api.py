"""Talking to a Topas server: the embedded simulator, or any OpenAI-compatible URL.

Only the `/v1/topas/*` extension endpoints are used here (stats, workflow registration,
task done). A server without them (plain vLLM/SGLang) still works: registration and
"done" notifications are skipped with a warning, and stats are reported as unavailable.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from topas_agents.errors import ConfigError
from topas_agents.integrations.task import (
    NO_WORKFLOW_UPLOADS,
    auth_headers,
    post_workflow,
    server_root,
)
from topas_agents.realbench.client import first_model_id
from topas_agents.workflow import Workflow, workflow_mapping

log = logging.getLogger("topas.metagpt")
TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 5.0  # a live server answers /v1/models at once; MetaGPT's retries take minutes


def probe_server(base_url: str, api_key: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast (ConfigError, one line) if the server is unreachable, refuses the key, or is
    not an OpenAI base URL (one without /v1 answered 404 and MetaGPT retried it for seconds
    before the task failed), before MetaGPT's first call would spend minutes retrying."""
    first_model_id(base_url, api_key, timeout_s)


def register_workflow(base_url: str, wf: Workflow, api_key: str | None = None) -> bool:
    """POST the workflow to the server; False (with a warning) if the server cannot."""
    try:
        rsp = post_workflow(base_url, workflow_mapping(wf), api_key, TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.warning("could not register workflow %s at %s: %s", wf.name, server_root(base_url), exc)
        return False
    if rsp.status_code in NO_WORKFLOW_UPLOADS:
        log.warning("the server takes no workflow uploads (HTTP %s): if it checks labels (SGLang with "
                    "the Topas plugin), start it with --workflow %s", rsp.status_code, wf.name)
        return False
    if rsp.status_code >= 400:
        log.warning("server refused workflow %s (%s): %s", wf.name, rsp.status_code, rsp.text[:300])
        return False
    return True


def fetch_stats(base_url: str, calls: int | None = None, api_key: str | None = None) -> dict[str, Any] | None:
    """GET /v1/topas/stats, or None if the server has no such endpoint."""
    params = {"calls": calls} if calls is not None else None
    try:
        rsp = httpx.get(f"{server_root(base_url)}/v1/topas/stats", params=params, timeout=TIMEOUT_S,
                        headers=auth_headers(api_key))
    except httpx.HTTPError as exc:
        log.warning("cannot fetch stats: %s", exc)
        return None
    if rsp.status_code != 200:
        return None
    return rsp.json()


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What a server says about itself in `/v1/topas/stats` (all None: not a Topas server)."""

    engine: str | None = None  # "sim" (the simulated engine) | "sglang"
    responder: str | None = None  # the simulated engine's reply text: echo | lorem | replay
    time_scale: float | None = None  # simulated seconds per wall second (sim engine)

    @property
    def simulated(self) -> bool:
        return self.engine == "sim"

    @property
    def clock_scale(self) -> float:
        """Client clock -> the server's clock (simulated seconds on the sim engine)."""
        return self.time_scale if self.simulated and self.time_scale else 1.0

    @property
    def jct_unit(self) -> str:
        return "simulated seconds" if self.simulated else "wall seconds"

    @property
    def artifacts_note(self) -> str | None:
        """Why the generated files are not real code (None: a real model may have written them)."""
        if not self.simulated or self.responder == "replay":
            return None
        return f"templates from the simulated engine's {self.responder or 'echo'} responder, not real code"


def server_info(base_url: str, api_key: str | None = None) -> ServerInfo:
    stats = fetch_stats(base_url, calls=0, api_key=api_key)
    server = (stats or {}).get("server") or {}
    scale = server.get("time_scale")
    return ServerInfo(engine=server.get("engine"), responder=server.get("responder"),
                      time_scale=float(scale) if isinstance(scale, int | float) else None)


@contextlib.contextmanager
def embedded_server(*, policy: str = "topas", time_scale: float = 20.0, profile: str | None = None,
                    responder: str = "echo", kv_budget: int | None = None, seed: int = 0) -> Iterator[Any]:
    """The embedded OpenAI-compatible simulator in a background thread (a ServerHandle)."""
    from topas_agents.server.config import ServerConfig
    from topas_agents.server.runner import start_server_in_thread

    kwargs: dict[str, Any] = {"policy": policy, "time_scale": time_scale, "responder": responder,
                              "kv_budget": kv_budget, "seed": seed, "port": 0,
                              "task_idle_timeout_s": 0.0}
    if profile is not None:
        kwargs["profile"] = profile
    try:
        config = ServerConfig(**kwargs)
    except TypeError as exc:  # a ServerConfig without one of these knobs
        raise ConfigError(f"embedded server: {exc}") from None
    handle = start_server_in_thread(config)
    try:
        yield handle
    finally:
        handle.stop()
