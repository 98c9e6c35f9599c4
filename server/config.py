"""`ServerConfig`: every knob of the embedded server, built once by the CLI (or a test)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..cli.args import check_api_key
from ..costmodel import DEFAULT_PROFILE
from ..errors import ConfigError

EngineKind = Literal["sim", "sglang"]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    engine: EngineKind = "sim"
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "topas"
    policy_options: tuple[tuple[str, str], ...] = ()  # `--policy-opt k=v`, strings as given
    profile: str = DEFAULT_PROFILE
    kv_budget: int | None = None  # None: the profile's kv_budget_tokens
    time_scale: float = 1.0  # simulated seconds per wall-clock second
    workflows: tuple[str, ...] = ()  # built-in names or YAML paths, registered at start
    responder: str = "echo"
    replay_file: str | None = None
    model_name: str = "topas-sim"
    # Wall seconds between token deliveries at most (the engine jumps at most this far, in
    # simulated time scaled by time_scale, between on_token callbacks).
    stream_interval_s: float = 0.02
    # Wall seconds without any call before an open task is concluded (0: never).
    task_idle_timeout_s: float = 300.0
    drain_timeout_s: float = 10.0  # graceful shutdown: wait this long for in-flight calls
    max_call_history: int = 10_000  # per-call records kept for /v1/topas/stats
    max_task_history: int = 10_000  # finished tasks kept for /v1/topas/stats
    default_max_tokens: int = 4096  # cap on a response's length when the client sets none
    seed: int = 0  # seeds sampling of workflow stage output lengths
    log_level: str = "warning"
    # `--api-key` (repeatable): each distinct key is a tenant; () serves without authentication.
    api_keys: tuple[str, ...] = ()
    # Request limits (docs/server.md "Limits"): far above real agent prompts, low enough that
    # one request cannot exhaust memory or hold the event loop.
    max_body_bytes: int = 16 * 2**20  # completions: 16 MiB of JSON (413 beyond)
    max_workflow_bytes: int = 4 * 2**20  # a 10k-stage workflow is ~1 MiB of YAML
    # Workflows one API key (or the keyless server) may upload, in number and in bytes of
    # definition: registered workflows stay for the server's lifetime, and parsed they take
    # about 4x their text (409 beyond). Real agents register a handful.
    max_workflows: int = 1024
    max_workflow_total_bytes: int = 64 * 2**20
    offload_bytes: int = 64 * 2**10  # bodies above this are parsed in a worker thread
    # A responder may echo user text (a [CONTENT] example, say); the text is cut here so one
    # call's token bookkeeping on the engine task stays cheap.
    max_response_chars: int = 256 * 2**10
    # How long an idle keep-alive connection stays open. Longer than clients keep theirs (httpx
    # and openai: 5 s, aiohttp: 15 s) and than load balancers' idle timeouts (60 s), so the
    # client, not the server, closes it: at uvicorn's 5 s both closed together, and a call sent
    # on a connection the server was closing failed (1 call in 1000, under load).
    keep_alive_s: float = 75.0
    # An engine advance (a policy decision, mostly) running this long makes /health answer 503
    # "stuck": decisions run off the event loop, so /health answers during one, and a hung
    # policy would otherwise read "ok" for ever. Far above any decision measured (tens of ms).
    stuck_advance_s: float = 30.0

    def __post_init__(self) -> None:
        if self.engine not in ("sim", "sglang"):
            raise ConfigError(f"--engine must be 'sim' or 'sglang', got {self.engine!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, got {self.port}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ConfigError(f"--time-scale must be a positive number, got {self.time_scale}")
        if self.kv_budget is not None and self.kv_budget <= 0:
            raise ConfigError(f"--kv-budget must be a positive integer, got {self.kv_budget}")
        if self.responder == "replay" and not self.replay_file:
            raise ConfigError("--responder replay needs --replay-file F.jsonl")
        for name in ("stream_interval_s", "task_idle_timeout_s", "drain_timeout_s", "keep_alive_s", "stuck_advance_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a number >= 0, got {value}")
        if self.stream_interval_s <= 0:
            raise ConfigError("stream_interval_s must be > 0")
        if self.stuck_advance_s <= 0:  # 0 read every advance in progress as stuck
            raise ConfigError("stuck_advance_s must be > 0")
        for key in self.api_keys:
            check_api_key(key)
        for name in ("max_call_history", "max_task_history", "default_max_tokens", "max_body_bytes",
                     "max_workflow_bytes", "max_workflows", "max_workflow_total_bytes", "offload_bytes",
                     "max_response_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")

    @property
    def max_jump_s(self) -> float:
        """Largest simulated-time jump between engine callbacks (smooth streaming)."""
        return self.stream_interval_s * self.time_scale


def parse_policy_options(pairs: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`['k=v', ...]` -> `(('k', 'v'), ...)`; one-line ConfigError on a malformed pair."""
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--policy-opt expects key=value, got {pair!r}")
        out.append((key.strip(), value.strip()))
    return tuple(out)
