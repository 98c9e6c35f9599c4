"""`topas` command line. Each subcommand lives in its own module with
`add_parser(subparsers)` and `run(args) -> int`; this file only dispatches.

Every user error (bad YAML, bad argument, unknown name) prints one line on stderr and
exits 2; no tracebacks for user errors.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ..errors import TopasError
from .args import given_options

# subcommand -> module (imported lazily so `topas bench` never imports the server stack)
SUBCOMMANDS = {
    "bench": "topas_agents.cli.bench",
    "serve": "topas_agents.cli.serve",
    "run": "topas_agents.cli.run",
    "eval": "topas_agents.cli.eval",
    "metagpt": "topas_agents.cli.metagpt",
    "docs": "topas_agents.cli.docs",
    "calibrate": "topas_agents.cli.calibrate",
}


class UsageError(TopasError):
    pass


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (exit 2) instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser(only: str | None = None) -> Parser:
    parser = Parser(prog="topas", description="Task-oriented prefix-aware scheduling for agent workflows")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, module in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:  # subcommand not built yet
                continue
            raise
        mod.add_parser(sub)
    return parser


# Optional dependencies -> the extra that installs them (pyproject.toml): a command that needs
# one the install lacks says which extra to add instead of printing a traceback.
EXTRA_FOR_MODULE = {
    "numpy": "bench", "tqdm": "bench", "matplotlib": "bench",
    "fastapi": "server", "uvicorn": "server", "starlette": "server",
    "metagpt": "metagpt", "sglang": "sglang", "transformers": "sglang",
}


def missing_extra_message(exc: ModuleNotFoundError) -> str | None:
    """A one-line install hint when `exc` is an optional dependency, else None."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_FOR_MODULE.get(top)
    if extra is None:
        return None
    return f"this command needs '{top}', which this install lacks: pip install 'topas-agents[{extra}]'"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        args = build_parser(only).parse_args(argv)
        if not getattr(args, "command", None):
            build_parser().print_help()
            return 2
        args.given = given_options(build_parser(only), argv)  # which flags were set, not defaulted
        return int(args.run(args) or 0)
    except TopasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        hint = missing_extra_message(exc)
        if hint is None:
            raise
        print(f"error: {hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
