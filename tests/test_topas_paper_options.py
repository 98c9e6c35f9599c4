"""topas-paper's options ported from `topas` (docs/topas.md, "Named options"): a hand case of each."""

from __future__ import annotations

import numpy as np
import pytest
from test_topas_paper_search import MU_B, eq13_index, fork_index, index, point
from test_topas_support import PROFILE, req, snap, task

from topas_agents.policies import make_policy
from topas_agents.policies.topas import PaperConfig
from topas_agents.policies.topas import paper_policy as pp
from topas_agents.policies.topas import paper_search as ps
from topas_agents.policies.topas.occupancy import Reservation
from topas_agents.policies.topas.paper_occupancy import reserve_head
from topas_agents.policies.topas.paper_pack import Pack, greedy_pack, move_cost, rival_pack
from topas_agents.policies.topas.paper_value import TaskValue, imminence, reuse_counts
from topas_agents.snapshot import check_decision


def test_a_rival_state_in_greedy_order_scores_as_greedy_pack_does():
    # The fork case of the GreedyPack tests: greedy admits ru, rb, rc with credits 0.8, 0.5 and
    # the updated marginal 1.0; the same admissions given as a rival's list score the same 2.3.
    ix = fork_index()
    greedy = greedy_pack(ix, frozenset({"B", "C"}))
    rival = rival_pack(ix, ("ru", "rb", "rc"))
    assert rival.agents == greedy.agents and not rival.preempt
    assert [(a.req.rid, round(a.credit, 9)) for a in rival.admits] == [("ru", 0.8), ("rb", 0.5), ("rc", 1.0)]
    assert rival.states == [(3, pytest.approx(greedy.best()[0]))] and greedy.best() == (pytest.approx(2.3), 3)


def test_a_rival_state_keeps_the_running_set_and_pays_eq8_for_its_moves():
    # eq13_index(): p runs on C (retained: a rival preempts nothing); B is resident and idle.
    # Admitting r (g = 1.5, Delta = 2) on A: R' = {A, C}, A comes in, B goes out, one task in.
    # Score = 1.5 x 2 - (l_A + l_B) mu/B x 1 + n_A l_A mu/B (n_A = 2); no J_redo, no J_revoke.
    ix = eq13_index()
    p, r = ix.running["C"][0], ix.waiting["A"][0]
    pack = rival_pack(ix, ("r",))
    assert pack.agents == frozenset({"A", "C"})
    assert pack.states == [(1, pytest.approx(3.0 - 3000 * MU_B + 2 * 1000 * MU_B))]
    # an unknown request, nothing admitted, or a state over the KV budget is not a state
    assert rival_pack(ix, ("r", "ghost")) is None and rival_pack(ix, ()) is None
    tight = index([r], [p], values=ix.values, service=ix.service, resident={"B"}, tokens=ix.tokens, budget=4100)
    assert rival_pack(tight, ("r",)) is None  # 1000 + 3000 + 100 (p) + 50 (r) > 4100
    # K cuts the rival's list to its first K admissions
    many = [req(f"w{i}", f"t{i}", "s", "A", inp=50, out=50) for i in range(3)]
    kx = index(many, values={f"t{i}": point(("s", 1.0)) for i in range(3)}, service={f"w{i}": 1.0 for i in range(3)},
               resident={"A"}, cfg=PaperConfig(K=2))
    assert [a.req.rid for a in rival_pack(kx, ("w2", "w0", "w1")).admits] == ["w2", "w0"]


def _chain_snapshot():
    w = [req(f"r{i}", f"t{i}", "s1", "a", arrival=i, task_arrival=i) for i in range(3)]
    return snap(now=10.0, waiting=w, tasks=[task(f"t{i}", arrival=i) for i in range(3)],
                prefixes={"a": (4096, "gpu")})


def test_rivals_option_takes_a_baselines_state_when_the_search_has_none(monkeypatch):
    s = _chain_snapshot()
    monkeypatch.setattr(pp, "search", lambda ix: (None, None))
    assert make_policy("topas-paper").decide(s).admit == ()  # off by default: nothing to emit
    pol = make_policy("topas-paper", {"rivals": 1})
    d = pol.decide(s)
    check_decision(s, d)
    assert d.admit == ("r0", "r1", "r2")  # Parrot's and LPM's admission: every request fits
    assert set(pol.pending) == {"r0", "r1", "r2"}  # credited like any emitted admission


def test_rivals_option_keeps_the_searched_state_when_it_scores_at_least_as_well():
    s = _chain_snapshot()
    plain, with_rivals = make_policy("topas-paper"), make_policy("topas-paper", {"rivals": 1})
    assert with_rivals.decide(s) == plain.decide(s)  # GreedyPack's state admits all three too


def test_work_conserving_option_turns_an_idle_decision_into_the_oldest_tasks_admission(monkeypatch):
    s = _chain_snapshot()
    monkeypatch.setattr(pp, "search", lambda ix: (None, None))
    assert make_policy("topas-paper", {"work_conserving": 0}).decide(s).admit == ()
    d = make_policy("topas-paper", {"work_conserving": 1}).decide(s)
    check_decision(s, d)
    assert d.admit[0] == "r0"


def test_prefetch_option_loads_the_prefix_of_a_stage_about_to_be_released():
    # chain3: s1 (agent a) runs, so s2 (agent b) is released when it ends: n_b = 1. b's prefix is
    # in CPU memory. With keep_idle + prefetch, R' = {a, b} is a state: eq 11 credits b's reload
    # and eq 8 charges nothing (no task is admitted on an incoming prefix), so b is loaded now.
    s = snap(running=[req("r", "t", "s1", "a")], tasks=[task("t", active=[("s1", 0.5)])],
             prefixes={"a": (4096, "gpu"), "b": (4096, "cpu")})
    for options, prefix_in in (({"keep_idle": 1}, ()), ({"prefetch": 1}, ()), ({"keep_idle": 1, "prefetch": 1}, ("b",))):
        d = make_policy("topas-paper", options).decide(s)
        check_decision(s, d)
        assert d.prefix_in == prefix_in, options
    # a prefix the engine does not know cannot be prefetched (never part of R' idle)
    unknown = snap(running=[req("r", "t", "s1", "a")], tasks=[task("t", active=[("s1", 0.5)])],
                   prefixes={"a": (4096, "gpu")})
    assert make_policy("topas-paper", {"keep_idle": 1, "prefetch": 1}).decide(unknown).prefix_in == ()


def test_block_option_charges_kv_left_stranded_for_a_shut_out_agent():
    # Budget 2000, R = {A} (prefix 100, resident). Admitting r1 (450 + 50 = 500 KV, D = 4) leaves
    # 1400 free; B's only waiting request needs 1000 KV + its 1000-token prefix > 1400: shut out.
    # J_block = block x g(tB) x D(r1) x 1400 / 2000 = 0.5 x 2 x 4 x 0.7 = 2.8, so the state
    # scores 1 x 4 - 2.8 = 1.2 (4 without the option).
    r1 = req("r1", "t1", "s", "A", inp=450, out=50)
    rb = req("rB", "tB", "s", "B", inp=950, out=50)
    kw = dict(values={"t1": point(("s", 4.0)), "tB": point(("s", 1.0))}, service={"r1": 4.0, "rB": 1.0},
              resident={"A"}, tokens={"A": 100, "B": 1000}, budget=2000, weight={"t1": 1.0, "tB": 2.0})
    assert greedy_pack(index([r1, rb], **kw), frozenset({"A"})).states == [(1, pytest.approx(4.0))]
    blocked = index([r1, rb], cfg=PaperConfig(block=0.5), **kw)
    assert greedy_pack(blocked, frozenset({"A"})).states == [(1, pytest.approx(1.2))]
    # D_r before option horizon's cap is the admission's duration
    blocked.uncapped = {"r1": 8.0}
    assert greedy_pack(blocked, frozenset({"A"})).states == [(1, pytest.approx(4.0 - 5.6))]
    # R = {A, B} on a 2700 budget: both are admitted, nothing is left waiting: no J_block (the
    # score is 1 x 4 + 2 x 1 less eq 8's move of B for one task)
    both = index([r1, rb], cfg=PaperConfig(block=0.5), **{**kw, "budget": 2700})
    assert greedy_pack(both, frozenset({"A", "B"})).states == [(2, pytest.approx(6.0 - 1000 * MU_B))]


def _at(ix, now: float):
    """`ix` seen at time `now` (the head's wait is measured against the snapshot's clock)."""
    ix.snap = snap(now=now, budget=ix.snap.kv_budget, waiting=ix.snap.waiting, running=ix.snap.running)
    return ix


def test_backfill_head_that_fits_now_is_admitted_first_in_every_state():
    # Budget 2500; A (100 tokens) resident runs p (100 KV); the head h (oldest task) waits on B
    # (1000 tokens, not resident) for 500 KV; w on A is worth more, so GreedyPack takes it first.
    # Pinned: A's prefix; free = 2500 - 100 - 100 = 2300 >= 500 + 1000: the head fits now, 800 to
    # spare, and is admitted first.
    p = req("p", "tp", "s", "A", inp=50, out=50)
    h = req("h", "th", "s", "B", inp=450, out=50, task_arrival=-10.0)
    w = req("w", "tw", "s", "A", inp=450, out=50)
    kw = dict(values={"tp": point(("s", 1.0)), "th": point(("s", 1.0)), "tw": point(("s", 9.0))},
              service={"p": 1.0, "h": 1.0, "w": 9.0}, tokens={"A": 100, "B": 1000}, budget=2500)
    plain = index([h, w], [p], **kw)
    assert [a.req.rid for a in greedy_pack(plain, frozenset({"A", "B"})).admits] == ["w", "h"]
    ix = _at(index([h, w], [p], cfg=PaperConfig(backfill=4.0), **kw), 100.0)
    ix.reservation = reserve_head(ix, mean_request_s=1.0)
    assert ix.reservation == Reservation("h", "B", 0.0, 800)
    assert reserve_head(_at(ix, 3.0), mean_request_s=1.0) is None  # waited 3 < 4 x 1 s: no reservation
    pack = greedy_pack(ix, frozenset({"A", "B"}))
    assert [a.req.rid for a in pack.admits] == ["h", "w"] and [k for k, _ in pack.states] == [1, 2]
    assert greedy_pack(ix, frozenset({"A"})) is None  # a state without the head's prefix


def test_backfill_waiting_head_keeps_its_kv_from_long_admissions():
    # Budget 1700, A (100) resident. p1 (600 KV, D 10, 4 s served: 6 s left) and p2 (600 KV, 3 s
    # left) run. The head h (800 KV) does not fit (free 400); when p2 ends 1000 are free: start 3 s,
    # 200 to spare. w (300 KV, D 5) would still run then and needs more than the spare: held back.
    # s (300 KV, D 2) ends before the head starts: backfilled.
    p1 = req("p1", "t1", "s", "A", inp=550, out=50, service=4.0)
    p2 = req("p2", "t2", "s", "A", inp=550, out=50)
    h = req("h", "th", "s", "A", inp=750, out=50, task_arrival=-10.0)
    w = req("w", "tw", "s", "A", inp=250, out=50)
    sh = req("s", "ts", "s", "A", inp=250, out=50)
    vals = {t: point(("s", d)) for t, d in (("t1", 10.0), ("t2", 3.0), ("th", 1.0), ("tw", 5.0), ("ts", 2.0))}
    kw = dict(values=vals, service={"p1": 10.0, "p2": 3.0, "h": 1.0, "w": 5.0, "s": 2.0}, tokens={"A": 100},
              budget=1700)
    plain = index([h, w], [p1, p2], **kw)
    assert [a.req.rid for a in greedy_pack(plain, frozenset({"A"})).admits] == ["w"]
    ix = _at(index([h, w, sh], [p1, p2], cfg=PaperConfig(backfill=4.0), **kw), 100.0)
    ix.reservation = reserve_head(ix, mean_request_s=1.0)
    assert ix.reservation == Reservation("h", "A", 3.0, 200)
    assert [a.req.rid for a in greedy_pack(ix, frozenset({"A"})).admits] == ["s"]


def test_advance_credits_starting_the_head_by_preempting_a_younger_task():
    # A, B (100 each) resident; p (1200 KV, D 10) of a younger task runs on A; the head h waits on
    # B (800 KV): free 300, after p ends 1600: start_s = 10. R = {B} preempts p and starts h now:
    # its credit gains advance x g(th) x 10 = 20 (g = 2). Not when p's task is older than h's.
    h = req("h", "th", "s", "B", inp=750, out=50, task_arrival=-10.0)
    kw = dict(service={"p": 10.0, "h": 1.0}, tokens={"A": 100, "B": 100}, budget=1700,
              weight={"tp": 1.0, "th": 2.0}, values={"tp": point(("s", 10.0)), "th": point(("s", 1.0))})

    def head_credit(task_arrival: float, advance: float) -> float:
        p = req("p", "tp", "s", "A", inp=1150, out=50, task_arrival=task_arrival)
        ix = _at(index([h], [p], resident={"B"}, cfg=PaperConfig(backfill=4.0, advance=advance), **kw), 100.0)
        ix.reservation = reserve_head(ix, mean_request_s=1.0)
        assert ix.reservation == Reservation("h", "B", 10.0, 800)
        return greedy_pack(ix, frozenset({"B"})).admits[0].credit

    assert head_credit(5.0, 0.0) == pytest.approx(2.0)
    assert head_credit(5.0, 1.0) == pytest.approx(2.0 + 20.0)
    assert head_credit(-20.0, 1.0) == pytest.approx(2.0)


def _fake_packs(monkeypatch, packs):
    """GreedyPack replaced by a table: prefix set -> (preemptions, k, score) of its one state."""
    def fake(ix, agents):
        if agents not in packs:
            return None
        preempt, k, score = packs[agents]
        pack = Pack(agents, preempt)
        pack.states.append((k, score))
        return pack

    monkeypatch.setattr(ps, "greedy_pack", fake)


def test_drop_incumbent_option_prefers_admitting_without_preempting_to_waiting(monkeypatch):
    # r runs on a; states: keep Q_t and admit nothing (R = {a}, k = 0, score 5), admit on b while
    # a keeps running (R = {a, b}, k = 1, score 3), admit on b by preempting r (R = {b}, score 4).
    # The paper takes the best (waiting); the option takes the best state that admits without
    # preempting, never the preempting one.
    r = req("r", "tr", "s", "a")
    ix = index([req("wb", "tb", "s", "b")], [r], values={"tr": point(("s", 1.0)), "tb": point(("s", 1.0))},
               service={"r": 1.0, "wb": 1.0})
    _fake_packs(monkeypatch, {frozenset("a"): ((), 0, 5.0), frozenset("ab"): ((), 1, 3.0),
                              frozenset("b"): ((r,), 1, 4.0)})
    assert ps.search(ix)[0].pack.agents == frozenset("a")
    ix.cfg = PaperConfig(drop_incumbent=1)
    choice, _ = ps.search(ix)
    assert choice.pack.agents == frozenset("ab") and choice.k == 1


def test_width_and_max_additions_options_bound_the_greedy_branch(monkeypatch):
    # Pool {a, b, c} > M = 2, nothing resident. Waiting progress (g Delta): a 1, b 3, c 2.
    F = frozenset
    table = {F(""): 0.0, F("a"): 5.0, F("b"): 2.0, F("c"): 0.5, F("ab"): 6.0, F("ac"): 1.0, F("bc"): 1.5,
             F("abc"): 7.0}
    _fake_packs(monkeypatch, {agents: ((), 1, score) for agents, score in table.items()})
    w = [req("wa", "ta", "s", "a"), req("wb", "tb", "s", "b"), req("wc", "tc", "s", "c")]
    ix = index(w, values={t: point(("s", d)) for t, d in (("ta", 1.0), ("tb", 3.0), ("tc", 2.0))},
               service={"wa": 1.0, "wb": 3.0, "wc": 2.0}, cfg=PaperConfig(M=2))
    # the paper: every outsider at each step: {a} (5), {a, b} (6), {a, b, c} (7)
    assert ps.search(ix)[0].pack.agents == F("abc")
    # width 1: only b, the outsider of most waiting progress, is tried; then c (a stall, no pair
    # left to test); Repair({b}) against c; a is never tried
    ix.cfg = PaperConfig(M=2, width=1)
    choice, states = ps.search(ix)
    assert states.evaluated == [F(), F("b"), F("bc"), F("c")] and choice.pack.agents == F("b")
    # max_additions 1: one addition ({a}), then Repair({a}) only: no pair is ever packed
    ix.cfg = PaperConfig(M=2, max_additions=1)
    choice, states = ps.search(ix)
    assert states.evaluated == [F(), F("a"), F("b"), F("c")] and choice.pack.agents == F("a")


def test_smith_move_option_prices_each_incoming_prefix_for_the_tasks_it_delays():
    # Incoming: A (1000 tokens) and B (2000) swap in over the host link, C (500, never cached) is
    # recomputed; t1 (g 1) is admitted on A, t2 (g 3) on B, t3 (g 2) on C; p runs on D.
    # Smith order: B (s_B / 3) before A (s_A / 1): 3 s_B + 1 (s_B + s_A); C's prefill delays t3
    # and the running request: 3 prefill(500). Eq 8: (l_A + l_B + l_C) mu/B x 3 tasks.
    run = [req("p", "tp", "s", "D", inp=50, out=50)]
    w = [req("a1", "t1", "s", "A"), req("b2", "t2", "s", "B"), req("c3", "t3", "s", "C")]
    ix = index(w, run, values={t: point(("s", 1.0)) for t in ("t1", "t2", "t3", "tp")},
               service={"a1": 1.0, "b2": 1.0, "c3": 1.0, "p": 1.0}, tokens={"A": 1000, "B": 2000, "C": 500, "D": 100},
               weight={"t1": 1.0, "t2": 3.0, "t3": 2.0, "tp": 1.0}, resident={"D"})
    ix.snap = snap(waiting=w, running=run, prefixes={"A": (1000, "cpu"), "B": (2000, "cpu"), "D": (100, "gpu")})
    tasks_in = {"A": {"t1": 1.0}, "B": {"t2": 3.0}, "C": {"t3": 2.0}}
    s_a, s_b = PROFILE.swap_s(1000), PROFILE.swap_s(2000)
    assert s_b / 3 < s_a / 1 and PROFILE.host_tier
    assert move_cost(ix, frozenset("ABC"), frozenset(), tasks_in) == pytest.approx(3500 * MU_B * 3)
    ix.cfg = PaperConfig(smith_move=1)
    expect = 3 * s_b + (s_b + s_a) + 3 * PROFILE.prefill_s(500)
    assert move_cost(ix, frozenset("ABC"), frozenset(), tasks_in) == pytest.approx(expect)


def test_reserve_first_option_admits_an_uncovered_prefixs_best_fitting_request_first():
    # R = {A, B}: p runs on A; B is uncovered. Free 3000 - 200 - 100 = 2700. Priorities (g Delta
    # per KV): b2 100 / 2800 (never fits: 2800 > 2700), a1 9 / 300, b1 1 / 300. The paper:
    # a1, then b1 covers B. reserve_first 1: B's best (b2) does not fit: no change; 2: b1 first.
    p = req("p", "tp", "s", "A", inp=50, out=50)
    w = [req("a1", "t1", "s", "A", inp=250, out=50), req("b1", "t2", "s", "B", inp=250, out=50),
         req("b2", "t3", "s", "B", inp=2750, out=50)]
    kw = dict(values={"tp": point(("s", 1.0)), "t1": point(("s", 9.0)), "t2": point(("s", 1.0)),
                      "t3": point(("s", 100.0))},
              service={"p": 1.0, "a1": 9.0, "b1": 1.0, "b2": 100.0}, tokens={"A": 100, "B": 100}, budget=3000,
              resident={"B"})
    for first, order in ((0, ["a1", "b1"]), (1, ["a1", "b1"]), (2, ["b1", "a1"])):
        ix = index(w, [p], cfg=PaperConfig(reserve_first=first), **kw)
        assert [a.req.rid for a in greedy_pack(ix, frozenset("AB")).admits] == order, first


def test_reuse_imminence_option_weighs_each_release_by_g_and_the_chance_it_comes_soon():
    # L_i's rows give the running stage s1 a residual of 1 s or 3 s (p = 1/2 each): within a 2 s
    # horizon with probability 1/2. chain3: s1 (agent a) running releases s2 (agent b).
    value = TaskValue(("s1",), np.array([[1.0], [3.0]]), np.zeros((2, 1)), np.array([0.5, 0.5]))
    assert imminence(value, "s1", 2.0) == 0.5 and imminence(value, "s9", 2.0) == 0.0
    s = snap(running=[req("r", "t", "s1", "a")], tasks=[task("t", active=[("s1", 0.5)])])
    assert reuse_counts(s) == {"b": 1}  # the paper: one release
    assert reuse_counts(s, lambda task_id, stage: 3.0 * 0.5) == {"b": 1.5}  # g = 3
    assert reuse_counts(s, lambda task_id, stage: 0.0) == {}
    # the policy wires it: n_b = g(t) x P(s1 ends within option horizon's cap)
    pol = make_policy("topas-paper", {"reuse_imminence": 1, "horizon": 0.3})
    ix = pol.index(s)
    expect = ix.gain_weight["t"] * imminence(ix.values["t"], "s1", pol.horizon_s(s))
    assert pol.horizon_s(s) > 0.0 and ix.counts.get("b", 0.0) == pytest.approx(expect)


def test_forfeit_2_charges_the_tasks_lost_progress_over_its_running_set():
    # fork_index()'s task t runs r_b (D 1) on B and r_c (D 2) on C; R = {C} preempts r_b.
    # L(r_c served) = E[max(1 + 1, 0 + 1), max(3 + 1, 0 + 1)] = 3; L(both served) = E[1, 3] = 2:
    # forfeit 2 loses g x 1. Forfeit 1 loses r_b's own Delta(r_b | {}) = L({}) 3.5 - L(r_b) 3 = 0.5.
    fork = fork_index().values["t"]
    run = [req("rb", "t", "b", "B", inp=50, out=50), req("rc", "t", "c", "C", inp=50, out=50)]
    scores = {}
    for level in (0, 1, 2):
        ix = index([], run, values={"t": fork}, service={"rb": 1.0, "rc": 2.0}, cfg=PaperConfig(forfeit=level))
        (k, scores[level]), = greedy_pack(ix, frozenset("C")).states
        assert k == 0
    assert scores[0] - scores[1] == pytest.approx(0.5) and scores[0] - scores[2] == pytest.approx(1.0)
