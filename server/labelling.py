"""From a request to its resolved label: task, stage, agent, workflow and agent-prefix size.

The label itself is exactly `topas_agents.labels.parse_label` (body key `topas` wins over the
X-Topas-* headers). On top of it the server checks the label against registered workflows
and resolves the agent's prefix size: label `prefix_tokens`, else the registered workflow's
agent prefix, else the tokens of the leading system message(s).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import LabelError
from ..labels import (
    BODY_KEY,
    METADATA_KEYS,
    UNLABELLED_AGENT,
    UNLABELLED_STAGE,
    Label,
    label_from_metadata,
    parse_label,
    unlabelled_task_id,
)
from ..workflow import Workflow
from .api_errors import bad_request, from_label_error
from .protocol import ParsedCall
from .tenancy import Tenant, qualify
from .workflows import WorkflowRegistry


@dataclass(frozen=True, slots=True)
class ResolvedLabel:
    label: Label | None
    source: Literal["body", "headers", "none"]
    task_id: str  # internal: qualified with the tenant (server/tenancy.py)
    stage: str
    agent: str  # internal: qualified with the tenant
    workflow: Workflow | None  # the engine's copy of the registered workflow, else None
    workflow_name: str | None  # as labelled
    prefix_tokens: int
    prefix_source: Literal["label", "workflow", "system", "unlabelled"]
    tenant: Tenant = None

    @property
    def labelled(self) -> bool:
        return self.label is not None


def _check_workflow(lab: Label, registry: WorkflowRegistry, tenant: Tenant,
                    served_without_dag: Callable[[str], bool] | None) -> Workflow | None:
    """The engine's copy of the label's workflow, checked against what `tenant` sees. A task
    whose first call was served without a DAG (its workflow was not registered then, on a
    server with none) is served so to its end: a workflow uploaded meanwhile, by anyone, made
    its next call a 400, or would have given the engine a DAG halfway through the task."""
    if lab.workflow is None:
        return None
    if served_without_dag is not None and served_without_dag(qualify(tenant, lab.task_id)):
        return None
    wf = registry.get(lab.workflow, tenant)
    if wf is None:
        names = registry.names(tenant)
        if names:
            shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
            raise bad_request(f"topas label field 'workflow': unknown workflow '{lab.workflow}' "
                              f"(registered: {shown})", f"{BODY_KEY}.workflow")
        return None  # nothing registered: served as a workflow-less task
    if not wf.has_stage(lab.stage):
        raise bad_request(f"topas label field 'stage': workflow '{wf.name}' has no stage '{lab.stage}'",
                          f"{BODY_KEY}.stage")
    expected = wf.stage(lab.stage).agent
    if lab.agent != expected:
        raise bad_request(f"topas label field 'agent': stage '{lab.stage}' of workflow '{wf.name}' is run "
                          f"by agent '{expected}', got '{lab.agent}'", f"{BODY_KEY}.agent")
    return registry.engine_copy(lab.workflow, tenant)


def resolve_label(body: Mapping[str, Any], headers: Mapping[str, str], call: ParsedCall,
                  registry: WorkflowRegistry, rid: str, tenant: Tenant = None,
                  metadata: Any = None, served_without_dag: Callable[[str], bool] | None = None) -> ResolvedLabel:
    """Raises ApiError(400) naming `topas.<field>` for a malformed or inconsistent label.
    `metadata`: a Responses request's, read when the body and headers carry no label.
    `served_without_dag(task_id)`: the task is known and its calls are served without a DAG."""
    try:
        lab = parse_label(body, headers)
    except LabelError as exc:
        raise from_label_error(exc) from None
    source: Literal["body", "headers"] = "body" if body.get(BODY_KEY) is not None else "headers"
    if lab is None and metadata is not None:
        try:
            lab = label_from_metadata(metadata)
        except LabelError as exc:
            raise bad_request(str(exc), f"metadata.{METADATA_KEYS.get(exc.field, BODY_KEY)}") from None
        source = "body"  # metadata is part of the body
    if lab is None:
        # each unlabelled call is its own one-stage task; its prompt is all dynamic input
        return ResolvedLabel(None, "none", qualify(tenant, unlabelled_task_id(rid)), UNLABELLED_STAGE,
                             qualify(tenant, UNLABELLED_AGENT), None, None, 0, "unlabelled", tenant)
    wf = _check_workflow(lab, registry, tenant, served_without_dag)
    if lab.prefix_tokens is not None:
        prefix, prefix_source = lab.prefix_tokens, "label"
    elif wf is not None:
        prefix, prefix_source = wf.prefix_tokens(qualify(tenant, lab.agent)), "workflow"
    else:
        prefix, prefix_source = call.system_tokens, "system"
    return ResolvedLabel(lab, source, qualify(tenant, lab.task_id), lab.stage, qualify(tenant, lab.agent), wf,
                         lab.workflow, prefix, prefix_source, tenant)  # type: ignore[arg-type]
