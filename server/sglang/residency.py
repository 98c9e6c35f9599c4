"""Agent prefixes <-> SGLang radix-tree nodes: pinning with lock refs and host-tier moves.

An agent's prefix is learned from the first request of that agent whose label gives
`prefix_tokens` N (or whose workflow declares it): the first N prompt tokens. Later requests
of the agent shrink it to the longest common prefix if they diverge earlier (the label count
is the client's estimate; the chat template may shift the boundary).

"GPU-resident" in the Topas model means *pinned* here: the radix path matching the prefix
(page-aligned) is locked with `tree_cache.lock(node)` (= `inc_lock_ref`), so SGLang's LRU
eviction cannot free it; `prefix_out` unlocks it (`dec_lock_ref`) and SGLang evicts it
lazily when it needs the memory (there is no API to evict one given node). A prefix is
resident after a decision admits one of its agent's requests or loads it (`prefix_in`); it
is "loading" until its tokens are in the tree (the admitted request's prefill inserts them)
and then pinned at the next sync.

Host tier (only with `--enable-hierarchical-cache`, `tree_cache.cache_controller` set): a
non-resident prefix whose KV is on host or device is reported "cpu"; `prefix_in` of it
calls `tree_cache.load_back(node)` (H->D, started with the next prefill batch) and pins
it. Without a host tier non-resident prefixes are "none"; `prefix_in` of a prefix with no
copy cannot load anything: it stays "loading" until a request of the agent recomputes it.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass
from typing import Any

from ...snapshot import PrefixLocation

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class AgentPrefix:
    agent: str
    tokens: int  # current prefix length (tokens), 0 for agents without a shared prefix
    token_ids: array | None = None
    extra_key: str | None = None
    cache_salt: str | None = None
    resident: bool = False
    lock: Any = None  # TreeLock while pinned
    host_copy: bool = False  # non-resident prefix found on host (or unpinned on device)
    last_used_s: float = 0.0


def common_prefix_len(a: array, b: Any, limit: int) -> int:
    """Longest common prefix of two token arrays, up to `limit` (C-level slice compares)."""
    lo, hi = 0, min(limit, len(a), len(b))
    if a[:hi] == array(a.typecode, b[:hi]):
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo], a[:hi+1] != b[:hi+1]
        mid = (lo + hi + 1) // 2
        if a[:mid] == array(a.typecode, b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixResidency:
    def __init__(self) -> None:
        self.agents: dict[str, AgentPrefix] = {}
        self.tree: Any = None
        self.page_size = 1

    def bind(self, tree_cache: Any, page_size: int) -> None:
        self.tree, self.page_size = tree_cache, max(1, int(page_size or 1))

    @property
    def trackable(self) -> bool:
        return self.tree is not None and not getattr(self.tree, "disable", False)

    @property
    def host_tier(self) -> bool:
        return self.trackable and getattr(self.tree, "cache_controller", None) is not None

    # ------------------------------------------------------------------ learning

    def learn(self, agent: str, req: Any, tokens: int) -> AgentPrefix:
        """Register/refine `agent`'s prefix from a request; `tokens` from its label/workflow."""
        ids = req.origin_input_ids
        p = self.agents.get(agent)
        if p is None:
            p = self.agents[agent] = AgentPrefix(agent, 0)
        if p.token_ids is None:
            tokens = max(0, min(tokens, len(ids) - 1))  # SGLang always recomputes the last token
            if tokens > 0:
                p.tokens, p.token_ids = tokens, array("q", ids[:tokens])
                p.extra_key, p.cache_salt = req.extra_key, req.cache_salt
        elif req.extra_key == p.extra_key and req.cache_salt == p.cache_salt:
            shared = common_prefix_len(p.token_ids, ids, min(p.tokens, len(ids) - 1))
            if shared < p.tokens:
                logger.info("topas: prefix of agent %r shrinks %d -> %d tokens", agent, p.tokens, shared)
                self._unpin(p)
                p.tokens, p.token_ids = shared, p.token_ids[:shared]
        return p

    def tokens(self, agent: str) -> int:
        p = self.agents.get(agent)
        return p.tokens if p is not None else 0

    # ------------------------------------------------------------------ tree access

    def _aligned(self, p: AgentPrefix) -> int:
        return p.tokens - p.tokens % self.page_size

    def _match(self, p: AgentPrefix) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        key = RadixKey(p.token_ids[:self._aligned(p)], extra_key=p.extra_key, cache_salt=p.cache_salt)
        return self.tree.match_prefix(MatchPrefixParams(key=key))

    def _mapped(self, p: AgentPrefix) -> bool:
        return self.trackable and p.token_ids is not None and self._aligned(p) > 0

    def _pin_if_present(self, p: AgentPrefix) -> Any:
        """Lock the prefix path if it is fully on device; returns the match (or None)."""
        m = self._match(p)
        if m.device_prefix_len >= self._aligned(p):
            p.lock = self.tree.lock(m.last_device_node)
        return m

    def _unpin(self, p: AgentPrefix) -> None:
        if p.lock is not None:
            self.tree.unlock(p.lock)
            p.lock = None

    def sync(self) -> None:
        """Pin resident prefixes that reached the tree; note host copies of the others."""
        for p in self.agents.values():
            if not self._mapped(p):
                continue
            if p.resident:
                if p.lock is None:
                    self._pin_if_present(p)
            else:
                m = self._match(p)
                on_either = max(m.full_kv_hit_length, m.device_prefix_len + m.host_hit_length)
                p.host_copy = self.host_tier and on_either >= self._aligned(p)

    def location(self, agent: str) -> PrefixLocation:
        p = self.agents[agent]
        if p.resident:
            return "gpu" if p.lock is not None or not self._mapped(p) else "loading"
        return "cpu" if p.host_copy else "none"

    # ------------------------------------------------------------------ decisions

    def admit(self, agent: str, now: float) -> None:
        p = self.agents.get(agent)
        if p is not None:
            p.resident, p.last_used_s = True, now

    def touch(self, agent: str, now: float) -> None:
        p = self.agents.get(agent)
        if p is not None:
            p.last_used_s = now

    def prefix_out(self, agent: str) -> None:
        p = self.agents[agent]
        p.resident = False
        self._unpin(p)

    def prefix_in(self, agent: str) -> str:
        """Make the prefix resident; returns what was done (for the decision log)."""
        p = self.agents[agent]
        p.resident = True
        if not self._mapped(p) or p.lock is not None:
            return "pinned" if p.lock is not None else "unmapped"
        m = self._pin_if_present(p)
        if p.lock is not None:
            return "pinned"
        covered = m.device_prefix_len + m.host_hit_length >= self._aligned(p)
        if self.host_tier and m.host_hit_length > 0 and covered and self.tree.load_back(m.best_match_node):
            p.lock = self.tree.lock(m.best_match_node)
            return "load_back"
        return "loading"

    def release_all(self) -> None:
        for p in self.agents.values():
            self._unpin(p)

    def pinned_tokens(self) -> int:
        return sum(self._aligned(p) for p in self.agents.values() if p.lock is not None)
