"""Greedy admission under the KV budget with LRU prefix eviction (a stock engine's admission).

Walk requests in the caller's priority order. A request needs `kv_tokens`, plus its agent's
prefix tokens when that prefix is not on GPU. If it does not fit, evict least-recently-used
GPU prefixes that no running or just-admitted request uses until it fits; if it still
cannot fit, stop (head-of-line blocking, like SGLang's PrefillAdder) or, with
`head_of_line=False`, skip it and try the next one.

`KVLedger` is the scratch accounting, reusable by other policies (Topas) that plan
evictions/admissions themselves: it mirrors `snapshot.kv_after` exactly.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping
from itertools import chain, compress, count, repeat
from operator import is_, ne
from typing import Any

from ..snapshot import Decision, RequestView, Snapshot


class KVLedger:
    """Free KV, resident prefixes and pins while a decision is being assembled."""

    def __init__(self, snap: Snapshot, *, protect: Collection[str] = ()) -> None:
        self.free = snap.kv_free
        self.tokens = {p.agent: p.tokens for p in snap.prefixes}
        self.on_gpu = {p.agent for p in snap.prefixes if p.on_gpu}
        # Pinned: used by a running request, admitted in this decision, or protected by the caller.
        self.pinned = {r.agent for r in snap.running} | set(protect)
        # LRU order of GPU prefixes (oldest first; agent name breaks ties deterministically).
        self.lru = [p.agent for p in sorted((p for p in snap.prefixes if p.on_gpu),
                                             key=lambda p: (p.last_used_s, p.agent))]
        self.admitted: list[str] = []
        self.evicted: list[str] = []

    def prefix_tokens(self, r: RequestView) -> int:
        return self.tokens.get(r.agent, r.prefix_tokens)

    def need(self, r: RequestView) -> int:
        """KV tokens admitting `r` takes now (its prefix only if not already on GPU)."""
        return r.kv_tokens + (0 if r.agent in self.on_gpu else self.prefix_tokens(r))

    def victims(self, need: int, keep: str) -> list[str] | None:
        """LRU prefixes to evict so that `need` fits (never `keep` or a pinned one); None if impossible."""
        short = need - self.free
        if short <= 0:
            return []
        chosen: list[str] = []
        for agent in self.lru:
            if agent == keep or agent in self.pinned or agent not in self.on_gpu:
                continue
            chosen.append(agent)
            short -= self.tokens[agent]
            if short <= 0:
                return chosen
        return None

    def evict(self, agent: str) -> None:
        self.on_gpu.discard(agent)
        self.free += self.tokens[agent]
        self.evicted.append(agent)

    def admit(self, r: RequestView) -> None:
        """Account `r` as admitted (caller has made room). Re-admitting an evicted prefix un-evicts it."""
        self.free -= self.need(r)
        if r.agent in self.evicted:
            self.evicted.remove(r.agent)  # evict-then-reload in one decision is a no-op
        self.tokens.setdefault(r.agent, r.prefix_tokens)
        self.on_gpu.add(r.agent)
        self.pinned.add(r.agent)
        self.admitted.append(r.rid)

    def try_admit(self, r: RequestView) -> bool:
        """Admit `r`, evicting LRU prefixes if needed; False (nothing changed) if it cannot fit."""
        need = self.need(r)
        victims = self.victims(need, keep=r.agent)
        if victims is None:
            return False
        for agent in victims:
            self.evict(agent)
        self.admit(r)
        return True

    def decision(self, **extra: tuple[str, ...]) -> Decision:
        return Decision(admit=tuple(self.admitted), prefix_out=tuple(self.evicted), **extra)


def greedy_admit(snap: Snapshot, order: Iterable[RequestView], *, head_of_line: bool = True,
                 protect: Collection[str] = ()) -> Decision:
    """Admit requests from `order` (consumed lazily) while they fit, LRU-evicting as needed."""
    ledger = KVLedger(snap, protect=protect)
    for r in order:
        if not ledger.try_admit(r) and head_of_line:
            break
    return ledger.decision()


class SortedWaiting:
    """The waiting queue in a policy's order, kept across decisions instead of re-sorted.

    Re-sorting `snap.waiting` at every decision is O(W log W) Python work, which dominates a
    simulation once thousands of requests wait (overload). Here each request's key is
    `(group value, *static_key(r))`: the static part (arrival, depth, ... ending with the
    rid) never changes; the optional group value (LAS: the task's attained service; LPM:
    cached prefix tokens of the agent) comes from a mapping given at each sync, and only
    groups whose value changed are re-keyed (found by a C-level compare over groups that
    have waiting requests).

    Membership is synced by diffing snapshots. Fast path: the new waiting tuple is the
    previous one minus what this policy admitted, plus new requests at the end (what
    SimEngine produces, with identical view objects); it is checked with identity-based
    C-level comparisons. Any other shape (a cancel, another engine's ordering or fresh view
    objects) triggers a full rebuild, so the order never depends on the fast path.
    """

    def __init__(self, static_key: Callable[[RequestView], tuple],
                 group_of: Callable[[RequestView], Hashable] | None = None, default: Any = 0) -> None:
        self._static = static_key
        self._group_of = group_of
        self._prev: tuple[RequestView, ...] = ()
        self._admitted: list[RequestView] = []
        self._keys: list[tuple] = []  # sorted full keys (unique: static keys end with the rid)
        self._key: dict[str, tuple] = {}  # rid -> full key
        self._views: dict[str, RequestView] = {}
        self._members: dict[Hashable, set[str]] = {}  # group -> rids waiting
        self._values: Mapping[Hashable, Any] = {}
        self._default: Any = default  # group value of a group without one (see sync)
        self.rebuilds = 0

    # ---------------------------------------------------------------- maintenance

    def sync(self, waiting: tuple[RequestView, ...], values: Mapping[Hashable, Any] | None = None,
             default: Any = 0) -> None:
        """Make the queue equal `waiting`; a group's value is `values.get(group, default)`.

        `values` is kept (not copied) until the next sync: pass a fresh mapping each time.
        """
        values = {} if values is None else values
        added = self._diff(waiting)
        if added is None or default != self._default:
            self._default = default
            self._rebuild(waiting, values)
        else:
            for v in self._admitted:
                self._remove(v.rid)
            self._rekey(values)
            for v in added:
                self._add(v)
        self._prev = waiting
        self._admitted = []

    def note_admitted(self, rids: Iterable[str]) -> None:
        """Tell the queue which requests this policy just admitted (they leave `waiting`)."""
        self._admitted = [self._views[rid] for rid in rids if rid in self._views]

    def _diff(self, waiting: tuple[RequestView, ...]) -> tuple[RequestView, ...] | None:
        prev = self._prev
        if self._admitted:
            cut = sorted(_position(prev, v) for v in self._admitted)
            if cut[0] < 0:
                return None
            bounds = zip([-1, *cut], [*cut, len(prev)], strict=True)
            prev = tuple(chain.from_iterable(prev[a + 1:b] for a, b in bounds))
        m = len(prev)
        # Tuple equality short-cuts on identity, so this is a C-level pass for SimEngine views.
        if len(waiting) < m or waiting[:m] != prev:
            return None
        added = waiting[m:]
        if any(v.rid in self._views for v in added):
            return None
        return added

    def _rebuild(self, waiting: tuple[RequestView, ...], values: Mapping[Hashable, Any]) -> None:
        self.rebuilds += 1
        self._keys, self._key, self._views, self._members = [], {}, {}, {}
        self._values = values
        for v in waiting:
            self._add(v, sort=False)
        self._keys.sort()

    def _add(self, v: RequestView, sort: bool = True) -> None:
        group = self._group_of(v) if self._group_of is not None else None
        key = (self._values.get(group, self._default), *self._static(v))
        self._views[v.rid] = v
        self._key[v.rid] = key
        self._members.setdefault(group, set()).add(v.rid)
        if sort:
            insort(self._keys, key)
        else:
            self._keys.append(key)

    def _remove(self, rid: str) -> None:
        v = self._views.pop(rid)
        key = self._key.pop(rid)
        del self._keys[bisect_left(self._keys, key)]
        group = self._group_of(v) if self._group_of is not None else None
        members = self._members[group]
        members.discard(rid)
        if not members:
            del self._members[group]

    def _rekey(self, values: Mapping[Hashable, Any]) -> None:
        """Re-key the groups whose value changed (C-level compare over groups with members)."""
        groups = list(self._members)
        default = self._default
        new = list(map(values.get, groups, repeat(default)))
        old = list(map(self._values.get, groups, repeat(default)))
        self._values = values
        for group, value in compress(zip(groups, new, strict=True), map(ne, new, old)):
            for rid in self._members[group]:
                key = self._key[rid]
                del self._keys[bisect_left(self._keys, key)]
                key = self._key[rid] = (value, *key[1:])
                insort(self._keys, key)

    # ---------------------------------------------------------------- reading

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[RequestView]:
        """Views in order (lazy: a head-of-line walk touches only what it admits + 1)."""
        views = self._views
        return (views[k[-1]] for k in self._keys)


def _position(seq: tuple, item: object) -> int:
    """Index of `item` in `seq` by identity (C-level scan, no __eq__ calls); -1 if absent."""
    return next(compress(count(), map(is_, seq, repeat(item))), -1)
