"""`task(...)`: one labelled task scope that tells the server when the task is over.

    from topas_agents.integrations.task import task

    with task(base_url="http://127.0.0.1:8000/v1", task_id="t1"):      # or `async with`
        with label(stage="plan", agent="planner"):
            client.chat.completions.create(...)
    # on exit: POST /v1/topas/tasks/t1/done: the task ends there (its JCT runs to the done
    # call, so work after the last LLM call inside the block counts)

A task labelled without a registered workflow is otherwise only concluded by the server's
idle timeout (300 s by default) or an explicit done call; with a workflow the server infers
the end at the last stage's call, and the done call is harmless. The scope is a partial label
(task_id, workflow): inner `label(stage=..., agent=...)` blocks or framework roles supply the
rest; a labelled client's call made inside it without them goes out unlabelled, with a warning
(once per task).

Light: imports httpx and the label module only (no server, no MetaGPT).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from topas_agents import labels
from topas_agents.errors import ConfigError

log = logging.getLogger("topas.task")
DONE_TIMEOUT_S = 10.0  # the done call is one small POST; a stuck server must not hang the exit


@dataclass(frozen=True, slots=True)
class TaskHandle:
    task_id: str
    base_url: str | None  # None: no done call (the server infers the end or times out)
    workflow: str | None = None


def fields_in_force() -> dict[str, Any]:
    """The label fields in force, complete or partial (task scope only)."""
    return labels.current_fields()


def server_root(base_url: str) -> str:
    """`http://h:p/v1` -> `http://h:p` (the /v1/topas/* paths hang off the root)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer KEY` for a server started with an API key; {} without one."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def refused_key_message(base_url: str, api_key: str | None, status: int) -> str:
    """What a client command says when the server answers 401/403 to its probe: a refused key,
    or a call that sent none (the commands take --api-key or TOPAS_API_KEY)."""
    what = "the API key" if api_key else "a call without an API key (give --api-key KEY or set TOPAS_API_KEY)"
    return f"the server at {base_url} refused {what} (HTTP {status})"


# Answers to a workflow upload from a server that takes none: plain SGLang/vLLM (404/405),
# SGLang with the plugin (404: workflows at start only), a cluster front over SGLang replicas (501).
NO_WORKFLOW_UPLOADS = frozenset({404, 405, 501})


def post_workflow(base_url: str, definition: Mapping[str, Any], api_key: str | None, timeout_s: float) -> httpx.Response:
    """POST a workflow mapping (YAML) to the server's /v1/topas/workflows; httpx errors propagate."""
    import yaml

    return httpx.post(f"{server_root(base_url)}/v1/topas/workflows", content=yaml.safe_dump(dict(definition), sort_keys=False),
                      headers=auth_headers(api_key), timeout=timeout_s)


def done_url(base_url: str, task_id: str, failed: bool = False) -> str:
    """`failed`: the task failed (`?outcome=failed`: the server ends it without a JCT)."""
    url = f"{server_root(base_url)}/v1/topas/tasks/{labels.path_segment(task_id)}/done"
    return url + "?outcome=failed" if failed else url


def _report(task_id: str, rsp: httpx.Response | None, exc: Exception | None, missing_ok: bool = False,
            unlabelled_calls: int = 0) -> bool:
    """True if the server closed the task; anything else is a warning, never an exception
    (the block's own outcome matters more, and plain vLLM/SGLang have no such endpoint).
    `missing_ok`: a 404 is expected (a runner pointed at a server that may be plain SGLang).
    `unlabelled_calls`: calls of the task that went out unlabelled (the likely reason for a 404)."""
    if exc is not None:
        log.warning("task-done for %s failed: %s", task_id, _describe(exc))
        return False
    assert rsp is not None
    if rsp.status_code == 404:
        if not missing_ok:
            log.warning("task-done for %s: %s", task_id, _not_found(rsp, unlabelled_calls))
    elif rsp.status_code in (401, 403):
        log.warning("task-done for %s: the server refused the API key (HTTP %s): give task(api_key=...), "
                    "task(client=...) with the client that holds the server's key, or --api-key",
                    task_id, rsp.status_code)
    elif rsp.status_code >= 400:
        log.warning("task-done for %s: HTTP %s %s", task_id, rsp.status_code, rsp.text[:200])
    return rsp.status_code < 400


def _describe(exc: BaseException) -> str:
    """`exc` in a log line; an exception group (anyio's, from an async connect) by its first
    member, whose message says what went wrong ("unhandled errors in a TaskGroup" does not)."""
    members = getattr(exc, "exceptions", None)
    if members:
        return _describe(members[0])
    return f"{type(exc).__name__}: {exc}"


def _not_found(rsp: httpx.Response, unlabelled_calls: int = 0) -> str:
    """Why a done call found nothing: a Topas server names the unknown task (its calls went out
    unlabelled, or none was ever accepted: refused calls, or calls that went to another server);
    any other server has no done endpoint."""
    try:
        body = rsp.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str) and message.startswith("unknown task") and unlabelled_calls:
        return (f"the server has no such task ({message[:200]}): {unlabelled_calls} call(s) made inside it went "
                "out unlabelled (no stage/agent label in force): open label(stage=..., agent=...) inside the task")
    if isinstance(message, str) and message.startswith("unknown task"):
        return (f"the server has no such task ({message[:200]}): none of its calls was accepted there "
                "(each was refused, or went to another server)")
    return ("the server has no done endpoint (HTTP 404): it is not the embedded Topas server or a Topas cluster's "
            "front (an SGLang server with the Topas plugin has none: its tasks end by their workflow or after the "
            "idle timeout), or not the one the calls went to")


def close_task(base_url: str, task_id: str, api_key: str | None = None, *, failed: bool = False,
               unlabelled_calls: int = 0) -> bool:
    """POST the task-done call (sync); True if the server accepted it. `failed`: the task
    failed, and the server counts no JCT for it. Never raises an Exception: a malformed
    base_url raised httpx.InvalidURL from the block's exit, replacing the block's own error
    (a BaseException such as KeyboardInterrupt still propagates)."""
    try:
        rsp = httpx.post(done_url(base_url, task_id, failed), headers=auth_headers(api_key), timeout=DONE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - logged: the done call is best-effort
        return _report(task_id, None, exc)
    return _report(task_id, rsp, None, unlabelled_calls=unlabelled_calls)


async def aclose_task(base_url: str, task_id: str, api_key: str | None = None, *, missing_ok: bool = False,
                      failed: bool = False, unlabelled_calls: int = 0) -> bool:
    """POST the task-done call (async); True if the server accepted it. Never raises an
    Exception (an out-of-range port raised anyio's ExceptionGroup of OverflowError)."""
    try:
        async with httpx.AsyncClient(timeout=DONE_TIMEOUT_S) as client:
            rsp = await client.post(done_url(base_url, task_id, failed), headers=auth_headers(api_key))
    except Exception as exc:  # noqa: BLE001 - logged: the done call is best-effort
        return _report(task_id, None, exc)
    return _report(task_id, rsp, None, missing_ok, unlabelled_calls)


def base_url_of(client: Any) -> str:
    """The base URL of an openai client (or of a `labelled(...)` wrapper around one)."""
    inner = getattr(client, "raw", client)
    url = getattr(inner, "base_url", None)
    if url is None:
        raise ConfigError(f"cannot find a base_url on {type(client).__name__}")
    return str(url)


def api_key_of(client: Any) -> str | None:
    """The API key an openai client sends (None if it has none), so the done call that
    `task(client=...)` sends is accepted by a server started with that key. With a key
    provider (openai >= 2), the key its last call used (the client stores each refresh)."""
    key = getattr(client, "api_key", None)
    return key if isinstance(key, str) and key else None


def new_task_id(prefix: str = "task") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# The task(...) scopes entered in this context, innermost last: calls made inside one without a
# complete label are noted on it, and a nested scope of the same id is refused.
_OPEN: contextvars.ContextVar[tuple[task, ...]] = contextvars.ContextVar("topas_task_scopes", default=())


def note_unlabelled_call() -> None:
    """A labelled client (openai wrapper, httpx transport or hook) is sending a call that carries
    no label: inside a `task(...)` scope, that is a call of the task gone astray (no stage/agent
    in force), so warn, once per task. Such calls went out unlabelled without a word."""
    fields = labels.current_fields()
    for scope in reversed(_OPEN.get()):
        if scope.handle.task_id == fields.get("task_id"):
            scope.note_unlabelled(fields)
            return


def is_failure(et: type[BaseException] | None, ev: BaseException | None) -> bool:
    """Whether a block left this way failed: any exception, Ctrl-C, a cancellation or timeout;
    not `sys.exit(0)` / `sys.exit()` (a CLI that finished its work) nor GeneratorExit (the
    consumer of a generator holding the scope stopped early: the task did what was asked)."""
    if et is None or issubclass(et, GeneratorExit):
        return False
    if issubclass(et, SystemExit):
        return getattr(ev, "code", None) not in (0, None)
    return True


class task:  # noqa: N801 - used like a function: `with task(...)`, `async with task(...)`
    """A task scope: labels calls inside with `task_id` (+ `workflow`), closes the task on exit.

    `base_url` (or `client`, an openai client) says where to send the done call; with
    neither, nothing is sent. A server started with an API key needs it on the done call
    too: `api_key`, else the key `client` holds. `task_id` defaults to a fresh unique id (see `.handle`).
    `close=False` keeps the label scope but sends nothing. Entering it while it is entered is
    an error, and so is entering it again once its exit sent the done call (the server
    refuses a closed task's calls: a new scope needs a new `task(...)`), and so is entering it
    inside an open scope of the same task id (its exit would close the outer task)."""

    def __init__(self, task_id: str | None = None, *, base_url: str | None = None, client: Any = None,
                 workflow: str | None = None, close: bool = True, api_key: str | None = None) -> None:
        if base_url is not None and client is not None:
            raise ConfigError("task(): give base_url or client, not both")
        url = base_url if client is None else base_url_of(client)
        if url is not None and not isinstance(url, str):  # it failed in __exit__, masking the block's error
            raise ConfigError(f"task(): base_url must be a string, got {type(url).__name__}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key.isprintable() or not api_key):
            raise ConfigError("task(): api_key must be a non-empty string of printable characters")
        # kept off the handle, which callers print and log
        self._api_key = api_key
        # the client's key is read at exit, not here: a client built with a key provider
        # (openai >= 2: api_key=callable) holds its key only once a call has refreshed it
        self._key_client = client if api_key is None else None
        # only None means "make one up": an empty id is refused on entry, like any other bad id
        self.handle = TaskHandle(new_task_id() if task_id is None else task_id, url if close else None, workflow)
        self._scope: contextlib.AbstractContextManager[Any] | None = None
        self._closed = False  # its exit sent the done call
        self._unlabelled = 0  # calls made inside it that went out unlabelled
        self._lock = threading.Lock()  # its calls may come from several threads

    def note_unlabelled(self, fields: dict[str, Any]) -> None:
        """One more call of this task went out unlabelled; the first one is a warning."""
        with self._lock:
            self._unlabelled += 1
            first = self._unlabelled == 1
        if first:
            missing = " and ".join(f for f in ("stage", "agent") if f not in fields)
            log.warning("task %s: a call went out unlabelled: no %s label in force inside the task scope. Open "
                        "label(stage=..., agent=...) inside the task(...) block (an outer label()'s stage and "
                        "agent are dropped: a new task id starts afresh)", self.handle.task_id, missing)

    def _enter(self) -> TaskHandle:
        if self._scope is not None:
            raise ConfigError(f"task {self.handle.task_id!r} is already entered")
        if self._closed:
            raise ConfigError(f"task {self.handle.task_id!r} was closed when its scope ended (the server "
                              "refuses a closed task's calls): enter a new task(...) instead")
        # only a scope that sends the done call (close=True, a server known) would close the outer
        if self.handle.base_url is not None and any(
                t.handle.task_id == self.handle.task_id for t in _OPEN.get() if t._scope is not None):
            raise ConfigError(f"task {self.handle.task_id!r} is open already in an enclosing task(...): a nested "
                              "scope of the same id would close it at its exit; use label(...) blocks inside the "
                              "outer scope, or give the sub-task its own id")
        scope = labels.label(task_id=self.handle.task_id, workflow=self.handle.workflow)
        scope.__enter__()
        self._scope = scope
        _OPEN.set((*_OPEN.get(), self))
        return self.handle

    def _exit(self, exc: tuple[Any, Any, Any]) -> None:
        scope, self._scope = self._scope, None
        # set, not reset by token: a generator's scope may exit in another context
        _OPEN.set(tuple(t for t in _OPEN.get() if t is not self))
        assert scope is not None
        scope.__exit__(*exc)

    def _done_key(self) -> str | None:
        return self._api_key if self._key_client is None else api_key_of(self._key_client)

    def __enter__(self) -> TaskHandle:
        return self._enter()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._exit((et, ev, tb))
        finally:  # the done call goes out whatever the label scope's exit does
            if self.handle.base_url is not None:
                self._closed = True
                # a block left by an exception (an error, Ctrl-C) is a failed task: no JCT
                close_task(self.handle.base_url, self.handle.task_id, self._done_key(),
                           failed=is_failure(et, ev), unlabelled_calls=self._unlabelled)

    async def __aenter__(self) -> TaskHandle:
        return self._enter()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            self._exit((et, ev, tb))
        finally:
            if self.handle.base_url is not None:
                self._closed = True
                await aclose_task(self.handle.base_url, self.handle.task_id, self._done_key(),
                                  failed=is_failure(et, ev), unlabelled_calls=self._unlabelled)
