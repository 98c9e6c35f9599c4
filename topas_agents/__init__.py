"""topas-agents: task-oriented, prefix-aware scheduling for multi-agent LLM workflows.

Light at import: heavy pieces (engine, server, integrations) load on first use.
"""

from __future__ import annotations

from topas_agents._lazy import lazy_getattr

__version__ = "0.1.0"

_LAZY = {
    "Workflow": "topas_agents.workflow",
    "load_workflow": "topas_agents.workflow",
    "parse_workflow": "topas_agents.workflow",
    "Label": "topas_agents.labels",
    "label": "topas_agents.labels",
    "current_label": "topas_agents.labels",
    # the client side in one import: `from topas_agents import label, labelled, task`
    "task": "topas_agents.integrations.task",
    "labelled": "topas_agents.integrations.openai_client",
    "LabelledClient": "topas_agents.integrations.openai_client",
    "labelled_http_client": "topas_agents.integrations.httpx_labels",
    "labelled_async_http_client": "topas_agents.integrations.httpx_labels",
    "StreamCutError": "topas_agents.cluster.stream_retry",
    "LabelError": "topas_agents.errors",
    "ConfigError": "topas_agents.errors",
    "Decision": "topas_agents.snapshot",
    "Snapshot": "topas_agents.snapshot",
    "make_policy": "topas_agents.policies",
    "load_profile": "topas_agents.costmodel",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
