"""What each named option of the paper core adds: cumulative option sets on the built-in workloads.

    python -m topas_agents.bench.paper_options [--tasks 200] [--seeds 0,1,2,3,4] [--jobs 2]
        [--workloads chain3,...] [--steps N] [--json OUT]

`topas-paper` is section IV as printed; every project-specific change is one of its named
options (`PaperConfig`, docs/topas.md "Named options"). Starting from the printed algorithm,
each step switches on more options (the previous step's plus its own), and the paper core is
run with the five baselines on every built-in workload at its default loads, over the seeds.
Each row is the paper-rule ratio to the best baseline (section V-A; mean over seeds and 95%
t interval, as `topas bench --seeds`), so a row's change from the row above is what its
options add. The last step has every option at `topas`'s value (`TOPAS_OPTIONS`, the policy
`topas-paper-full`); `topas-core` (the tuned code path) is the last row, for reference.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TopasError
from ..policies import BASELINES
from ..policies.topas.paper_config import TUNED_OPTIONS
from ..suite.report import fmt_value
from .evaluate import DEFAULT_WORKLOADS, evaluate
from .options import parse_positive_int, parse_seed_list


@dataclass(frozen=True, slots=True)
class Step:
    """One row: `adds` switched on over the previous row's options."""

    name: str
    adds: Mapping[str, float | int]


# The order follows the loss causes: first `topas`'s valuation (TUNED_OPTIONS), then what the
# never-slower contract added (stranded KV, the starving head), then the search's own
# deviations, then the prefix-keeping ones and V_reuse's weights.
STEPS: tuple[Step, ...] = (
    Step("printed (topas-paper)", {}),
    Step("+ valuation (TUNED_OPTIONS)", TUNED_OPTIONS),
    Step("+ block", {"block": 0.5}),
    Step("+ backfill, advance", {"backfill": 4.0, "advance": 1.0}),
    Step("+ rivals, work_conserving", {"rivals": 1, "work_conserving": 1}),
    Step("+ drop_incumbent", {"drop_incumbent": 1}),
    Step("+ smith_move, reserve_first", {"smith_move": 1, "reserve_first": 4}),
    Step("+ width, max_additions", {"width": 4, "max_additions": 8}),
    Step("+ keep_idle, prefetch", {"keep_idle": 1, "prefetch": 1}),
    Step("+ reuse_imminence", {"reuse_imminence": 1}),
    Step("+ forfeit 2 (= TOPAS_OPTIONS)", {"forfeit": 2}),
)
REFERENCE = "topas-core"


def _ratios(docs: Mapping[str, Mapping[str, Any]], policy: str) -> dict[str, dict[str, Any]]:
    """Per workload: the policy's mean and p99 paper-rule ratios over seeds, and comparators."""
    out = {}
    for w, doc in docs.items():
        agg = doc["over_seeds"][policy]
        out[w] = {"mean": agg["mean_jct_vs_best_baseline"], "p99": agg["p99_jct_vs_best_baseline"],
                  "best_baseline": agg["best_baseline"], "best_baseline_p99": agg["best_baseline_p99"]}
    return out


def run_steps(steps: Sequence[Step], workloads: Sequence[str], tasks: int, seeds: Sequence[int],
              jobs: int = 1) -> dict[str, Any]:
    """Every step (cumulative options of `topas-paper`) and the reference, with the baselines."""
    rows, options = [], {}
    for step in steps:
        options = {**options, **step.adds}
        docs = evaluate(workloads, ["topas-paper", *BASELINES], tasks, seeds, jobs=jobs, options=options)
        rows.append({"name": step.name, "adds": dict(step.adds), "options": dict(options),
                     "workloads": _ratios(docs, "topas-paper")})
    docs = evaluate(workloads, [REFERENCE, *BASELINES], tasks, seeds, jobs=jobs)
    rows.append({"name": REFERENCE, "adds": {}, "options": {}, "workloads": _ratios(docs, REFERENCE)})
    return {"tasks": tasks, "seeds": list(seeds), "workloads": list(workloads), "rows": rows}


def format_steps(result: Mapping[str, Any]) -> str:
    """A markdown table: one row per step, mean / p99 ratio (95% CI) per workload."""
    ws = result["workloads"]
    lines = ["| options | " + " | ".join(f"{w} mean / p99" for w in ws) + " |", "|---" * (len(ws) + 1) + "|"]
    for row in result["rows"]:
        cells = []
        for w in ws:
            r = row["workloads"][w]
            cells.append(" / ".join(_cell(r[m]) for m in ("mean", "p99")))
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(iv: Mapping[str, Any] | None) -> str:
    if iv is None:
        return "-"
    ci = iv.get("ci95")
    return fmt_value(iv["mean"]) + (f" [{fmt_value(ci[0])}, {fmt_value(ci[1])}]" if ci else "")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tasks", default="200")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--steps", default=str(len(STEPS)), help=f"run the first N steps (1-{len(STEPS)})")
    ap.add_argument("--jobs", default="1")
    ap.add_argument("--json", default=None, help="also write the rows here")
    return ap


def main(argv: list[str] | None = None) -> int:
    from ..cli.args import check_output, write_json

    args = _parser().parse_args(argv)
    try:
        tasks = parse_positive_int(args.tasks, "--tasks")
        seeds = parse_seed_list(args.seeds)
        jobs = parse_positive_int(args.jobs, "--jobs")
        n = parse_positive_int(args.steps, "--steps")
        if n > len(STEPS):
            raise TopasError(f"--steps: at most {len(STEPS)}, got {n}")
        check_output("--json", args.json)  # before a run of tens of minutes, not after it
        result = run_steps(STEPS[:n], [w.strip() for w in args.workloads.split(",")], tasks, seeds, jobs)
        print(format_steps(result))
        if args.json:
            write_json(args.json, result)
    except TopasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
