"""Hierarchical cache (`--enable-hierarchical-cache`): a prefix goes out to the host tier and
comes back, through the policy's prefix_out / prefix_in on a real SGLang server.

Needs CUDA. Measured on this CPU machine with SGLang 0.5.23: the server dies at startup
while building the HiCache host pool, because `alloc_with_host_register`
(mem_cache/pool_host/common.py) pins the host buffer with `cudaHostRegister`
(`pin_memory=True` by default): "RuntimeError: Found no NVIDIA driver on your system".
So on CPU this module is skipped with that reason; the GPU smoke runs it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")

from sglang_cpu import serving  # noqa: E402

from topas_agents.realbench.client import run_tasks  # noqa: E402

NO_HOST_POOL_ON_CPU = ("SGLang 0.5.23's HiCache host pool pins its buffer with cudaHostRegister "
                       "(mem_cache/pool_host/common.py): without CUDA the server dies at startup")
KV_TOKENS = 3000

if not serving.has_cuda():
    pytest.skip(NO_HOST_POOL_ON_CPU, allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with serving.module_server(tmp_path_factory.mktemp("sglang-hicache"), "fcfs", kv_tokens=KV_TOKENS,
                               extra_args=["--enable-hierarchical-cache", "--hicache-ratio", "2"]) as srv:
        yield srv


def test_prefix_round_trips_through_the_host_tier(server: Any) -> None:
    plans = serving.plans(server.workflow, server.tokens, n_tasks=1, output_tokens=4, prefix="hc")
    asyncio.run(run_tasks(server.base_url, "model", server.workflow, plans, timeout_s=300))
    time.sleep(1.0)
    prefix = serving.prefix_len(server.tokens, "a")
    _pinned, evicted, _last = serving.pins_after_flood(server, server.tokens, KV_TOKENS, prefix)
    assert "a" in evicted
    time.sleep(1.0)
    # Out: with a host tier the evicted prefix is reported on host ("cpu"), not gone.
    plans = serving.plans(server.workflow, server.tokens, n_tasks=1, output_tokens=4, prefix="back")
    before = len(server.records())
    results = asyncio.run(run_tasks(server.base_url, "model", server.workflow, plans, timeout_s=300))
    decisions = [d for d in server.records()[before:] if d["event"] == "decision"]
    assert any(d["prefix_in"].get("a") == "load_back" or d["resident"].get("a") == "gpu" for d in decisions)
    first = results[0].calls[0]
    assert first.stage == "s1" and first.cached_tokens is not None and first.cached_tokens >= prefix - 1, first
