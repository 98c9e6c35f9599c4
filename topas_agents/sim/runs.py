"""GPU work: start a prefill step or a decode jump, and commit it when it ends.

`GpuWork` owns the decode batch, the work in flight and the GPU counters; it executes the
prefill queue that residency fills. Prefill has priority over decode (SGLang without mixed
chunks): while any admitted request still needs prefill, decoding requests wait.
"""

from __future__ import annotations

from collections.abc import Callable

from ..costmodel import Profile
from .events import RUN_END, EventHeap
from .fills import PrefillQueue
from .residency import Residency
from .state import PrefixFill, Req, Run
from .steps import (
    PREFILL_CHUNK_TOKENS,
    decode_jump_terms,
    jump_s,
    prefill_batch_s,
    steps_to_cover,
    steps_within,
)
from .tasks import Tasks


class GpuWork:
    __slots__ = ("run", "fills", "decoding", "dec_ctx", "on_token", "runs", "prefill_steps", "decode_steps",
                 "prefill_tokens", "tokens", "busy_s", "batch_time", "decode_time",
                 "_profile", "_max_jump_s", "_events", "_residency", "_tasks", "_retire", "_wake")

    def __init__(self, profile: Profile, max_jump_s: float | None, events: EventHeap, fills: PrefillQueue,
                 residency: Residency, tasks: Tasks, *, retire: Callable[[Req], None],
                 wake: Callable[[], None]) -> None:
        self.run: Run | None = None  # the work in flight
        self.fills = fills
        self.decoding: dict[str, Req] = {}  # the decode batch
        self.dec_ctx = 0  # sum of context over decoding requests
        self.on_token: Callable[[str, int], None] | None = None
        self.runs = self.prefill_steps = self.decode_steps = self.prefill_tokens = self.tokens = 0
        self.busy_s = self.batch_time = self.decode_time = 0.0
        self._profile = profile
        self._max_jump_s = max_jump_s
        self._events = events
        self._residency = residency  # told when a prefill recomputed a prefix
        self._tasks = tasks  # service accounting
        self._retire = retire  # a request generated its last token
        self._wake = wake  # a scheduling event that is no request's finish (a prefix recomputed)

    @property
    def has_work(self) -> bool:
        return bool(self.fills.jobs or self.decoding)

    def start(self, now: float) -> None:
        """Start the next GPU work, if any (the GPU must be free)."""
        if self.fills.jobs:
            self._start_prefill(now)
        elif self.decoding:
            self._start_decode(now)

    def _start_prefill(self, now: float) -> None:
        chunks = self.fills.chunks(PREFILL_CHUNK_TOKENS)
        dur = prefill_batch_s(self._profile, ((t, j.fill_base + j.fill_done) for j, t in chunks))
        run = Run("prefill", now, now + dur)
        run.chunks = chunks
        self._begin(run)

    def _start_decode(self, now: float) -> None:
        batch = list(self.decoding.values())
        step0, slope = decode_jump_terms(self._profile, len(batch), self.dec_ctx)
        k = min(r.spec.output_tokens - r.generated for r in batch)
        nxt = self._events.peek(self.run)
        if nxt is not None:  # stop at the first step boundary at or after the next event
            k = min(k, steps_to_cover(nxt - now, step0, slope))
        if self._max_jump_s is not None:
            k = min(k, steps_within(self._max_jump_s, step0, slope))
        run = Run("decode", now, now + jump_s(k, step0, slope))
        run.k, run.step0, run.slope, run.reqs = k, step0, slope, batch
        self._begin(run)

    def _begin(self, run: Run) -> None:
        self.run = run
        self._events.push(run.end_s, RUN_END, run)

    def interrupt(self, t: float) -> None:
        """Something outside the jump happens at `t`: end the jump at the first boundary >= t."""
        run = self.run
        if run is None or run.kind != "decode" or run.end_s <= t:
            return
        k = steps_to_cover(t - run.start_s, run.step0, run.slope)
        if k < run.k:
            run.k = k
            run.end_s = run.start_s + jump_s(k, run.step0, run.slope)
            self._events.push(run.end_s, RUN_END, run)  # the old entry is now stale

    def drop(self, r: Req) -> None:
        """Take a running request out of the decode batch or the prefill queue."""
        if r.phase == "decode":
            del self.decoding[r.rid]
            self.dec_ctx -= r.context
        elif r.phase == "fill":
            self.fills.remove(r)

    # ------------------------------------------------------------------ commit

    def finish(self, run: Run) -> None:
        """The work in flight ended: commit its tokens (callbacks may submit or cancel)."""
        self.run = None
        dur = run.end_s - run.start_s
        self.busy_s += dur
        self.runs += 1
        if run.kind == "prefill":
            self._commit_prefill(run, dur)
        else:
            self._commit_decode(run, dur)

    def _commit_prefill(self, run: Run, dur: float) -> None:
        self.prefill_steps += 1
        for job, take in run.chunks:
            if isinstance(job, PrefixFill):
                if not job.live:
                    continue
            elif job.state != "running" or job.phase != "fill":
                continue  # cancelled while the step ran
            else:
                self._tasks.serve(job, dur)
            job.fill_done += take
            self.prefill_tokens += take
            if job.fill_done >= job.fill_total:
                self._fill_complete(job)

    def _fill_complete(self, job: Req | PrefixFill) -> None:
        self.fills.remove(job)
        if isinstance(job, PrefixFill):
            self._residency.prefix_computed(job.prefix)
            self._wake()
            return
        r = job
        r.phase = None  # out of the prefill queue; decode or finish below
        if r.computes_prefix:
            r.computes_prefix = False
            self._residency.prefix_computed(r.prefix)
        # The prefill's forward pass also yields the next output token (as in real engines).
        r.generated += 1
        self.tokens += 1
        r.view = None
        if self.on_token is not None:
            self.on_token(r.rid, r.generated)
        if r.generated >= r.spec.output_tokens:
            self._retire(r)
        else:
            r.phase = "decode"
            self.decoding[r.rid] = r
            self.dec_ctx += r.context

    def _commit_decode(self, run: Run, dur: float) -> None:
        self.decode_steps += run.k
        live = [r for r in run.reqs if r.state == "running" and r.phase == "decode"]
        self.batch_time += len(run.reqs) * dur
        self.decode_time += dur
        k = run.k
        self.dec_ctx += k * len(live)
        self.tokens += k * len(live)
        on_token = self.on_token
        serve = self._tasks.serve
        for r in live:
            r.generated += k
            r.view = None
            serve(r, dur)
            if on_token is not None:
                on_token(r.rid, r.generated)
        for r in live:  # callbacks may cancel batch-mates: re-check the state
            if r.state == "running" and r.generated >= r.spec.output_tokens:
                self._retire(r)
