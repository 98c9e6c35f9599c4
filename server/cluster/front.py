"""The Topas front: the one URL a cluster's clients use, in front of smg and the replicas.

Data plane (`/v1/chat/completions`, `/v1/completions`, `/v1/models`): relayed to smg, bytes
streamed through, after three things smg cannot do itself:
- a label sent only in `X-Topas-*` headers is copied into the body's `topas` field (smg
  forwards the body but drops those headers);
- the routing key (`X-Topas-Route-Key`, the label's task id or agent) is set from the label,
  body or headers, so clients that only use `extra_body` are routed by task too;
- the request's `model` is mapped to the replicas' served model (smg answers 404 for other
  names, while one Topas server accepts any).
Control plane (smg does not proxy it): `/v1/topas/*` and `/metrics`, fanned out to the
replicas and answered as one (`aggregate.py`). See docs/cluster.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from topas_agents.labels import MAX_LABEL_CHARS
from topas_agents.server.api_errors import ApiError, bad_request, shutting_down
from topas_agents.server.app import done_outcome
from topas_agents.server.bodies import CLIENT_GONE, done_before_client_left, read_body
from topas_agents.server.tenancy import EXEMPT_PATHS, authenticate_scope, tenant_ids

from .aggregate import (
    ReplicaAnswer,
    aggregate_stats,
    client_error,
    metrics_page,
    missing_replicas,
    no_replica_served,
    pick_owner_answer,
    pick_registration_answer,
)
from .commands import cluster_api_key
from .config import ROUTE_KEY_HEADER, ClusterConfig
from .drain import RelayDrain
from .relay import RelayResponse, get_from_gateway, post_to_gateway, rewrite_call
from .requests import (
    CALLS_PROBLEM,
    MAX_CALL_BODY_BYTES,
    MAX_CALLS_DIGITS,
    MAX_WORKFLOW_BODY_BYTES,
    OFFLOAD_BYTES,
    done_path,
)
from .supervisor import GATEWAY, Registration, RestartEvent

_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length"}
# Set by the front's own HTTP server on every response: relayed from smg too, they came twice.
_UPSTREAM_ONLY = {"date", "server"}


class Front:
    """The front's state: the cluster layout, one HTTP client, the served model id."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.client: httpx.AsyncClient | None = None
        self.served_model: str | None = None
        # run-time registrations, replayed on a restarted replica (supervisor.py); read from
        # the supervisor's thread, hence the lock. One per (workflow name, key): the replicas
        # hold one definition per name and key, so the record stays as bounded as their
        # quota; keyed by body it grew by a copy of every re-registration whose text differed
        # (spacing, key order) though the replicas answered "already registered".
        self._registrations: dict[tuple[str, str | None], Registration] = {}
        self._lock = threading.Lock()
        self.restart_events: Sequence[RestartEvent] = ()  # the supervisor's list, set by the launcher
        self.drain = RelayDrain()  # the relays in flight, drained on stop (drain.py)

    def registrations(self) -> list[Registration]:
        with self._lock:
            return list(self._registrations.values())

    @property
    def http(self) -> httpx.AsyncClient:
        if self.client is None:  # created on the serving loop (lifespan)
            limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
            self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), limits=limits)
        return self.client

    async def model_id(self) -> str | None:
        if self.served_model is None:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                r = await self.http.get(f"{self.config.smg_url}/v1/models", timeout=5.0)
                self.served_model = r.json()["data"][0]["id"]
        return self.served_model

    async def one(self, url: str, method: str, path: str, content: bytes | None = None,
                  headers: Mapping[str, str | bytes] | None = None, parse: bool = True) -> ReplicaAnswer:
        """`parse=False`: the body as bytes (`_stats_view` reads it later, off the event loop)."""
        try:
            r = await self.http.request(method, url + path, content=content, headers=headers,
                                        timeout=self.config.control_timeout_s)
        except httpx.InvalidURL as exc:  # not an HTTPError: the request's URL, not the replica
            raise bad_request(f"request URL cannot be forwarded: {exc} ({len(url + path)} characters)") from None
        except httpx.HTTPError as exc:
            return ReplicaAnswer(url, None, None, f"{type(exc).__name__}: {exc}")
        return ReplicaAnswer(url, r.status_code, _parsed(r.content) if parse else r.content)

    async def fan_out(self, request: Request, method: str, path: str,
                      content: bytes | None = None, parse: bool = True) -> list[ReplicaAnswer]:
        """The call on every replica at once, with the caller's credentials (replicas started
        with --api-key check them on the control plane too)."""
        auth = request.headers.get("authorization")
        # as the bytes the client sent (Starlette reads Latin-1; httpx would encode text as ASCII)
        headers = {"Authorization": auth.encode("latin-1")} if auth else None
        return list(await asyncio.gather(*(self.one(u, method, path, content, headers, parse)
                                           for u in self.config.replica_urls)))

    # ------------------------------------------------------------------ data plane

    async def relay(self, request: Request) -> Response:
        if self.drain.draining:
            raise shutting_down()
        raw = await read_body(request, MAX_CALL_BODY_BYTES)
        # the client's header bytes as they came: Starlette reads them as Latin-1 and httpx
        # would encode that text as ASCII, so a non-ASCII value (a UTF-8 X-Topas-Task-Id) was a 500
        drop = _HOP | {ROUTE_KEY_HEADER.lower()}
        headers = [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in drop]
        model = await self.model_id()
        # parsing and re-encoding a big body (16 MiB: about 0.25 s here) held every relay
        # on the event loop; above a replica's own threshold it runs in a worker thread
        args = (raw, request.headers, request.url.path, model, self.config.router_policy)
        call = await asyncio.to_thread(rewrite_call, *args) if len(raw) > OFFLOAD_BYTES else rewrite_call(*args)
        raw = call.body
        if call.route_key is not None:
            headers.append((ROUTE_KEY_HEADER.encode("ascii"), call.route_key))
        send = asyncio.ensure_future(self._to_gateway(request.url.path, raw, headers))
        if not await done_before_client_left(send, request):
            # the client left before smg answered (a non-streaming call: smg answers when it
            # is over): cut the relay, so smg cancels the replica's call, as one server does;
            # waiting kept it running to its end, counted "ok"
            send.cancel()
            with contextlib.suppress(BaseException):
                await send
            return Response(status_code=CLIENT_GONE)
        try:
            resp = send.result()
        except httpx.HTTPError as exc:
            return _error(502, f"gateway unreachable: {type(exc).__name__}: {exc}")
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP | _UPSTREAM_ONLY}
        return RelayResponse(self.drain.body(resp), resp, status_code=resp.status_code, headers=out_headers)

    def _gateway_wait_s(self) -> float:
        """How long a call waits for a restarting smg: none once the supervisor gave up on it."""
        gave_up = any(e.process == GATEWAY and e.outcome == "gave_up" for e in list(self.restart_events))
        return self.config.restart.gateway_wait_s if self.config.restart.enabled and not gave_up else 0.0

    async def _to_gateway(self, path: str, raw: bytes, headers: list[tuple[bytes, bytes]]) -> httpx.Response:
        return await post_to_gateway(self.http, self.config.smg_url + path, raw, headers, self._gateway_wait_s(),
                                     lambda: self.drain.draining)

    async def models(self, request: Request) -> Response:
        """`/v1/models` and `/v1/models/{id}` (openai's models.retrieve), as smg answers them."""
        path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path  # id as sent
        try:  # as calls do, it waits for a restarting smg
            r = await get_from_gateway(self.http, f"{self.config.smg_url}{path}", self._gateway_wait_s(),
                                       lambda: self.drain.draining)
        except httpx.HTTPError as exc:
            return _error(502, f"gateway unreachable: {exc}")
        return Response(r.content, status_code=r.status_code, media_type="application/json")

    # ------------------------------------------------------------------ control plane

    async def health(self, request: Request) -> JSONResponse:
        if self.drain.draining:  # as one server: a load balancer stops sending calls it refuses
            return JSONResponse({"status": "draining"}, status_code=503)
        replicas = await self.fan_out(request, "GET", "/health")
        gateway = await self.one(self.config.smg_url, "GET", "/health")
        up = sum(1 for a in replicas if a.ok)
        ok = gateway.ok and up > 0
        return JSONResponse({"status": "ok" if ok else "degraded", "gateway": gateway.brief(),
                             "replicas_up": up, "replicas": [a.brief() for a in replicas]},
                            status_code=200 if ok else 503)

    async def layout(self, request: Request) -> JSONResponse:
        c = self.config
        return JSONResponse({"front": c.front_url, "gateway": c.smg_url, "replicas": list(c.replica_urls),
                             "engine": c.engine, "router_policy": c.router_policy,
                             "route_key_header": ROUTE_KEY_HEADER,
                             "restarts": [e.as_dict() for e in list(self.restart_events)]})

    def _restarted(self) -> list[int]:
        """The replica (1-based) of each process the supervisor started in place of a dead one."""
        return [e.replica for e in list(self.restart_events) if e.outcome == "restarted" and e.replica is not None]

    async def no_control_plane(self, request: Request) -> JSONResponse:
        """SGLang replicas have no `/v1/topas/*` endpoints: answer what to use instead (a fan-out
        would only collect 404s, and an aggregate of none would read as 'no replica up')."""
        return _error(501, "the SGLang replicas have no Topas control plane: workflows are registered "
                      "at start (topas serve --workflow), a task ends when its workflow's stages are "
                      "done or after --task-idle-timeout without calls, and each replica's plugin "
                      "reports through its decision log (--decision-log F.jsonl: one file per "
                      "replica, F.replica-<i>.jsonl); see docs/cluster.md", "not_implemented")

    async def stats(self, request: Request) -> JSONResponse:
        calls = request.query_params.get("calls")
        if calls is not None and len(calls.strip()) > MAX_CALLS_DIGITS:
            raise bad_request(CALLS_PROBLEM, "calls")
        suffix = "?" + urllib.parse.urlencode({"calls": calls}) if calls is not None else ""
        raw = await self.fan_out(request, "GET", "/v1/topas/stats" + suffix, parse=False)
        restarts = len(self._restarted())
        full = request.query_params.get("full") in ("1", "true")
        # megabytes of JSON per replica with full histories: read, merged and written in a
        # thread (on the event loop they held every relay 0.6-0.8 s per stats request)
        return await asyncio.to_thread(_stats_view, raw, restarts, full)

    async def metrics(self, request: Request) -> Response:
        answers = await self.fan_out(request, "GET", "/metrics")
        if (refused := _refused(answers)) is not None:
            return refused
        if (down := _none_served(answers, "/metrics")) is not None:
            return down
        texts = [a.body if a.ok and isinstance(a.body, str) else None for a in answers]
        # each text parsed and written again (about 4 ms a replica): off the event loop
        page = await asyncio.to_thread(metrics_page, texts, self._restarted())
        return PlainTextResponse(page, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def list_workflows(self, request: Request) -> JSONResponse:
        answers = await self.fan_out(request, "GET", "/v1/topas/workflows")
        if (refused := _refused(answers)) is not None:
            return refused
        if (down := _none_served(answers, "/v1/topas/workflows")) is not None:
            return down
        names = sorted({n for a in answers if a.ok and isinstance(a.body, Mapping)
                        for n in a.body.get("workflows", [])})
        # replicas_up as in /v1/topas/stats; replicas_missing: whose names may be missing here
        return JSONResponse({"workflows": names, "replicas_up": sum(a.ok for a in answers),
                             "replicas_missing": missing_replicas(answers), "replicas": [
            {**a.brief(), "workflows": a.body.get("workflows") if a.ok and isinstance(a.body, Mapping) else None}
            for a in answers]})

    async def add_workflow(self, request: Request) -> JSONResponse:
        raw = await read_body(request, MAX_WORKFLOW_BODY_BYTES)
        status, body = pick_registration_answer(await self.fan_out(request, "POST", "/v1/topas/workflows", raw))
        # recorded (replayed on restarted replicas) only when no replica refused it: a split
        # registration is not replayed (docs/cluster.md, "Control plane")
        name = body.get("name")
        if status in (200, 201) and isinstance(name, str):
            # a keyless cluster takes any Authorization: replay without one
            auth = request.headers.get("authorization") if cluster_api_key(self.config) is not None else None
            with self._lock:
                self._registrations.setdefault((name, auth), Registration(raw, auth))
        return JSONResponse(body, status_code=status)

    async def done(self, request: Request) -> JSONResponse:
        raw_path = request.scope.get("raw_path")  # keeps a task id's percent-escapes as sent
        target = done_path(raw_path or request.url.path.encode("utf-8", "surrogateescape"))
        path, task_id = target.path, target.task_id
        if len(task_id) > MAX_LABEL_CHARS:  # no replica has it (and 70000 characters overflowed httpx's URL limit)
            raise ApiError(404, f"unknown task '{task_id[:300]}'", "task_id")  # a replica's words
        if done_outcome(request.query_params.getlist("outcome"), target.stage) == "failed":
            path += "?outcome=failed"  # the owner ends it without a JCT
        status, body = pick_owner_answer(await self.fan_out(request, "POST", path))
        return JSONResponse(body, status_code=status)

    async def no_timeline(self, request: Request) -> JSONResponse:
        """Timelines are recorded per replica (each engine its own); a merged one would mix
        independent simulated clocks. Say where to read them instead of a generic 404."""
        return _error(501, "the front does not merge timelines: each replica records its own; read "
                      f"GET /v1/topas/timeline on a replica ({', '.join(self.config.replica_urls)}); "
                      "see docs/timelines.md", "not_implemented")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """An unknown route or a wrong method, answered as the single server answers it
    (server/app.py): an OpenAI-style body (405 keeps its Allow header)."""
    return JSONResponse(ApiError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code,
                        headers=exc.headers)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    """A request the front itself refuses (413, a body that is not JSON, ...), in the replicas' words."""
    return JSONResponse(exc.body(), status_code=exc.status)


def _parsed(content: bytes) -> Any:
    """A replica's answer: its JSON, else its text."""
    try:
        return json.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace")


def _stats_view(raw: Sequence[ReplicaAnswer], restarts: int, full: bool) -> Response:
    """The cluster's `/v1/topas/stats` from the replicas' unparsed answers (run in a thread)."""
    answers = [ReplicaAnswer(a.url, a.status, _parsed(a.body) if isinstance(a.body, bytes) else a.body, a.error)
               for a in raw]
    if (refused := _refused(answers)) is not None:  # e.g. ?calls=-1: their 400, not an empty view
        return refused
    if (down := _none_served(answers, "/v1/topas/stats")) is not None:
        return down
    view = aggregate_stats(answers)
    view["cluster"]["restarts"] = restarts  # a restarted replica's counters begin again: totals drop
    if full:
        view["replica_stats"] = [a.body if a.ok else None for a in answers]
    return JSONResponse(view)  # rendered here, in the thread


def _none_served(answers: Sequence[ReplicaAnswer], what: str) -> JSONResponse | None:
    """503 when no replica served a fanned-out read (`no_replica_served`)."""
    down = no_replica_served(answers, what)
    return None if down is None else JSONResponse(down.body, status_code=down.status)


def _refused(answers: Sequence[ReplicaAnswer]) -> JSONResponse | None:
    """The replicas' 4xx when every one that answered refused the request (`client_error`)."""
    refused = client_error(answers)
    return None if refused is None else JSONResponse(refused.body, status_code=refused.status)


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "server_error", "param": None, "code": code}},
                        status_code=status)


class FrontAuth:
    """Pure ASGI middleware: with an API key, every endpoint but `/health` needs it, checked
    here first and answered as a replica answers it (401 `invalid_api_key`). Without it the
    front's own answers (the layout, smg's model list, the bounds on ids) went to callers
    without a key, and an over-long id got its 404 before the replicas' 401."""

    def __init__(self, app: Any, api_key: str | None) -> None:
        self.app = app
        self.tenants = tenant_ids((api_key,)) if api_key is not None else {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.tenants and scope["type"] == "http" and scope.get("path") not in EXEMPT_PATHS:
            try:
                authenticate_scope(scope, self.tenants)
            except ApiError as exc:
                await JSONResponse(exc.body(), status_code=exc.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_front(config: ClusterConfig) -> Starlette:
    front = Front(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await front.close()

    routes = [
        Route("/v1/chat/completions", front.relay, methods=["POST"]),
        Route("/v1/completions", front.relay, methods=["POST"]),
        Route("/v1/responses", front.relay, methods=["POST"]),
        Route("/v1/models", front.models, methods=["GET"]),
        Route("/v1/models/{model:path}", front.models, methods=["GET"]),
        Route("/health", front.health, methods=["GET"]),
        Route("/metrics", front.metrics, methods=["GET"]),
        Route("/v1/topas/cluster", front.layout, methods=["GET"]),
    ]
    # the replicas' control plane, fanned out; SGLang replicas have none (no_control_plane)
    replica_control = config.engine != "sglang"
    routes += [
        Route(path, handler if replica_control else front.no_control_plane, methods=[method])
        for path, handler, method in (
            ("/v1/topas/stats", front.stats, "GET"),
            ("/v1/topas/workflows", front.list_workflows, "GET"),
            ("/v1/topas/workflows", front.add_workflow, "POST"),
            ("/v1/topas/timeline", front.no_timeline, "GET"),
            # task and stage done, forwarded on the raw path: the replicas split it
            # (server/app.py `done_target`), so an id holding "/" (%2F) arrives whole
            ("/v1/topas/tasks/{target:path}", front.done, "POST"),
        )
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error,
                                                                           ApiError: _api_error},
                    middleware=[Middleware(FrontAuth, api_key=cluster_api_key(config))])
    app.state.front = front
    return app
