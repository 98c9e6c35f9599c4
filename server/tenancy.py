"""API keys and tenants (docs/server.md "Authentication and tenants").

With `--api-key` set, every endpoint but `/health` needs `Authorization: Bearer <key>`. Each
distinct key is a tenant (`key1`, `key2`, ... in the order given). A tenant's task ids,
agent names and workflow names live in its own namespace: inside the server (tracker,
engine, stats records) they are qualified as `<tenant>/<name>`, and every response shows a
tenant only its own names, unqualified. Without keys there is one anonymous tenant (None)
and names are used as given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ..workflow import AgentSpec, Workflow
from .api_errors import ApiError

Tenant = str | None
EXEMPT_PATHS = frozenset({"/health"})  # liveness probes carry no credentials


def tenant_ids(keys: tuple[str, ...]) -> dict[str, str]:
    """key -> tenant id; a repeated key is the same tenant."""
    out: dict[str, str] = {}
    for key in keys:
        out.setdefault(key, f"key{len(out) + 1}")
    return out


def authenticate(headers: Mapping[str, str], tenants: Mapping[str, str]) -> Tenant:
    """The caller's tenant, or ApiError(401). Every key is compared in constant time."""
    if not tenants:
        return None
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    token = token.strip()
    found: Tenant = None
    for key, tenant in tenants.items():
        if hmac.compare_digest(token.encode("utf-8", "replace"), key.encode("utf-8")):
            found = tenant
    if scheme.lower() != "bearer" or found is None:
        raise ApiError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                       type_="invalid_request_error", code="invalid_api_key")
    return found


def authenticate_scope(scope: Mapping[str, Any], tenants: Mapping[str, str]) -> Tenant:
    """`authenticate` on an ASGI request scope's headers (for pure ASGI middleware)."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
    return authenticate(headers, tenants)


def qualify(tenant: Tenant, name: str) -> str:
    return name if tenant is None else f"{tenant}/{name}"


def unqualify(tenant: Tenant, name: str) -> str:
    return name if tenant is None else name.removeprefix(f"{tenant}/")


def owned_by(tenant: Tenant, name: str) -> bool:
    return tenant is None or name.startswith(f"{tenant}/")


@contextlib.contextmanager
def tenant_names(tenant: Tenant) -> Iterator[None]:
    """Errors raised inside name the tenant's tasks and agents as the tenant does."""
    try:
        yield
    except ApiError as exc:
        if tenant is not None:
            exc.message = unqualify_quoted(tenant, exc.message)
        raise


def unqualify_quoted(tenant: str, message: str) -> str:
    """`message` with the tenant prefix taken off the quoted names in it (`task 'key1/t'` ->
    `task 't'`): only a prefix, at the start of a quoted name, is the tenant's qualification
    (errors quote names, as `'x'` or repr). Any other "key1/" is the tenant's own text, such as
    a task id "a/key1/b", and stays."""
    prefix = re.escape(f"{tenant}/")
    return re.sub(rf"(^|[\s(\[{{,:=])(['\"]){prefix}", r"\1\2", message)


def engine_workflow(tenant: Tenant, wf: Workflow) -> Workflow:
    """The copy of a tenant's workflow the engine sees: workflow and agent names qualified,
    so tenants never share a workflow or an agent's KV prefix."""
    if tenant is None:
        return wf
    agents = tuple(AgentSpec(qualify(tenant, a.name), a.prefix_tokens) for a in wf.agents)
    stages = tuple(dataclasses.replace(s, agent=qualify(tenant, s.agent)) for s in wf.stages)
    return dataclasses.replace(wf, name=qualify(tenant, wf.name), agents=agents, stages=stages)
