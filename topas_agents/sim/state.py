"""Mutable engine-internal records (slotted for speed). Never handed to policies."""

from __future__ import annotations

from typing import Literal

from ..engine import EngineRequest
from ..snapshot import PrefixLocation, PrefixView, RequestView, TaskView

ReqState = Literal["waiting", "running", "finished", "cancelled"]
# Phase of a running request: waiting for its prefix (swap-in or another request's
# recompute), prefilling (queued for or inside prefill chunks), or decoding.
Phase = Literal["load", "fill", "decode"]


class Prefix:
    __slots__ = ("agent", "tokens", "location", "ready", "host_copy", "last_used_s", "running",
                 "waiters", "filler", "transfer", "view", "cache_queries", "cache_hits")

    def __init__(self, agent: str, tokens: int) -> None:
        self.agent = agent
        self.tokens = tokens
        self.location: PrefixLocation = "none"
        self.ready = False  # location == "gpu" and materialised (not still being recomputed)
        self.host_copy = False  # a CPU copy exists or is being written (FIFO link)
        self.last_used_s = 0.0
        self.running = 0  # running requests pinning it
        self.waiters: list[Req] = []  # running requests waiting for it to become ready
        self.filler: Req | PrefixFill | None = None  # what is recomputing it
        self.transfer: Transfer | None = None  # the swap-in while loading
        self.view: PrefixView | None = None  # cached snapshot view (None: stale)
        # Prefix-cache accounting, in tokens, counted at each admission (Residency.pin):
        # prompt tokens queried, and those served from this prefix already materialised on GPU.
        self.cache_queries = 0
        self.cache_hits = 0

    @property
    def on_gpu(self) -> bool:
        return self.location in ("gpu", "loading")


class Task:
    __slots__ = ("task_id", "workflow", "arrival_s", "done", "active", "rounds", "agents", "attained_s",
                 "view")

    def __init__(self, task_id: str, workflow: str | None, arrival_s: float) -> None:
        self.task_id = task_id
        self.workflow = workflow
        self.arrival_s = arrival_s
        self.done: set[str] = set()
        self.active: dict[str, float] = {}  # started, not done stage -> attained service
        self.rounds: dict[str, int] = {}  # stage -> requests submitted
        self.agents: dict[str, str] = {}  # stage -> agent
        self.attained_s = 0.0
        self.view: TaskView | None = None


class Req:
    __slots__ = ("spec", "rid", "task", "prefix", "input_tokens", "arrival_s", "generated", "service_s",
                 "preemptions", "state", "phase", "fill_total", "fill_done", "fill_base",
                 "computes_prefix", "view")

    def __init__(self, spec: EngineRequest, task: Task, prefix: Prefix, input_tokens: int,
                 arrival_s: float) -> None:
        self.spec = spec
        self.rid = spec.rid
        self.task = task
        self.prefix = prefix
        self.input_tokens = input_tokens  # spec's input plus any prefix excess folded in
        self.arrival_s = arrival_s
        self.generated = 0
        self.service_s = 0.0
        self.preemptions = 0
        self.state: ReqState = "waiting"
        self.phase: Phase | None = None
        self.fill_total = 0  # tokens this prefill must compute
        self.fill_done = 0
        self.fill_base = 0  # cached context before the first new token
        self.computes_prefix = False
        self.view: RequestView | None = None

    @property
    def kv_tokens(self) -> int:
        return self.input_tokens + self.spec.max_new_tokens

    @property
    def context(self) -> int:
        """KV a decode step reads for this request (its prefix is read per request)."""
        return self.prefix.tokens + self.input_tokens + self.generated


class PrefixFill:
    """A prefill of a prefix alone (`prefix_in` of a prefix that exists nowhere)."""

    __slots__ = ("prefix", "fill_total", "fill_done", "fill_base", "live")

    def __init__(self, prefix: Prefix) -> None:
        self.prefix = prefix
        self.fill_total = prefix.tokens
        self.fill_done = 0
        self.fill_base = 0
        self.live = True


class Transfer:
    __slots__ = ("prefix", "direction", "start_s", "end_s", "cancelled")

    def __init__(self, prefix: Prefix, direction: Literal["in", "out"], start_s: float, end_s: float) -> None:
        self.prefix = prefix
        self.direction = direction
        self.start_s = start_s
        self.end_s = end_s
        self.cancelled = False


class Run:
    """GPU work in flight: one prefill step or a jump of k uniform decode steps."""

    __slots__ = ("kind", "start_s", "end_s", "k", "step0", "slope", "reqs", "chunks")

    def __init__(self, kind: Literal["prefill", "decode"], start_s: float, end_s: float) -> None:
        self.kind = kind
        self.start_s = start_s
        self.end_s = end_s
        self.k = 1
        self.step0 = 0.0
        self.slope = 0.0
        self.reqs: list[Req] = []  # decode batch
        self.chunks: list[tuple[Req | PrefixFill, int]] = []  # prefill (job, tokens)
