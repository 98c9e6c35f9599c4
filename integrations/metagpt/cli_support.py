"""Helpers shared by `topas run` and `topas eval` (argument groups, output). No MetaGPT
import here: the commands call `prepare_metagpt` before importing the runner."""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid
from collections.abc import Iterator
from typing import Any

from topas_agents.cli.args import model_name, non_negative_int, positive_float, positive_int
from topas_agents.errors import ConfigError

# Simulated seconds per wall second on the embedded server. 50: a SOP task (~200 simulated s
# of LLM work on the default profile) takes ~4 wall s, while MetaGPT's own processing between
# calls (~0.08 wall s per task, also scaled) stays ~2% of the JCT. Measured with `topas run sop
# --prompt "Create a snake game." --json F` (client_gaps_s vs jct_s): scale 10 -> 0.9 of ~200 s,
# 50 -> 3.9, 200 -> 15 (7%), 400 -> 31 (11%). Larger scales inflate the client's share; smaller
# ones only cost wall time. Tests use 400 where only labels and counts matter.
DEFAULT_TIME_SCALE = 50.0


def add_common(p: argparse.ArgumentParser) -> None:
    """Server, MetaGPT and output options shared by `topas run` and `topas eval`."""
    p.add_argument("--server", metavar="URL", default=None,
                   help="an OpenAI-compatible base URL (…/v1); default: an embedded simulator in-process")
    p.add_argument("--time-scale", type=positive_float, default=DEFAULT_TIME_SCALE,
                   help=f"embedded server: simulated seconds per wall second (default {DEFAULT_TIME_SCALE:g}: a SOP "
                   "task of ~200 simulated s takes ~4 wall s, and MetaGPT's own time between calls, scaled too, "
                   "stays ~2%% of JCT). With --server the server's own clock applies (`topas serve` defaults to "
                   "1, real time: ~75 wall s per SOP task; start it with --time-scale 50 for quick runs)")
    p.add_argument("--profile", default=None, help="embedded server: cost profile name or YAML")
    p.add_argument("--kv-budget", type=positive_int, default=None, help="embedded server: KV budget (tokens)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed (arrivals, simulated output lengths)")
    p.add_argument("--root", default=".topas/metagpt",
                   help="MetaGPT root: config, logs and the generated repos, workspace/<project>/ (default "
                   ".topas/metagpt)")
    p.add_argument("--model", type=model_name, default=None, help="model name sent to the server (default topas-sim)")
    p.add_argument("--no-restructure", action="store_true",
                   help="keep MetaGPT's stock prompt layout (static text after the context)")
    p.add_argument("--max-tokens", type=non_negative_int, default=None, metavar="N",
                   help="max_tokens sent per call; 0: omit (default: omitted on the embedded server, which "
                   "then samples output lengths from the workflow; MetaGPT's 4096 with --server)")
    p.add_argument("--parse-retries", type=positive_int, default=None, metavar="N",
                   help="MetaGPT retries of unparsable replies (default: MetaGPT's 6, with waits)")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.add_argument("--verbose", action="store_true", help="show MetaGPT's log (INFO) on stderr")
    p.add_argument("--task-id-prefix", metavar="P", default=None, type=_prefix_text,
                   help="task ids are P-<id> (default with --server, and always for `topas run`: <workflow>-<random "
                   "hex>, unique per run, so a repeated run against one server never reuses a finished task's id, "
                   "which the server refuses with 409)")


def _prefix_text(text: str) -> str:
    """`--task-id-prefix` checked as it is parsed (it was checked after MetaGPT loaded)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


# What only the embedded server reads: with --server, the server runs its own policy, clock,
# profile and budget, so these were silently ignored (README: a flag the mode would ignore is
# an error).
EMBEDDED_ONLY = ("--policy", "--policies", "--time-scale", "--profile", "--kv-budget")


def check_server_flags(args: argparse.Namespace) -> None:
    """ConfigError for an embedded-server flag given with --server."""
    given = getattr(args, "given", None) or frozenset()
    flag = next((f for f in EMBEDDED_ONLY if f in given), None)
    if args.server and flag is not None:
        raise ConfigError(f"{flag} applies to the embedded server only: with --server, the server runs its own "
                          "policy, clock and KV budget")


def task_id_prefix(given: str | None, workflow: str) -> str:
    """`--task-id-prefix`, or a fresh `<workflow>-<hex>`. A server closes a task for good once
    it is done (a later call for it gets 409), so each run against one server needs new ids."""
    if given is not None:
        if not given.strip():
            raise ConfigError("--task-id-prefix must not be empty")
        return given
    return f"{workflow}-{uuid.uuid4().hex[:8]}"


def max_tokens_options(max_tokens: int | None, external: bool) -> dict[str, Any]:
    """`--max-tokens` -> RunOptions fields (send_max_tokens, max_tokens)."""
    if max_tokens is None:
        return {"send_max_tokens": external}
    if max_tokens < 0:
        raise ConfigError(f"--max-tokens must be >= 0, got {max_tokens}")
    return {"send_max_tokens": False} if max_tokens == 0 else {"send_max_tokens": True, "max_tokens": max_tokens}


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """MetaGPT prints (e.g. 'no mermaid') to stdout; keep stdout for our JSON."""
    with contextlib.redirect_stdout(sys.stderr):
        yield
