"""`topas metagpt config`: write or patch MetaGPT's config2.yaml under a project root.

    topas metagpt config --base-url http://127.0.0.1:8000/v1 [--root .topas/metagpt]
                         [--model NAME] [--api-key KEY]

Only `<root>/config/config2.yaml` is written; other keys in it are kept. Point MetaGPT at it
with `METAGPT_PROJECT_ROOT=<root>` (or `prepare_metagpt(root)` in code).
"""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("metagpt", help="MetaGPT integration utilities",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="metagpt_command", metavar="ACTION", parser_class=type(p))
    c = sub.add_parser("config", help="write/patch <root>/config/config2.yaml")
    c.add_argument("--base-url", required=True, help="OpenAI-compatible base URL (…/v1)")
    c.add_argument("--root", default=".topas/metagpt", help="MetaGPT project root (default .topas/metagpt)")
    c.add_argument("--model", default=None, help="model name (default: keep, else topas-sim)")
    c.add_argument("--api-key", default=None, help="API key (default: keep, else a local placeholder)")
    c.set_defaults(run=run)
    p.set_defaults(run=lambda args: (p.print_help(), 2)[1])


def run(args: argparse.Namespace) -> int:
    from ..integrations.metagpt.config_file import read_config, write_config

    path = write_config(args.root, args.base_url, model=args.model, api_key=args.api_key)
    llm = dict(read_config(args.root)["llm"])
    if llm.get("api_key"):
        llm["api_key"] = llm["api_key"][:3] + "***"
    print(json.dumps({"config": str(path), "llm": llm}, indent=2))
    return 0
