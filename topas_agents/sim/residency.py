"""Prefix residency: where each agent prefix lives, the KV it holds, the host link.

`Residency` owns the prefix records, the KV counter and the single FIFO host link. Every
method keeps `kv_used` equal to the snapshot accounting (prefixes on GPU or loading +
kv_tokens of running requests: `pin`/`unpin` count a request's own KV here too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..costmodel import Profile
from .events import TRANSFER, EventHeap
from .fills import PrefillQueue
from .state import Prefix, PrefixFill, Req, Transfer


class PrefixCacheCount(NamedTuple):
    """One agent's prefix-cache counters since the engine started, in tokens (see `pin`)."""

    queries: int  # prompt tokens (prefix + input) of its admitted requests
    hits: int  # of those, prefix tokens already materialised on GPU at admission


class Residency:
    __slots__ = ("prefixes", "kv_used", "swaps_in", "swaps_out", "recomputes", "on_transfer",
                 "forgotten_counts", "_profile", "_host_tier", "_events", "_fills", "_link_free_s")

    def __init__(self, profile: Profile, host_tier: bool, events: EventHeap, fills: PrefillQueue) -> None:
        self.prefixes: dict[str, Prefix] = {}
        self.kv_used = 0
        self.swaps_in = self.swaps_out = self.recomputes = 0
        # `on_transfer(now, transfer)` when a transfer is queued (timeline recording; None: off)
        self.on_transfer: Callable[[float, Transfer], None] | None = None
        self._profile = profile
        self._host_tier = host_tier
        self._events = events  # transfer completions are scheduled here
        self._fills = fills  # requests whose prefix is ready, and prefix recomputes, go here
        self._link_free_s = 0.0
        # prefix-cache counters of forgotten prefixes (`forget`), so counters never go down
        self.forgotten_counts: dict[str, PrefixCacheCount] = {}

    def forget(self, agents: set[str]) -> None:
        """Drop the records of these agents' prefixes, each idle and off the GPU (see
        SimEngine._forget_idle_agents); a later request of the agent registers it anew."""
        for agent in agents:
            p = self.prefixes.pop(agent)
            assert not p.on_gpu and p.transfer is None and p.running == 0 and not p.waiters
            old = self.forgotten_counts.get(agent, PrefixCacheCount(0, 0))
            self.forgotten_counts[agent] = PrefixCacheCount(old.queries + p.cache_queries, old.hits + p.cache_hits)

    def register(self, agent: str, tokens: int) -> Prefix:
        """The agent's prefix record; its size is fixed when first registered."""
        p = self.prefixes.get(agent)
        if p is None:
            p = self.prefixes[agent] = Prefix(agent, tokens)
        return p

    # ------------------------------------------------------------------ transfers

    def _enqueue_transfer(self, p: Prefix, direction: str, now: float) -> Transfer:
        """Serialise a transfer on the single host link (FIFO) and schedule its completion."""
        start = max(now, self._link_free_s)
        tr = Transfer(p, direction, start, start + self._profile.swap_s(p.tokens))  # type: ignore[arg-type]
        self._link_free_s = tr.end_s
        self._events.push(tr.end_s, TRANSFER, tr)
        if self.on_transfer is not None:
            self.on_transfer(now, tr)
        if direction == "in":
            self.swaps_in += 1
        else:
            self.swaps_out += 1
        return tr

    def transfer_done(self, tr: Transfer) -> bool:
        """A transfer ended; True if it made a prefix ready (a scheduling event)."""
        p = tr.prefix
        if tr.direction == "out" or tr.cancelled or p.transfer is not tr:
            return False  # a swap-out only frees the link; a cancelled swap-in still used its slot
        p.transfer = None
        p.location = "gpu"
        p.view = None
        self._prefix_ready(p)
        return True

    # ------------------------------------------------------------------ prefix readiness

    def _prefix_ready(self, p: Prefix) -> None:
        """The prefix is materialised on GPU: its waiting requests may now prefill."""
        p.ready = True
        p.filler = None
        waiters, p.waiters = p.waiters, []
        for r in waiters:
            self._fills.add_request(r, compute_prefix=False)

    def prefix_computed(self, p: Prefix) -> None:
        """A prefill that recomputed `p` completed."""
        self.recomputes += 1
        self._prefix_ready(p)

    def _lose_filler(self, p: Prefix) -> None:
        """The request recomputing `p` left: hand the work to a waiter, or drop the prefix."""
        p.filler = None
        if p.waiters:
            self._fills.add_request(p.waiters.pop(0), compute_prefix=True)
            return
        self._drop_from_gpu(p)

    def _drop_from_gpu(self, p: Prefix) -> None:
        self.kv_used -= p.tokens
        p.location = "cpu" if p.host_copy else "none"
        p.ready = False
        p.view = None

    # ------------------------------------------------------------------ decision ops

    def prefix_out(self, p: Prefix, now: float) -> None:
        if p.location == "gpu" and p.ready:
            self.kv_used -= p.tokens
            p.ready = False
            if self._host_tier:
                if not p.host_copy:
                    self._enqueue_transfer(p, "out", now)
                    p.host_copy = True  # FIFO: any later swap-in runs after this copy
                p.location = "cpu"
            else:
                p.location = "none"
        elif p.location == "gpu":  # being recomputed by a prefix-only prefill (never pinned)
            if isinstance(p.filler, PrefixFill):
                self._fills.cancel_prefix(p.filler)
            p.filler = None
            self._drop_from_gpu(p)
        elif p.location == "loading":  # a proactive swap-in nobody waits for
            assert p.transfer is not None
            p.transfer.cancelled = True
            p.transfer = None
            self._drop_from_gpu(p)
        p.view = None

    def prefix_in(self, p: Prefix, now: float) -> None:
        p.last_used_s = now
        p.view = None
        if p.location == "cpu":
            self.kv_used += p.tokens
            p.location = "loading"
            p.ready = False
            p.transfer = self._enqueue_transfer(p, "in", now)
        elif p.location == "none":
            self.kv_used += p.tokens
            p.location = "gpu"
            p.ready = False
            if p.tokens == 0:
                self._prefix_ready(p)
            else:
                self._fills.add_prefix(p)

    def pin(self, r: Req, now: float) -> None:
        """An admitted request takes its KV and pins its prefix (loading or recomputing it)."""
        self.kv_used += r.kv_tokens
        p = r.prefix
        # vLLM's prefix_cache_queries/hits, in tokens, once per admission (a re-admission
        # after preemption queries again, as in vLLM): a hit only when the prefix is already
        # materialised on GPU. Loading from host or being recomputed is a miss here, since
        # this request still waits for those tokens. Counting only: no effect on the run.
        p.cache_queries += p.tokens + r.input_tokens
        if p.ready:
            p.cache_hits += p.tokens
        p.running += 1
        p.last_used_s = now
        p.view = None
        if p.location == "cpu":
            self.prefix_in(p, now)
        if p.location == "none":
            self.kv_used += p.tokens
            p.location = "gpu"
            p.ready = p.tokens == 0  # an empty prefix needs no recompute
            if not p.ready:
                self._fills.add_request(r, compute_prefix=True)
                return
        if p.ready:
            self._fills.add_request(r, compute_prefix=False)
        else:  # loading, or being recomputed by another request / a prefix prefill
            r.phase = "load"
            p.waiters.append(r)

    def unpin(self, r: Req, now: float) -> None:
        """A running request leaves the GPU (its phase not yet cleared): frees its KV."""
        self.kv_used -= r.kv_tokens
        p = r.prefix
        p.running -= 1
        p.last_used_s = now
        p.view = None
        if r.phase == "fill":
            if r.computes_prefix:
                self._lose_filler(p)
        elif r.phase == "load":
            p.waiters.remove(r)
