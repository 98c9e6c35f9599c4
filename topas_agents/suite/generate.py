"""Seeded random workflows for the suite: valid DAGs of many shapes, sized against a KV budget.

`generate_suite(n, seed, kv_budget)` returns `n` workflows; workflow `i` depends only on
`(seed, i)` (its own RNG), so a larger suite extends a smaller one. Every workflow is built
as a YAML mapping and passed through `parse_workflow`, so it is valid by construction, and
`workflow_to_dict` writes it back in the form `load_workflow` reads (the suite's YAMLs replay
with `topas bench --workload FILE.yaml`). The distribution is documented in docs/suite.md.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import ConfigError
from ..workflow import IntRange, Workflow, parse_workflow
from .shapes import SHAPES, Shape, Skeleton, build_skeleton


@dataclass(frozen=True, slots=True)
class GenConfig:
    """The generator's distribution (docs/suite.md explains each range)."""

    # Agent prefixes: log-uniform, then scaled so their sum is `prefix_sum_ratio` x budget
    # (the residency pressure axis: from "all fit" to "a few times what fits").
    prefix_tokens: tuple[int, int] = (256, 16384)
    prefix_sum_ratio: tuple[float, float] = (0.25, 4.0)
    # Per-call sizes, log-uniform: from short tool calls to long documents.
    input_tokens: tuple[int, int] = (100, 8000)
    output_tokens: tuple[int, int] = (32, 2048)
    # Chance a size is a [lo, hi] range rather than a fixed value, and hi/lo at most.
    range_prob: float = 0.5
    range_spread: float = 2.5
    # ReAct: rounds lo in [1, 3], hi up to lo + 4; tool waits (seconds) uniform.
    react_rounds_max_extra: int = 4
    tool_wait_s: tuple[float, float] = (0.2, 5.0)
    # Stages of non-`react` shapes that are nevertheless multi-round ReAct stages.
    react_prob: float = 0.2
    # Prefixes are rounded to this many tokens (page-like sizes read better in YAML).
    prefix_quantum: int = 64


DEFAULT_GEN = GenConfig()
# The smallest budget a workflow can be fitted into: min prefix + min input + min output.
MIN_BUDGET = 1024


@dataclass(frozen=True, slots=True)
class GeneratedWorkflow:
    index: int
    shape: Shape
    workflow: Workflow
    # Sum of agent prefixes / KV budget, after fitting (the residency pressure).
    prefix_ratio: float


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _size(rng: random.Random, bounds: tuple[int, int], cfg: GenConfig) -> IntRange:
    lo = round(_log_uniform(rng, *bounds))
    if rng.random() >= cfg.range_prob:
        return IntRange(lo, lo)
    return IntRange(lo, min(bounds[1], round(lo * rng.uniform(1.2, cfg.range_spread))))


def _prefixes(rng: random.Random, n: int, budget: int, cfg: GenConfig) -> list[int]:
    lo, hi = cfg.prefix_tokens
    raw = [_log_uniform(rng, lo, hi) for _ in range(n)]
    target = _log_uniform(rng, *cfg.prefix_sum_ratio) * budget
    scale = target / sum(raw)
    q = cfg.prefix_quantum
    return [max(lo, min(hi, round(r * scale / q) * q)) for r in raw]


def _fit(prefix: int, inp: IntRange, out: IntRange, budget: int, cfg: GenConfig) -> tuple[int, IntRange, IntRange]:
    """Make one call fit the budget alone (bench.work.check_fits): shrink the call's sizes
    first (the prefix is shared by the agent's other stages), down to the minimum sizes; only
    a prefix that leaves less than that minimum call shrinks (so it stays large)."""
    min_in, min_out = cfg.input_tokens[0], cfg.output_tokens[0]
    if prefix + min_in + min_out > budget:
        prefix = (budget - min_in - min_out) // cfg.prefix_quantum * cfg.prefix_quantum
    room = budget - prefix
    if inp.hi + out.hi > room:
        factor = room / (inp.hi + out.hi)
        in_hi = max(min_in, math.floor(inp.hi * factor))
        out_hi = max(min_out, min(math.floor(out.hi * factor), room - in_hi))
        in_hi = max(min_in, min(in_hi, room - out_hi))
        inp, out = IntRange(min(inp.lo, in_hi), in_hi), IntRange(min(out.lo, out_hi), out_hi)
    return prefix, inp, out


def _range_value(r: IntRange) -> int | list[int]:
    return r.lo if r.lo == r.hi else [r.lo, r.hi]


def _stage_sizes(rng: random.Random, react: bool, cfg: GenConfig) -> dict[str, Any]:
    inp, out = _size(rng, cfg.input_tokens, cfg), _size(rng, cfg.output_tokens, cfg)
    extra: dict[str, Any] = {}
    if react:
        lo = rng.randint(1, 3)
        extra = {"requests": [lo, lo + rng.randint(1, cfg.react_rounds_max_extra)],
                 "tool_wait_s": round(rng.uniform(*cfg.tool_wait_s), 1)}
    return {"input": inp, "output": out, **extra}


def _build(skel: Skeleton, shape: Shape, name: str, rng: random.Random, budget: int,
           loads: tuple[float, ...], cfg: GenConfig) -> dict[str, Any]:
    prefixes = _prefixes(rng, skel.n_agents, budget, cfg)
    sized = [_stage_sizes(rng, s.react or rng.random() < cfg.react_prob, cfg) for s in skel.stages]
    # Fit every stage; a shrunk prefix can only help the agent's earlier-fitted stages.
    for s, sz in zip(skel.stages, sized, strict=True):
        prefixes[s.agent], sz["input"], sz["output"] = _fit(prefixes[s.agent], sz["input"], sz["output"],
                                                            budget, cfg)
    stages = []
    for i, (s, sz) in enumerate(zip(skel.stages, sized, strict=True)):
        row: dict[str, Any] = {"name": f"s{i}", "agent": f"a{s.agent}", "after": [f"s{d}" for d in s.after],
                               "requests": sz.get("requests", 1), "input_tokens": _range_value(sz["input"]),
                               "output_tokens": _range_value(sz["output"])}
        if "tool_wait_s" in sz:
            row["tool_wait_s"] = sz["tool_wait_s"]
        stages.append(row)
    ratio = sum(prefixes) / budget
    return {"name": name, "description": f"random suite: {shape}, {skel.n_agents} agents, "
            f"prefixes {ratio:.2f}x a {budget}-token KV budget", "loads": list(loads),
            "agents": [{"name": f"a{i}", "prefix_tokens": p} for i, p in enumerate(prefixes)],
            "stages": stages}


def generate_workflow(seed: int, index: int, kv_budget: int, *, loads: tuple[float, ...] = (0.3, 0.6, 0.9),
                      cfg: GenConfig = DEFAULT_GEN, shape: Shape | None = None) -> GeneratedWorkflow:
    """Workflow `index` of suite `seed`. Shapes go round-robin over `SHAPES` so every shape
    appears in any suite of at least 8 workflows."""
    if kv_budget < MIN_BUDGET:
        raise ConfigError(f"the random suite needs a KV budget of at least {MIN_BUDGET} tokens, got {kv_budget}")
    rng = random.Random(f"topas-suite:{seed}:{index}")
    shape = shape or SHAPES[index % len(SHAPES)]
    skel = build_skeleton(shape, rng)
    data = _build(skel, shape, f"rand{seed}-{index:03d}-{shape}", rng, kv_budget, loads, cfg)
    wf = parse_workflow(data, data["name"])
    return GeneratedWorkflow(index, shape, wf, sum(a.prefix_tokens for a in wf.agents) / kv_budget)


def generate_suite(n: int, seed: int, kv_budget: int, *, loads: tuple[float, ...] = (0.3, 0.6, 0.9),
                   cfg: GenConfig = DEFAULT_GEN) -> tuple[GeneratedWorkflow, ...]:
    return tuple(generate_workflow(seed, i, kv_budget, loads=loads, cfg=cfg) for i in range(n))


def workflow_to_dict(wf: Workflow) -> dict[str, Any]:
    """The YAML mapping `parse_workflow` turns back into an equal `Workflow`."""
    stages = []
    for s in wf.stages:
        row: dict[str, Any] = {"name": s.name, "agent": s.agent, "after": list(s.after),
                               "requests": _range_value(s.requests), "input_tokens": _range_value(s.input_tokens),
                               "output_tokens": _range_value(s.output_tokens)}
        if s.tool_wait_s:
            row["tool_wait_s"] = s.tool_wait_s
        stages.append(row)
    return {"name": wf.name, "description": wf.description, "loads": list(wf.loads),
            "agents": [{"name": a.name, "prefix_tokens": a.prefix_tokens} for a in wf.agents],
            "stages": stages}


class _FlowDumper(yaml.SafeDumper):
    """Block style for the top level, flow style for each agent/stage row (as the built-in
    workloads are written: one line per stage)."""


def _represent_dict(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    flow = all(not isinstance(v, dict | list) or (isinstance(v, list) and all(
        not isinstance(x, dict) for x in v)) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data,
                                     flow_style=not any(isinstance(x, dict) for x in data))


_FlowDumper.add_representer(dict, _represent_dict)
_FlowDumper.add_representer(list, _represent_list)


def workflow_to_yaml(wf: Workflow, header: str = "") -> str:
    """`wf` as YAML text (`header` lines become leading comments)."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    body = yaml.dump(workflow_to_dict(wf), Dumper=_FlowDumper, sort_keys=False, width=200)
    return comments + body
