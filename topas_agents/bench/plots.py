"""Plots of bench documents (single seed or `run_seeds`): mean and p99 JCT vs offered load,
one line per policy with its 95% t band over seeds. Matplotlib (Agg) is imported only here."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .aggregate import mean_ci

# Policies can coincide exactly (e.g. two baselines that make the same decisions on a
# chain); hollow markers of decreasing size and distinct dash patterns keep each visible.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h")
_DASHES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))


def _runs(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(result["per_seed"]) if "per_seed" in result else [result]


def _x(pt: Mapping[str, Any], capacity: float | None) -> float:
    """Offered load: as given, else rate / capacity (a stated rate), else the rate itself."""
    if pt["load"] is not None:
        return float(pt["load"])
    if pt["rate"] is None:
        return math.nan
    return pt["rate"] / capacity if capacity else float(pt["rate"])


def _series(runs: Sequence[Mapping[str, Any]], get: Any) -> tuple[list[float], list[float], list[float]]:
    """Mean over seeds at each point and its CI (equal to the mean where n < 2 or missing)."""
    mid, low, high = [], [], []
    for j in range(len(runs[0]["points"])):
        vals = [get(run["points"][j]) for run in runs]
        if any(v is None for v in vals):
            for series in (mid, low, high):
                series.append(math.nan)
            continue
        iv = mean_ci(vals)
        mid.append(iv.mean)
        low.append(iv.mean if iv.low is None else iv.low)
        high.append(iv.mean if iv.high is None else iv.high)
    return mid, low, high


def _title(result: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> str:
    seeds = [run["seed"] for run in runs]
    setup = result.get("host_tier", {}).get("setup", "profile default")
    return (f"{result['workload']} on {result['profile']}: {result['tasks']} tasks/run, "
            f"seeds {','.join(map(str, seeds))} (band: 95% t CI over seeds), host tier: {setup}")


def plot_result(result: Mapping[str, Any], path: str | Path) -> Path:
    """Two panels (mean JCT with the lower bound, p99 JCT) vs offered load; returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg only; no pyplot state
    from matplotlib.figure import Figure

    runs = _runs(result)
    cap = result.get("capacity_rps")
    xs = [_x(pt, cap) for pt in runs[0]["points"]]
    order = sorted(range(len(xs)), key=lambda j: xs[j])
    xs = [xs[j] for j in order]
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    policies = list(runs[0]["points"][0]["results"]) if runs[0]["points"] else []
    tiers = result.get("host_tier", {}).get("policies", {})
    for i, name in enumerate(policies):
        label = name + (" (no host tier)" if tiers.get(name) is False else "")
        color = "black" if name == "topas" else f"C{i % 10}"  # the policy under study stands out
        style = {"marker": _MARKERS[i % len(_MARKERS)], "linestyle": _DASHES[i % len(_DASHES)],
                 "markerfacecolor": "none", "markersize": 9 - 0.5 * (i % 8), "color": color,
                 "linewidth": 2.5 if name == "topas" else 1.4, "label": label}
        for ax, key in zip(axes, ("mean_jct", "p99_jct"), strict=True):
            mid, low, high = _series(runs, lambda pt, n=name, k=key: pt["results"][n][k])
            ax.plot(xs, [mid[j] for j in order], **style)
            if len(runs) > 1:
                ax.fill_between(xs, [low[j] for j in order], [high[j] for j in order], color=color, alpha=0.12)
    lb, _, _ = _series(runs, lambda pt: pt["lower_bound"]["mean_jct"])
    axes[0].plot(xs, [lb[j] for j in order], "k--", linewidth=1, label="lower bound")
    for ax, title in zip(axes, ("mean JCT", "p99 JCT"), strict=True):
        ax.set_xlabel("offered load (fraction of ideal capacity)")
        ax.set_ylabel(f"{title} (s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(result, runs), fontsize=9)
    return save_figure(fig, path, "--plot")


def _policy_style(i: int, name: str) -> dict[str, Any]:
    """The line style `plot_result` gives policy `i` (topas stands out), for the other plots."""
    return {"marker": _MARKERS[i % len(_MARKERS)], "linestyle": _DASHES[i % len(_DASHES)],
            "markerfacecolor": "none", "markersize": 9 - 0.5 * (i % 8),
            "color": "black" if name == "topas" else f"C{i % 10}",
            "linewidth": 2.5 if name == "topas" else 1.4}


def figure_path(path: str | Path) -> Path:
    """Where a figure asked for at `path` is written: matplotlib adds `.png` to a name without
    a suffix, so `--plot out` wrote `out.png` beside a checked `out`; callers check this path."""
    out = Path(path)
    return out if out.suffix else out.with_name(out.name + ".png")


def save_figure(fig: Any, path: str | Path, flag: str, dpi: int = 110) -> Path:
    """Write `fig` to `figure_path(path)` (parents created); a failure is a one-line error
    naming `flag`."""
    out = figure_path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=dpi)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{flag} {path}: cannot write: {exc}") from None
    return out


def _figure(size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg only; no pyplot state
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_jct_cdf(jcts: Mapping[str, Sequence[float | None]], path: str | Path, *, title: str = "",
                 unit: str = "s", flag: str = "--plot") -> Path:
    """Empirical CDF of per-task JCT, one step line per policy (None = a failed task: left out,
    and counted in the legend). Returns the path."""
    fig = _figure((7, 4.5))
    ax = fig.subplots()
    for i, (name, values) in enumerate(jcts.items()):
        ok = sorted(float(v) for v in values if v is not None)
        failed = len(values) - len(ok)
        label = f"{name} (n={len(ok)}" + (f", {failed} failed)" if failed else ")")
        style = {**_policy_style(i, name), "markevery": (1, max(1, len(ok) // 12))}  # markers on the tasks, not the start
        if ok:  # F(x) = fraction of tasks done by x; the step starts at 0 before the first task
            ax.step([ok[0], *ok], [0.0, *((k + 1) / len(ok) for k in range(len(ok)))], where="post",
                    label=label, **style)
        else:
            ax.plot([], [], label=label, **style)
    ax.set_xlabel(f"task JCT ({unit})")
    ax.set_ylabel("fraction of tasks")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(_fitted(title or "per-task JCT CDF", 7), fontsize=9)
    return save_figure(fig, path, flag)


def plot_jct_bars(summary: Mapping[str, Mapping[str, float | None]], path: str | Path, *, title: str = "",
                  unit: str = "s", flag: str = "--plot") -> Path:
    """Mean and p99 JCT per policy as grouped bars (`summary[policy]` has `mean_jct_s` and
    `p99_jct_s`; None, e.g. every task failed, is drawn as a missing bar)."""
    fig = _figure((max(5.0, 1.3 * len(summary) + 2), 4.2))
    ax = fig.subplots()
    names = list(summary)
    width = 0.38
    for k, (key, label) in enumerate((("mean_jct_s", "mean"), ("p99_jct_s", "p99"))):
        xs = [j + (k - 0.5) * width for j in range(len(names))]
        vals = [summary[n].get(key) for n in names]
        bars = ax.bar(xs, [math.nan if v is None else v for v in vals], width, label=label,
                      color="C0" if k == 0 else "C1", hatch="" if k == 0 else "//", edgecolor="black")
        ax.bar_label(bars, labels=["-" if v is None else f"{v:.3g}" for v in vals], fontsize=7)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(f"JCT ({unit})")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    if all(summary[n].get(k) is None for n in names for k in ("mean_jct_s", "p99_jct_s")):
        # every task failed: say so (an empty chart around a y axis of -0.04..0.04 said nothing)
        ax.set_ylim(0, 1)
        ax.text(0.5, 0.5, "no task succeeded: no JCT", transform=ax.transAxes, ha="center", va="center")
    ax.set_title(_fitted(title or "JCT by policy", fig.get_figwidth()), fontsize=9)
    return save_figure(fig, path, flag)


def _fitted(title: str, width_in: float, fontsize: float = 9.0) -> str:
    """`title` with each line wrapped to the figure's width (a long one was cut at the edge)."""
    import textwrap

    chars = max(20, int(width_in * 72 / (fontsize * 0.6)))  # about 0.6 em per character
    return "\n".join(textwrap.fill(line, chars) for line in title.splitlines())
