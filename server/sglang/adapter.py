"""The `Adapter`: one object holding the policy and everything the hooks need.

The plugin's hook functions are thin trampolines into the installed Adapter (plugin.py);
this class does the work:

- HTTP process: `on_convert` puts the request's label on the internal request.
- Scheduler process: `on_new_request` parses the label onto the `Req` and books it;
  `on_prefill` wraps SGLang's prefill step: when the queues changed (or every `redecide_s`
  while requests wait) it builds a Snapshot, asks the policy, checks the Decision and
  applies preempt / prefix_out / prefix_in, then runs SGLang's prefill on the admitted
  requests only; `order_waiting` and `retraction_order` keep SGLang's sorts in line.

Failure policy: a policy exception or an inapplicable Decision is logged and counted, and
nothing is admitted in that step (never silently stock SGLang). A snapshot that is already
over budget (reality drifted from the model) accepts decisions that do not add KV.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...costmodel import Profile, load_profile
from ...errors import LabelError
from ...labels import Label
from ...policies import Policy, close_policy, make_live_policy
from ...snapshot import Decision, Snapshot, check_decision
from ...workflow import load_workflow
from . import apply, labels_http
from .config import PluginConfig
from .residency import PrefixResidency
from .snapshot import ViewCache, build_snapshot
from .tasks import RequestBook

logger = logging.getLogger(__name__)
# After a policy failure SGLang schedules on its own at least this long, whatever redecide_s
# (0 is allowed there): a failing policy asked at every scheduler pass flooded the log.
FALLBACK_MIN_S = 0.5


class DecisionLog:
    """JSONL records, one per line, flushed per line (several processes may append)."""

    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)  # `topas serve` checked it, creating nothing
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the adapter

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")

    def close(self) -> None:
        self._file.close()


class Adapter:
    def __init__(self, config: PluginConfig, *, policy: Policy | None = None, profile: Profile | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.policy = policy if policy is not None else make_live_policy(config.policy, config.policy_options)
        self.profile = profile if profile is not None else load_profile(config.profile)
        self.workflows = MappingProxyType({wf.name: wf for wf in map(load_workflow, config.workflows)})
        self._clock = clock
        self._t0 = clock()
        self.book = RequestBook(dict(self.workflows), config.task_idle_s)
        self.residency = PrefixResidency()
        self.views = ViewCache()
        self.reqs: dict[str, Any] = {}  # tracked SGLang Req objects by rid
        self.stats: Counter[str] = Counter()
        self._log = DecisionLog(config.decision_log) if config.decision_log else None
        self._sched: Any = None
        self._kv_pool = 0
        self._state_key: tuple | None = None
        self._last_decide = -math.inf
        # until when SGLang schedules on its own after the policy failed (see `_decide`)
        self._fallback_until = -math.inf
        self._admit: tuple[str, ...] = ()
        self._rank: dict[str, int] | None = None  # decision order, while SGLang's prefill runs
        self._kept: dict[str, int] = {}  # running rid -> admission sequence (retraction order)
        self._seq = itertools.count()
        self._record: dict[str, Any] | None = None
        self._retractions: dict[str, int] = {}  # rid -> retraction_count already accounted for
        self._adds: list[Any] = []  # PrefillAdder.add_one_req results in the current prefill step

    def now(self) -> float:
        return self._clock() - self._t0

    def log_event(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            self._log.write({"event": event, "t": round(self.now(), 6), "pid": os.getpid(),
                             "process": multiprocessing.current_process().name, **fields})

    def close(self) -> None:
        """Release every pin, the policy's worker (the guard's forecast) and the log (uninstall)."""
        self.residency.release_all()
        close_policy(self.policy)
        if self._log is not None:
            self._log.close()
            self._log = None

    # ------------------------------------------------------------------ HTTP process

    def on_convert(self, converted: Any, request: Any, raw_request: Any) -> None:
        label = labels_http.label_of(request, raw_request, self.workflows)
        if label is not None:
            labels_http.attach_label(converted, label)
            self.stats["http_labelled"] += 1

    def on_responses(self, request: Any, raw_request: Any) -> None:
        """A Responses API call: its label is checked now (LabelError: HTTP 400) and kept on
        the HTTP request until its engine requests are sent (`on_generate`)."""
        label = labels_http.label_of(request, raw_request, self.workflows, getattr(request, "metadata", None))
        if label is not None and raw_request is not None:
            labels_http.keep_label(raw_request, label)
            self.stats["http_labelled"] += 1

    def on_generate(self, obj: Any, raw_request: Any) -> None:
        labels_http.attach_kept_label(obj, raw_request)

    # ------------------------------------------------------------------ scheduler process

    def on_new_request(self, req: Any) -> None:
        try:
            label = labels_http.decode_routing_key(getattr(req, "routing_key", None))
        except LabelError as exc:
            logger.warning("topas: request %s: bad label in routing key (%s); served unlabelled", req.rid, exc)
            label = None
        req.topas_label = label
        meta = self.book.arrive(req.rid, label, self.now())
        self.residency.learn(meta.agent, req, self._declared_prefix(label))
        self.reqs[req.rid] = req

    def _declared_prefix(self, label: Label | None) -> int:
        if label is None:
            return 0
        if label.prefix_tokens is not None:
            return label.prefix_tokens
        wf = self.workflows.get(label.workflow) if label.workflow is not None else None
        return wf.prefix_tokens(label.agent) if wf is not None and wf.has_agent(label.agent) else 0

    def bind(self, sched: Any) -> None:
        """Attach to a scheduler (first hook call in the scheduler process)."""
        if self._sched is sched:
            return
        self.residency.release_all()
        self._sched = sched
        self.residency.bind(sched.tree_cache, getattr(sched, "page_size", 1))
        pool = getattr(sched, "max_total_num_tokens", None) or sched.token_to_kv_pool_allocator.size
        self._kv_pool = int(pool)
        from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

        self.views.clip = int(CLIP_MAX_NEW_TOKENS)
        if getattr(sched, "tp_size", 1) > 1:
            logger.warning("topas: tp_size > 1 is untested: every rank must take identical decisions")

    @property
    def kv_budget(self) -> int:
        """The pool size, or the configured budget. A budget above the pool makes the policy
        over-commit (as SGLang's own optimistic `new_token_ratio` admission does); SGLang's
        decode retraction absorbs the excess, in policy-ranked order."""
        budget = self.config.kv_budget
        return self._kv_pool if budget is None else budget

    def on_prefill(self, orig: Callable[..., Any], sched: Any, running_batch: Any) -> Any:
        """AROUND `Scheduler.get_new_batch_prefill(running_batch)`."""
        self.bind(sched)
        now = self.now()
        waiting = [r for r in sched.waiting_queue if not r.finished()]
        running = [r for r in running_batch.reqs if not r.finished()]
        chunked = getattr(sched, "chunked_req", None)
        if chunked is not None and not chunked.finished() and chunked not in running:
            running.append(chunked)
        if now < self._fallback_until:  # the policy failed: SGLang's own scheduling meanwhile
            return orig(sched, running_batch)
        key = (tuple(r.rid for r in waiting), tuple(r.rid for r in running))
        stale = bool(waiting) and now - self._last_decide >= self.config.redecide_s
        if key != self._state_key or stale or self.book.pending_events:
            self._state_key = key
            self._observe(waiting, running, now)
            if not self._decide(sched, running_batch, waiting, running, now):
                return orig(sched, running_batch)
        by_rid = {r.rid: r for r in sched.waiting_queue}
        admitted = [by_rid[rid] for rid in self._admit if rid in by_rid]
        self._rank = {r.rid: i for i, r in enumerate(admitted)}
        self._adds = []
        try:
            plan, ran = apply.run_restricted(sched, admitted, lambda: orig(sched, running_batch))
        finally:
            self._rank = None
        deferred = apply.deferred_reasons(admitted, ran, self._adds, running_batch)
        self._adds = []
        self._admitted(ran, deferred, now)
        return plan

    def note_add_result(self, result: Any) -> None:
        """AFTER `PrefillAdder.add_one_req`: remember why SGLang's prefill step stopped."""
        if self._rank is not None:
            self._adds.append(result)

    def order_waiting(self, queue: list[Any]) -> None:
        """AFTER `SchedulePolicy.calc_priority`: restore the decision's order."""
        if self._rank is not None:
            apply.reorder(queue, self._rank)

    def retraction_order(self, order: list[int], reqs: list[Any]) -> list[int] | None:
        """AFTER `ScheduleBatch._get_decode_retraction_order`."""
        return apply.retraction_order(order, reqs, self._kept) if self._kept else None

    # ------------------------------------------------------------------ internals

    def _observe(self, waiting: list[Any], running: list[Any], now: float) -> None:
        for req in itertools.chain(waiting, running):
            if req.rid not in self.reqs:  # arrived before install or around the hook
                self.on_new_request(req)
        self._note_retractions(itertools.chain(waiting, running))
        ended = self.book.observe({r.rid for r in waiting}, {r.rid for r in running}, now)
        for rid in ended:
            req = self.reqs.pop(rid)
            finished = getattr(req, "finished_reason", None)
            # a request aborted while it waited has no finish reason yet (it was logged "NoneType")
            reason = "FINISH_ABORT" if finished is None else type(finished).__name__
            ok = reason != "FINISH_ABORT"
            meta = self.book.meta.get(rid)
            self.book.end(rid, ok, now)
            self.views.forget(rid)
            self._kept.pop(rid, None)
            self._retractions.pop(rid, None)
            self.stats["ended_ok" if ok else "ended_failed"] += 1
            self.log_event("end", rid=rid, task=meta.task_id if meta else None, stage=meta.stage if meta else None,
                           ok=ok, reason=reason, output_tokens=len(req.output_ids),
                           retractions=req.retraction_count, kv=self.kv_state())
        for req in running:
            self.residency.touch(self.book.meta[req.rid].agent, now)
        self.book.expire(now)
        self.residency.sync()

    def _note_retractions(self, reqs: Any) -> None:
        """Count retractions SGLang made on its own (decode OOM): the policy's are pre-booked."""
        for req in reqs:
            count = req.retraction_count
            seen = self._retractions.get(req.rid, 0)
            if count > seen:
                self._retractions[req.rid] = count
                self.stats["sglang_retracted"] += count - seen
                self.log_event("retracted", rid=req.rid, by="sglang", retractions=count)

    def residency_after(self) -> dict[str, str]:
        """agent -> location after the decision's prefix moves (agents with no copy left out)."""
        where = {agent: self.residency.location(agent) for agent in self.residency.agents}
        return {agent: loc for agent, loc in where.items() if loc != "none"}

    def kv_state(self) -> dict[str, int]:
        """The scheduler's KV pool right now (tokens): free, evictable cache, locked, pinned."""
        if self._sched is None:
            return {}
        tree = self._sched.tree_cache
        return {"pool": self._kv_pool, "available": int(self._sched.token_to_kv_pool_allocator.available_size()),
                "evictable": int(tree.evictable_size()), "protected": int(tree.protected_size()),
                "pinned": self.residency.pinned_tokens()}

    def _snapshot(self, waiting: list[Any], running: list[Any], now: float) -> Snapshot:
        return build_snapshot(now=now, kv_budget=self.kv_budget, waiting=waiting, running=running,
                              book=self.book, residency=self.residency, views=self.views,
                              profile=self.profile, workflows=self.workflows, events=self.book.events())

    def _decide(self, sched: Any, running_batch: Any, waiting: list[Any], running: list[Any],
                now: float) -> bool:
        """Ask the policy and apply its decision; False when it failed. A policy bug must not
        stop serving: SGLang then schedules on its own (its stock order) until the policy is
        asked again `redecide_s` later. Before, it admitted nothing, so every call hung, and a
        stage-done event the failed decision left unconsumed re-ran the policy at every
        scheduler pass (about 4,000 errors a second in the decision log)."""
        snap = self._snapshot(waiting, running, now)
        self._last_decide = now
        try:
            decision = self.policy.decide(snap)
            # over budget already (model drift): accept decisions that add no KV
            check_decision(replace(snap, kv_budget=max(snap.kv_budget, snap.kv_used)), decision)
        except Exception as exc:
            self.stats["decision_errors"] += 1
            self._admit = ()
            self._fallback_until = now + max(self.config.redecide_s, FALLBACK_MIN_S)
            if self.stats["decision_errors"] <= 10 or self.stats["decision_errors"] % 100 == 0:
                logger.error("topas: policy %r failed (%s: %s); SGLang schedules on its own for %g s",
                             self.config.policy, type(exc).__name__, exc, max(self.config.redecide_s, FALLBACK_MIN_S))
            self.log_event("error", error=f"{type(exc).__name__}: {exc}")
            return False
        self.book.consume_events(len(snap.events))
        self.stats["decisions"] += 1
        self._apply(sched, running_batch, snap, decision)
        return True

    def _apply(self, sched: Any, running_batch: Any, snap: Snapshot, decision: Decision) -> None:
        skipped: list[str] = []
        if decision.preempt:
            retracted, skipped = apply.preempt(sched, running_batch, decision.preempt)
            self.stats["preempted"] += len(retracted)
            for req in retracted:
                self._kept.pop(req.rid, None)
                self._retractions[req.rid] = req.retraction_count  # ours, not SGLang's
                self.book.mark(req.rid, "waiting", snap.now)
                self.log_event("retracted", rid=req.rid, by="policy", retractions=req.retraction_count)
        for agent in decision.prefix_out:
            self.residency.prefix_out(agent)
        loads = {agent: self.residency.prefix_in(agent) for agent in decision.prefix_in}
        self._admit = decision.admit
        if decision.empty or self._log is None:
            self._record = None
            return
        views = {v.rid: v for v in snap.waiting + snap.running}
        self._record = {
            "event": "decision", "t": round(snap.now, 6), "seq": int(self.stats["decisions"]),
            "policy": self.config.policy, "waiting": len(snap.waiting), "running": len(snap.running),
            "kv_used": snap.kv_used, "kv_budget": snap.kv_budget,
            "admit": [_describe(views[rid]) for rid in decision.admit],
            "preempt": [_describe(views[rid]) for rid in decision.preempt], "preempt_skipped": skipped,
            "prefix_in": loads, "prefix_out": list(decision.prefix_out),
            "resident": self.residency_after(),
            "kv": self.kv_state(),
        }

    def _admitted(self, ran: list[Any], deferred: dict[str, str], now: float) -> None:
        for req in ran:
            meta = self.book.meta.get(req.rid)
            if meta is not None:
                self.residency.admit(meta.agent, now)
                self.book.mark(req.rid, "running", now)
            self._kept[req.rid] = next(self._seq)
        self.stats["admitted"] += len(ran)
        if self._record is not None and self._log is not None:
            self.stats["deferred"] += len(deferred)
            self._record["sglang_admitted"] = [r.rid for r in ran]
            self._record["deferred"] = deferred
            self._log.write(self._record)
        self._record = None


def _describe(v: Any) -> dict[str, Any]:
    return {"rid": v.rid, "task": v.task_id, "stage": v.stage, "agent": v.agent}
