"""Prefix residency and request placement: the state changes a Decision makes.

Mixed into `SimEngine`; every method keeps `_kv_used` equal to the snapshot accounting
(prefixes on GPU or loading + kv_tokens of running requests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .state import Prefix, PrefixFill, Req, Transfer

if TYPE_CHECKING:
    from .engine import SimEngine

TRANSFER = 1  # heap event kind (see engine.py)


class ResidencyMixin:
    # ------------------------------------------------------------------ transfers

    def _enqueue_transfer(self: SimEngine, p: Prefix, direction: str) -> Transfer:
        """Serialise a transfer on the single host link (FIFO) and schedule its completion."""
        start = max(self.now, self._link_free_s)
        tr = Transfer(p, direction, start, start + self.profile.swap_s(p.tokens))  # type: ignore[arg-type]
        self._link_free_s = tr.end_s
        self._push(tr.end_s, TRANSFER, tr)
        if direction == "in":
            self._n_swaps_in += 1
        else:
            self._n_swaps_out += 1
        return tr

    def _transfer_done(self: SimEngine, tr: Transfer) -> None:
        p = tr.prefix
        if tr.direction == "out" or tr.cancelled or p.transfer is not tr:
            return  # a swap-out only frees the link; a cancelled swap-in still used its slot
        p.transfer = None
        p.location = "gpu"
        p.view = None
        self._prefix_ready(p)
        self._dirty = True

    # ------------------------------------------------------------------ prefix readiness

    def _prefix_ready(self: SimEngine, p: Prefix) -> None:
        """The prefix is materialised on GPU: its waiting requests may now prefill."""
        p.ready = True
        p.filler = None
        waiters, p.waiters = p.waiters, []
        for r in waiters:
            self._start_fill(r, compute_prefix=False)

    def _start_fill(self: SimEngine, r: Req, *, compute_prefix: bool) -> None:
        r.phase = "fill"
        r.computes_prefix = compute_prefix
        r.fill_done = 0
        # Re-prefill after preemption: input + generated. At least one token is computed even
        # for a fully cached prompt (SGLang recomputes the last prompt token to get logits).
        own = max(1, r.input_tokens + r.generated)
        if compute_prefix:
            r.fill_total, r.fill_base = r.prefix.tokens + own, 0
            r.prefix.filler = r
        else:
            r.fill_total, r.fill_base = own, r.prefix.tokens
        r.view = None
        self._fills.append(r)

    def _start_prefix_fill(self: SimEngine, p: Prefix) -> None:
        if p.tokens == 0:
            self._prefix_ready(p)
            return
        job = PrefixFill(p)
        p.filler = job
        self._fills.append(job)

    def _prefix_computed(self: SimEngine, p: Prefix) -> None:
        self._n_recomputes += 1
        self._prefix_ready(p)

    def _lose_filler(self: SimEngine, p: Prefix) -> None:
        """The request recomputing `p` left: hand the work to a waiter, or drop the prefix."""
        p.filler = None
        if p.waiters:
            self._start_fill(p.waiters.pop(0), compute_prefix=True)
            return
        self._drop_from_gpu(p)

    def _drop_from_gpu(self: SimEngine, p: Prefix) -> None:
        self._kv_used -= p.tokens
        p.location = "cpu" if p.host_copy else "none"
        p.ready = False
        p.view = None

    # ------------------------------------------------------------------ decision ops

    def _prefix_out(self: SimEngine, p: Prefix) -> None:
        if p.location == "gpu" and p.ready:
            self._kv_used -= p.tokens
            p.ready = False
            if self.host_tier:
                if not p.host_copy:
                    self._enqueue_transfer(p, "out")
                    p.host_copy = True  # FIFO: any later swap-in runs after this copy
                p.location = "cpu"
            else:
                p.location = "none"
        elif p.location == "gpu":  # being recomputed by a prefix-only prefill (never pinned)
            if isinstance(p.filler, PrefixFill):
                p.filler.live = False
                self._fills.remove(p.filler)
            p.filler = None
            self._drop_from_gpu(p)
        elif p.location == "loading":  # a proactive swap-in nobody waits for
            assert p.transfer is not None
            p.transfer.cancelled = True
            p.transfer = None
            self._drop_from_gpu(p)
        p.view = None

    def _prefix_in(self: SimEngine, p: Prefix) -> None:
        p.last_used_s = self.now
        p.view = None
        if p.location == "cpu":
            self._kv_used += p.tokens
            p.location = "loading"
            p.ready = False
            p.transfer = self._enqueue_transfer(p, "in")
        elif p.location == "none":
            self._kv_used += p.tokens
            p.location = "gpu"
            p.ready = False
            self._start_prefix_fill(p)

    def _admit(self: SimEngine, r: Req) -> None:
        del self._waiting[r.rid]
        del self._waiting_views[r.rid]
        self._running[r.rid] = r
        r.state = "running"
        r.view = None
        self._kv_used += r.kv_tokens
        p = r.prefix
        p.running += 1
        p.last_used_s = self.now
        p.view = None
        if p.location == "cpu":
            self._prefix_in(p)
        if p.location == "none":
            self._kv_used += p.tokens
            p.location = "gpu"
            p.ready = p.tokens == 0  # an empty prefix needs no recompute
            if not p.ready:
                self._start_fill(r, compute_prefix=True)
                return
        if p.ready:
            self._start_fill(r, compute_prefix=False)
        else:  # loading, or being recomputed by another request / a prefix prefill
            r.phase = "load"
            p.waiters.append(r)

    def _release(self: SimEngine, r: Req) -> None:
        """Take a running request off the GPU (finish, preemption, cancel): frees its KV."""
        del self._running[r.rid]
        self._kv_used -= r.kv_tokens
        p = r.prefix
        p.running -= 1
        p.last_used_s = self.now
        p.view = None
        if r.phase == "decode":
            del self._decoding[r.rid]
            self._dec_ctx -= r.context
        elif r.phase == "fill":
            self._fills.remove(r)
            if r.computes_prefix:
                self._lose_filler(p)
        elif r.phase == "load":
            p.waiters.remove(r)
        r.phase = None
        r.computes_prefix = False
        r.view = None

    def _requeue(self: SimEngine, r: Req) -> None:
        r.state = "waiting"
        r.fill_total = r.fill_done = r.fill_base = 0
        self._waiting[r.rid] = r
        self._waiting_views[r.rid] = self._request_view(r)
