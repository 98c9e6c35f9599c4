"""`topas run sop|tl`: run MetaGPT software-company tasks, every call labelled.

    topas run sop --prompt "Create a snake game."
    topas run tl --dataset softwaredev --limit 3 --json out.json --trace run.jsonl
    topas run sop --prompt "..." --server http://127.0.0.1:8000/v1

sop: ProductManager -> Architect -> ProjectManager -> Engineer (-> QaEngineer with --qa).
tl:  TeamLeader star TL,PM,TL,Architect,TL,ProjectManager,TL,Engineer,TL.
Without --server an embedded simulator (echo responder) serves the calls in-process and
JCT is reported in simulated seconds (as with a --server that runs the simulated engine).
Tasks given together start together. Prints one JSON document (per task: id, stages in
order, calls per stage, JCT, success, artifacts); exit status 1 if any task failed.

Artifacts: each task's generated repository is <root>/workspace/<project>/ (the project name
is unique per task). On the simulated engine its files are templates from the echo
responder, not real code: the JSON says so next to the path (`artifacts_note`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..errors import ConfigError
from .args import client_api_key


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ..integrations.metagpt.cli_support import add_common
    from .args import positive_int

    p = subparsers.add_parser("run", help="run MetaGPT workflows (SOP or TeamLeader) with Topas labels",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workflow", choices=("sop", "tl"), help="sop: MetaGPT's SOP chain; tl: TeamLeader star")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one task with this requirement")
    src.add_argument("--dataset", choices=("softwaredev",), help="tasks from a dataset")
    p.add_argument("--limit", type=positive_int, default=None, help="first N dataset prompts")
    p.add_argument("--policy", default="topas", help="embedded server's scheduling policy (default topas)")
    p.add_argument("--qa", action="store_true",
                   help="SOP: hire the QaEngineer; the code it runs is confined to a bubblewrap sandbox (no pip, "
                   "no network; writes only to the task's <root>/workspace/<project>/), removed after the task")
    p.add_argument("--no-code-review", action="store_true", help="Engineer without WriteCodeReview")
    p.add_argument("--trace", metavar="OUT.jsonl", help="record every call as a trace (topas bench --trace)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="--server's API key (default: $TOPAS_API_KEY)")
    add_common(p)
    p.set_defaults(run=run)


def _specs(args: argparse.Namespace) -> list[Any]:
    from ..integrations.metagpt.cli_support import task_id_prefix
    from ..integrations.metagpt.runner import TaskSpec
    from ..integrations.metagpt.softwaredev import load_softwaredev

    prefix = task_id_prefix(args.task_id_prefix, args.workflow)
    if args.prompt is not None:
        if not args.prompt.strip():
            raise ConfigError("--prompt must not be empty")
        if args.limit is not None:
            raise ConfigError("--limit applies to --dataset only")
        return [TaskSpec(f"{prefix}-0", args.prompt)]
    return [TaskSpec(f"{prefix}-{p.task_id}", p.prompt, p.name) for p in load_softwaredev(args.limit)]


def _options(args: argparse.Namespace, url: str, key: str | None) -> Any:
    from ..integrations.metagpt.cli_support import max_tokens_options
    from ..integrations.metagpt.runner import RunOptions

    extra: dict[str, Any] = {"model": args.model} if args.model else {}
    extra.update(max_tokens_options(args.max_tokens, external=args.server is not None))
    if key:
        extra["api_key"] = key
    return RunOptions(base_url=url, workflow=args.workflow, root=args.root, restructure=not args.no_restructure,
                      code_review=not args.no_code_review, qa=args.qa, parse_retries=args.parse_retries, **extra)


async def _run(args: argparse.Namespace, url: str) -> tuple[list[Any], Any, Any]:
    """(results, recorder, the server's ServerInfo)."""
    from ..integrations.metagpt.recorder import CallRecorder, scaled_clock
    from ..integrations.metagpt.runner import attach_server_view, label_workflow, run_tasks
    from ..integrations.metagpt.server_api import fetch_stats, probe_server, register_workflow, server_info

    key = client_api_key(args) if args.server else None
    options = _options(args, url, key)
    if args.server:  # a dead server: one line in seconds, not minutes of retries; the key the
        # user gave (options.api_key is MetaGPT's placeholder when none was), for the message
        probe_server(url, key)
    info = server_info(url, options.api_key)  # a simulated engine reports JCT in its own (scaled) clock
    register_workflow(url, label_workflow(options.workflow, options.qa), options.api_key)
    recorder = CallRecorder(scaled_clock(info.clock_scale))
    results = await run_tasks(_specs(args), options, recorder)
    return attach_server_view(results, fetch_stats(url, api_key=options.api_key)), recorder, info


def run(args: argparse.Namespace) -> int:
    from ..integrations.metagpt.cli_support import check_server_flags, stdout_to_stderr
    from ..integrations.metagpt.environment import prepare_metagpt
    from .args import check_output, write_json

    check_server_flags(args)
    if args.qa and args.workflow != "sop":
        raise ConfigError("--qa applies to `topas run sop` only")
    if args.qa:  # before MetaGPT loads and the server starts, not after
        from ..integrations.metagpt.sandbox import require_sandbox

        require_sandbox()
    check_output("--json", args.json)  # before the tasks run, not after
    check_output("--trace", args.trace)
    if args.server:
        client_api_key(args)  # a key no header can carry: say so before MetaGPT loads
    prepare_metagpt(args.root, log_level="INFO" if args.verbose else "ERROR")
    from ..integrations.metagpt.recorder import save_trace
    from ..integrations.metagpt.server_api import embedded_server

    with stdout_to_stderr():
        if args.server:
            results, recorder, info = asyncio.run(_run(args, args.server))
        else:
            with embedded_server(policy=args.policy, time_scale=args.time_scale, profile=args.profile,
                                 kv_budget=args.kv_budget, seed=args.seed) as handle:
                results, recorder, info = asyncio.run(_run(args, handle.url))
    doc = {"workflow": results[0].workflow if results else None,
           "server": args.server or f"embedded (policy {args.policy}, time scale {args.time_scale:g})",
           "jct_unit": info.jct_unit,
           "tasks": [_task_json(r, info.artifacts_note) for r in results]}
    print(json.dumps(doc, indent=2))
    for r in results:
        note = f" ({info.artifacts_note})" if info.artifacts_note else ""
        print(f"artifacts of {r.task_id}: {r.artifacts}{note}", file=sys.stderr)
    if args.json:
        write_json(args.json, {**doc, "details": [r.to_json() for r in results]})
    if args.trace:
        n = save_trace(args.trace, recorder.records)
        print(f"trace: {n} calls -> {args.trace}", file=sys.stderr)
    failed = [r for r in results if not r.success]
    for r in failed:
        print(f"FAILED {r.task_id}: {r.error}", file=sys.stderr)
    return 1 if failed else 0


def _task_json(r: Any, artifacts_note: str | None) -> dict[str, Any]:
    out = {"task_id": r.task_id, "success": r.success, "error": r.error, "stages": list(r.stages),
           "calls_per_stage": r.calls_per_stage, "calls": r.calls, "jct_s": r.jct_s, "wall_s": r.wall_s,
           "artifacts": r.artifacts}
    if artifacts_note:  # said where the path is, so nobody mistakes the files for generated code
        out["artifacts_note"] = artifacts_note
    return out
