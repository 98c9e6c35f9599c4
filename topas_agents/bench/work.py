"""Per-call cost bounds shared by the oracle lower bound and the capacity estimate.

Two quantities, both priced with `Profile` methods only (the simulator prices the same
steps with the same methods, so a bound and simulated reality cannot drift apart):

* `call_latency_s`: the fastest one LLM call can finish: alone in the engine (batch 1),
  its agent prefix already resident, nothing to swap or recompute.
* `call_work_s`: the fewest GPU-seconds one call can cost. A step's time is shared by the
  requests in it; the call's share is smallest when the step is as full as the KV budget
  lets it be (`batch_cap`). What cannot be shared (its own KV read in decode, its own
  prefill attention) is charged in full.

Both are lower bounds for any schedule: batching, swaps, recomputation and preemption
only add latency and work.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..costmodel import Profile
from ..errors import ConfigError
from ..workflow import RoundPlan, StageSpec, TaskPlan, Workflow


def _mean_decode_context(prefix: int, input_tokens: int, output_tokens: int) -> float:
    """Mean KV a decode step of this call reads: steps run with 1..output-1 tokens already
    generated (the prefill's forward pass yields the first token, as in real engines), and
    the prefix is read per request."""
    return prefix + input_tokens + output_tokens / 2


def call_latency_s(profile: Profile, prefix: int, input_tokens: int, output_tokens: int) -> float:
    """Batch-1 latency of one call with its prefix resident: its prefill (which yields the
    first token) and `output - 1` decode steps. Decode cost is affine in context, so the
    steps sum exactly to `(output - 1)` steps at the mean context."""
    ctx = _mean_decode_context(prefix, input_tokens, output_tokens)
    decode = (output_tokens - 1) * profile.decode_step_s(1, ctx)
    return profile.prefill_s(input_tokens, prefix) + decode


def batch_cap(kv_budget: int, prefix: int, request_kv: int, min_request_kv: int) -> int:
    """The most requests a step holding this one can contain.

    Its prefix must be resident and its own KV (input + full decode reservation) reserved;
    every other running request reserves at least `min_request_kv` tokens. Returns 0 when
    the call cannot run at all under `kv_budget`.
    """
    room = kv_budget - prefix - request_kv
    if room < 0:
        return 0
    return 1 + room // max(1, min_request_kv)


def call_work_s(profile: Profile, kv_budget: int, prefix: int, input_tokens: int,
                output_tokens: int, min_request_kv: int, reserved_kv: int | None = None) -> float:
    """Least GPU-seconds one call can cost, whatever it is batched with.

    Prefill: a step of N new tokens costs at least its per-token share of the fullest
    possible step (N <= kv_budget), plus this call's own attention over its prefix.
    Decode (`output - 1` steps; the prefill yields the first token): a step of B requests
    costs `decode_step_s(B, 0)` shared B ways (B at most `batch_cap`), plus this call's own
    KV read (`decode_step_s` is affine in context), which no one else pays for.
    `reserved_kv` is the call's own reservation (default: input + output).
    """
    kv = input_tokens + output_tokens if reserved_kv is None else reserved_kv
    cap = batch_cap(kv_budget, prefix, kv, min_request_kv)
    if cap == 0:
        raise ConfigError(
            f"a call with prefix {prefix} + input {input_tokens} + output {output_tokens} tokens "
            f"does not fit the KV budget of {kv_budget} tokens"
        )
    full = max(kv_budget, input_tokens)
    fixed_share = profile.step_s(full, 0) * input_tokens / full
    attention = profile.prefill_s(input_tokens, prefix) - profile.step_s(input_tokens, 0)
    prefill = fixed_share + max(0.0, attention)
    ctx = _mean_decode_context(prefix, input_tokens, output_tokens)
    kv_read = profile.decode_step_s(1, ctx) - profile.decode_step_s(1, 0)
    decode = (output_tokens - 1) * (profile.decode_step_s(cap, 0) / cap + kv_read)
    return prefill + decode


def request_kv(stage: StageSpec, r: RoundPlan) -> int:
    """KV a call reserves beyond its prefix: its input plus its decode limit, which the
    driver sets to the stage's declared output upper bound (a client knows its limit, not
    the length it will get)."""
    return r.input_tokens + max(stage.output_tokens.hi, r.output_tokens)


def min_request_kv(tasks: Iterable[TaskPlan]) -> int:
    """The smallest KV reservation of any call in `tasks`."""
    return min(
        (request_kv(t.workflow.stage(s), r) for t in tasks for s, rs in t.rounds.items() for r in rs),
        default=1,
    )


def workflow_min_request_kv(wf: Workflow) -> int:
    """The smallest KV reservation any call of `wf` can have."""
    return min(s.input_tokens.lo + s.output_tokens.hi for s in wf.stages)


def stage_latency_s(profile: Profile, wf: Workflow, stage: str, rounds: tuple[RoundPlan, ...]) -> float:
    """Fastest a stage can finish once ready: its rounds at batch 1, separated by the
    stage's tool wait (a ReAct round's tool runs before the next round is sent), each round
    passing the front end first (`call_overhead_s`: the simulator charges it before the
    engine sees the call; the bound left it out, and a profile with an overhead showed JCTs
    twice its "lower bound")."""
    st = wf.stage(stage)
    prefix = wf.prefix_tokens(st.agent)
    llm = sum(call_latency_s(profile, prefix, r.input_tokens, r.output_tokens) for r in rounds)
    return llm + len(rounds) * profile.call_overhead_s + tool_wait_total_s(st.tool_wait_s, len(rounds))


def tool_wait_total_s(tool_wait_s: float, n_rounds: int) -> float:
    """Tool time a stage of `n_rounds` rounds spends: one wait between consecutive rounds,
    as the simulator's driver schedules them (the last round's answer ends the stage)."""
    return tool_wait_s * max(0, n_rounds - 1)


def critical_path_s(profile: Profile, task: TaskPlan) -> float:
    """Longest path through the task's DAG, each stage at its fastest (`stage_latency_s`)."""
    wf = task.workflow
    finish: dict[str, float] = {}
    for name in wf.topo_order:
        start = max((finish[d] for d in wf.stage(name).after), default=0.0)
        finish[name] = start + stage_latency_s(profile, wf, name, task.rounds[name])
    return max(finish.values(), default=0.0)


def task_work_s(profile: Profile, kv_budget: int, task: TaskPlan, min_kv: int) -> float:
    """Least GPU-seconds the whole task can cost (sum of `call_work_s` over its calls)."""
    wf = task.workflow
    total = 0.0
    for name, rounds in task.rounds.items():
        stage = wf.stage(name)
        prefix = wf.prefix_tokens(stage.agent)
        for r in rounds:
            total += call_work_s(profile, kv_budget, prefix, r.input_tokens, r.output_tokens, min_kv,
                                 request_kv(stage, r))
    return total


def check_fits(wf: Workflow, kv_budget: int) -> None:
    """Raise ConfigError if some call of `wf` could never run under `kv_budget`."""
    for st in wf.stages:
        need = wf.prefix_tokens(st.agent) + st.input_tokens.hi + st.output_tokens.hi
        if need > kv_budget:
            raise ConfigError(
                f"KV budget {kv_budget} tokens cannot hold stage '{st.name}' of workflow '{wf.name}' "
                f"(prefix {wf.prefix_tokens(st.agent)} + input {st.input_tokens.hi} + output "
                f"{st.output_tokens.hi} = {need} tokens)"
            )
