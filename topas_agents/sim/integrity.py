"""Executable engine invariants (the engine calls them after every decision when check=True).

They re-derive each manager's bookkeeping from the records, across managers: the request
table, GPU work (prefill queue, decode batch, tokens) and residency (prefixes, KV).
"""

from __future__ import annotations

from .requests import RequestTable
from .residency import Residency
from .runs import GpuWork
from .state import PrefixFill


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"engine invariant broken: {what}")


def check_engine(requests: RequestTable, gpu: GpuWork, residency: Residency, *, kv_budget: int,
                 host_tier: bool) -> None:
    _check_queues(requests, gpu)
    _check_prefixes(requests, residency, host_tier)
    _check_budget(requests, residency, kv_budget)
    _check_tokens(requests, gpu)


def _check_queues(requests: RequestTable, gpu: GpuWork) -> None:
    waiting, running = set(requests.waiting), set(requests.running)
    _require(not waiting & running, f"requests both waiting and running: {sorted(waiting & running)}")
    _require(waiting | running == set(requests.live), "live request table != waiting + running")
    _require(set(requests.waiting_views) == waiting, "waiting views out of sync")
    for rid, r in requests.waiting.items():
        _require(r.state == "waiting" and r.phase is None, f"{rid} waiting in state {r.state}/{r.phase}")
    jobs = gpu.fills.jobs
    fills = [j for j in jobs if not isinstance(j, PrefixFill)]
    _require(len({id(j) for j in jobs}) == len(jobs), "a prefill job queued twice")
    for r in fills:
        _require(r.rid in running and r.phase == "fill", f"{r.rid} queued for prefill but {r.phase}")
    for rid, r in requests.running.items():
        _require(r.state == "running", f"{rid} running in state {r.state}")
        p = r.prefix
        _require(p.on_gpu, f"{rid} runs while prefix {p.agent} is {p.location}")
        if r.phase == "decode":
            _require(rid in gpu.decoding, f"{rid} decoding but not in the batch")
            _require(not p.waiters or r not in p.waiters, f"{rid} decodes and waits")
        elif r.phase == "fill":
            _require(r in jobs, f"{rid} prefilling but not queued")
            _require(p.ready or r.computes_prefix, f"{rid} prefills before prefix {p.agent} is ready")
        else:
            _require(r.phase == "load" and r in p.waiters and not p.ready,
                     f"{rid} in phase {r.phase} (prefix {p.agent} ready={p.ready})")
    _require(set(gpu.decoding) <= running, "decode batch holds a request that is not running")
    ctx = sum(r.context for r in gpu.decoding.values())
    _require(ctx == gpu.dec_ctx, f"decode context {gpu.dec_ctx} != recomputed {ctx}")


def _check_prefixes(requests: RequestTable, residency: Residency, host_tier: bool) -> None:
    pins: dict[str, int] = {}
    for r in requests.running.values():
        pins[r.prefix.agent] = pins.get(r.prefix.agent, 0) + 1
    for agent, p in residency.prefixes.items():
        _require(p.running == pins.get(agent, 0), f"prefix {agent} pinned {p.running}, running {pins.get(agent, 0)}")
        _require(p.running >= 0, f"prefix {agent} has negative pins")
        if p.location == "loading":
            _require(p.transfer is not None and not p.transfer.cancelled, f"prefix {agent} loading w/o transfer")
            _require(host_tier and p.host_copy, f"prefix {agent} loading without a host copy")
        if p.location == "cpu":
            _require(host_tier and p.host_copy, f"prefix {agent} on cpu without a host tier copy")
        if p.location == "gpu" and not p.ready:
            _require(p.filler is not None, f"prefix {agent} unmaterialised with nobody computing it")
        if p.ready:
            _require(p.location == "gpu" and not p.waiters, f"prefix {agent} ready but {p.location}/waiters")
        if not p.on_gpu:
            _require(p.running == 0 and not p.waiters, f"prefix {agent} off GPU but in use")


def _check_budget(requests: RequestTable, residency: Residency, kv_budget: int) -> None:
    used = sum(p.tokens for p in residency.prefixes.values() if p.on_gpu)
    used += sum(r.kv_tokens for r in requests.running.values())
    _require(used == residency.kv_used, f"kv_used {residency.kv_used} != recomputed {used}")
    _require(used <= kv_budget, f"kv_used {used} exceeds the budget {kv_budget}")


def _check_tokens(requests: RequestTable, gpu: GpuWork) -> None:
    live = sum(r.generated for r in requests.live.values())
    total = live + requests.finished_tokens + requests.cancelled_tokens
    _require(total == gpu.tokens, f"tokens generated {gpu.tokens} != accounted {total}")
    for rid, r in requests.live.items():
        _require(0 <= r.generated < r.spec.output_tokens, f"{rid} generated {r.generated}/{r.spec.output_tokens}")
        if r.phase == "fill":
            _require(0 <= r.fill_done < r.fill_total, f"{rid} prefill {r.fill_done}/{r.fill_total}")
