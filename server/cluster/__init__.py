"""Topas replicas behind SGLang's gateway (smg) and the Topas front (docs/cluster.md).

Light at import: httpx/uvicorn/starlette load when a cluster is started.
"""

from __future__ import annotations

from topas_agents._lazy import lazy_getattr

_LAZY = {
    "ClusterConfig": "topas_agents.server.cluster.config",
    "GatewaySettings": "topas_agents.server.cluster.config",
    "RestartPolicy": "topas_agents.server.cluster.config",
    "RestartEvent": "topas_agents.server.cluster.supervisor",
    "ClusterHandle": "topas_agents.server.cluster.launcher",
    "run_replicas": "topas_agents.server.cluster.launcher",
    "serve_replicas": "topas_agents.server.cluster.launcher",
    "start_cluster": "topas_agents.server.cluster.launcher",
    "build_front": "topas_agents.server.cluster.front",
    "aggregate_stats": "topas_agents.server.cluster.aggregate",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
