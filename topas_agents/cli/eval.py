"""`topas eval softwaredev`: SoftwareDev prompts as Poisson arrivals, per scheduling policy.

    topas eval softwaredev --workflow sop --rate 0.02 --policies fcfs,lpm,topas --limit 4
    topas eval softwaredev --workflow tl --rate 0.05 --server http://gpu-box:8000/v1
    topas eval softwaredev --rate 0.05 --limit 4 --json eval.json --plot plots/

Each policy gets a fresh embedded simulator (echo responder; --rate in tasks per simulated
second) and the same arrival times; with --server the one external server is measured
(its policy is whatever it runs; --rate in tasks per second of its clock: simulated seconds on
a simulated server, wall seconds on a real engine). Prints a mean/p99 JCT
table (failed tasks are counted and excluded from JCT) and writes --json (with every task's
JCT per policy, `jcts_s`); --plot DIR draws DIR/jct_cdf.png (per-task JCT CDF, one line per
policy) and DIR/jct_summary.png (mean and p99 JCT per policy). Exit status 1 if any task
failed. With --server, an unreachable server is a one-line error at once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ..errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ..bench.options import parse_policy_list
    from ..bench.protocol import LIMITS
    from ..integrations.metagpt.cli_support import add_common
    from .args import int_between, positive_float, positive_int

    def policies(text: str) -> tuple[str, ...]:
        try:
            return parse_policy_list(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("--policies: ")) from None

    p = subparsers.add_parser("eval", help="evaluate policies on SoftwareDev with MetaGPT",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", choices=("softwaredev",))
    p.add_argument("--workflow", choices=("sop", "tl"), default="sop")
    p.add_argument("--rate", type=positive_float, required=True, help="arrival rate (tasks/s; see above)")
    p.add_argument("--policies", type=policies, default=("fcfs", "lpm", "topas"),
                   help="comma-separated policies for the embedded server (default fcfs,lpm,topas)")
    p.add_argument("--limit", type=positive_int, default=None, help="use the first N prompts")
    p.add_argument("--tasks", type=int_between(*LIMITS.tasks, " (bench.protocol.Limits)"), default=None,
                   help="number of tasks (default: one per prompt; prompts are cycled)")
    p.add_argument("--trace-dir", metavar="DIR", help="write one trace per policy (DIR/<policy>.jsonl)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="write DIR/jct_cdf.png (per-task JCT CDF per policy) and DIR/jct_summary.png")
    p.add_argument("--api-key", default=None, metavar="KEY", help="--server's API key (default: $TOPAS_API_KEY)")
    add_common(p)
    p.set_defaults(run=run)


def _task_id_prefix(args: argparse.Namespace) -> str | None:
    """With --server, fresh ids per run (a second evaluation against one server reused the
    dataset ids: every call a 409); the embedded servers are fresh per policy: dataset ids."""
    from ..integrations.metagpt.cli_support import task_id_prefix

    if args.server is None and args.task_id_prefix is None:
        return None
    return task_id_prefix(args.task_id_prefix, args.workflow)


def run(args: argparse.Namespace) -> int:
    from ..integrations.metagpt.cli_support import check_server_flags, stdout_to_stderr
    from .args import client_api_key

    check_server_flags(args)
    api_key = client_api_key(args) if args.server else None  # before MetaGPT loads (seconds)
    from ..integrations.metagpt.environment import prepare_metagpt
    from ..integrations.metagpt.softwaredev import load_softwaredev
    from .args import check_output, write_json

    if args.plot:
        import matplotlib  # noqa: F401  (a missing [bench] extra fails now, not after the whole evaluation)
    check_output("--json", args.json)  # every output before the evaluation, not after it
    check_output("--plot", args.plot, "dir")
    check_output("--trace-dir", args.trace_dir, "dir")
    prompts = load_softwaredev(args.limit)
    prepare_metagpt(args.root, log_level="INFO" if args.verbose else "ERROR")
    from ..integrations.metagpt.evaluation import EvalConfig, evaluate, format_table

    config = EvalConfig(workflow=args.workflow, rate=args.rate, policies=tuple(args.policies),
                        tasks=args.tasks or len(prompts), server=args.server, time_scale=args.time_scale,
                        profile=args.profile, kv_budget=args.kv_budget, seed=args.seed, root=Path(args.root),
                        restructure=not args.no_restructure,
                        parse_retries=args.parse_retries if args.parse_retries is not None else 2,
                        model=args.model, max_tokens=args.max_tokens,
                        api_key=api_key, task_id_prefix=_task_id_prefix(args))
    show = not args.no_progress and sys.stderr.isatty()
    with stdout_to_stderr():
        doc = asyncio.run(evaluate(config, prompts, progress=show,
                                   trace_dir=Path(args.trace_dir) if args.trace_dir else None))
    print(format_table(doc))
    if args.json:
        write_json(args.json, doc)
    if args.plot:
        from ..integrations.metagpt.evaluation import plot_eval

        for path in plot_eval(doc, args.plot):
            print(f"plot: {path}", file=sys.stderr)
    failed = [(policy, r) for policy, e in doc["policies"].items() for r in e["results"] if not r["success"]]
    for policy, r in failed:  # each with its error, as `topas run` says them (the JSON has them too)
        print(f"FAILED {policy} {r['task_id']}: {r['error']}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} task(s) failed", file=sys.stderr)
    return 1 if failed else 0  # a failed task is a failed evaluation (like `topas run`)
