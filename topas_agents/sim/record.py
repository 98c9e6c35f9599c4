"""Optional per-request lifecycle recording (timelines), off unless a recorder is given.

`TimelineRecorder` is handed to `SimEngine(recorder=...)` (or `SimEngine.set_recorder`,
for an engine built elsewhere, like the server's). The engine calls it at lifecycle points
it already has (submit, admit, preempt, finish, cancel), after every decision and every
batch of same-time events (`sync`: phase changes of running requests, the KV and batch
counters), and the residency calls it when a host-link transfer is queued. With no
recorder the engine pays one `is None` test per event batch and lifecycle point.

Phases of one request, in time order and never overlapping:
    queued -> [prefix_load] -> prefill -> decode -> (finished | cancelled)
and after a preemption `preempted` (waiting again) instead of `queued`. `prefix_load` is a
running request waiting for its agent prefix (a swap-in, or another request's recompute);
`prefill` includes waiting in the prefill queue, `decode` includes steps paused by prefill.

Bounds: `first_tasks` records only the requests of the first N tasks to arrive and stops
sampling once they are all done (benchmarks); `keep_requests` keeps only the most recent N
requests and `keep_samples` counter samples (a long-lived server).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError
from .state import Req, Transfer

SpanPhase = Literal["queued", "preempted", "prefix_load", "prefill", "decode"]
RequestEnd = Literal["finished", "cancelled", "open"]
# A running request's engine phase -> its span name.
_RUNNING: dict[str | None, SpanPhase] = {"load": "prefix_load", "fill": "prefill", "decode": "decode"}


@dataclass(frozen=True, slots=True)
class Span:
    phase: SpanPhase
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    rid: str
    task_id: str
    workflow: str | None
    stage: str
    agent: str
    round: int
    arrival_s: float
    end_s: float  # finish/cancel time, or the timeline's `now_s` if still open
    end: RequestEnd
    spans: tuple[Span, ...]
    preemptions: tuple[float, ...]  # times it was preempted


@dataclass(frozen=True, slots=True)
class PrefixTransfer:
    """A host-link transfer, queued at `queued_s`, on the (FIFO) link from start to end."""

    agent: str
    direction: Literal["in", "out"]
    tokens: int
    queued_s: float
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class Sample:
    """Engine counters from `t_s` until the next sample."""

    t_s: float
    kv_used: int
    running: int  # admitted requests (any phase)
    decoding: int  # the decode batch


@dataclass(frozen=True, slots=True)
class Timeline:
    kv_budget: int
    now_s: float
    requests: tuple[RequestTimeline, ...]  # arrival order
    transfers: tuple[PrefixTransfer, ...]
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class RecorderConfig:
    """What to keep. None: no limit."""

    first_tasks: int | None = None  # only the first N tasks to arrive (a bench's Gantt rows)
    keep_requests: int | None = None  # only the latest N requests (bounded memory online)
    keep_samples: int | None = None  # only the latest N counter samples and transfers

    def __post_init__(self) -> None:
        for name in ("first_tasks", "keep_requests", "keep_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"RecorderConfig.{name} must be >= 1 or None, got {value}")


class _Open:
    """A request being recorded (mutable until it ends)."""

    __slots__ = ("req", "arrival_s", "phase", "since", "spans", "preemptions", "end", "end_s")

    def __init__(self, req: Req, now: float) -> None:
        self.req = req
        self.arrival_s = now
        self.phase: SpanPhase | None = "queued"
        self.since = now
        self.spans: list[Span] = []
        self.preemptions: list[float] = []
        self.end: RequestEnd = "open"
        self.end_s = now

    def move(self, phase: SpanPhase | None, now: float) -> None:
        if phase == self.phase:
            return
        if self.phase is not None:
            self.spans.append(Span(self.phase, self.since, now))
        self.phase, self.since = phase, now


class TimelineRecorder:
    """Collects what `Timeline` reports; the engine calls the methods below."""

    def __init__(self, config: RecorderConfig | None = None) -> None:
        self.config = config or RecorderConfig()
        self.kv_budget = 0  # set by the engine it is attached to
        self._reqs: OrderedDict[str, _Open] = OrderedDict()
        self._tasks: set[str] = set()  # tracked tasks (first_tasks mode)
        self._tasks_done: set[str] = set()
        self._samples: deque[Sample] = deque(maxlen=self.config.keep_samples)
        self._transfers: deque[PrefixTransfer] = deque(maxlen=self.config.keep_samples)
        self._last: tuple[int, int, int] | None = None
        self.closed = False  # every tracked task is done: nothing more to record

    # ------------------------------------------------------------------ engine hooks

    def arrive(self, now: float, r: Req) -> None:
        if self.closed:
            return
        first = self.config.first_tasks
        if first is not None and r.task.task_id not in self._tasks:
            if len(self._tasks) >= first:
                return
            self._tasks.add(r.task.task_id)
        self._reqs[r.rid] = _Open(r, now)
        keep = self.config.keep_requests
        if keep is not None and len(self._reqs) > keep:
            self._reqs.popitem(last=False)

    def admit(self, now: float, r: Req) -> None:
        o = self._reqs.get(r.rid)
        if o is not None:
            o.move(_RUNNING.get(r.phase, "prefill"), now)

    def preempt(self, now: float, r: Req) -> None:
        o = self._reqs.get(r.rid)
        if o is not None:
            o.preemptions.append(now)
            o.move("preempted", now)

    def leave(self, now: float, r: Req, end: Literal["finished", "cancelled"]) -> None:
        o = self._reqs.get(r.rid)
        if o is not None and o.end == "open":
            o.move(None, now)
            o.end, o.end_s = end, now

    def task_done(self, task_id: str) -> None:
        if task_id in self._tasks:
            self._tasks_done.add(task_id)
            first = self.config.first_tasks
            self.closed = first is not None and len(self._tasks_done) >= first

    def transfer(self, now: float, tr: Transfer) -> None:
        if not self.closed:
            self._transfers.append(PrefixTransfer(tr.prefix.agent, tr.direction, tr.prefix.tokens, now,
                                                  tr.start_s, tr.end_s))

    def sync(self, now: float, running: Iterable[Req], kv_used: int, decoding: int) -> None:
        """After a decision or a batch of events: note phase changes and the counters."""
        if self.closed:
            return
        n = 0
        reqs = self._reqs
        for r in running:
            n += 1
            o = reqs.get(r.rid)
            if o is not None and o.end == "open":
                o.move(_RUNNING.get(r.phase, o.phase), now)
        key = (kv_used, n, decoding)
        if key != self._last:
            self._last = key
            self._samples.append(Sample(now, kv_used, n, decoding))

    # ------------------------------------------------------------------ results

    def timeline(self, now: float) -> Timeline:
        """What was recorded up to `now` (open requests and their phases end at `now`)."""
        return Timeline(self.kv_budget, now, tuple(_freeze(o, now) for o in self._reqs.values()),
                        tuple(self._transfers), tuple(self._samples))

    @property
    def last_end_s(self) -> float:
        """When the last recorded request ended (0.0 if none did)."""
        return max((o.end_s for o in self._reqs.values() if o.end != "open"), default=0.0)


def _freeze(o: _Open, now: float) -> RequestTimeline:
    spans = list(o.spans)
    if o.end == "open" and o.phase is not None:
        spans.append(Span(o.phase, o.since, max(now, o.since)))
    spec = o.req.spec
    return RequestTimeline(o.req.rid, spec.task_id, spec.workflow, spec.stage, spec.agent, spec.round,
                           o.arrival_s, o.end_s if o.end != "open" else max(now, o.since), o.end,
                           tuple(spans), tuple(o.preemptions))
