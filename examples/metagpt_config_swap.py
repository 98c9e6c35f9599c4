"""Swapping MetaGPT's LLM endpoint: the config file for MetaGPT itself, and a fresh
per-run Config in code, so one process can drive several servers.

    topas serve --port 8000 --time-scale 50        # server A, in another terminal (README)
    python examples/metagpt_config_swap.py [--base-url http://127.0.0.1:8000/v1] [--root .topas/example-swap]
                                           [--api-key KEY]   # A's key (default $TOPAS_API_KEY)

1. `write_config(root, url, api_key=...)` (= `topas metagpt config --base-url URL --root DIR`)
   writes or patches `<root>/config/config2.yaml` with server A (`--base-url`, default the
   README's `topas serve`, and its key if it has one); MetaGPT reads it at import when
   METAGPT_PROJECT_ROOT=<root>.
   `prepare_metagpt(root)` does both, explicitly. The file keeps pointing at A after the
   example ends, so `METAGPT_PROJECT_ROOT=<root>` scripts can keep using it while A runs.
2. Every run builds its own Context (`RunOptions.base_url` -> `metagpt_context`), so two SOP
   tasks go to two different servers here (A, and B: an embedded simulator this example
   starts, policy topas), with nothing global changed between them; each server's stats show
   only its own task. Task ids are fresh per run, so the example can be run again against A.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path
from typing import NamedTuple

README_SERVER = "http://127.0.0.1:8000/v1"  # `topas serve` (README): --host 127.0.0.1 --port 8000


def _server_a(url: str, key: str | None) -> None:
    """Fail in one line when A does not answer; with the command that starts A only when
    nothing is listening (a refused key or a wrong URL needs another fix)."""
    import httpx

    from topas_agents.errors import ConfigError
    from topas_agents.integrations.metagpt.server_api import probe_server, server_info

    try:
        probe_server(url, key)
    except ConfigError as exc:
        if isinstance(exc.__context__, httpx.HTTPError):  # the probe's own connection error
            raise ConfigError(f"{exc}; start server A first: topas serve --port 8000 --time-scale 50 "
                              "(or pass --base-url URL of a running server)") from None
        raise
    info = server_info(url, key)
    if info.simulated and info.clock_scale < 10:  # `topas serve`'s default 1: ~75 wall s per SOP task
        print(f"note: server A runs at time scale {info.clock_scale:g}, so its task takes a minute or more "
              "(`topas serve --time-scale 50`: seconds)")


class Server(NamedTuple):
    """A server the example runs a task on; api_key None: it takes none."""

    name: str
    url: str
    api_key: str | None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default=README_SERVER,
                    help=f"server A, written to config2.yaml (default {README_SERVER}: `topas serve`)")
    ap.add_argument("--api-key", help="server A's API key (`topas serve --api-key`; default $TOPAS_API_KEY)")
    ap.add_argument("--root", default=".topas/example-swap", help="MetaGPT root for this example")
    ap.add_argument("--time-scale", type=float, default=50.0, help="server B (embedded): time scale")
    ap.add_argument("--prompt", default="Create a snake game.")
    args = ap.parse_args()

    from topas_agents.cli.args import client_api_key
    from topas_agents.integrations.metagpt.config_file import (
        DEFAULT_API_KEY,
        home_overrides,
        read_config,
        write_config,
    )
    from topas_agents.integrations.metagpt.environment import prepare_metagpt
    from topas_agents.integrations.metagpt.server_api import (
        embedded_server,
        fetch_stats,
        register_workflow,
        server_info,
    )

    key = client_api_key(args)  # as `topas run`: --api-key, else TOPAS_API_KEY
    _server_a(args.base_url, key)
    # (1) the file MetaGPT reads at import: point it at server A (with its key, if it has one)
    path = write_config(args.root, args.base_url, model="topas-sim", api_key=key)
    print(f"config file {path}: llm.base_url = {read_config(args.root)['llm']['base_url']}")
    if home_overrides():
        print("note: ~/.metagpt/config2.yaml has an llm section, which MetaGPT reads last: it wins over this file")
    prepare_metagpt(args.root, log_level="ERROR")

    from topas_agents.integrations.metagpt.runner import RunOptions, TaskSpec, label_workflow, run_task

    run = uuid.uuid4().hex[:6]  # a server closes a finished task id for good
    with embedded_server(policy="topas", time_scale=args.time_scale) as b:
        servers = (Server("A", args.base_url, key), Server("B", b.url, None))  # B, embedded here, takes no key
        # (2) per run: a fresh Config/Context for each server, no global state touched
        for name, url, url_key in servers:
            register_workflow(url, label_workflow("sop"), url_key)
            options = RunOptions(base_url=url, workflow="sop", root=Path(args.root), send_max_tokens=False,
                                 parse_retries=2, api_key=url_key or DEFAULT_API_KEY)  # no key: a placeholder
            result = asyncio.run(run_task(TaskSpec(f"swap-{name.lower()}-{run}", args.prompt), options))
            note = server_info(url, url_key).artifacts_note  # simulated engine: the files are templates
            print(f"server {name}: task {result.task_id} success={result.success} calls={result.calls} "
                  f"artifacts={result.artifacts}" + (f" ({note})" if note else ""))
        for name, url, url_key in servers:
            stats = fetch_stats(url, api_key=url_key) or {}
            seen = sorted({c["task_id"] for c in stats.get("calls", []) if c["task_id"].endswith(run)})
            print(f"server {name} ({stats['server']['policy']}) saw this run's tasks {seen}")


if __name__ == "__main__":
    from topas_agents.cli.args import run_module

    run_module(main)  # a bad argument or an unusable server: one line `error: ...`, exit 2, as `topas`
