"""Suite ratios: the paper rule over seeds, the per-load view, and the distribution summary."""

from __future__ import annotations

import pytest

from topas_agents.suite.ratios import baseline_floor, paper_rule, per_load, worst_load
from topas_agents.suite.report import LOSS_THRESHOLD, distribution

BASE = ("fcfs", "lpm")


def _m(mean: float, p99: float) -> dict[str, float]:
    return {"mean_jct": mean, "p99_jct": p99}


# seed -> load -> policy -> metrics. Seed 1: lpm is best on average (avg 15 vs fcfs 17),
# but fcfs wins at load 0.8. Seed 2: fcfs best on average.
RUNS = {
    1: {0.2: {"fcfs": _m(14, 30), "lpm": _m(10, 20), "topas": _m(9, 18)},
        0.8: {"fcfs": _m(20, 40), "lpm": _m(20, 50), "topas": _m(24, 44)}},
    2: {0.2: {"fcfs": _m(10, 20), "lpm": _m(12, 20), "topas": _m(11, 20)},
        0.8: {"fcfs": _m(20, 40), "lpm": _m(30, 40), "topas": _m(21, 40)}},
}


def test_paper_rule_averages_over_loads_then_seeds() -> None:
    r = paper_rule(RUNS, "topas", "mean_jct", BASE)
    # seed 1: topas 16.5 / lpm 15 = 1.1; seed 2: topas 16 / fcfs 15 = 16/15.
    assert r.ratio == pytest.approx((1.1 + 16 / 15) / 2)
    assert r.winners == ("lpm", "fcfs")
    assert r.load is None and r.ci95 is not None and r.ci95[0] < r.ratio < r.ci95[1]


def test_per_load_averages_over_seeds_then_compares() -> None:
    rs = per_load(RUNS, "topas", "mean_jct", BASE)
    assert [r.load for r in rs] == [0.2, 0.8]
    # load 0.2: topas 10, fcfs 12, lpm 11 -> lpm; load 0.8: topas 22.5, fcfs 20 -> fcfs.
    assert rs[0].ratio == pytest.approx(10 / 11) and rs[0].winner == "lpm"
    assert rs[1].ratio == pytest.approx(22.5 / 20) and rs[1].winner == "fcfs"
    assert worst_load(rs) == rs[1]


def test_baseline_floor_picks_the_baseline_with_the_smallest_worse_metric() -> None:
    # One load, a trade-off: fcfs has the best mean (10), lpm the best p99 (20). Worse-metric
    # ratios: fcfs max(1.0, 30/20) = 1.5, lpm max(12/10, 1.0) = 1.2, spf max(1.1, 23/20) = 1.15.
    runs = {1: {0.5: {"fcfs": _m(10, 30), "lpm": _m(12, 20), "spf": _m(11, 23)}}}
    floor = baseline_floor(runs, ("fcfs", "lpm", "spf"))
    assert floor["mean_jct"][0].winner == floor["p99_jct"][0].winner == "spf"
    assert floor["mean_jct"][0].ratio == pytest.approx(1.1)
    assert floor["p99_jct"][0].ratio == pytest.approx(1.15)
    # RUNS (seeds averaged first): lpm is best on both metrics at 0.2, fcfs on both at 0.8,
    # so a perfect selector loses nothing there.
    floor = baseline_floor(RUNS, BASE)
    assert [r.winner for r in floor["mean_jct"]] == ["lpm", "fcfs"]
    assert [r.ratio for m in ("mean_jct", "p99_jct") for r in floor[m]] == [1.0] * 4
    # A baseline with a missing value is not picked; none known: no ratio.
    runs = {1: {0.5: {"fcfs": _m(10, 30), "lpm": {"mean_jct": None, "p99_jct": 5}}}}
    assert baseline_floor(runs, ("fcfs", "lpm"))["p99_jct"][0].winner == "fcfs"
    assert baseline_floor(runs, ("lpm",))["mean_jct"][0].ratio is None


def test_missing_value_gives_no_ratio() -> None:
    runs = {1: {0.5: {"fcfs": _m(10, 20), "topas": {"mean_jct": None, "p99_jct": 5}}}}
    assert paper_rule(runs, "topas", "mean_jct", ("fcfs",)).ratio is None
    assert per_load(runs, "topas", "mean_jct", ("fcfs",))[0].ratio is None
    assert per_load(runs, "topas", "p99_jct", ("fcfs",))[0].ratio == pytest.approx(0.25)
    assert worst_load(per_load(runs, "topas", "mean_jct", ("fcfs",))) is None


def test_distribution_quantiles_and_losses() -> None:
    d = distribution([1.0, 0.5, None, 1.5, 1.02, 0.9])
    assert (d.n, d.unknown, d.min, d.max) == (5, 1, 0.5, 1.5)
    assert d.p50 == pytest.approx(1.0)
    assert d.p10 == pytest.approx(0.5 + 0.4 * 0.4)  # numpy-style linear interpolation
    assert d.losses == 1  # 1.02 itself is within the threshold
    assert LOSS_THRESHOLD == 1.02
    assert distribution([None]).n == 0
