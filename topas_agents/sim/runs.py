"""GPU work: start a prefill step or a decode jump, and commit it when it ends.

Mixed into `SimEngine`. Prefill has priority over decode (SGLang without mixed chunks):
while any admitted request still needs prefill, decoding requests wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .state import PrefixFill, Req, Run
from .steps import (
    PREFILL_CHUNK_TOKENS,
    decode_jump_terms,
    jump_s,
    prefill_batch_s,
    steps_to_cover,
    steps_within,
)

if TYPE_CHECKING:
    from .engine import SimEngine

RUN_END = 2  # heap event kind (see engine.py)


class RunsMixin:
    def _start_run(self: SimEngine) -> None:
        if self._fills:
            self._start_prefill()
        elif self._decoding:
            self._start_decode()

    def _start_prefill(self: SimEngine) -> None:
        budget = PREFILL_CHUNK_TOKENS
        chunks: list[tuple[Req | PrefixFill, int]] = []
        for job in self._fills:
            take = min(budget, job.fill_total - job.fill_done)
            chunks.append((job, take))
            budget -= take
            if budget <= 0:
                break
        dur = prefill_batch_s(self.profile, ((t, j.fill_base + j.fill_done) for j, t in chunks))
        run = Run("prefill", self.now, self.now + dur)
        run.chunks = chunks
        self._begin(run)

    def _start_decode(self: SimEngine) -> None:
        batch = list(self._decoding.values())
        step0, slope = decode_jump_terms(self.profile, len(batch), self._dec_ctx)
        k = min(r.spec.output_tokens - r.generated for r in batch)
        nxt = self._peek()
        if nxt is not None:  # stop at the first step boundary at or after the next event
            k = min(k, steps_to_cover(nxt - self.now, step0, slope))
        if self.max_jump_s is not None:
            k = min(k, steps_within(self.max_jump_s, step0, slope))
        run = Run("decode", self.now, self.now + jump_s(k, step0, slope))
        run.k, run.step0, run.slope, run.reqs = k, step0, slope, batch
        self._begin(run)

    def _begin(self: SimEngine, run: Run) -> None:
        self._run = run
        self._push(run.end_s, RUN_END, run)

    def _interrupt(self: SimEngine, t: float) -> None:
        """Something outside the jump happens at `t`: end the jump at the first boundary >= t."""
        run = self._run
        if run is None or run.kind != "decode" or run.end_s <= t:
            return
        k = steps_to_cover(t - run.start_s, run.step0, run.slope)
        if k < run.k:
            run.k = k
            run.end_s = run.start_s + jump_s(k, run.step0, run.slope)
            self._push(run.end_s, RUN_END, run)  # the old entry is now stale

    # ------------------------------------------------------------------ commit

    def _finish_run(self: SimEngine, run: Run) -> None:
        self._run = None
        dur = run.end_s - run.start_s
        self._busy_s += dur
        self._n_runs += 1
        if run.kind == "prefill":
            self._commit_prefill(run, dur)
        else:
            self._commit_decode(run, dur)
        if self.check:
            self.check_integrity()

    def _serve(self: SimEngine, r: Req, dur: float) -> None:
        r.service_s += dur
        task = r.task
        task.attained_s += dur
        stage = r.spec.stage
        if stage in task.active:
            task.active[stage] += dur
        task.view = None
        self._task_dirty[task.task_id] = task

    def _commit_prefill(self: SimEngine, run: Run, dur: float) -> None:
        self._n_prefill_steps += 1
        for job, take in run.chunks:
            if isinstance(job, PrefixFill):
                if not job.live:
                    continue
            elif job.state != "running" or job.phase != "fill":
                continue  # cancelled while the step ran
            else:
                self._serve(job, dur)
            job.fill_done += take
            self._n_prefill_tokens += take
            if job.fill_done >= job.fill_total:
                self._fill_complete(job)

    def _fill_complete(self: SimEngine, job: Req | PrefixFill) -> None:
        self._fills.remove(job)
        if isinstance(job, PrefixFill):
            self._prefix_computed(job.prefix)
            self._dirty = True
            return
        r = job
        r.phase = None  # out of the prefill queue; decode or finish below
        if r.computes_prefix:
            r.computes_prefix = False
            self._prefix_computed(r.prefix)
        # The prefill's forward pass also yields the next output token (as in real engines).
        r.generated += 1
        self._tokens += 1
        r.view = None
        if self.on_token is not None:
            self.on_token(r.rid, r.generated)
        if r.generated >= r.spec.output_tokens:
            self._finish(r)
        else:
            r.phase = "decode"
            self._decoding[r.rid] = r
            self._dec_ctx += r.context

    def _commit_decode(self: SimEngine, run: Run, dur: float) -> None:
        self._n_decode_steps += run.k
        live = [r for r in run.reqs if r.state == "running" and r.phase == "decode"]
        self._batch_time += len(run.reqs) * dur
        self._decode_time += dur
        k = run.k
        self._dec_ctx += k * len(live)
        self._tokens += k * len(live)
        on_token = self.on_token
        for r in live:
            r.generated += k
            r.view = None
            self._serve(r, dur)
            if on_token is not None:
                on_token(r.rid, r.generated)
        for r in live:  # callbacks may cancel batch-mates: re-check the state
            if r.state == "running" and r.generated >= r.spec.output_tokens:
                self._finish(r)

    def _finish(self: SimEngine, r: Req) -> None:
        self._release(r)
        del self._reqs[r.rid]
        r.state = "finished"
        self._finished_tokens += r.generated
        self._n_finished += 1
        self._dirty = True
        if self.on_finish is not None:
            self.on_finish(r.rid, self.now)
