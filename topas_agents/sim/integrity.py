"""Executable engine invariants (the engine calls them after every decision when check=True)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .state import PrefixFill

if TYPE_CHECKING:
    from .engine import SimEngine


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"engine invariant broken: {what}")


def check_engine(eng: SimEngine) -> None:
    _check_queues(eng)
    _check_prefixes(eng)
    _check_budget(eng)
    _check_tokens(eng)


def _check_queues(eng: SimEngine) -> None:
    waiting, running = set(eng._waiting), set(eng._running)
    _require(not waiting & running, f"requests both waiting and running: {sorted(waiting & running)}")
    _require(waiting | running == set(eng._reqs), "live request table != waiting + running")
    _require(set(eng._waiting_views) == waiting, "waiting views out of sync")
    for rid, r in eng._waiting.items():
        _require(r.state == "waiting" and r.phase is None, f"{rid} waiting in state {r.state}/{r.phase}")
    fills = [j for j in eng._fills if not isinstance(j, PrefixFill)]
    _require(len({id(j) for j in eng._fills}) == len(eng._fills), "a prefill job queued twice")
    for r in fills:
        _require(r.rid in running and r.phase == "fill", f"{r.rid} queued for prefill but {r.phase}")
    for rid, r in eng._running.items():
        _require(r.state == "running", f"{rid} running in state {r.state}")
        p = r.prefix
        _require(p.on_gpu, f"{rid} runs while prefix {p.agent} is {p.location}")
        if r.phase == "decode":
            _require(rid in eng._decoding, f"{rid} decoding but not in the batch")
            _require(not p.waiters or r not in p.waiters, f"{rid} decodes and waits")
        elif r.phase == "fill":
            _require(r in eng._fills, f"{rid} prefilling but not queued")
            _require(p.ready or r.computes_prefix, f"{rid} prefills before prefix {p.agent} is ready")
        else:
            _require(r.phase == "load" and r in p.waiters and not p.ready,
                     f"{rid} in phase {r.phase} (prefix {p.agent} ready={p.ready})")
    _require(set(eng._decoding) <= running, "decode batch holds a request that is not running")
    ctx = sum(r.context for r in eng._decoding.values())
    _require(ctx == eng._dec_ctx, f"decode context {eng._dec_ctx} != recomputed {ctx}")


def _check_prefixes(eng: SimEngine) -> None:
    pins: dict[str, int] = {}
    for r in eng._running.values():
        pins[r.prefix.agent] = pins.get(r.prefix.agent, 0) + 1
    for agent, p in eng._prefixes.items():
        _require(p.running == pins.get(agent, 0), f"prefix {agent} pinned {p.running}, running {pins.get(agent, 0)}")
        _require(p.running >= 0, f"prefix {agent} has negative pins")
        if p.location == "loading":
            _require(p.transfer is not None and not p.transfer.cancelled, f"prefix {agent} loading w/o transfer")
            _require(eng.host_tier and p.host_copy, f"prefix {agent} loading without a host copy")
        if p.location == "cpu":
            _require(eng.host_tier and p.host_copy, f"prefix {agent} on cpu without a host tier copy")
        if p.location == "gpu" and not p.ready:
            _require(p.filler is not None, f"prefix {agent} unmaterialised with nobody computing it")
        if p.ready:
            _require(p.location == "gpu" and not p.waiters, f"prefix {agent} ready but {p.location}/waiters")
        if not p.on_gpu:
            _require(p.running == 0 and not p.waiters, f"prefix {agent} off GPU but in use")


def _check_budget(eng: SimEngine) -> None:
    used = sum(p.tokens for p in eng._prefixes.values() if p.on_gpu)
    used += sum(r.kv_tokens for r in eng._running.values())
    _require(used == eng._kv_used, f"kv_used {eng._kv_used} != recomputed {used}")
    _require(used <= eng.kv_budget, f"kv_used {used} exceeds the budget {eng.kv_budget}")


def _check_tokens(eng: SimEngine) -> None:
    live = sum(r.generated for r in eng._reqs.values())
    total = live + eng._finished_tokens + eng._cancelled_tokens
    _require(total == eng._tokens, f"tokens generated {eng._tokens} != accounted {total}")
    for rid, r in eng._reqs.items():
        _require(0 <= r.generated < r.spec.output_tokens, f"{rid} generated {r.generated}/{r.spec.output_tokens}")
        if r.phase == "fill":
            _require(0 <= r.fill_done < r.fill_total, f"{rid} prefill {r.fill_done}/{r.fill_total}")
