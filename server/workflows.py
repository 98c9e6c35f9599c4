"""Workflows registered with the server (`--workflow`, `POST /v1/topas/workflows`).

The registry's engine mapping is handed to the engine at construction and only ever grows,
so the engine sees later registrations without copying. Workflows given at start are shared:
every tenant sees them and none can replace them. A workflow uploaded by a tenant lives in
that tenant's namespace (server/tenancy.py), so no tenant can squat or replace another's name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from ..errors import ConfigError, WorkflowError
from ..workflow import (
    DERIVED_WORKFLOWS,
    Workflow,
    builtin_workflows,
    load_workflow,
    load_yaml_data,
    parse_workflow,
)
from .api_errors import ApiError, bad_request
from .tenancy import Tenant, engine_workflow, qualify

log = logging.getLogger("topas.server")


class WorkflowRegistry:
    """`max_uploads` / `max_upload_bytes`: how many workflows, and how many bytes of their
    definitions, one tenant may upload (ServerConfig.max_workflows, max_workflow_total_bytes).
    A registered workflow is kept for the server's lifetime (tasks may use it), so without a
    bound a client that uploads distinct definitions grows the server's memory without end (a
    4 MiB definition holds about 17 MB once parsed)."""

    def __init__(self, max_uploads: int | None = None, max_upload_bytes: int | None = None) -> None:
        self._shared: dict[str, Workflow] = {}  # --workflow at start
        self._own: dict[tuple[str, str], Workflow] = {}  # (tenant, name) -> as uploaded
        self._engine: dict[str, Workflow] = {}  # engine name -> engine copy
        # a tenant's first copy of a shared workflow, made by a call's label (on the event loop)
        # and handed to the engine by `publish` in the engine task: the engine iterates the
        # mapping while it advances in its worker thread
        self._unpublished: dict[str, Workflow] = {}
        self._max_uploads = max_uploads
        self._max_upload_bytes = max_upload_bytes
        self._uploaded: dict[Tenant, tuple[int, int]] = {}  # tenant -> (workflows, bytes)

    @property
    def mapping(self) -> Mapping[str, Workflow]:
        """The live engine-name -> Workflow mapping (shared with the engine)."""
        return self._engine

    def __bool__(self) -> bool:
        return bool(self._engine)

    def visible(self, tenant: Tenant = None) -> bool:
        """Whether `tenant` sees any workflow (strict label checking applies then)."""
        return bool(self.names(tenant))

    def get(self, name: str, tenant: Tenant = None) -> Workflow | None:
        """The workflow `name` as `tenant` sees it (its own first, then the shared ones)."""
        if tenant is None:
            return self._engine.get(name)
        return self._own.get((tenant, name)) or self._shared.get(name)

    def engine_copy(self, name: str, tenant: Tenant = None) -> Workflow | None:
        """The engine's copy of what `get` returns (registered on first use for shared ones)."""
        wf = self.get(name, tenant)
        if wf is None or tenant is None:
            return wf
        key = qualify(tenant, name)
        if key in self._engine:
            return self._engine[key]
        if key not in self._unpublished:
            self._unpublished[key] = engine_workflow(tenant, wf)
        return self._unpublished[key]

    def publish(self, wf: Workflow) -> None:
        """Make a copy from `engine_copy` visible to the engine (call it in the engine task)."""
        if wf.name not in self._engine and self._unpublished.get(wf.name) is wf:
            self._engine[wf.name] = self._unpublished.pop(wf.name)

    def agent_conflicts(self, wf: Workflow, tenant: Tenant = None) -> list[str]:
        """Agents of `wf` that a workflow `tenant` sees declares with another prefix size. An
        agent is one prefix per server (per key, with keys): the engine keeps the size it met
        first, so one of the two workflows is modelled with the wrong prefix. Said, not refused:
        a workflow that reuses an agent with its own size was taken without a word."""
        mine = {a.name: a.prefix_tokens for a in wf.agents}
        out = []
        for name in self.names(tenant):
            other = self.get(name, tenant)
            if other is None or other.name == wf.name:
                continue
            out += [f"agent '{a.name}' has a {a.prefix_tokens}-token prefix in workflow '{other.name}' and "
                    f"{mine[a.name]} here: an agent is one prefix on this server, which keeps the size it met "
                    "first; give the agents distinct names" for a in other.agents
                    if a.name in mine and mine[a.name] != a.prefix_tokens]
        return out

    def names(self, tenant: Tenant = None) -> list[str]:
        if tenant is None:
            return sorted(self._engine)
        return sorted({*self._shared, *(n for t, n in self._own if t == tenant)})

    def add(self, wf: Workflow, tenant: Tenant = None, size: int = 0) -> bool:
        """Register `wf` (uploaded as `size` bytes) for `tenant`; True if new. Re-registering an
        identical definition is a no-op; a different definition under a name the tenant sees is
        a 409 (tasks use it), and so is a new one beyond the tenant's upload quota."""
        old = self.get(wf.name, tenant)
        if old is not None:
            if old == wf:
                return False
            raise ApiError(409, f"workflow '{wf.name}' is already registered with a different definition",
                           "name")
        self._count_upload(tenant, size)
        if tenant is None:
            self._engine[wf.name] = wf
        else:
            self._own[(tenant, wf.name)] = wf
            self._engine[qualify(tenant, wf.name)] = engine_workflow(tenant, wf)
        return True

    def _count_upload(self, tenant: Tenant, size: int) -> None:
        count, total = self._uploaded.get(tenant, (0, 0))
        if self._max_uploads is not None and count + 1 > self._max_uploads:
            raise ApiError(409, f"this server already holds {count} workflows uploaded with this key, its "
                                f"limit (max_workflows); workflows are kept while the server runs", "name")
        if self._max_upload_bytes is not None and total + size > self._max_upload_bytes:
            raise ApiError(409, f"this workflow ({size} bytes) would take the definitions uploaded with this "
                                f"key past {self._max_upload_bytes} bytes, this server's limit "
                                f"(max_workflow_total_bytes); workflows are kept while the server runs", "name")
        self._uploaded[tenant] = (count + 1, total + size)

    def load(self, name_or_path: str) -> Workflow:
        """CLI `--workflow NAME|PATH.yaml`: shared by every tenant (a one-line WorkflowError)."""
        wf = load_workflow(name_or_path)
        if self._shared.get(wf.name, wf) != wf:
            raise WorkflowError(f"two different workflows named '{wf.name}'")
        for warning in self.agent_conflicts(wf):
            log.warning("--workflow %s: %s", name_or_path, warning)
        self._shared[wf.name] = wf
        self._engine[wf.name] = wf
        return wf


def decode_upload(raw: bytes) -> str:
    """The upload body as text: strict UTF-8 (400 otherwise, as completions answer), so a
    workflow is never registered under a name mangled by replacement characters."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"workflow body is not valid UTF-8 (byte {exc.start})") from None


def check_upload_fits(wf: Workflow, fits: Callable[[Workflow], None] | None) -> None:
    """400 when `fits` (the engine's KV-budget check, None when the engine has none) says a
    stage of `wf` can never run: the message `topas serve --workflow` refuses it with."""
    if fits is None:
        return
    try:
        fits(wf)
    except ConfigError as exc:
        raise bad_request(str(exc)) from None


def parse_upload(text: str) -> Workflow:
    """`POST /v1/topas/workflows` body: YAML or JSON (JSON is YAML), or the bare name of a
    built-in workflow (never a server-side path). 400 on any error. CPU-bound: the app runs
    it in a worker thread."""
    try:
        data = load_yaml_data(text)
        if isinstance(data, str):  # a built-in by name (derived ones too, as --workflow takes them)
            if data not in builtin_workflows() and data not in DERIVED_WORKFLOWS:
                known = ", ".join([*builtin_workflows(), *DERIVED_WORKFLOWS])
                raise WorkflowError(f"unknown built-in workflow {data[:80]!r} (built-in: {known}; "
                                    "or send a workflow definition, YAML or JSON)")
            return load_workflow(data)
        return parse_workflow(data, "request body")
    except WorkflowError as exc:
        raise bad_request(str(exc)) from None
