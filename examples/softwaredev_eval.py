"""SoftwareDev with MetaGPT: Poisson arrivals of the published prompts, each policy on its
own embedded simulator, mean/p99 JCT per policy (the library behind `topas eval`).

    python examples/softwaredev_eval.py [--workflow sop|tl] [--limit 4] [--rate 0.02]
                                        [--policies fcfs,topas] [--time-scale 50]
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path


def main() -> int:
    """0 when every task of every policy succeeded, 1 otherwise (as `topas eval`)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workflow", choices=("sop", "tl"), default="sop")
    ap.add_argument("--limit", type=int, default=4, help="first N of the 11 prompts")
    ap.add_argument("--rate", type=float, default=0.02, help="tasks per simulated second")
    ap.add_argument("--policies", default="fcfs,topas")
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--root", default=".topas/example-softwaredev")
    args = ap.parse_args()

    from topas_agents.integrations.metagpt.environment import prepare_metagpt
    from topas_agents.integrations.metagpt.softwaredev import load_softwaredev

    prepare_metagpt(args.root, log_level="ERROR")
    from topas_agents.integrations.metagpt.evaluation import EvalConfig, evaluate, format_table

    prompts = load_softwaredev(args.limit)
    config = EvalConfig(workflow=args.workflow, rate=args.rate, policies=tuple(args.policies.split(",")),
                        tasks=len(prompts), time_scale=args.time_scale, root=Path(args.root))
    doc = asyncio.run(evaluate(config, prompts))
    print(format_table(doc))
    failed = 0
    for policy, entry in doc["policies"].items():
        for r in entry["results"]:
            if r["success"]:
                print(f"  {policy:<6} {r['task_id']} {r['name']:<20} JCT {r['jct_s']:7.1f} s  ok")
            else:
                failed += 1
                print(f"  {policy:<6} {r['task_id']} {r['name']:<20} FAILED: {r['error']}")
    return 1 if failed else 0


if __name__ == "__main__":
    from topas_agents.cli.args import run_module

    run_module(main)  # a bad argument: one line `error: ...`, exit 2, as `topas`
