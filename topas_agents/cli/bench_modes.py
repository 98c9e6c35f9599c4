"""Which `topas bench` flags each mode reads: a flag given in a mode that ignores it is an
error, not a silent no-op (`--rate` with `--suite`, `--scale` in the simulator, `--tasks`
with `--replicas`, ...).

The flags given are `args.given` (cli.args.given_options: told apart from defaults by a
second parse); a Namespace built without it (a test calling `run` directly) is not checked.
"""

from __future__ import annotations

import argparse
from typing import Literal

from ..errors import ConfigError

BenchMode = Literal["decision-cost", "real", "suite", "cluster", "sim"]

# Read by every mode.
_COMMON = frozenset({"--policies", "--profile", "--json", "--seed", "--no-progress"})
_POLICY_SETUP = frozenset({"--policy-opt", "--policy-config", "--kv-budget"})
_REAL_ONLY = frozenset({"--server", "--engine", "--model-path", "--engine-arg", "--scale", "--kv-tokens",
                        "--ignore-eos", "--model", "--timeout", "--words-per-token", "--sim", "--api-key"})

# What each mode reads beyond _COMMON (see the mode's own code: realbench.runner.run_from_args,
# suite.cli.config_from_args, cluster.cli.run_cluster_from_args, bench.runner.BenchConfig).
MODE_FLAGS: dict[BenchMode, frozenset[str]] = {
    # the options of the policies timed (not --kv-budget: the benchmark's world uses the profile's)
    "decision-cost": frozenset({"--decision-cost", "--policy-opt", "--policy-config"}),
    # realbench replays one --workload at one --rate; the server or engine it starts takes no options
    "real": _REAL_ONLY | {"--workload", "--tasks", "--rate"},
    "suite": _POLICY_SETUP | {"--suite", "--load", "--tasks", "--seeds", "--protocol", "--host-tier",
                              "--no-host-tier", "--jobs", "--workflows", "--suite-seed", "--worst-dir",
                              "--reuse", "--recheck"},
    "cluster": _POLICY_SETUP | {"--workload", "--load", "--seeds", "--protocol", "--jobs", "--replicas",
                                "--router", "--tasks-per-replica", "--scaling", "--p99-target"},
    "sim": _POLICY_SETUP | {"--workload", "--trace", "--rate", "--load", "--tasks", "--seeds", "--protocol",
                            "--host-tier", "--no-host-tier", "--jobs", "--task-jcts", "--plot", "--timeline",
                            "--timeline-tasks", "--check"},
}

_MODE_NAMES: dict[BenchMode, str] = {
    "decision-cost": "--decision-cost",
    "real": "a real engine (--server or --engine sglang)",
    "suite": "--suite",
    "cluster": "--replicas",
    "sim": "the simulated --workload/--trace bench",
}

# The flag a mode reads in place of one it ignores.
_INSTEAD: dict[tuple[BenchMode, str], str] = {
    ("suite", "--rate"): "--load: the suite runs each workflow at fractions of its capacity",
    ("cluster", "--rate"): "--load: loads are relative to N x one engine",
    ("cluster", "--tasks"): "--tasks-per-replica",
    ("real", "--load"): "--rate",
}


def bench_mode(args: argparse.Namespace) -> BenchMode:
    """The mode `topas bench` runs in, in the order `cli.bench.run` dispatches."""
    if args.decision_cost:
        return "decision-cost"
    if args.server or args.engine != "sim":
        return "real"
    if args.suite:
        return "suite"
    if args.replicas:
        return "cluster"
    return "sim"


def check_mode_flags(args: argparse.Namespace) -> None:
    """ConfigError naming the first given flag that the mode ignores, and where it applies."""
    given = getattr(args, "given", None)
    if given is None:
        return
    mode = bench_mode(args)
    allowed = _COMMON | MODE_FLAGS[mode]
    if args.engine == "sim":
        allowed = allowed | {"--engine"}  # --engine sim names the simulator every other mode runs
    for flag in sorted(given - allowed):
        instead = _INSTEAD.get((mode, flag))
        where = [name for m, name in _MODE_NAMES.items() if flag in MODE_FLAGS[m]]
        hint = f" (use {instead})" if instead else f"; it applies to {', '.join(where)}" if where else ""
        raise ConfigError(f"{flag} has no effect with {_MODE_NAMES[mode]}{hint}")
    if mode == "real" and args.rate and len(args.rate) > 1:
        raise ConfigError("a real engine replays one --rate; give a single value")
