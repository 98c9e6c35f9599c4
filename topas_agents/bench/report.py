"""Human-readable views of a bench result: the terminal table and the two-panel plot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..policies import LIVE_OPTIONS


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.0f}%"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _point_header(pt: Mapping[str, Any]) -> str:
    lb = pt["lower_bound"]
    load = f" (load {pt['load']:.2f})" if pt["load"] is not None else ""
    rate = "recorded arrivals" if pt["rate"] is None else f"rate {pt['rate']:.4g} tasks/s"
    return (f"{rate}{load}: lower bound {_s(lb['mean_jct'])} s "
            f"(critical path {_s(lb['critical_path'])} s, work bound {_s(lb['work_bound'])} s)")


_COLUMNS = ("policy", "host tier", "mean JCT s", "p99 JCT s", "gap to LB", "mean batch", "swaps", "recompute",
            "preempt", "decision ms")
_WIDTHS = (14, 10, 11, 11, 10, 11, 7, 10, 8, 12)


def _line(cells: tuple[str, ...], name_width: int = _WIDTHS[0]) -> str:
    widths = (name_width, *_WIDTHS[1:])
    return "".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def _name_width(names: Iterable[str]) -> int:
    """The policy column: wide enough for the longest name (e.g. `topas-paper-tuned`) plus a space."""
    return max([_WIDTHS[0] - 1, *(len(n) for n in names)]) + 1


def _tier(x: bool | None) -> str:
    return "-" if x is None else ("cpu" if x else "none")


def format_table(result: Mapping[str, Any], capacity: float | None = None) -> str:
    """Per point: one row per policy; then the paper rule's summary over points."""
    cap = capacity if capacity is not None else result.get("capacity_rps")
    cap_s = f", capacity {cap:.4g} tasks/s" if cap else ""
    setup = result.get("host_tier", {}).get("setup")
    tier_s = f", host tier setup: {setup}" if setup else ""
    lines = [f"{result['workload']} on {result['profile']}: {result['tasks']} tasks, seed {result['seed']}{cap_s}{tier_s}"]
    width = _name_width(name for pt in result["points"] for name in pt["results"])
    for pt in result["points"]:
        lines += ["", _point_header(pt), _line(_COLUMNS, width)]
        for name, r in pt["results"].items():
            lines.append(_line((name, _tier(r.get("host_tier")), _s(r["mean_jct"]), _s(r["p99_jct"]), _pct(r["gap"]),
                                _num(r["mean_batch"], ".1f"), _num(r["prefix_swaps"], "d"),
                                _num(r.get("prefix_recomputes"), "d"), _num(r["preemptions"], "d"),
                                _num(r["decision_ms_mean"], ".3f")), width))
    lines += ["", "summary (paper rule: each metric averaged over the points, ratio to the baseline "
              "with the lowest average):"]
    for name, s in result["summary"].items():
        ratio, ratio99 = s["mean_jct_vs_best_baseline"], s["p99_jct_vs_best_baseline"]
        vs = f", mean {ratio:.3f}x best baseline ({s['best_baseline']})" if ratio is not None else ""
        if ratio99 is not None:
            vs += f", p99 {ratio99:.3f}x best ({s['best_baseline_p99']})"
        lines.append(f"  {name:<{width}} mean JCT {_s(s['mean_jct'])} s, p99 JCT {_s(s['p99_jct'])} s{vs}")
    guarded = sorted({name for pt in result["points"] for name in pt["results"]} & set(LIVE_OPTIONS))
    if guarded:  # its decision ms read 150 ms beside the baselines' 0.03: the forecasts, not the decisions
        lines.append(f"  decision ms of {', '.join(guarded)}: each decide() call with its forecast guard's "
                     "simulations, which run inline here (on a live server, in a worker process); "
                     "`topas bench --decision-cost` times the decisions alone")
    return "\n".join(lines)


def seed_result(doc: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """One seed of a `run_seeds` document as a single-seed bench document."""
    return {"workload": doc["workload"], "profile": doc["profile"], "seed": run["seed"], "tasks": doc["tasks"],
            "capacity_rps": doc.get("capacity_rps"), "host_tier": doc.get("host_tier", {}),
            "points": run["points"], "summary": run["summary"]}


def _ci(iv: Mapping[str, Any] | None, fmt: str = ".3f") -> str:
    if iv is None:
        return "-"
    if iv["ci95"] is None:
        return format(iv["mean"], fmt)
    return f"{iv['mean']:{fmt}} [{iv['ci95'][0]:{fmt}}, {iv['ci95'][1]:{fmt}}]"


def format_seeds_table(doc: Mapping[str, Any]) -> str:
    """Each seed's per-point table, then per policy the paper-rule ratios' mean and 95% CI."""
    parts = [format_table(seed_result(doc, run)) for run in doc["per_seed"]]
    tiers = doc.get("host_tier", {}).get("policies", {})
    lines = ["", f"over seeds {', '.join(map(str, doc['seeds']))} (mean [95% t CI]; ratio < 1: faster than the "
             "best baseline):"]
    width = _name_width(doc["over_seeds"])
    for name, agg in doc["over_seeds"].items():
        # No baseline in the run: no comparator (the aggregate holds None per seed).
        best = "/".join(sorted({b for b in agg["best_baseline"] if b})) or "no baseline"
        best99 = "/".join(sorted({b for b in agg["best_baseline_p99"] if b})) or "no baseline"
        lines.append(f"  {name:<{width}} host tier {_tier(tiers.get(name)):<4}  mean JCT {_ci(agg['mean_jct'], '.1f')} s, "
                     f"ratio {_ci(agg['mean_jct_vs_best_baseline'])} vs {best}; p99 ratio "
                     f"{_ci(agg['p99_jct_vs_best_baseline'])} vs {best99}")
    return "\n\n".join(parts) + "\n" + "\n".join(lines)


def plot_result(result: Mapping[str, Any], path: Any) -> Any:
    """Mean and p99 JCT vs load (see `plots.plot_result`; matplotlib is imported there)."""
    from .plots import plot_result as plot

    return plot(result, path)
