"""What a policy selector could reach on a suite: hindsight, expectation, and the guard.

The forecast guard (`policies/forecast.py`) picks one policy per run from simulations of
the observed workload. Two reference selectors bound what any such picker can do, per
(workflow, load) cell, judged by the per-load contract (the larger of a policy's mean-JCT
and p99-JCT ratios to each metric's best baseline, each averaged over the arrival seeds):

* **hindsight**: the policy (core or a baseline) that scores best on the judged seeds
  themselves. No selector that runs one policy per cell does better.
* **expectation**: the policy that scores best on *other* arrival seeds of the same
  workflow and load (a second suite document, many seeds): a selector that knows each
  policy's expected JCTs exactly, but not the judged traces. The core is kept unless a
  policy's expected score is lower by more than `margin` (the guard's hysteresis rule).

Where the expectation pick loses on the judged seeds, a forecast could not have known
better; where the guard loses and the expectation pick does not, the forecast erred (or
switched too late). Inputs are `topas bench --suite random --json` documents over the same
suite seed; run `python -m topas_agents.suite.selectors --help`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..policies import BASELINES
from ..policies.forecast import ForecastConfig, switch_target
from .ratios import METRICS
from .report import LOSS_THRESHOLD

GUARD_MARGIN = ForecastConfig().margin  # the expectation pick uses the guard's rule and margin
CORE_NAMES = ("topas-core", "topas")  # documents from before the rename call the core `topas`

Cell = Mapping[str, Mapping[str, Mapping[str, float]]]  # seed -> policy -> metric -> value


@dataclass(frozen=True, slots=True)
class CellScores:
    """One (workflow, load) cell. Scores are contract scores (1.0 = the best baseline on both
    metrics); `guard` is None without a guard document."""

    cell: str  # "<workflow>@<load>"
    core: float
    hindsight: float
    pick: str  # "core" or a baseline
    pick_expected: float
    pick_judged: float
    guard: float | None


def contract_scores(cell: Cell, policies: Sequence[str], baselines: Sequence[str]) -> dict[str, float]:
    """Per policy: max over metrics of its seed-averaged value / the best baseline's."""
    seeds = list(cell)
    avg = {p: {m: sum(cell[s][p][m] for s in seeds) / len(seeds) for m in METRICS} for p in policies}
    best = {m: min(avg[b][m] for b in baselines) for m in METRICS}
    return {p: max(avg[p][m] / best[m] for m in METRICS) for p in policies}


def _core_name(policies: Sequence[str]) -> str:
    for name in CORE_NAMES:
        if name in policies:
            return name
    raise ValueError(f"no core policy ({' or '.join(CORE_NAMES)}) in {sorted(policies)}")


def _cell(doc_workflow: Mapping[str, Any], load: str, rename: Mapping[str, str]) -> Cell:
    return {s: {rename.get(p, p): v for p, v in by_load[load].items()}
            for s, by_load in doc_workflow["runs"].items()}


def score_cells(judged: Mapping[str, Any], expected: Mapping[str, Any],
                guard: Mapping[str, Any] | None = None, margin: float = GUARD_MARGIN,
                guard_policy: str = "topas") -> list[CellScores]:
    """Every cell of `judged` (a suite document), its picks made on `expected`'s seeds."""
    baselines = [b for b in BASELINES if b in judged["policies"]]
    core = _core_name(judged["policies"])
    x_core = _core_name(expected["policies"])
    policies = [*baselines, core]
    by_name = {w["name"]: w for w in expected["workflows"]}
    guards = {w["name"]: w for w in guard["workflows"]} if guard else {}
    out = []
    for w in judged["workflows"]:
        for load in map(str, judged["loads"]):
            judged_scores = contract_scores(_cell(w, load, {}), policies, baselines)
            x_scores = contract_scores(_cell(by_name[w["name"]], load, {x_core: core}), policies, baselines)
            pick = switch_target(x_scores, core, core, margin)  # the guard's rule, the core running
            g = None
            if guard:
                seeds = w["runs"].keys()
                g_cell = {s: {**w["runs"][s][load], guard_policy: guards[w["name"]]["runs"][s][load][guard_policy]}
                          for s in seeds}
                g = contract_scores(g_cell, [*baselines, guard_policy], baselines)[guard_policy]
            out.append(CellScores(f"{w['name']}@{load}", judged_scores[core], min(judged_scores.values()),
                                  "core" if pick == core else pick, x_scores[pick], judged_scores[pick], g))
    return out


def summary(cells: Sequence[CellScores]) -> dict[str, dict[str, float | int]]:
    """Per selector: cells over the threshold and the worst score."""
    columns = {"core": "core", "hindsight": "hindsight", "expectation pick (judged seeds)": "pick_judged",
               "expectation pick (its own seeds)": "pick_expected", "guard": "guard"}
    out: dict[str, dict[str, float | int]] = {}
    for label, field in columns.items():
        values = [getattr(c, field) for c in cells if getattr(c, field) is not None]
        if values:
            out[label] = {"losing": sum(v > LOSS_THRESHOLD for v in values), "cells": len(values),
                          "max": max(values)}
    return out


def load_document(path: Path) -> dict[str, Any]:
    """A suite JSON document; `.gz` files are read through gzip (the committed many-seed
    documents are stored compressed)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(raw)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m topas_agents.suite.selectors", description=__doc__.split("\n\n")[0])
    p.add_argument("judged", type=Path, help="suite JSON whose seeds judge (e.g. docs/results/suite/suite-g3.json)")
    p.add_argument("expected", type=Path, help="suite JSON (or .json.gz) of the same suite over other arrival seeds")
    p.add_argument("--guard", type=Path, help="suite JSON of the guard on the judged seeds")
    p.add_argument("--guard-policy", default="topas", help="the guard's policy name in --guard (default topas)")
    p.add_argument("--margin", type=float, default=GUARD_MARGIN,
                   help="expectation pick's hysteresis (default: the guard's, %(default)s)")
    p.add_argument("--json", type=Path, help="write the summary and every cell as JSON")
    args = p.parse_args(argv)
    try:
        docs = [load_document(path) if path else None for path in (args.judged, args.expected, args.guard)]
        cells = score_cells(docs[0], docs[1], docs[2], args.margin, args.guard_policy)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    table = summary(cells)
    for label, row in table.items():
        print(f"{label:34s} losing {row['losing']:3d} / {row['cells']}  max {row['max']:.3f}")
    for c in cells:
        if max(c.core, c.pick_judged, c.guard or 0.0) > LOSS_THRESHOLD:
            g = "" if c.guard is None else f" guard {c.guard:.3f}"
            print(f"  {c.cell:24s} core {c.core:.3f} hindsight {c.hindsight:.3f} "
                  f"pick {c.pick} ({c.pick_expected:.3f} expected, {c.pick_judged:.3f} judged){g}")
    if args.json:
        args.json.write_text(json.dumps({"margin": args.margin, "summary": table,
                                         "cells": [asdict(c) for c in cells]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
