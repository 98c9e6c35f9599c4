"""Real-engine benchmark: replay a workload's arrivals as labelled calls, measure task JCT.

    run_from_args(args) -> int     (wired by the CLI: `topas bench --server URL` /
                                    `--engine sglang --model-path DIR`)

Tasks are sampled from a workflow (`sample_task`: rounds, input and output sizes) with
Poisson arrivals at `--rate` tasks/s; `--scale` shrinks prefixes, inputs and outputs together
so the residency trade-off survives on a tiny model and a small KV pool (`--kv-tokens`,
shrink it by the same factor). Each call sends exact output lengths (`max_tokens` plus
`min_tokens`, or `ignore_eos` with `--ignore-eos`). JCT is measured at the client, from a
task's arrival to its last answer.

`--server URL`: one run against that endpoint (whatever policy it schedules with; give that
policy as the only `--policies` entry to compare it with the simulator).
`--engine sglang --model-path DIR`: for each of `--policies`, a fresh SGLang server through
the product launcher (`topas serve --engine sglang`), with `--engine-arg` passed to SGLang
(e.g. `--engine-arg=--device --engine-arg=cpu` plus, on CPU, the environment described in
docs/sglang.md), and the plugin's decision log counted for decisions, preemptions and errors.
`--sim` replays the same trace in the simulator on a profile calibrated on the (first) server
and writes the fidelity of its JCTs against the real ones (`realbench/fidelity.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import random
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..costmodel import Profile, load_profile
from ..errors import ConfigError
from ..workflow import TaskPlan, Workflow, load_workflow, parse_workflow
from .client import (
    Call,
    CallFailed,
    TaskResult,
    agent_prompt,
    first_model_id,
    register_workload,
    run_tasks,
    words,
)
from .engine import LaunchedServer, scaled_workflow, start_sglang

WORDS_PER_TOKEN = 1.0  # prompt words per target token without a tokenizer (a word is >= 1 token)


@dataclass(frozen=True, slots=True)
class PolicyResult:
    mean_jct: float
    p99_jct: float
    tasks: int
    tasks_completed: int
    decisions: int | None  # None: the server's decision log is not ours to read
    preemptions: int | None
    plugin_errors: int | None
    failures: tuple[Failure, ...] = ()  # why each failed task failed (task order)


class Failure(NamedTuple):
    """A failed task: its failing call (`task/stage#round`; None when no call answered) and why."""

    call: str | None
    reason: str


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options `run_from_args` reads (for the CLI that wires it)."""
    p.add_argument("--server", default=None, metavar="URL", help="OpenAI base URL (…/v1) to benchmark")
    p.add_argument("--engine", choices=("sglang",), default=None, help="start a fresh server per policy")
    p.add_argument("--model-path", default=None, metavar="DIR", help="--engine sglang: model directory")
    p.add_argument("--engine-arg", action="append", default=[], metavar="ARG", help="extra SGLang argument")
    p.add_argument("--policies", default="lpm,topas", help="comma list (with --engine)")
    p.add_argument("--workload", default="chain3", help="workflow name or YAML path")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--rate", type=float, default=0.5, help="task arrivals per second (Poisson)")
    p.add_argument("--scale", type=float, default=0.05, help="prefix/input/output size factor (0 < s <= 1)")
    p.add_argument("--kv-tokens", type=int, default=4096, help="--engine sglang: --max-total-tokens")
    p.add_argument("--ignore-eos", action="store_true", help="fix lengths with ignore_eos, not min_tokens")
    p.add_argument("--model", default=None, help="model id (default: the server's first /v1/models entry)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900.0, help="per-policy run limit (s)")
    p.add_argument("--words-per-token", type=float, default=None,
                   help="prompt words per token (default: measured with --model-path's tokenizer, else 1)")
    p.add_argument("--sim", action="store_true", help="also simulate the same trace per policy")
    p.add_argument("--profile", default=None, help="--sim profile (default: calibrated on the first server)")
    p.add_argument("--json", default=None, metavar="OUT.json",
                   help="write {'real': {policy: {...}}, 'sim', 'profile', 'fidelity', 'calibration'} here")
    p.add_argument("--api-key", default=None, metavar="KEY", help="--server's API key (default: $TOPAS_API_KEY)")


def build_calls(task: TaskPlan, words_per_token: float, ignore_eos: bool,
                label_prefix: str = "") -> dict[str, list[Call]]:
    """The task's calls: prompts sized from its (already scaled) plan, exact output lengths.
    `label_prefix` goes before the task id the server sees (the prompts, the results and the
    --sim replay keep the plan's id)."""
    from ..labels import Label

    wf, rng = task.workflow, random.Random(task.task_id)
    n_words = lambda tokens: max(1, round(tokens * words_per_token))  # noqa: E731
    plan: dict[str, list[Call]] = {}
    for name in wf.topo_order:
        agent = wf.stage(name).agent
        system = agent_prompt(wf.name, agent, n_words(wf.prefix_tokens(agent)))
        label = Label(label_prefix + task.task_id, name, agent, wf.name, None)  # prefix size: the registered workflow
        plan[name] = [Call(task.task_id, name, agent, i, system,
                           f"{task.task_id}/{name}#{i}: " + words(n_words(r.input_tokens), rng), label,
                           r.output_tokens, ignore_eos)
                      for i, r in enumerate(task.rounds[name])]
    return plan


def sample_tasks(wf: Workflow, n: int, rate: float, seed: int) -> list[TaskPlan]:
    """The simulator's own trace generator: the real run and `--sim` replay the same tasks."""
    from ..sim.driver import make_trace

    return list(make_trace(wf, n, rate, seed))


def tokens_per_word_ratio(model_path: str | None, given: float | None) -> float:
    if given is not None:
        return given
    if not model_path:
        return WORDS_PER_TOKEN
    from transformers import AutoTokenizer

    text = words(400, random.Random(0))
    return 400 / max(1, len(AutoTokenizer.from_pretrained(model_path)(text)["input_ids"]))


def summarize(results: Sequence[TaskResult | BaseException], n: int, log: dict[str, int] | None) -> PolicyResult:
    from ..bench.aggregate import percentile

    jcts = [r.jct_s for r in results if isinstance(r, TaskResult)]
    mean = sum(jcts) / len(jcts) if jcts else math.nan
    failures = tuple(Failure(r.call, r.reason) if isinstance(r, CallFailed) else Failure(None, f"{type(r).__name__}: {r}"[:500])
                     for r in results if isinstance(r, BaseException))
    return PolicyResult(mean, percentile(jcts, 99), n, len(jcts),
                        *((log["decisions"], log["preemptions"], log["errors"]) if log else (None, None, None)),
                        failures)


def report_failures(name: str, result: PolicyResult, shown: int = 3) -> None:
    """Why tasks failed, on stderr: the distinct reasons (the first `shown`), with their counts.
    A run that exits 1 must say why (it printed only '0/3 tasks')."""
    by_reason: dict[str, list[str | None]] = {}
    for failure in result.failures:
        by_reason.setdefault(failure.reason, []).append(failure.call)
    for reason, calls in list(by_reason.items())[:shown]:
        where = f" (first: {calls[0]})" if calls[0] is not None else ""
        print(f"{name}: {len(calls)} task(s) failed{where}: {reason}", file=sys.stderr)
    if len(by_reason) > shown:
        print(f"{name}: {len(by_reason) - shown} more distinct failure(s) (--json lists every one)", file=sys.stderr)


def run_once(base_url: str, model: str, args: argparse.Namespace, tasks: list[TaskPlan],
             wpt: float, api_key: str | None = None, label_prefix: str = "") -> list[TaskResult | BaseException]:
    wf = tasks[0].workflow
    plans = [build_calls(t, wpt, args.ignore_eos, label_prefix) for t in tasks]
    return asyncio.run(run_tasks(base_url, model, wf, plans, [t.arrival_s for t in tasks],
                                 timeout_s=args.timeout, return_exceptions=True, api_key=api_key))


def run_from_args(args: argparse.Namespace) -> int:
    """Run the benchmark; prints one line per policy, writes --json; 0 if every task completed."""
    if (args.server is None) == (args.engine is None):
        raise ConfigError("realbench: give exactly one of --server URL or --engine sglang --model-path DIR")
    if not 0 < args.scale <= 1 or args.tasks < 1 or args.rate <= 0:
        raise ConfigError("realbench: need 0 < --scale <= 1, --tasks >= 1, --rate > 0")
    if args.engine and not args.model_path:
        raise ConfigError("realbench: --engine sglang needs --model-path DIR")
    from ..cli.args import check_output

    check_output("--json", args.json)
    if args.engine:
        from ..server.sglang.config import require_sglang

        require_sglang()  # before any trace is built or server started (ConfigError: exit 2)
    definition = scaled_workflow(load_workflow(args.workload), args.scale)
    wf = parse_workflow(definition)
    tasks = sample_tasks(wf, args.tasks, args.rate, args.seed)
    wpt = tokens_per_word_ratio(args.model_path, args.words_per_token)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    profile: Profile | None = load_profile(args.profile) if args.profile else None
    measured: dict[str, Any] = {}  # calibration points, when this run calibrated
    out: dict[str, PolicyResult] = {}
    real_jcts: dict[str, dict[str, float]] = {}  # policy -> task id -> client JCT
    if args.server:
        url = args.server.rstrip("/")
        key = getattr(args, "api_key", None)
        first = first_model_id(url, key)  # reachable, and takes the key, before anything else runs
        if (note := register_workload(url, definition, key)) is not None:
            print(f"note: {note}", file=sys.stderr)
        profile = profile or (_calibrate(url, first, args.kv_tokens, measured, key) if args.sim else None)
        # a server of its own that outlives the run: this run's tasks get ids of their own (the
        # same ids again reopened the last run's tasks, their JCT the gap between the runs)
        results = run_once(url, args.model or first, args, tasks, wpt, key, label_prefix=f"{uuid.uuid4().hex[:8]}-")
        out["server"] = summarize(results, args.tasks, None)
        # the endpoint schedules with whatever policy it runs: name it with a single --policies
        real_jcts[policies[0] if len(policies) == 1 else "server"] = _jcts(results)
    for policy in policies if args.engine else ():
        server: LaunchedServer = start_sglang(policy, args.model_path, wf, args.kv_tokens, args.engine_arg, 1.0)
        try:
            served: str | None = None  # the server's first model id, asked once per server
            if args.sim and profile is None:
                served = first_model_id(server.base_url)
                profile = _calibrate(server.base_url, served, args.kv_tokens, measured)
            model = args.model or served or first_model_id(server.base_url)
            results = run_once(server.base_url, model, args, tasks, wpt)
        finally:
            server.stop()
        out[policy] = summarize(results, args.tasks, server.log_counts())
        real_jcts[policy] = _jcts(results)
    doc: dict[str, Any] = {"real": {k: _as_dict(v) for k, v in out.items()}}
    for name, r in out.items():
        print(summary_line(name, r))
        report_failures(name, r)
    if args.sim and profile is not None:
        doc.update(_sim_and_fidelity(tasks, policies, profile, args.kv_tokens, real_jcts))
        if measured:
            doc["calibration"] = measured
    if args.json:
        from ..cli.args import write_json

        write_json(args.json, doc)
    return 0 if all(r.tasks_completed == r.tasks for r in out.values()) else 1


def _jcts(results: Sequence[TaskResult | BaseException]) -> dict[str, float]:
    return {r.task_id: r.jct_s for r in results if isinstance(r, TaskResult)}


def _sim_and_fidelity(tasks: list[TaskPlan], policies: Sequence[str], profile: Profile, kv_tokens: int,
                      real_jcts: dict[str, dict[str, float]]) -> dict[str, Any]:
    """`sim`, `profile` and `fidelity` of the JSON: the same trace simulated per policy, with
    and without the measured per-call overhead, against the real per-task JCTs."""
    from .fidelity import fidelity

    runs = simulate_tasks(tasks, policies, profile, kv_tokens)
    model_only = simulate_tasks(tasks, policies, dataclasses.replace(profile, call_overhead_s=0.0), kv_tokens)
    sim = {p: {"mean_jct": r.mean_jct, "p99_jct": r.p99_jct} for p, r in runs.items()}
    per_task = lambda rs: {p: {t.task_id: t.jct_s for t in r.tasks} for p, r in rs.items()}  # noqa: E731
    fid = fidelity(real_jcts, per_task(runs), per_task(model_only))
    for name, r in sim.items():
        print(f"{name:>8}: simulated mean JCT {r['mean_jct']:.3f} s, p99 {r['p99_jct']:.3f} s")
    for name, e in fid["policies"].items():
        te = e["task_rel_error"]
        print(f"{name:>8}: sim/real mean JCT error {e['mean_jct_rel_error']:+.1%}"
              f" (without call overhead {e.get('rel_error_without_call_overhead', float('nan')):+.1%});"
              f" per-task error p10/p50/p90 {te.get('p10', float('nan')):+.1%} / {te.get('p50', float('nan')):+.1%}"
              f" / {te.get('p90', float('nan')):+.1%}")
    if not fid["policies"]:
        print(f"nothing compared: no simulated policy ({', '.join(sim)}) is the real run ({', '.join(real_jcts)}); "
              "with --server give the policy the server runs as the only --policies", file=sys.stderr)
    else:
        print(f"ranking real {fid['ranking']['real']} sim {fid['ranking']['sim']}; "
              f"10% goal met: {fid['goal']['met']}")
    return {"sim": sim, "profile": dataclasses.asdict(profile), "fidelity": fid}


def _calibrate(url: str, model: str, kv_tokens: int, measured: dict[str, Any], api_key: str | None = None) -> Profile:
    """Measure the server's `model` (topas calibrate) for the simulator's profile; the points go
    in `measured` ((x, seconds) lists: prefill by prompt tokens, decode step by batch, calls)."""
    from ..cli.calibrate import _kv_budget, fit_profile, measure

    budget = _kv_budget(url, kv_tokens, api_key) or kv_tokens
    m = asyncio.run(measure(url, model, budget, api_key))
    measured.update(prefill=m.prefill, decode=m.decode, calls=[b._asdict() for b in m.calls])
    profile = fit_profile(load_profile(), "calibrated", model, budget, m.prefill, m.decode, m.calls)
    print(f"calibrated: tm_s {profile.tm_s:.5f}, tc_s_per_token {profile.tc_s_per_token:.3e}, "
          f"call_overhead_s {profile.call_overhead_s:.4f} (minimal calls, s: "
          + ", ".join(f"{b.wall_s:.3f}" + (f"/{b.calls}" if b.calls > 1 else "") for b in m.calls)
          + "; decode step by batch: " + ", ".join(f"{b}: {t:.4f}" for b, t in m.decode) + " s)")
    return profile


def simulate_tasks(tasks: list[TaskPlan], policies: Sequence[str], profile: Profile,
                   kv_tokens: int) -> dict[str, Any]:
    """The same trace in the simulator, per policy, on the real pool size (no host tier):
    policy -> `RunResult`."""
    from ..policies import make_policy
    from ..sim.driver import simulate

    return {p: simulate(tasks, make_policy(p), profile, kv_budget=kv_tokens, host_tier=False) for p in policies}


def simulate_policies(tasks: list[TaskPlan], policies: Sequence[str], profile: Profile,
                      kv_tokens: int) -> dict[str, dict[str, float]]:
    """Mean and p99 JCT of `simulate_tasks`."""
    return {p: {"mean_jct": r.mean_jct, "p99_jct": r.p99_jct}
            for p, r in simulate_tasks(tasks, policies, profile, kv_tokens).items()}


def _as_dict(r: PolicyResult) -> dict[str, Any]:
    doc = {f: getattr(r, f) for f in PolicyResult.__slots__}
    doc["failures"] = [f._asdict() for f in r.failures]
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m topas_agents.realbench.runner ...`: the real-engine bench that `topas bench
    --server URL` / `--engine sglang` runs (the same options)."""
    from ..cli.args import client_api_key

    p = argparse.ArgumentParser(prog="realbench", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    args.api_key = client_api_key(args) if args.server else None  # the environment read here, at the edge
    return run_from_args(args)


if __name__ == "__main__":
    from ..cli.args import run_module

    run_module(main)


def summary_line(name: str, r: PolicyResult) -> str:
    """One policy's printed result. Counts the server does not report (a `topas serve`, another
    endpoint: None) are left out; they printed as "decisions None"."""
    counts = [f"{label} {n}" for label, n in (("decisions", r.decisions), ("preemptions", r.preemptions),
                                               ("plugin errors", r.plugin_errors)) if n is not None]
    return (f"{name:>8}: mean JCT {r.mean_jct:.3f} s, p99 {r.p99_jct:.3f} s, {r.tasks_completed}/{r.tasks} tasks"
            + "".join(f", {c}" for c in counts))
