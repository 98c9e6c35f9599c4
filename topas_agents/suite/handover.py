"""How much a run's first decisions decide: policy A until the k-th task arrival, then B.

The forecast guard hands a run from one policy to another at an arrival count. When a run that
switched to B ends far from B run alone, either the handover cost it (what A left behind: the
queue, the resident prefixes) or the run is so sensitive to its first decisions that any
different start would have moved it as much. Handing over from several first policies at
several counts tells the two apart: if starting with FCFS or Parrot moves the run as much as
starting with the core, the spread is the run's own, not the handover's.

    python -m topas_agents.suite.handover --first topas-core,fcfs,parrot --then lpm --at 2,4,6,8 \\
        -- --workload W.yaml --load 0.8 --seeds 101,102 --tasks 60 --json out.json

runs `topas bench` (the arguments after `--`) on B alone and on one policy per (A, k), named
`A-then-B-at-k`. The switching policy is the one the guard's modelled forecast simulates
(`forecast_run.ScheduledPolicy`). The names are registered in this process only; `--jobs N`
works where the bench's worker processes are forked (Linux), not spawned.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from typing import Any

from ..policies import available_policies, register_policy
from ..policies.forecast_run import ScheduledPolicy, Stint

_CORE = "topas-core"  # the Topas instance a schedule keeps learning in (ScheduledPolicy)


def handover_name(first: str, then: str, at: int) -> str:
    return f"{first}-then-{then}-at-{at}"


def register_handovers(firsts: Sequence[str], then: str, ats: Sequence[int]) -> list[str]:
    """Register one policy per (first, at): `first` from the start, `then` from the at-th
    arrival. Returns their names in (first, at) order."""
    names = []
    for first in firsts:
        for at in ats:
            name = handover_name(first, then, at)
            attr = f"_make_{next(_SERIAL)}"
            globals()[attr] = _factory(first, then, at, name)  # make_policy imports `module:attr`
            register_policy(name, f"{__name__}:{attr}")
            names.append(name)
    return names


_SERIAL = itertools.count()


def _factory(first: str, then: str, at: int, name: str) -> Any:
    def make(**_options: Any) -> ScheduledPolicy:
        policy = ScheduledPolicy((Stint(0, first), Stint(at, then)), _CORE, None)
        policy.name = name
        return policy

    return make


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, bench = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="python -m topas_agents.suite.handover", description=__doc__.splitlines()[0])
    ap.add_argument("--first", default=f"{_CORE},fcfs,parrot", help="policies run before the handover")
    ap.add_argument("--then", default="lpm", help="the policy handed over to (also run alone)")
    ap.add_argument("--at", default="2,4,6,8", help="arrival counts to hand over at")
    args = ap.parse_args(ours)
    firsts = [p.strip() for p in args.first.split(",") if p.strip()]
    known = available_policies()
    for name in [*firsts, args.then]:
        if name not in known:
            ap.error(f"unknown policy '{name}'")
    try:
        ats = [int(x) for x in args.at.split(",")]
    except ValueError:
        ap.error(f"--at takes comma-separated arrival counts, got {args.at!r}")
    if any(a < 1 for a in ats):
        ap.error("--at counts must be >= 1")
    if "--policies" in bench:
        ap.error("the policies are --first, --then and --at; give no --policies after --")
    names = register_handovers(firsts, args.then, ats)
    from ..cli import main as cli_main

    return cli_main(["bench", *bench, "--policies", ",".join([args.then, *names])])


if __name__ == "__main__":
    raise SystemExit(main())
