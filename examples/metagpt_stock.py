"""A STOCK MetaGPT script (stock roles, stock Team, MetaGPT's own config) labelled for Topas
with one call, against the embedded OpenAI-compatible simulator.

    python examples/metagpt_stock.py [--root .topas/example-stock] [--time-scale 50]

The only Topas lines are `prepare_metagpt` (MetaGPT's root; a script that already has one can
skip it) and `with enable(base_url=...)`: while it is active every call carries
task (a fresh id per Team.run, closed on the server when the run ends), stage (from the
action: WritePRD -> write_prd) and agent (from the role: ProductManager -> product_manager).
"""

from __future__ import annotations

import argparse
import asyncio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".topas/example-stock", help="MetaGPT root for this example")
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--idea", default="Create a 2048 game.")
    args = ap.parse_args()

    from topas_agents.integrations.metagpt import prepare_metagpt
    from topas_agents.integrations.metagpt.server_api import embedded_server, fetch_stats

    prepare_metagpt(args.root, log_level="ERROR")  # MetaGPT's root, before MetaGPT is imported
    from metagpt.roles import Architect, Engineer, ProductManager, ProjectManager
    from metagpt.team import Team

    from topas_agents.integrations.metagpt import enable  # needs MetaGPT imported

    with embedded_server(policy="topas", time_scale=args.time_scale) as server:
        with enable(base_url=server.url) as topas:
            # --- the stock MetaGPT script, unchanged ---
            team = Team()
            team.hire([ProductManager(), Architect(), ProjectManager(), Engineer()])
            team.invest(3.0)
            asyncio.run(team.run(n_round=8, idea=args.idea))
            # -------------------------------------------
        stats = fetch_stats(server.url)
    for task_id in topas.task_ids:
        task = next(t for t in stats["tasks"]["items"] if t["task_id"] == task_id)
        print(f"task {task_id}: done={task['done']} ({task['done_reason']}), JCT {task['jct_s']:.1f} simulated s")
    for c in stats["calls"]:
        print(f"  call {c['stage']:<12} {c['agent']:<16} label from {c['label_source']}, "
              f"prefix {c['prefix_tokens']} + input {c['input_tokens']} tokens")


if __name__ == "__main__":
    from topas_agents.cli.args import run_module

    run_module(main)  # a bad argument: one line `error: ...`, exit 2, as `topas`
