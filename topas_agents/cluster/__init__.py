"""Many replicas: the simulated cluster bench (`run_cluster_bench`, docs/cluster.md) and the
client-side stream resumption used for failover (`stream_retry`). The real cluster (smg in
front of `topas serve` replicas) is `topas_agents.server.cluster`."""

from __future__ import annotations

from topas_agents._lazy import lazy_getattr

_LAZY = {
    "ResumingStream": "topas_agents.cluster.stream_retry",
    "AsyncResumingStream": "topas_agents.cluster.stream_retry",
    "run_cluster_bench": "topas_agents.cluster.bench",
    "ClusterBenchConfig": "topas_agents.cluster.bench",
    "run_cluster_seeds": "topas_agents.cluster.seeds",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
