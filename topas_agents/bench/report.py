"""Human-readable views of a bench result: the terminal table and the two-panel plot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError


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


_COLUMNS = ("policy", "mean JCT s", "p99 JCT s", "gap to LB", "mean batch", "swaps", "preempt", "decision ms")


def format_table(result: Mapping[str, Any], capacity: float | None = None) -> str:
    """Per point: one row per policy; then the summary over points."""
    cap = f", capacity {capacity:.4g} tasks/s" if capacity else ""
    lines = [f"{result['workload']} on {result['profile']}: {result['tasks']} tasks, seed {result['seed']}{cap}"]
    widths = (14, 11, 11, 10, 11, 7, 8, 12)
    header = "".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(_COLUMNS, widths, strict=True)))
    for pt in result["points"]:
        lines += ["", _point_header(pt), header]
        for name, r in pt["results"].items():
            cells = (name, _s(r["mean_jct"]), _s(r["p99_jct"]), _pct(r["gap"]), _num(r["mean_batch"], ".1f"),
                     _num(r["prefix_swaps"], "d"), _num(r["preemptions"], "d"), _num(r["decision_ms_mean"], ".3f"))
            lines.append("".join(c.rjust(w) if i else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))))
    lines += ["", "summary (mean over points):"]
    for name, s in result["summary"].items():
        ratio, ratio99 = s["mean_jct_vs_best_baseline"], s["p99_jct_vs_best_baseline"]
        vs = f", mean {ratio:.3f}x best baseline ({s['best_baseline']})" if ratio is not None else ""
        if ratio99 is not None:
            vs += f", p99 {ratio99:.3f}x best ({s['best_baseline_p99']})"
        lines.append(f"  {name:<14} mean JCT {_s(s['mean_jct'])} s, p99 JCT {_s(s['p99_jct'])} s{vs}")
    return "\n".join(lines)


def plot_result(result: Mapping[str, Any], path: str | Path) -> Path:
    """Mean and p99 JCT vs arrival rate, one line per policy (lower bound dashed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg only; no pyplot state
    from matplotlib.figure import Figure

    points = [pt for pt in result["points"] if pt["rate"] is not None]
    rates = [pt["rate"] for pt in points]
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    mean_ax, p99_ax = fig.subplots(1, 2)
    policies = list(points[0]["results"]) if points else []
    for name in policies:
        # Topas stands out; its ablations are dashed so they read as variants of it.
        style = {"linewidth": 2.5} if name == "topas" else {"linestyle": "--"} if name.startswith("topas") else {}
        for ax, key in ((mean_ax, "mean_jct"), (p99_ax, "p99_jct")):
            ys = [pt["results"][name][key] for pt in points]
            ax.plot(rates, [float("nan") if y is None else y for y in ys], marker="o", label=name, **style)
    mean_ax.plot(rates, [pt["lower_bound"]["mean_jct"] for pt in points], "k--", label="lower bound")
    for ax, title in ((mean_ax, "mean JCT"), (p99_ax, "p99 JCT")):
        ax.set_xlabel("arrival rate (tasks/s)")
        ax.set_ylabel(f"{title} (s)")
        ax.set_title(f"{result['workload']}: {title}")
        ax.grid(alpha=0.3)
    mean_ax.legend(fontsize=8)
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--plot {path}: cannot write: {exc}") from None
    return out
