"""The FastAPI application: OpenAI-compatible endpoints plus /v1/topas/* and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..workflow import Workflow
from .api_errors import ApiError, bad_request, shutting_down
from .bodies import CLIENT_GONE, done_before_client_left, parse_json_body, read_body
from .calls import Call
from .config import ServerConfig
from .labelling import resolve_label
from .metrics import CONTENT_TYPE, render_metrics
from .openai_format import ChunkWriter, full_response
from .protocol import ParsedCall, parse_chat, parse_completion
from .responders import Responder, make_responder
from .responses_api import ResponsesWriter, chat_body, in_responses_terms, response_object
from .service import EngineFactory, SimService
from .stats import build_stats_json
from .tenancy import EXEMPT_PATHS, Tenant, authenticate_scope, tenant_ids
from .textcheck import MAYBE_SURROGATE as _MAYBE_SURROGATE
from .textcheck import has_lone_surrogate
from .timeline_api import install_timeline
from .workflows import WorkflowRegistry, check_upload_fits, decode_upload, parse_upload

log = logging.getLogger("topas.server")
TENANT_KEY = "topas.tenant"  # ASGI scope key set by EdgeMiddleware
# Workflow uploads parsed at once in worker threads; more wait their turn. asyncio's default
# pool has min(32, cores + 4) threads (6 on 2 cores), shared with the parsing of big
# completion bodies: six slow uploads took them all and chat parsing stalled ~50 s.
MAX_CONCURRENT_UPLOAD_PARSES = 2


async def _send_error(send: Any, err: ApiError) -> None:
    body = json.dumps(err.body()).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class EdgeMiddleware:
    """Pure ASGI middleware, outermost: authentication (tenant into `scope`), a last-resort
    500 that is never re-raised (a re-raised exception reached uvicorn, which could reset the
    keep-alive connection), and response counts by route and status (streaming-safe)."""

    def __init__(self, app: Any, service: SimService) -> None:
        self.app = app
        self.service = service
        self.tenants = tenant_ids(service.config.api_keys)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status, started = 500, False

        async def send_status(message: dict) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        try:
            if scope.get("path") not in EXEMPT_PATHS:
                scope = {**scope, TENANT_KEY: authenticate_scope(scope, self.tenants)}
            await self.app(scope, receive, send_status)
        except ApiError as exc:  # authentication
            if not started:
                await _send_error(send_status, exc)
        except Exception as exc:  # a bug: answer 500 once, keep the connection usable
            log.exception("unhandled error")
            if not started:
                await _send_error(send_status, ApiError(500, f"internal error: {type(exc).__name__}",
                                                        type_="server_error"))
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "other"
            self.service.requests[(endpoint, status)] += 1


def _tenant(request: Request) -> Tenant:
    return request.scope.get(TENANT_KEY)


def _decode_call(raw: bytes, kind: str) -> tuple[Any, ParsedCall]:
    """JSON body -> (body, ParsedCall); every malformed input is a 400 (CPU-bound for big
    bodies: run in a worker thread). A Responses body is parsed as the chat body it means."""
    body = parse_json_body(raw)
    if _MAYBE_SURROGATE.search(raw) and has_lone_surrogate(body):
        raise bad_request("request body contains a lone UTF-16 surrogate escape (invalid Unicode)")
    if kind == "responses":
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object")
        return body, parse_chat(chat_body(body))
    return body, parse_chat(body) if kind == "chat" else parse_completion(body)


async def _off_loop(size: int, limit: int, fn: Any, *args: Any) -> Any:
    """`fn(*args)`, in a worker thread when the input is big enough to hold the event loop."""
    return await asyncio.to_thread(fn, *args) if size > limit else fn(*args)


def _parse_checked_upload(text: str, fits: Callable[[Workflow], None] | None) -> Workflow:
    """`POST /v1/topas/workflows` body text -> a workflow the engine can run (400 otherwise)."""
    wf = parse_upload(text)
    check_upload_fits(wf, fits)
    return wf


async def _wait_over(call: Call) -> None:
    while not call.over:
        await call.wait_change(call.generated)


async def _finished_or_gone(call: Call, request: Request) -> bool:
    """Wait for the call to end; False if the client went away first."""
    done = asyncio.ensure_future(_wait_over(call))
    try:
        await done_before_client_left(done, request)
    finally:
        done.cancel()
    return call.over


async def _stream(svc: SimService, call: Call, writer: ChunkWriter | ResponsesWriter) -> AsyncIterator[bytes]:
    try:
        first = writer.start()
        if first:
            yield first
        sent = ""
        while True:
            seen = call.generated
            text = call.text_upto(seen) if call.error is None else sent
            if len(text) > len(sent):
                yield writer.text(text[len(sent):])
                sent = text
            if call.error is not None:
                yield writer.failed(call.error)
                return
            if call.finished and len(sent) == len(call.text):
                break
            await call.wait_change(seen)
        yield writer.end()
    finally:  # client gone (generator cancelled/closed) before the end: free its KV
        svc.cancel_soon(call)


class _CallStream(StreamingResponse):
    """A streamed call that is cancelled in the engine if the response ends early for any
    reason, including a disconnect before the first chunk."""

    def __init__(self, content: AsyncIterator[bytes], svc: SimService, call: Call) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._svc = svc
        self._call = call

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._svc.cancel_soon(self._call)


def build_app(config: ServerConfig, *, responder: Responder | None = None,
              engine_factory: EngineFactory | None = None) -> FastAPI:
    """The app for `config`. `responder`/`engine_factory` override the configured ones
    (integrations plug in their responder; tests use a fake engine)."""
    registry = WorkflowRegistry(config.max_workflows, config.max_workflow_total_bytes)
    for name in config.workflows:
        registry.load(name)
    fits: Callable[[Workflow], None] | None = None  # an engine given by the caller: its own checks
    if engine_factory is None:
        from .engine_factory import check_startup_workflows_fit, sim_engine_factory, workflow_fit_check

        check_startup_workflows_fit(config, registry.mapping)
        engine_factory = sim_engine_factory
        fits = workflow_fit_check(config)
    svc = SimService(config, registry, responder or make_responder(config), engine_factory)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc.start()
        try:
            yield
        finally:
            await svc.stop()

    app = FastAPI(title="topas-agents simulated engine", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = svc
    app.add_middleware(EdgeMiddleware, service=svc)
    _add_error_handlers(app)
    _add_openai_routes(app, svc)
    _add_topas_routes(app, svc, fits)
    install_timeline(app, svc, _tenant)  # GET /v1/topas/timeline (docs/timelines.md)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = ApiError(exc.status_code, str(exc.detail))
        return JSONResponse(err.body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        err = bad_request(f"invalid request: {str(first.get('msg', 'validation error'))[:200]}",
                          ".".join(str(p) for p in first.get("loc", ())[1:]) or None)
        return JSONResponse(err.body(), status_code=400)
    # Other exceptions: EdgeMiddleware answers 500 (Starlette's handler for Exception re-raises)


def _add_openai_routes(app: FastAPI, svc: SimService) -> None:
    cfg = svc.config

    async def complete(request: Request, kind: str, endpoint: str) -> Response:
        if svc.draining:
            raise shutting_down()
        raw = await read_body(request, cfg.max_body_bytes)
        try:
            body, parsed = await _off_loop(len(raw), cfg.offload_bytes, _decode_call, raw, kind)
            rid = svc.new_rid(kind)
            metadata = body.get("metadata") if kind == "responses" else None  # may carry the label
            lab = resolve_label(body, request.headers, parsed, svc.registry, rid, _tenant(request), metadata,
                                svc.tracker.served_without_dag)
            call = await svc.submit(rid, parsed, lab, endpoint)
        except ApiError as exc:  # a Responses call is checked as the chat call it means
            raise (in_responses_terms(exc) if kind == "responses" else exc) from None
        model = parsed.model or cfg.model_name
        if parsed.stream:
            writer = ResponsesWriter(body, call, model) if kind == "responses" else \
                ChunkWriter(kind, call, model, parsed.include_usage)
            return _CallStream(_stream(svc, call, writer), svc, call)
        try:
            if not await _finished_or_gone(call, request):
                return Response(status_code=CLIENT_GONE)  # nobody is listening
        finally:
            svc.cancel_soon(call)  # no-op once the call is over
        if call.error is not None:
            raise call.error
        if kind == "responses":
            return JSONResponse(response_object(body, call, model))
        return JSONResponse(full_response(kind, call, model))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await complete(request, "chat", "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(request, "completion", "/v1/completions")

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        """The Responses API (SGLang serves it; the OpenAI Agents SDK's default): responses_api.py."""
        return await complete(request, "responses", "/v1/responses")

    def model_card() -> dict[str, Any]:
        return {"id": cfg.model_name, "object": "model", "created": int(time.time()), "owned_by": "topas-agents"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> dict[str, Any]:
        """openai's `models.retrieve` (SGLang serves it too): the served model, else 404."""
        if model != cfg.model_name:
            raise ApiError(404, f"The model '{model}' does not exist", "model", code="model_not_found")
        return model_card()


def _add_topas_routes(app: FastAPI, svc: SimService, fits: Callable[[Workflow], None] | None) -> None:
    upload_parses = asyncio.Semaphore(MAX_CONCURRENT_UPLOAD_PARSES)

    @app.get("/health")
    async def health() -> JSONResponse:
        status = svc.status
        body = {"status": status, "engine": svc.config.engine, "in_flight": len(svc.calls)}
        if svc.loop.failure is not None:
            body["error"] = str(svc.loop.failure)
        if svc.stalled_since is not None:  # requests wait, nothing runs: the policy admits none
            body["stalled_s"] = round(asyncio.get_running_loop().time() - svc.stalled_since, 3)
        if advancing := svc.advancing_s():  # a decision in progress (off the event loop)
            body["advancing_s"] = round(advancing, 3)
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/v1/topas/stats")
    async def stats(request: Request) -> Response:
        calls, tenant = _calls_param(request.query_params.get("calls")), _tenant(request)
        # JSON text as is: returning the dict ran FastAPI's jsonable_encoder over every row on
        # the event loop (0.2 s with 10 000 calls and tasks); rows that no longer change are
        # encoded once (stats.StatsRows)
        text = await svc.in_engine(lambda: build_stats_json(svc, calls, tenant))
        return Response(text, media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = await svc.in_engine(lambda: render_metrics(svc))
        return PlainTextResponse(text, media_type=CONTENT_TYPE)

    @app.get("/v1/topas/workflows")
    async def list_workflows(request: Request) -> dict[str, Any]:
        return {"workflows": svc.registry.names(_tenant(request))}

    @app.post("/v1/topas/workflows")
    async def add_workflow(request: Request) -> JSONResponse:
        raw = await read_body(request, svc.config.max_workflow_bytes)
        text = decode_upload(raw)
        if len(raw) <= svc.config.offload_bytes:
            wf = _parse_checked_upload(text, fits)
        else:
            async with upload_parses:
                wf = await asyncio.to_thread(_parse_checked_upload, text, fits)
        added = await svc.register_workflow(wf, _tenant(request), len(raw))
        body: dict[str, Any] = {"name": wf.name, "created": added.created, "stages": [s.name for s in wf.stages],
                                "agents": {a.name: a.prefix_tokens for a in wf.agents}}
        if added.warnings:
            body["warnings"] = added.warnings  # the key's own view: names as it registered them
        return JSONResponse(body, status_code=201 if added.created else 200)

    # One route for both done calls, split on the raw path: a task id or stage may hold "/"
    # (sent as %2F, which the ASGI server decodes before routing, so `{task_id}` never
    # matched such a task and it could not be closed).
    @app.post("/v1/topas/tasks/{target:path}")
    async def done(request: Request, target: str) -> dict[str, Any]:
        task_id, stage = done_target(request.scope.get("raw_path"), target)
        outcome = done_outcome(request.query_params.getlist("outcome"), stage)
        if stage is None:
            return await svc.task_done(task_id, _tenant(request), failed=outcome == "failed")
        return await svc.stage_done(task_id, stage, _tenant(request))


_DONE_PREFIX = b"/v1/topas/tasks/"
DoneOutcome = Literal["ok", "failed"]


def done_outcome(values: list[str], stage: str | None) -> DoneOutcome:
    """A task's done call may say how the task ended, once: `?outcome=ok` (the default) or
    `?outcome=failed` (no JCT: a run that raised or was interrupted is no finished task)."""
    if not values:
        return "ok"
    if len(values) > 1:
        raise bad_request(f"outcome given {len(values)} times: give it once", "outcome")
    if stage is not None:
        raise bad_request("outcome applies to a task's done call, not to a stage's", "outcome")
    if values[0] not in ("ok", "failed"):
        raise bad_request(f"outcome must be 'ok' or 'failed', got {values[0][:100]!r}", "outcome")
    return "failed" if values[0] == "failed" else "ok"


def done_target(raw_path: bytes | None, decoded: str) -> tuple[str, str | None]:
    """(task id, stage or None) of `POST /v1/topas/tasks/{task}/done` or
    `.../{task}/stages/{stage}/done`, each part percent-decoded (as UTF-8) from the raw path,
    so an id holding "/" arrives whole; 404 for any other shape. Without a raw path (an ASGI
    server that gives none) the decoded path is split instead."""
    if raw_path is not None:
        rest = raw_path.split(b"?", 1)[0]
        rest = rest[len(_DONE_PREFIX):] if rest.startswith(_DONE_PREFIX) else b""
    else:
        rest = decoded.encode("utf-8", "surrogateescape")
    parts = [unquote_to_bytes(p).decode("utf-8", "replace") for p in rest.split(b"/")]
    if len(parts) == 2 and parts[1] == "done" and parts[0]:
        return parts[0], None
    if len(parts) == 4 and parts[1] == "stages" and parts[3] == "done" and parts[0] and parts[2]:
        return parts[0], parts[2]
    raise ApiError(404, "Not Found")


def _calls_param(value: str | None) -> int | None:
    """`?calls=N`: an integer >= 0 (400 otherwise, in the OpenAI error shape)."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise bad_request("'calls' must be an integer in 0..999999999", "calls")
    return int(text)
