"""Shared helpers for the SGLang adapter tests (real SGLang 0.5.23 classes on CPU).

Imported by the other tests/test_sglang_*.py files. SGLang's scheduler modules take ~20 s
to import, so they are imported once per session here; every test is marked `sglang` and
the whole module is skipped when SGLang is not importable.
"""

from __future__ import annotations

import contextlib
import pkgutil
import types
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

import torch  # noqa: E402  (after the skip: torch comes with SGLang)
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.managers.schedule_batch import (  # noqa: E402
    FINISH_LENGTH,  # noqa: E402
    Req,
    ScheduleBatch,
)
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry, HookType, _propagate_patch  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from topas_agents.server.sglang import plugin  # noqa: E402
from topas_agents.server.sglang.adapter import Adapter  # noqa: E402
from topas_agents.server.sglang.config import PluginConfig  # noqa: E402
from topas_agents.snapshot import NOOP, Decision, Snapshot  # noqa: E402

__all__ = [
    "NOOP", "AddReqResult", "Decision", "EvictParams", "HookRegistry", "InsertParams", "MatchPrefixParams",
    "RadixCache", "RadixKey", "Req", "ScheduleBatch", "Scheduler", "SchedulePolicy", "Snapshot",
    "World", "applied_hooks", "make_adapter", "make_req", "published", "ScriptedPolicy",
    "sglang_prefill", "finish",
]


@pytest.fixture(scope="session")
def published() -> Iterator[Any]:
    """SGLang's runtime context (ServerArgs published), needed by caches and policies."""
    # As sglang.test.test_utils.published_topology (not imported: that module pulls in HF
    # `datasets`, which this repo's top-level datasets/ shadows when pytest runs from the root).
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", device="cpu")
    reset_context()
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    try:
        yield server_args
    finally:
        reset_context()


def make_req(rid: str, ids: Sequence[int], max_new: int = 8, routing_key: str | None = None) -> Any:
    return Req(rid=rid, origin_input_text="", origin_input_ids=array("q", ids),
               sampling_params=SamplingParams(max_new_tokens=max_new), routing_key=routing_key)


class World:
    """A real KV pool + radix tree + a Scheduler instance built without a model.

    `Scheduler.__new__` gives the real class (its `_add_request_to_queue` runs as in the
    server); only the attributes those code paths read are set.
    """

    def __init__(self, kind: str = "unified", size: int = 2048, page_size: int = 1, max_reqs: int = 256,
                 schedule_policy: str = "fcfs") -> None:
        self.req_pool = ReqToTokenPool(size=max_reqs, max_context_len=1024, device="cpu",
                                       enable_memory_saver=False)
        kv = MHATokenToKVPool(size, page_size=page_size, dtype=torch.float16, head_num=1, head_dim=8,
                              layer_num=1, device="cpu", enable_memory_saver=False)
        self.alloc = TokenToKVPoolAllocator(size, torch.float16, "cpu", kv, need_sort=False)
        params = {"disable": False, "req_to_token_pool": self.req_pool,
                  "token_to_kv_pool_allocator": self.alloc, "page_size": page_size}
        if kind == "unified":
            self.tree = UnifiedRadixCache(CacheInitParams(**params, tree_components=(ComponentType.FULL,)))
        else:
            self.tree = RadixCache(CacheInitParams(**params))
        s = Scheduler.__new__(Scheduler)
        s.waiting_queue, s.chunked_req, s.page_size = [], None, page_size
        s.tree_cache, s.token_to_kv_pool_allocator, s.max_total_num_tokens = self.tree, self.alloc, size
        s.req_to_token_pool = self.req_pool
        s.enable_priority_scheduling = s.abort_on_priority_when_disabled = False
        s.disaggregation_mode, s.max_queued_requests = DisaggregationMode.NULL, None
        s.enable_hicache_storage = s.enable_lmcache = False
        s.processed_tokens_counter = 0
        s.policy = SchedulePolicy(schedule_policy, self.tree, False, False, False)
        self.sched = s
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)

    def insert(self, ids: Sequence[int]) -> None:
        """Put `ids` in the tree as an earlier, finished request would have."""
        self.tree.insert(InsertParams(key=RadixKey(array("q", ids)), value=self.alloc.alloc(len(ids))))

    def evict_all(self) -> None:
        self.tree.evict(EvictParams(num_tokens=10**9))

    def device_match(self, ids: Sequence[int]) -> int:
        return self.tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", ids)))).device_prefix_len

    def run_prefill(self, reqs: list[Any]) -> Any:
        """A real prefill batch for `reqs` (KV allocated, rows held), merged into `running`."""
        batch = ScheduleBatch.init_new(reqs, self.req_pool, self.alloc, self.tree, _MODEL_CONFIG, False,
                                       SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        for r in reqs:  # what process_batch_result does after the forward: prompt -> tree
            self.tree.checkpoint(r, up_to=len(r.full_untruncated_fill_ids))
        if self.running.is_empty():
            self.running = batch
        else:
            self.running.merge_batch(batch)
        return batch


def finish(world: World, req: Any) -> None:
    """What SGLang does when a request finishes: cache its KV in the tree, free its row,
    drop it from the running batch."""
    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    release_kv_cache(req, world.tree, checkpoint=True)
    world.running.filter_batch()


_MODEL_CONFIG = types.SimpleNamespace(vocab_size=512, is_encoder_decoder=False,
                                      hf_text_config=types.SimpleNamespace())


def sglang_prefill(world: World, max_prefill_tokens: int = 16384) -> Any:
    """SGLang's `_get_new_batch_prefill_raw` admission core, on real components.

    Same steps as scheduler.py:4079-4320 minus the GPU-only parts: `policy.calc_priority`
    on the waiting queue, a `PrefillAdder`, `init_next_round_input` + `add_one_req` in queue
    order until the first non-CONTINUE, remove the admitted from the queue, build and
    prepare the batch. Returns the admitted requests.
    """
    def prefill(sched: Any, running_batch: Any) -> list[Any]:
        if not sched.waiting_queue:
            return []
        sched.policy.calc_priority(sched.waiting_queue, running_batch)
        adder = PrefillAdder(sched.page_size, world.tree, world.alloc,
                             running_batch, 1.0, max_prefill_tokens, None)
        for req in sched.waiting_queue:
            req.init_next_round_input(world.tree)
            if adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None) != AddReqResult.CONTINUE:
                break
        admitted = list(adder.can_run_list)
        sched.waiting_queue = [r for r in sched.waiting_queue if r not in set(admitted)]
        if admitted:
            world.run_prefill(admitted)
        return admitted

    return prefill


class ScriptedPolicy:
    """A tiny test policy: returns the decisions it is given, records the snapshots."""

    name = "scripted"

    def __init__(self, *decisions: Decision) -> None:
        self.decisions = list(decisions)
        self.snaps: list[Snapshot] = []
        self.fn: Any = None

    def decide(self, snap: Snapshot) -> Decision:
        self.snaps.append(snap)
        if self.fn is not None:
            return self.fn(snap)
        return self.decisions.pop(0) if self.decisions else NOOP


def make_adapter(policy: Any = None, clock: Any = None, **config: Any) -> Adapter:
    cfg = PluginConfig(policy=config.pop("name", "fcfs"), redecide_s=config.pop("redecide_s", 0.0), **config)
    kwargs = {"clock": clock} if clock is not None else {}
    return Adapter(cfg, policy=policy, **kwargs)


@contextlib.contextmanager
def applied_hooks(specs: Sequence[tuple[str, Any, str]]) -> Iterator[None]:
    """Register + apply hooks through the real HookRegistry, then undo everything.

    HookRegistry has no unpatch: save each target's raw attribute, restore it afterwards
    (re-propagating to `from X import Y` copies) and restore the registry's own state.
    """
    hooks_before = {k: list(v) for k, v in HookRegistry._hooks.items()}
    patched_before = set(HookRegistry._patched)
    saved = []
    for target, hook, kind in specs:
        obj_path, attr = target.rsplit(".", 1)
        obj = pkgutil.resolve_name(obj_path)
        saved.append((obj, attr, obj.__dict__[attr] if isinstance(obj, type) else getattr(obj, attr)))
        HookRegistry.register(target, hook, HookType[kind])
    HookRegistry.apply_hooks()
    try:
        yield
    finally:
        for obj, attr, raw in reversed(saved):
            current = obj.__dict__[attr] if isinstance(obj, type) else getattr(obj, attr)
            setattr(obj, attr, raw)
            if _unwrap(current) is not _unwrap(raw):
                _propagate_patch(_unwrap(current), _unwrap(raw), obj)
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(hooks_before)
        HookRegistry._patched.clear()
        HookRegistry._patched.update(patched_before)


def _unwrap(attr: Any) -> Any:
    return attr.__func__ if isinstance(attr, staticmethod | classmethod) else attr


@pytest.fixture
def no_adapter() -> Iterator[None]:
    plugin.uninstall()
    yield
    plugin.uninstall()


@pytest.mark.usefixtures("published")
def test_fixtures_build_a_real_prefill() -> None:
    w = World()
    reqs = [make_req("a", range(1, 41)), make_req("b", range(100, 120))]
    w.sched.waiting_queue = list(reqs)
    assert sglang_prefill(w)(w.sched, w.running) == reqs
    assert w.running.reqs == reqs and w.sched.waiting_queue == []
    assert w.device_match(range(1, 41)) == 40  # the prompt reached the tree
