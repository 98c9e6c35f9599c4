"""A tiny fake engine with SimEngine's online API, for server tests that need exact control
(disconnects, failures) independent of the real simulator. Also tests the fake itself."""

from __future__ import annotations

import collections
from dataclasses import dataclass

import pytest

from topas_agents.costmodel import load_profile
from topas_agents.engine import EngineRequest  # the core request type: the fake replaces only the engine
from topas_agents.errors import TopasError
from topas_agents.snapshot import PrefixView, RequestView, Snapshot


class FakeOverBudgetError(TopasError):
    pass


@dataclass
class FakeStats:
    decisions: int = 0
    decision_ms_mean: float = 0.0
    decision_ms_p99: float = 0.0
    mean_batch: float = 0.0
    prefix_swaps_in: int = 0
    prefix_swaps_out: int = 0
    preemptions: int = 0


class FakeEngine:
    """FCFS; admitted requests decode one token per `step_s` in lockstep; KV reserved as
    prefix (once per agent) + input + max_new_tokens."""

    def __init__(self, kv_budget: int = 200_000, step_s: float = 0.01, fail_at: float | None = None) -> None:
        self.now = 0.0
        self.kv_budget = kv_budget
        self.step_s = step_s
        self.fail_at = fail_at
        self.waiting: collections.deque[EngineRequest] = collections.deque()
        self.running: dict[str, EngineRequest] = {}
        self.generated: dict[str, int] = {}
        self.arrival: dict[str, float] = {}
        self.prefix_tokens: dict[str, int] = {}
        self.on_token = None
        self.on_finish = None
        self.stage_dones: list[tuple[str, str]] = []
        self.task_dones: list[str] = []
        self.cancelled: list[str] = []
        self.submitted: list[EngineRequest] = []
        self._stats = FakeStats()
        self._next = None

    def _kv_used(self) -> int:
        agents = {r.agent for r in self.running.values()}
        return sum(self.prefix_tokens[a] for a in agents) + sum(
            r.input_tokens + r.max_new_tokens for r in self.running.values())

    def submit(self, req: EngineRequest) -> None:
        if req.prefix_tokens + req.input_tokens + req.max_new_tokens > self.kv_budget:
            raise FakeOverBudgetError(f"request {req.rid} needs more KV than the budget {self.kv_budget}")
        self.prefix_tokens.setdefault(req.agent, req.prefix_tokens)
        self.arrival[req.rid] = self.now
        self.waiting.append(req)
        self.submitted.append(req)
        if self._next is None:
            self._next = self.now

    def cancel(self, rid: str) -> bool:
        for r in list(self.waiting):
            if r.rid == rid:
                self.waiting.remove(r)
                self.cancelled.append(rid)
                return True
        if self.running.pop(rid, None) is not None:
            self.cancelled.append(rid)
            return True
        return False

    def stage_done(self, task_id: str, stage: str) -> None:
        self.stage_dones.append((task_id, stage))

    def task_done(self, task_id: str) -> None:
        self.task_dones.append(task_id)

    def call_at(self, t: float, fn) -> None:  # pragma: no cover - unused by the server
        raise NotImplementedError

    def next_event_time(self) -> float | None:
        return self._next

    def advance(self, until: float) -> None:
        while self._next is not None and self._next <= until:
            self.now = self._next
            if self.fail_at is not None and self.now >= self.fail_at:
                raise RuntimeError("fake engine failure")
            self._step()
        self.now = max(self.now, until)

    def _step(self) -> None:
        self._stats.decisions += 1
        while self.waiting:
            r = self.waiting[0]
            extra = r.input_tokens + r.max_new_tokens
            if r.agent not in {x.agent for x in self.running.values()}:
                extra += self.prefix_tokens[r.agent]
            if self._kv_used() + extra > self.kv_budget:
                break
            self.waiting.popleft()
            self.running[r.rid] = r
            self.generated[r.rid] = 0
        for rid, r in list(self.running.items()):
            self.generated[rid] += 1
            if self.on_token:
                self.on_token(rid, self.generated[rid])
            if self.generated[rid] >= r.output_tokens:
                del self.running[rid]
                if self.on_finish:
                    self.on_finish(rid, self.now)
        self._next = self.now + self.step_s if (self.running or self.waiting) else None

    def stats(self) -> FakeStats:
        return self._stats

    def snapshot(self) -> Snapshot:
        def view(r: EngineRequest) -> RequestView:
            return RequestView(r.rid, r.task_id, r.workflow, r.stage, r.agent, r.prefix_tokens, r.input_tokens,
                               r.max_new_tokens, self.generated.get(r.rid, 0), self.arrival[r.rid],
                               r.task_arrival_s or 0.0, r.round)

        running_agents = collections.Counter(r.agent for r in self.running.values())
        prefixes = tuple(PrefixView(a, t, "gpu" if running_agents[a] else "none", self.now, running_agents[a])
                         for a, t in self.prefix_tokens.items())
        return Snapshot(self.now, self.kv_budget, tuple(view(r) for r in self.waiting),
                        tuple(view(r) for r in self.running.values()), prefixes, (), load_profile())


def fake_factory(**kw):
    """An engine_factory for build_app/start_server_in_thread; `.engines` lists what it built."""
    def factory(config, workflows):
        eng = FakeEngine(**kw)
        factory.engines.append(eng)
        return eng, EngineRequest

    factory.engines = []
    return factory


def _req(rid: str, out: int, max_new: int | None = None) -> EngineRequest:
    return EngineRequest(rid, "t", None, "s", "a", 10, 5, out, max_new or out)


def test_fake_engine_runs_requests_to_completion_in_order() -> None:
    eng = FakeEngine(step_s=0.1)
    done: list[tuple[str, float]] = []
    eng.on_finish = lambda rid, t: done.append((rid, t))
    eng.submit(_req("a", 3))
    eng.submit(_req("b", 1))
    eng.advance(10.0)
    assert [r for r, _ in done] == ["b", "a"]
    assert done[1][1] == pytest.approx(0.2)
    assert eng.next_event_time() is None and eng.snapshot().kv_used == 0


def test_fake_engine_over_budget_and_cancel() -> None:
    eng = FakeEngine(kv_budget=100)
    with pytest.raises(TopasError):
        eng.submit(_req("big", 10, max_new=200))
    eng.submit(_req("x", 50))
    eng.advance(0.05)
    assert eng.snapshot().kv_used > 0
    assert eng.cancel("x") and not eng.cancel("x")
    assert eng.snapshot().kv_used == 0
