"""Swapping MetaGPT's LLM endpoint: the config file for MetaGPT itself, and a fresh
per-run Config in code, so one process can drive several servers.

    python examples/metagpt_config_swap.py [--root .topas/example-swap] [--time-scale 50]

1. `write_config(root, url)` (= `topas metagpt config --base-url URL --root DIR`) writes or
   patches `<root>/config/config2.yaml`; MetaGPT reads it at import when
   METAGPT_PROJECT_ROOT=<root>. `prepare_metagpt(root)` does both, explicitly.
2. Every run builds its own Context (`RunOptions.base_url` -> `metagpt_context`), so two SOP
   tasks go to two different servers here (policies fcfs and topas), with nothing global
   changed between them; each server's stats show only its own task.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".topas/example-swap", help="MetaGPT root for this example")
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--prompt", default="Create a snake game.")
    args = ap.parse_args()

    from topas_agents.integrations.metagpt.config_file import read_config, write_config
    from topas_agents.integrations.metagpt.environment import prepare_metagpt
    from topas_agents.integrations.metagpt.server_api import embedded_server, fetch_stats, register_workflow

    with embedded_server(policy="fcfs", time_scale=args.time_scale) as a, \
            embedded_server(policy="topas", time_scale=args.time_scale) as b:
        # (1) the file MetaGPT reads at import: point it at server A
        path = write_config(args.root, a.url, model="topas-sim")
        print(f"config file {path}: llm.base_url = {read_config(args.root)['llm']['base_url']}")
        prepare_metagpt(args.root, log_level="ERROR")

        from topas_agents.integrations.metagpt.runner import RunOptions, TaskSpec, label_workflow, run_task

        # (2) per run: a fresh Config/Context for each server, no global state touched
        for name, server in (("A (fcfs)", a), ("B (topas)", b)):
            register_workflow(server.url, label_workflow("sop"))
            options = RunOptions(base_url=server.url, workflow="sop", root=Path(args.root),
                                 send_max_tokens=False, parse_retries=2)
            result = asyncio.run(run_task(TaskSpec(f"swap-{name[0].lower()}", args.prompt), options))
            print(f"server {name}: task {result.task_id} success={result.success} calls={result.calls} "
                  f"artifacts={result.artifacts}")
        for name, server in (("A", a), ("B", b)):
            stats = fetch_stats(server.url) or {}
            seen = sorted({c["task_id"] for c in stats.get("calls", [])})
            print(f"server {name} ({stats['server']['policy']}) saw tasks {seen}")


if __name__ == "__main__":
    main()
