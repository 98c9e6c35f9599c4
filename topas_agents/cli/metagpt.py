"""`topas metagpt config`: write or patch MetaGPT's config2.yaml under a project root.

    topas metagpt config --base-url http://127.0.0.1:8000/v1 [--root .topas/metagpt]
                         [--model NAME] [--api-key KEY] [--home | --force]

Only `<root>/config/config2.yaml` is written; other keys in it are kept. Point MetaGPT at it
with `METAGPT_PROJECT_ROOT=<root>` (or `prepare_metagpt(root)` in code).

Precedence: MetaGPT merges environment < <root>/config/config2.yaml < ~/.metagpt/config2.yaml
per top-level key, so an `llm` section in ~/.metagpt/config2.yaml replaces the written one
whole. The command refuses then (exit 2): remove that section, or pass --home to patch
~/.metagpt/config2.yaml itself (the file that wins), or --force to write the project file anyway.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from topas_agents.errors import ConfigError

from .args import check_api_key, model_name


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("metagpt", help="MetaGPT integration utilities",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="metagpt_command", metavar="ACTION", parser_class=type(p))
    c = sub.add_parser("config", help="write/patch <root>/config/config2.yaml")
    c.add_argument("--base-url", required=True, help="OpenAI-compatible base URL (…/v1)")
    c.add_argument("--root", default=".topas/metagpt", help="MetaGPT project root (default .topas/metagpt)")
    c.add_argument("--model", type=model_name, default=None, help="model name (default: keep, else topas-sim)")
    c.add_argument("--api-key", default=None, help="API key (default: keep, else a local placeholder)")
    where = c.add_mutually_exclusive_group()
    where.add_argument("--home", action="store_true",
                       help="patch ~/.metagpt/config2.yaml instead (it overrides every project config)")
    where.add_argument("--force", action="store_true",
                       help="write the project config even though ~/.metagpt/config2.yaml overrides its llm")
    c.set_defaults(run=run)
    p.set_defaults(run=lambda args: (p.print_help(), 2)[1])


def _shown(llm: dict[str, Any]) -> dict[str, Any]:
    llm = dict(llm)
    if llm.get("api_key"):
        llm["api_key"] = str(llm["api_key"])[:3] + "***"  # never echo a key
    return llm


def run(args: argparse.Namespace) -> int:
    from ..integrations.metagpt.config_file import (
        DEFAULT_API_KEY,
        config_path,
        home_config_path,
        home_overrides,
        read_config_file,
        write_config_file,
    )

    if args.api_key is not None:
        check_api_key(args.api_key)  # MetaGPT's openai client would fail on it at its first call
    home = home_config_path()
    if args.home:
        before = read_config_file(home).get("llm") if home.exists() else None
        kept = before.get("api_key") if isinstance(before, dict) else None
        path = write_config_file(home, args.base_url, model=args.model, api_key=args.api_key)
        llm = read_config_file(path)["llm"]
        out = {"config": str(path), "llm": _shown(llm), "effective": True}
        print(json.dumps(out, indent=2))
        if args.api_key is None and kept and kept != DEFAULT_API_KEY:  # the user's own provider key, most likely
            print(f"warning: {path} keeps its api_key ({_shown(llm)['api_key']}), and MetaGPT now sends it to "
                  f"{args.base_url} with every call; give --api-key (the Topas server's key, or any text for "
                  "a server without one) to replace it", file=sys.stderr)
        return 0
    shadow = home_overrides(home=home)
    if shadow and not args.force:
        other = shadow["llm"].get("base_url") if isinstance(shadow["llm"], dict) else None
        raise ConfigError(f"{home} has an 'llm' section (base_url {other!r}); MetaGPT reads it after "
                          f"{config_path(args.root)} and it replaces the whole llm section, so "
                          "--base-url would not take effect: remove that section, or use --home to patch it, "
                          "or --force to write the project config anyway")
    path = write_config_file(config_path(args.root), args.base_url, model=args.model, api_key=args.api_key)
    out = {"config": str(path), "llm": _shown(read_config_file(path)["llm"]), "effective": not shadow,
           "needs": f"METAGPT_PROJECT_ROOT={Path(args.root).resolve()}"}
    if shadow:
        out["overridden_by"] = str(home)
    print(json.dumps(out, indent=2))
    return 0
