"""`GET /v1/topas/timeline?format=perfetto&n=N`: the live simulated engine's recent request
timelines as Chrome/Perfetto trace-event JSON (docs/timelines.md).

`install_timeline` attaches a bounded `TimelineRecorder` to the engine (a SimEngine only; on
another engine the route answers 404) and adds the route. The recorder keeps the latest
`KEEP_REQUESTS` requests and `KEEP_SAMPLES` counter samples and transfers, so memory stays
bounded however long the server runs. With API keys a tenant sees only its own tasks and
agents' transfers (names unqualified); the KV and batch counters are engine-wide, as in
/v1/topas/stats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..bench.timeline import perfetto_trace, window
from ..sim.record import RecorderConfig, TimelineRecorder
from .api_errors import ApiError, bad_request
from .service import SimService
from .tenancy import Tenant, owned_by, unqualify

# Requests kept by the live recorder, and the most one response may hold: a few MB of JSON,
# enough to see the recent scheduling pattern of a busy server.
KEEP_REQUESTS = 2000
# Counter samples and transfers kept: a few per engine event; this spans the requests above
# at typical agent-workload rates while staying a few MB.
KEEP_SAMPLES = 50_000
DEFAULT_REQUESTS = 200  # `n` when not given
FORMATS = ("perfetto",)


def parse_params(params: Any) -> int:
    """The query's `n` (default DEFAULT_REQUESTS); 400 for a bad `format` or `n`."""
    fmt = params.get("format", "perfetto").strip()
    if fmt not in FORMATS:
        raise bad_request(f"'format' must be one of {', '.join(FORMATS)}, got {fmt[:40]!r}", "format")
    raw = params.get("n")
    if raw is None:
        return DEFAULT_REQUESTS
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or not 1 <= int(text) <= KEEP_REQUESTS:
        raise bad_request(f"'n' must be an integer in 1..{KEEP_REQUESTS}", "n")
    return int(text)


def _render(tl: Any, n: int, tenant: Tenant, policy: str) -> dict[str, Any]:
    keep = None if tenant is None else (lambda name: owned_by(tenant, name))
    rename = None if tenant is None else (lambda name: unqualify(tenant, name))
    view = window(tl, n, keep=keep, rename=rename)
    return perfetto_trace(view, meta={"source": "live engine", "policy": policy, "n": n,
                                      "kept_requests": KEEP_REQUESTS})


def install_timeline(app: FastAPI, svc: SimService, tenant_of: Callable[[Request], Tenant]) -> None:
    """Record the engine's timelines (if it is a SimEngine) and serve them."""
    setter = getattr(svc.engine, "set_recorder", None)
    rec: TimelineRecorder | None = None
    if setter is not None:
        rec = TimelineRecorder(RecorderConfig(keep_requests=KEEP_REQUESTS, keep_samples=KEEP_SAMPLES))
        setter(rec)

    @app.get("/v1/topas/timeline")
    async def timeline(request: Request) -> JSONResponse:
        n = parse_params(request.query_params)
        if rec is None:
            raise ApiError(404, "timelines need the simulated engine (--engine sim)")
        tenant = tenant_of(request)
        # Freezing the records runs in the engine task (no races); building the JSON does not.
        tl = await svc.in_engine(lambda: rec.timeline(svc.engine.now))
        # nor encoding it (a few MB at the default bounds): a JSONResponse encodes its content
        # when it is built, and it was built on the loop
        return await asyncio.to_thread(lambda: JSONResponse(_render(tl, n, tenant, svc.config.policy)))
