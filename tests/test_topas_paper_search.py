"""topas-paper: GreedyPack (IV-E), the score (eq 10, 13), Algorithm 1 branches and the policy's
bookkeeping, on hand-built cases (hand computations in the comments)."""

from __future__ import annotations

import numpy as np
import pytest
from test_topas_support import CHAIN3, PROFILE, req, snap, task

from topas_agents.errors import ConfigError
from topas_agents.policies import make_policy
from topas_agents.policies.topas import PaperConfig, make_paper_config
from topas_agents.policies.topas import paper_search as ps
from topas_agents.policies.topas.paper_pack import Index, Pack, greedy_pack
from topas_agents.policies.topas.paper_value import TaskValue, t_decode
from topas_agents.snapshot import check_decision

MU_B = PROFILE.kv_bytes_per_token / PROFILE.swap_bytes_per_s


def point(*stage_x: tuple[str, float]) -> TaskValue:
    """L_i of a task whose ready stages have point-mass residuals and no successors."""
    stages = tuple(s for s, _ in stage_x)
    z = np.array([[x for _, x in stage_x]], dtype=float)
    return TaskValue(stages, z, np.zeros_like(z), np.ones(1))


def index(waiting=(), running=(), values=None, service=None, *, resident=(), tokens=None, budget=17500,
          cfg=None, weight=None, credit=None, counts=None) -> Index:
    reqs = list(waiting) + list(running)
    values = values or {}
    tokens = tokens or {r.agent: 1000 for r in reqs}
    s = snap(budget=budget, waiting=waiting, running=running)
    by_agent_w: dict[str, list] = {}
    by_agent_r: dict[str, list] = {}
    for r in waiting:
        by_agent_w.setdefault(r.agent, []).append(r)
    for r in running:
        by_agent_r.setdefault(r.agent, []).append(r)
    return Index(s, cfg or PaperConfig(), frozenset(resident) | frozenset(by_agent_r), tokens, by_agent_w,
                 by_agent_r, weight or {r.task_id: 1.0 for r in reqs}, values, {r.rid: r.task_id for r in reqs},
                 {r.rid: values[r.task_id].col[r.stage] for r in reqs}, service or {}, credit or {}, counts or {})


def test_greedy_pack_admits_by_weighted_progress_per_kv_token():
    # Three one-stage tasks on resident agent A, g = 1, Delta = D (point masses):
    # r1: 1 s / 100 KV = 0.01, r2: 3 s / 600 = 0.005, r3: 2 s / 100 = 0.02 -> order r3, r1, r2.
    # Scores (no move, no preemption, no reuse): 2, 3, 6; Phi = 6 at k = 3. Nothing runs on A,
    # so k = 0 (A resident and idle) is not a state of R = {A}.
    w = [req("r1", "t1", "s", "A", inp=50, out=50), req("r2", "t2", "s", "A", inp=300, out=300),
         req("r3", "t3", "s", "A", inp=50, out=50)]
    ix = index(w, values={"t1": point(("s", 1.0)), "t2": point(("s", 3.0)), "t3": point(("s", 2.0))},
               service={"r1": 1.0, "r2": 3.0, "r3": 2.0}, resident={"A"})
    pack = greedy_pack(ix, frozenset({"A"}))
    assert [a.req.rid for a in pack.admits] == ["r3", "r1", "r2"]
    assert pack.states == [(1, 2.0), (2, 3.0), (3, 6.0)]
    assert pack.best() == (6.0, 3)
    # aging multiplies progress: g(t2) = 10 puts r2 first (30 / 600 = 0.05)
    ix.gain_weight["t2"] = 10.0
    assert greedy_pack(ix, frozenset({"A"})).admits[0].req.rid == "r2"


def fork_index() -> Index:
    """Fork task t (eq 6-7 case): X_b in {1, 3}, X_c = 2, tail 1; r_b D = 1, r_c D = 2, both 100
    KV; other task u: one stage, Delta = 0.8; B and C resident."""
    fork = TaskValue(("b", "c"), np.array([[1.0, 2.0], [3.0, 2.0]]), np.ones((2, 2)), np.array([0.5, 0.5]))
    w = [req("rb", "t", "b", "B", inp=50, out=50), req("rc", "t", "c", "C", inp=50, out=50),
         req("ru", "u", "s", "B", inp=50, out=50)]
    return index(w, values={"t": fork, "u": point(("s", 0.8))}, service={"rb": 1.0, "rc": 2.0, "ru": 0.8},
                 resident={"B", "C"})


def test_greedy_pack_updates_same_task_marginals_after_each_choice():
    # fork_index(): initial u 0.8, r_b 0.5, r_c 0.5 -> u, then r_b (rid tie-break), then r_c at
    # its updated marginal Delta(r_c | {r_b}) = 1.0. Credits 0.8, 0.5, 1.0.
    pack = greedy_pack(fork_index(), frozenset({"B", "C"}))
    assert [(a.req.rid, round(a.credit, 9)) for a in pack.admits] == [("ru", 0.8), ("rb", 0.5), ("rc", 1.0)]


def test_zero_gain_choices_continue_preferring_a_represented_task():
    # Tasks t1, t2 are forks with point masses b = 3, c = 1: serving c (D = 1) leaves max(3, 0) = 3,
    # a zero gain. t1 is represented (its b request runs, retained by R = {B, C}); t2 arrived
    # earlier, yet t1's zero-gain request goes first; packing continues and admits t2's too.
    # C is uncovered until the first admission: states at k = 1 and 2, both score 0; equal
    # scores prefer more admissions.
    run = [req("b1", "t1", "b", "B", inp=50, out=50)]
    w = [req("c2", "t2", "c", "C", inp=50, out=50, task_arrival=-5.0),
         req("c1", "t1", "c", "C", inp=50, out=50)]
    values = {"t1": point(("b", 3.0), ("c", 1.0)), "t2": point(("b", 3.0), ("c", 1.0))}
    ix = index(w, run, values=values, service={"c1": 1.0, "c2": 1.0, "b1": 3.0}, resident={"B", "C"})
    pack = greedy_pack(ix, frozenset({"B", "C"}))
    assert [a.req.rid for a in pack.admits] == ["c1", "c2"]
    assert pack.states == [(1, 0.0), (2, 0.0)]
    assert pack.best() == (0.0, 2)


def test_greedy_pack_reserves_capacity_and_a_slot_for_uncovered_prefixes():
    # R = {A, B}, prefixes 100 tokens each, budget 1400: free = 1200. B's only request needs 500.
    # r1 (A, 1000 KV, best priority) would leave 200 < 500 for B: it never fits. r3 (A, 600 KV)
    # fits in 1200 - 500 = 700, then rB (500 <= 600). Only the k = 2 allocation covers R.
    w = [req("r1", "t1", "s", "A", inp=500, out=500), req("r3", "t3", "s", "A", inp=300, out=300),
         req("rB", "t2", "s", "B", inp=250, out=250)]
    values = {"t1": point(("s", 100.0)), "t2": point(("s", 1.0)), "t3": point(("s", 30.0))}
    ix = index(w, values=values, service={"r1": 100.0, "rB": 1.0, "r3": 30.0}, resident={"A", "B"},
               tokens={"A": 100, "B": 100}, budget=1400)
    pack = greedy_pack(ix, frozenset({"A", "B"}))
    assert [a.req.rid for a in pack.admits] == ["r3", "rB"]
    assert [k for k, _ in pack.states] == [2]
    # a prefix with nothing to cover it is infeasible (idle prefixes are excluded), and so is
    # one whose smallest request cannot fit
    assert greedy_pack(ix, frozenset({"A", "Z"})) is None
    tight = index(w, values=values, service={"r1": 100.0, "rB": 1.0, "r3": 30.0}, resident={"A", "B"},
                  tokens={"A": 100, "B": 100}, budget=600)
    assert greedy_pack(tight, frozenset({"A", "B"})) is None


def eq13_index() -> Index:
    """R_t = {B (idle, 2000 tokens), C (3000; runs p, 50 tokens generated, credit 0.7)}; r
    (g = 1.5, Delta = 2) of one task waits on A (1000, not resident); n_A = 2."""
    p = req("p", "tp", "s", "C", gen=50, inp=50, out=100)
    r = req("r", "t", "s", "A", inp=50, out=50)
    return index([r], [p], values={"t": point(("s", 2.0)), "tp": point(("s", 5.0))}, service={"r": 2.0, "p": 5.0},
                 resident={"B"}, tokens={"A": 1000, "B": 2000, "C": 3000}, weight={"t": 1.5, "tp": 1.0},
                 credit={"p": 0.7}, counts={"A": 2})


def test_score_eq13_and_the_k_cap():
    # eq13_index(); candidate R = {A}: A comes in, B and C go out, p is preempted, r admitted.
    # Score = 1.5 x 2 - (l_A + l_B + l_C) mu/B x 1 task - T_decode x 50 - 0.7 + n_A l_A mu/B (n_A = 2).
    ix = eq13_index()
    p, r = ix.running["C"][0], ix.waiting["A"][0]
    pack = greedy_pack(ix, frozenset({"A"}))
    expect = 3.0 - 6000 * MU_B - t_decode(p, PROFILE) * 50 - 0.7 + 2 * 1000 * MU_B
    assert [rq.rid for rq in pack.preempt] == ["p"]
    assert pack.states == [(1, pytest.approx(expect))]
    # K caps |A_R| and |P_R| separately; K = 0 removes both
    p2 = req("p2", "tp", "s", "C", inp=50, out=100)
    ix2 = index([r], [p, p2], values=ix.values, service={"r": 2.0, "p": 5.0, "p2": 5.0},
                cfg=PaperConfig(K=1), tokens=ix.tokens)
    assert greedy_pack(ix2, frozenset({"A"})) is None  # two preemptions > K = 1
    ix2.cfg = PaperConfig(K=0)
    assert greedy_pack(ix2, frozenset({"A"})) is not None
    ix2.cfg = PaperConfig(K=0, k_preempt=1)  # option: a separate, smaller preemption cap
    assert greedy_pack(ix2, frozenset({"A"})) is None
    many = [req(f"w{i}", f"t{i}", "s", "A", inp=50, out=50) for i in range(3)]
    ix3 = index(many, values={f"t{i}": point(("s", 1.0)) for i in range(3)},
                service={f"w{i}": 1.0 for i in range(3)}, resident={"A"}, cfg=PaperConfig(K=2))
    assert len(greedy_pack(ix3, frozenset({"A"})).admits) == 2


# ---------------------------------------------------------------------------- Algorithm 1

def _fake_packs(monkeypatch, table):
    def fake(ix, agents):
        if agents not in table:
            return None
        pack = Pack(agents, ())
        pack.states.append((1 if agents else 0, table[agents]))
        return pack
    monkeypatch.setattr(ps, "greedy_pack", fake)


def _pool_index(cfg, running=(), resident=()):
    w = [req(f"w{a}", f"t{a}", "s", a) for a in "abc"]
    return index(w, running, values={f"t{a}": point(("s", 1.0)) for a in "abc"} | {"tr": point(("s", 1.0))},
                 service={}, cfg=cfg, resident=resident)


F = frozenset


def test_algorithm1_enumerates_every_subset_when_the_pool_is_small(monkeypatch):
    # |A_t| = 3 <= M = 6: all 2^3 prefix sets are packed, the best Phi ({b, c}: 4) wins.
    table = {F(): 0.0, F("a"): 1.0, F("b"): 2.0, F("c"): 1.0, F("ab"): 3.0, F("ac"): 1.5, F("bc"): 4.0, F("abc"): 2.0}
    _fake_packs(monkeypatch, table)
    choice, states = ps.search(_pool_index(PaperConfig(M=6)))
    assert len(states.evaluated) == 8
    assert choice.pack.agents == F("bc") and choice.score == 4.0


def test_algorithm1_greedy_pair_test_and_repair(monkeypatch):
    # |A_t| = 3 > M = 2, R_t = {}. Repair({}) is empty. Singles {a},{b},{c} score 1 > Phi({}) = 0:
    # R_g = {a} (first on ties). Singles {a,b}, {a,c} (0.5) stall: the one pair test adds {b, c}:
    # Phi({a,b,c}) = 5 > 1. No outsider remains; the pair test was used: stop. Repair({a,b,c})
    # drops to {b,c} (new), {a,c}, {a,b} (memoised). Best: {a, b, c}.
    table = {F(): 0.0, F("a"): 1.0, F("b"): 1.0, F("c"): 1.0, F("ab"): 0.5, F("ac"): 0.5, F("bc"): 2.0, F("abc"): 5.0}
    _fake_packs(monkeypatch, table)
    choice, states = ps.search(_pool_index(PaperConfig(M=2)))
    assert states.evaluated == [F(), F("a"), F("b"), F("c"), F("ab"), F("ac"), F("abc"), F("bc")]
    assert choice.pack.agents == F("abc")
    # a repair of the final R_g that beats it is selected
    _fake_packs(monkeypatch, table | {F("bc"): 9.0})
    choice, _ = ps.search(_pool_index(PaperConfig(M=2)))
    assert choice.pack.agents == F("bc")


def test_algorithm1_repairs_r_t_first(monkeypatch):
    # R_t = {a} (resident). Repair(R_t): drop -> {}, swaps -> {b}, {c}; then singles {a,b}, {a,c}.
    table = {F(): 0.0, F("a"): 1.0, F("b"): 3.0, F("c"): 0.0, F("ab"): 0.0, F("ac"): 0.0, F("bc"): 0.0, F("abc"): 0.0}
    _fake_packs(monkeypatch, table)
    choice, states = ps.search(_pool_index(PaperConfig(M=2), resident={"a"}))
    assert states.evaluated[:6] == [F("a"), F(), F("b"), F("c"), F("ab"), F("ac")]
    assert choice.pack.agents == F("b")


def test_empty_incumbent_is_removed_when_a_nonempty_state_exists(monkeypatch):
    # Q_t empty: doing nothing (score 0) is the empty incumbent; every other state scores -1,
    # yet one of them is selected. With something running, doing nothing is a legitimate state.
    table = {F(): 0.0, F("a"): -1.0, F("b"): -1.5, F("c"): -2.0, F("ab"): -3.0, F("ac"): -3.0, F("bc"): -3.0,
             F("abc"): -4.0}
    _fake_packs(monkeypatch, table)
    choice, _ = ps.search(_pool_index(PaperConfig(M=6)))
    assert choice.pack.agents == F("a") and choice.score == -1.0
    _fake_packs(monkeypatch, {F(): 0.0})
    choice, _ = ps.search(_pool_index(PaperConfig(M=6)))
    assert choice.pack.agents == F() and choice.k == 0  # nothing nonempty: the incumbent stays


# ---------------------------------------------------------------------------- the policy

def test_credit_is_granted_when_seen_running_and_cleared_on_completion():
    pol = make_policy("topas-paper")
    w = req("r1", "t1", "s1", "a")
    s1 = snap(waiting=[w], tasks=[task("t1")], prefixes={"a": (4096, "gpu")})
    d1 = pol.decide(s1)
    check_decision(s1, d1)
    assert d1.admit == ("r1",)
    assert "r1" in pol.pending and "r1" not in pol.credits  # emitted, not yet seen running
    lam = pol.pending["r1"]
    assert lam > 0.0
    s2 = snap(running=[w], tasks=[task("t1", active=[("s1", 0.5)])], prefixes={"a": (4096, "gpu")})
    check_decision(s2, pol.decide(s2))
    assert pol.credits == {"r1": lam} and not pol.pending
    # preempted (back in W_t): the credit goes; re-admission creates a new pending credit
    back = req("r1", "t1", "s1", "a", gen=10)
    s_back = snap(now=5.0, waiting=[back], tasks=[task("t1", active=[("s1", 0.5)])], prefixes={"a": (4096, "gpu")})
    d_back = pol.decide(s_back)
    assert not pol.credits and d_back.admit == ("r1",) and "r1" in pol.pending
    s3 = snap(tasks=[task("t1", done={"s1"})], prefixes={"a": (4096, "gpu")})
    d3 = pol.decide(s3)
    assert not pol.credits and not pol.pending  # completed: cleared
    assert d3.prefix_out == ("a",)  # R' is empty: the idle prefix leaves


def test_policy_decisions_are_valid_on_a_chain_snapshot():
    pol = make_policy("topas-paper")
    w = [req(f"r{i}", f"t{i}", "s1", "a", arrival=i, task_arrival=i) for i in range(6)]
    w.append(req("x", "tx", "s2", "b"))
    s = snap(now=10.0, waiting=w, tasks=[task(f"t{i}", arrival=i) for i in range(6)] + [task("tx", done={"s1"})],
             prefixes={"a": (4096, "gpu"), "b": (4096, "cpu"), "c": (4096, "gpu")}, workflows=(CHAIN3,))
    d = pol.decide(s)
    check_decision(s, d)
    assert d.admit and "c" in d.prefix_out  # c is idle: never kept


def test_paper_options_are_validated():
    assert make_paper_config(M="3", K=0).M == 3
    with pytest.raises(ConfigError):
        make_paper_config(enum_agents=4)  # a knob of the tuned search only (the paper's is M)
    with pytest.raises(ConfigError):
        make_paper_config(K=-1)


def test_project_options_are_off_by_default_and_each_changes_its_term():
    cfg = PaperConfig()
    assert (cfg.horizon, cfg.work_floor, cfg.size_weight, cfg.kv_exp, cfg.redo_prefill, cfg.pin_finishing,
            cfg.k_preempt, cfg.forfeit, cfg.keep_idle, cfg.prefetch, cfg.block, cfg.backfill, cfg.advance,
            cfg.drop_incumbent, cfg.width, cfg.max_additions, cfg.smith_move, cfg.reserve_first, cfg.reuse_imminence,
            cfg.rivals, cfg.work_conserving) == (0.0, 0.0, 0.0, 1.0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0,
                                                 0)
    # kv_exp = 0: order by weighted progress alone: r2 (3 s) first although 600 KV
    w = [req("r1", "t1", "s", "A", inp=50, out=50), req("r2", "t2", "s", "A", inp=300, out=300)]
    vals = {"t1": point(("s", 1.0)), "t2": point(("s", 3.0))}
    ix = index(w, values=vals, service={"r1": 1.0, "r2": 3.0}, resident={"A"}, cfg=PaperConfig(kv_exp=0.0))
    assert greedy_pack(ix, F("A")).admits[0].req.rid == "r2"
    # work_floor: a zero-gain branch (c = 1 beside b = 3) is worth work_floor x D = 0.25
    wc = [req("c1", "t1", "c", "C")]
    ix = index(wc, values={"t1": point(("b", 3.0), ("c", 1.0))}, service={"c1": 1.0}, resident={"C"},
               cfg=PaperConfig(work_floor=0.25))
    assert greedy_pack(ix, F("C")).states == [(1, 0.25)]
    # redo_prefill: J_redo is the re-prefill of input + generated tokens
    p = req("p", "tp", "s", "B", gen=50, inp=50, out=100)
    for flag, redo in ((0, t_decode(p, PROFILE) * 50), (1, PROFILE.prefill_s(100, 4096))):
        ix = index([], [p], values={"tp": point(("s", 1.0))}, service={"p": 1.0}, cfg=PaperConfig(redo_prefill=flag),
                   tokens={"B": 1000})
        assert greedy_pack(ix, F()).states == [(0, pytest.approx(-redo))]
    # forfeit: the preempted request's own progress g Delta(p | {}) = 1 x min(1, 1) is lost too
    ix = index([], [p], values={"tp": point(("s", 1.0))}, service={"p": 1.0}, tokens={"B": 1000},
               cfg=PaperConfig(forfeit=1))
    assert greedy_pack(ix, F()).states == [(0, pytest.approx(-t_decode(p, PROFILE) * 50 - 1.0))]
    # keep_idle: resident D with nothing to run stays in R' only when n_D > 0 (and only with the option)
    r = req("r", "t", "s", "A", inp=50, out=50)
    for opt, counts, ok in ((0, {"D": 1}, False), (1, {}, False), (1, {"D": 1}, True)):
        kx = index([r], values={"t": point(("s", 1.0))}, service={"r": 1.0}, resident={"A", "D"},
                   tokens={"A": 100, "D": 100}, counts=counts, cfg=PaperConfig(keep_idle=opt))
        assert (greedy_pack(kx, F("AD")) is not None) is ok
        assert ("D" in ps.active_agents(kx)) is ok
    # pin_finishing: preempting a request in the pinned set is infeasible
    ix.pinned = frozenset({"p"})
    assert greedy_pack(ix, F()) is None


def test_paper_ablation_factories():
    from topas_agents.policies.topas import (
        make_topas_paper_base,
        make_topas_paper_noaging,
        make_topas_paper_noreuse,
    )
    assert (make_topas_paper_base().config.beta, make_topas_paper_base().config.rho) == (0.0, 0.0)
    assert make_topas_paper_noreuse().config.beta == 0.0 and make_topas_paper_noreuse().config.rho == 1.0
    assert make_topas_paper_noaging().config.rho == 0.0 and make_topas_paper_noaging(K=3).config.K == 3
    from topas_agents.policies.topas import make_topas_paper_tuned
    tuned = make_topas_paper_tuned(k_preempt=2).config
    assert (tuned.horizon, tuned.kv_exp, tuned.forfeit, tuned.k_preempt) == (0.3, 0.0, 1, 2)
