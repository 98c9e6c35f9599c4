"""The prefill queue: admitted requests and prefix-only recomputes that still need prefill.

Residency puts jobs in (a request whose prefix is ready, or that recomputes it; a prefix
brought back by recompute); GPU work takes chunks off the front and removes finished jobs.
"""

from __future__ import annotations

from .state import Prefix, PrefixFill, Req


class PrefillQueue:
    __slots__ = ("jobs",)

    def __init__(self) -> None:
        self.jobs: list[Req | PrefixFill] = []  # FIFO

    def add_request(self, r: Req, *, compute_prefix: bool) -> None:
        """Queue `r`'s prefill; with `compute_prefix` it also recomputes its agent prefix."""
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
        self.jobs.append(r)

    def add_prefix(self, p: Prefix) -> None:
        """Queue a prefill of the (non-empty) prefix alone."""
        job = PrefixFill(p)
        p.filler = job
        self.jobs.append(job)

    def cancel_prefix(self, job: PrefixFill) -> None:
        """Drop a prefix-only prefill; a chunk of it already in flight is discarded."""
        job.live = False
        self.jobs.remove(job)

    def remove(self, job: Req | PrefixFill) -> None:
        self.jobs.remove(job)

    def chunks(self, budget: int) -> list[tuple[Req | PrefixFill, int]]:
        """The next step's (job, new tokens): jobs in order until `budget` tokens are taken."""
        out: list[tuple[Req | PrefixFill, int]] = []
        for job in self.jobs:
            take = min(budget, job.fill_total - job.fill_done)
            out.append((job, take))
            budget -= take
            if budget <= 0:
                break
        return out
