"""DAG skeletons for the random suite: which agent runs each stage and what it waits for.

A skeleton says nothing about token sizes (`generate.py` adds those). Each builder takes the
RNG and returns `Skeleton(n_agents, stages)`; stage `i` may only depend on stages `< i`, so
every skeleton is acyclic by construction. Agents are numbered 0..n-1 and every agent runs
at least one stage.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Shape = Literal["chain", "fanout", "diamond", "star", "debate", "loop", "react", "layered"]
SHAPES: tuple[Shape, ...] = ("chain", "fanout", "diamond", "star", "debate", "loop", "react", "layered")

MAX_AGENTS = 16  # the range: 2-16 agents per workflow


@dataclass(frozen=True, slots=True)
class StageSkel:
    agent: int
    after: tuple[int, ...]
    # A multi-round ReAct stage (requests range + tool wait) rather than one call.
    react: bool = False


@dataclass(frozen=True, slots=True)
class Skeleton:
    n_agents: int
    stages: tuple[StageSkel, ...]


def _chain(rng: random.Random) -> Skeleton:
    n = rng.randint(2, MAX_AGENTS)
    return Skeleton(n, tuple(StageSkel(i, (i - 1,) if i else ()) for i in range(n)))


def _fanout(rng: random.Random) -> Skeleton:
    """A root, k parallel workers, and (usually) a merge that waits for all of them."""
    merge = rng.random() < 0.75
    k = rng.randint(1 if merge else 2, MAX_AGENTS - 1 - int(merge))
    stages = [StageSkel(0, ())] + [StageSkel(1 + i, (0,)) for i in range(k)]
    if merge:
        stages.append(StageSkel(k + 1, tuple(range(1, k + 1))))
    return Skeleton(len(stages), tuple(stages))


def _diamond(rng: random.Random) -> Skeleton:
    """d diamonds in series: fork -> w branches -> join, each join the next fork."""
    width = rng.randint(2, 3)
    d = rng.randint(1, (MAX_AGENTS - 1) // (width + 1))
    stages = [StageSkel(0, ())]
    fork = 0
    for _ in range(d):
        branches = [len(stages) + i for i in range(width)]
        stages += [StageSkel(b, (fork,)) for b in branches]
        fork = len(stages)
        stages.append(StageSkel(fork, tuple(branches)))
    return Skeleton(len(stages), tuple(stages))


def _star(rng: random.Random) -> Skeleton:
    """TeamLeader-like: the central agent 0 before, between and after k specialists."""
    k = rng.randint(1, 8)
    stages = [StageSkel(0, ())]
    for i in range(k):
        stages.append(StageSkel(1 + i, (len(stages) - 1,)))
        stages.append(StageSkel(0, (len(stages) - 1,)))
    return Skeleton(k + 1, tuple(stages))


def _debate(rng: random.Random) -> Skeleton:
    """Two agents alternating for r turns each, sometimes closed by a judge (agent 2)."""
    turns = 2 * rng.randint(2, 6)
    stages = [StageSkel(i % 2, (i - 1,) if i else ()) for i in range(turns)]
    judge = rng.random() < 0.5
    if judge:
        stages.append(StageSkel(2, (turns - 1,)))
    return Skeleton(2 + int(judge), tuple(stages))


def _loop(rng: random.Random) -> Skeleton:
    """An unrolled loop: a body of m agents (e.g. code -> review -> test) repeated r times,
    sometimes after a planner that runs once."""
    m, reps = rng.randint(2, 4), rng.randint(2, 4)
    planner = rng.random() < 0.5
    stages = [StageSkel(m, ())] if planner else []
    for i in range(m * reps):
        stages.append(StageSkel(i % m, (len(stages) - 1,) if stages else ()))
    return Skeleton(m + int(planner), tuple(stages))


def _react(rng: random.Random) -> Skeleton:
    """A short chain or fork of multi-round ReAct stages (every stage waits on tools)."""
    n = rng.randint(2, 6)
    if rng.random() < 0.5:
        return Skeleton(n, tuple(StageSkel(i, (i - 1,) if i else (), True) for i in range(n)))
    return Skeleton(n, (StageSkel(0, (), True), *(StageSkel(i, (0,), True) for i in range(1, n))))


def _layered(rng: random.Random) -> Skeleton:
    """A random layered DAG: each stage depends on 1-2 stages of the layer before."""
    n = rng.randint(3, MAX_AGENTS)
    sizes: list[int] = []
    left = n
    while left:
        sizes.append(min(left, rng.randint(1, 4)))
        left -= sizes[-1]
    stages: list[StageSkel] = []
    prev: list[int] = []
    for size in sizes:
        layer = []
        for _ in range(size):
            deps = tuple(sorted(rng.sample(prev, min(len(prev), rng.randint(1, 2))))) if prev else ()
            layer.append(len(stages))
            stages.append(StageSkel(len(stages), deps))
        prev = layer
    return Skeleton(n, tuple(stages))


BUILDERS: dict[Shape, Callable[[random.Random], Skeleton]] = {
    "chain": _chain, "fanout": _fanout, "diamond": _diamond, "star": _star,
    "debate": _debate, "loop": _loop, "react": _react, "layered": _layered,
}


def build_skeleton(shape: Shape, rng: random.Random) -> Skeleton:
    return BUILDERS[shape](rng)
