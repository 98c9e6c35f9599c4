"""The serving core: admits calls into the engine, tracks tasks, streams progress back.

`SimService` owns the engine loop and everything only the engine task may touch (tracker,
in-flight calls, records). HTTP handlers call its async methods; each runs as one command
inside the engine task.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..engine import Engine, OverBudgetError, RequestFactory
from ..errors import TaskError, TopasError
from ..labels import BODY_KEY
from ..policies import close_policy
from ..task_tracker import Action, StageDoneAction, TaskTracker
from ..workflow import Workflow
from .api_errors import ApiError, bad_request, from_task_error, shutting_down
from .bodies import CLIENT_GONE
from .calls import Call, CallRecord
from .config import ServerConfig
from .engine_loop import EngineLoop
from .labelling import ResolvedLabel
from .metrics import ServiceMetrics
from .openai_format import ToolCall
from .protocol import ParsedCall
from .responders import Responder, ResponseContext
from .stats import StatsRows
from .tenancy import qualify, tenant_names
from .tokens import count_tokens, truncate
from .workflows import WorkflowRegistry

log = logging.getLogger("topas.server")

# (config, workflows) -> (engine, its request constructor taking EngineRequest's keyword fields)
EngineFactory = Callable[[ServerConfig, Mapping[str, Workflow]], tuple[Engine, RequestFactory]]


class LengthHint(NamedTuple):
    """How long a reply should be: the client's max_tokens, else a draw from the workflow
    stage's output profile (`from_stage`), else None (the responder's own length)."""

    tokens: int | None
    from_stage: bool


class EngineProgress(NamedTuple):
    """What an engine callback reported during `advance`, applied to its call after `advance`
    returns (on the event loop: `advance` may run in a worker thread, and a call's asyncio
    event must be set on the loop). `generated` None: the request finished at `t`."""

    rid: str
    generated: int | None
    t: float


class Registration(NamedTuple):
    """An uploaded workflow's registration: new or the same again, and its agent warnings."""

    created: bool
    warnings: list[str]


class SimulatedReply(NamedTuple):
    """A call's reply: its text (a tool call's JSON arguments), the simulated output tokens,
    the decode reservation, the finish reason and the tool call."""

    text: str
    output_tokens: int
    max_new_tokens: int
    finish_reason: str
    tool: ToolCall | None


class SimService:
    def __init__(self, config: ServerConfig, registry: WorkflowRegistry, responder: Responder,
                 engine_factory: EngineFactory) -> None:
        self.config = config
        self.registry = registry
        self.responder = responder
        self.engine, self._make_request = engine_factory(config, registry.mapping)
        self.engine.on_token = self._on_token
        self.engine.on_finish = self._on_finish
        self.loop = EngineLoop(self.engine, config.time_scale, after_advance=self._after_advance,
                               periodic=self._periodic, on_failure=self._on_failure)
        self.tracker = TaskTracker(config.task_idle_timeout_s, config.max_task_history)
        self.calls: dict[str, Call] = {}  # in flight
        self.records: collections.deque[CallRecord] = collections.deque(maxlen=config.max_call_history)
        self.stats_rows = StatsRows()  # /v1/topas/stats rows that no longer change, encoded once
        self.stalled_since: float | None = None  # wall time the policy left waiting requests idle
        self.requests: collections.Counter[tuple[str, int]] = collections.Counter()  # (endpoint, status)
        self.call_status: collections.Counter[str] = collections.Counter()
        self.metrics = ServiceMetrics(self)  # /metrics: this service's own registry and histograms
        self.draining = False
        self._progress: list[EngineProgress] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.loop.start()

    async def stop(self) -> None:
        await self.drain(0.0)
        await self.loop.stop()
        # the guard's forecast worker would hold the exit; an engine from `engine_factory` need
        # not expose its policy (the Engine protocol names none): one that did not ended every
        # shutdown in an AttributeError ("Application shutdown failed")
        close_policy(getattr(self.engine, "policy", None))

    async def drain(self, timeout_s: float, cut_short: Callable[[], bool] = lambda: False) -> None:
        """Refuse new calls (503), let in-flight ones finish for `timeout_s` (or until
        `cut_short()`: a second Ctrl-C), fail the rest."""
        self.draining = True
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.calls and asyncio.get_running_loop().time() < deadline and not cut_short():
            await asyncio.sleep(0.02)
        if self.calls:
            err = ApiError(503, "server shut down before the request finished")
            with contextlib.suppress(ApiError):  # the engine loop already stopped
                await self.loop.call(lambda: self._fail_all(err, "failed"))

    @property
    def status(self) -> str:
        if self.loop.failure is not None:
            return "failed"
        if self.advancing_s() > self.config.stuck_advance_s:
            return "stuck"  # a decision that never ends: /health answers during it, so says so
        return "draining" if self.draining else "ok"

    def advancing_s(self) -> float:
        """Wall seconds the engine's advance in progress (in its worker thread) has run; 0 if none."""
        since = self.loop.advancing_since
        return 0.0 if since is None else asyncio.get_running_loop().time() - since

    # ------------------------------------------------------------------ calls

    @staticmethod
    def new_rid(kind: str) -> str:
        # the id the answer carries (OpenAI's forms: chatcmpl-, cmpl-, resp_), so a call's id
        # finds its stats record; a Responses call's rid was resp-<hex> under the id resp_<hex>
        if kind == "responses":
            return f"resp_{uuid.uuid4().hex[:24]}"
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"

    async def submit(self, rid: str, call: ParsedCall, lab: ResolvedLabel, endpoint: str) -> Call:
        if self.draining:
            raise shutting_down()
        with tenant_names(lab.tenant):
            return await self.loop.call(lambda: self._submit(rid, call, lab, endpoint))

    def cancel_soon(self, c: Call) -> None:
        """Cancel an abandoned call (client gone); never blocks, safe in finally blocks."""
        if not c.over:
            self.loop.call_soon(lambda: self._cancel(c))

    async def stage_done(self, task_id: str, stage: str, tenant: str | None = None) -> dict[str, Any]:
        """`task_id` as the tenant named it (a tenant reaches only its own tasks)."""
        with tenant_names(tenant):
            return await self.loop.call(lambda: self._explicit(qualify(tenant, task_id), stage, tenant))

    async def task_done(self, task_id: str, tenant: str | None = None, failed: bool = False) -> dict[str, Any]:
        """`failed`: the client says the task failed (it ends with no JCT, `tasks.failed`)."""
        with tenant_names(tenant):
            return await self.loop.call(lambda: self._explicit(qualify(tenant, task_id), None, tenant, failed))

    async def register_workflow(self, wf: Workflow, tenant: str | None, size: int) -> Registration:
        """Register an upload in the engine task: the engine reads the registry's mapping while
        it advances (maybe in the loop's worker thread), and one registration must not
        interleave with another's conflict check."""
        def register() -> Registration:
            warnings = self.registry.agent_conflicts(wf, tenant)
            return Registration(self.registry.add(wf, tenant, size), warnings)
        return await self.loop.call(register)

    async def in_engine(self, fn: Callable[[], Any]) -> Any:
        """Run `fn()` inside the engine task (stats, metrics)."""
        return await self.loop.call(fn)

    # ------------------------------------------------------------------ engine-task side

    def _length(self, call: ParsedCall, lab: ResolvedLabel, round_: int) -> LengthHint:
        if call.max_tokens is not None:
            return LengthHint(call.max_tokens, False)
        if lab.workflow is not None:
            rng = random.Random(f"{self.config.seed}:{lab.task_id}:{lab.stage}:{round_}")
            return LengthHint(lab.workflow.stage(lab.stage).output_tokens.sample(rng), True)
        return LengthHint(None, False)

    def _response(self, call: ParsedCall, lab: ResolvedLabel, round_: int) -> SimulatedReply:
        target, from_stage = self._length(call, lab, round_)
        ctx = ResponseContext(call.kind, call.messages, call.last_user, lab.task_id, lab.stage, lab.agent,
                              round_, lab.labelled, target, call.tools, call.response_format)
        reply = self.responder.respond(ctx)
        tool = reply if isinstance(reply, ToolCall) else None
        whole = tool.arguments if tool else reply
        if tool is None and call.stop:  # a real engine stops generating at the first one
            whole = whole[: min((i for i in map(whole.find, call.stop) if i >= 0), default=len(whole))]
        text = whole[: self.config.max_response_chars]
        # A cut reply is reported as cut, like OpenAI's "length" for output past max_tokens:
        # "tool_calls" (or "stop") would claim complete output, and a cut tool call's
        # arguments are not valid JSON.
        done = "length" if len(text) < len(whole) else "tool_calls" if tool else "stop"
        natural = max(1, count_tokens(text))
        if from_stage:  # the workload decides the simulated length; the text stays whole
            return SimulatedReply(text, target or 1, target or 1, done, tool)
        limit = call.max_tokens if call.max_tokens is not None else self.config.default_max_tokens
        if natural > limit:
            return SimulatedReply(truncate(text, limit), limit, call.max_tokens or limit, "length", tool)
        return SimulatedReply(text, natural, call.max_tokens or natural, done, tool)

    def _submit(self, rid: str, call: ParsedCall, lab: ResolvedLabel, endpoint: str) -> Call:
        if lab.workflow is not None:  # a tenant's first call to a shared workflow: the engine sees it now
            self.registry.publish(lab.workflow)
        try:
            arrival, known = self.tracker.check_call(lab.task_id, lab.workflow_name)
        except TaskError as exc:
            raise from_task_error(exc) from None
        if known is not None and known.done_reason is not None and known.done_reason != "abandoned":
            # a retry, or a client that reuses ids across runs: its JCT now spans both
            log.warning("task %r ended (%s) and has a new call: reopened, its JCT runs from its first "
                        "arrival; a new run needs a new task_id", lab.task_id[:80], known.done_reason)
        round_ = self.tracker.next_round(lab.task_id, lab.stage)
        text, n_out, max_new, reason, tool = self._response(call, lab, round_)
        now = self.engine.now
        input_tokens = max(1, call.prompt_tokens - lab.prefix_tokens)
        req = self._make_request(
            rid=rid, task_id=lab.task_id, workflow=lab.workflow.name if lab.workflow else None,
            stage=lab.stage, agent=lab.agent, prefix_tokens=lab.prefix_tokens, input_tokens=input_tokens,
            output_tokens=n_out, max_new_tokens=max_new, round=round_,
            task_arrival_s=arrival if arrival is not None else now)
        try:
            self.engine.submit(req)
        except OverBudgetError as exc:  # the request can never run: a context-length error, in the
            # words and code OpenAI-compatible servers use (frameworks trim their context on them)
            raise ApiError(400, f"maximum context length exceeded: {exc}", self._over_budget_param(call, lab, input_tokens),
                           code="context_length_exceeded") from None
        except TopasError as exc:  # a malformed request the engine refused
            raise bad_request(str(exc), self._over_budget_param(call, lab, input_tokens)) from None
        actions = self.tracker.commit_call(lab.task_id, lab.stage, lab.workflow, lab.workflow_name,
                                           not lab.labelled, now, self._wall(), owner=lab.tenant)
        self._apply(actions)
        record = CallRecord(rid, endpoint, lab.label.to_body() if lab.label else None, lab.source,
                            lab.task_id, lab.stage, lab.agent, lab.workflow_name, round_, lab.prefix_tokens,
                            lab.prefix_source, input_tokens, n_out, max_new, now, tenant=lab.tenant)
        self.records.append(record)
        c = Call(rid, record, text, n_out, reason, tool)
        self.calls[rid] = c
        return c

    def _over_budget_param(self, call: ParsedCall, lab: ResolvedLabel, input_tokens: int) -> str | None:
        """The request field that makes a call too big for the KV budget: the label's
        prefix_tokens when it alone is too big, else the prompt when it is, else max_tokens when
        the client set it (None: the server's default length, or an engine without a budget)."""
        budget = getattr(self.engine, "kv_budget", None)
        if isinstance(budget, int):
            if lab.prefix_source == "label" and lab.prefix_tokens > budget:
                return f"{BODY_KEY}.prefix_tokens"
            if lab.prefix_tokens + input_tokens > budget:
                return "messages" if call.kind == "chat" else "prompt"
        return "max_tokens" if call.max_tokens is not None else None

    def _cancel(self, c: Call) -> None:
        if self.calls.pop(c.rid, None) is None:
            return  # finished (or failed) meanwhile
        self.engine.cancel(c.rid)
        c.fail(ApiError(CLIENT_GONE, "client disconnected"))
        self._end(c, "cancelled", self.engine.now)

    def _end(self, c: Call, status: str, t: float) -> None:
        c.record.status = status  # type: ignore[assignment]
        c.record.finish_s = t
        c.record.finish_reason = c.finish_reason if status == "ok" else status
        self.call_status[status] += 1
        r = c.record
        if status == "ok":
            self.metrics.observe_call(r)
        self._apply(self.tracker.end_call(r.task_id, r.stage, status == "ok", t, self._wall()))

    def _fail_all(self, err: ApiError, status: str) -> None:
        for rid, c in list(self.calls.items()):
            del self.calls[rid]
            try:
                self.engine.cancel(rid)
            except Exception:  # a failed engine may refuse; the call is failed regardless
                log.warning("engine.cancel(%s) failed", rid, exc_info=True)
            c.fail(err)
            self._end(c, status, self.engine.now)

    def _explicit(self, task_id: str, stage: str | None, tenant: str | None, failed: bool = False) -> dict[str, Any]:
        now, wall = self.engine.now, self._wall()
        try:
            if stage is None:
                actions = self.tracker.task_done(task_id, now, wall, failed)
            else:
                actions = self.tracker.stage_done(task_id, stage, now, wall)
        except TaskError as exc:
            raise from_task_error(exc) from None
        self._apply(actions)
        from .stats import task_json

        task = self.tracker.active.get(task_id) or self.tracker.finished[task_id]
        return task_json(task, tenant)

    def _apply(self, actions: list[Action]) -> None:
        for a in actions:
            try:
                if isinstance(a, StageDoneAction):
                    self.engine.stage_done(a.task_id, a.stage)
                else:
                    self.engine.task_done(a.task_id)
            except TopasError as exc:
                log.warning("engine rejected %s: %s", a, exc)

    # callbacks fired inside engine.advance(), maybe in the loop's worker thread: record only,
    # and apply after it returns, on the event loop
    def _on_token(self, rid: str, n_generated: int) -> None:
        self._progress.append(EngineProgress(rid, n_generated, self.engine.now))

    def _on_finish(self, rid: str, t: float) -> None:
        self._progress.append(EngineProgress(rid, None, t))

    def _after_advance(self) -> None:
        progress, self._progress = self._progress, []
        finished: list[EngineProgress] = []
        for p in progress:
            c = self.calls.get(p.rid)
            if c is None:
                continue
            if p.generated is None:
                if c.record.first_token_s is None:
                    c.record.first_token_s = p.t
                c.on_finish()
                finished.append(p)
            else:
                if c.record.first_token_s is None and p.generated > 0:
                    c.record.first_token_s = p.t
                c.on_token(p.generated)
        for p in finished:
            c = self.calls.pop(p.rid, None)
            if c is not None:
                self._end(c, "ok", p.t)

    def _periodic(self, wall: float) -> None:
        self._apply(self.tracker.expire_idle(self.engine.now, wall))
        self._ask_a_stalled_policy_again(wall)

    def _ask_a_stalled_policy_again(self, wall: float) -> None:
        """A policy that admitted nothing while requests wait and nothing is scheduled would
        be asked again only at the next arrival: its callers hung with /health "ok" and no
        word in the log. It is asked again at every periodic tick (a policy holding requests
        for a batching window then serves them), and the stall is logged once and shown as
        /health's `stalled_s`."""
        redecide = getattr(self.engine, "redecide", None)
        waiting = 0 if redecide is None or self.engine.next_event_time() is not None else \
            len(self.engine.snapshot().waiting)
        if not waiting:
            self.stalled_since = None
            return
        if self.stalled_since is None:
            self.stalled_since = wall
            log.warning("policy %r left %d request(s) waiting with nothing running or scheduled: asked again "
                        "every %.2f s until it admits", self.config.policy, waiting, self.loop.max_sleep_s)
        redecide()

    def _on_failure(self, exc: BaseException) -> None:
        self._fail_all(ApiError(500, f"engine failed: {exc}", type_="server_error"), "failed")

    @staticmethod
    def _wall() -> float:
        return asyncio.get_running_loop().time()
