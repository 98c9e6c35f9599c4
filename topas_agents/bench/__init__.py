"""Benchmarking: policies on workflows in the simulator, against an oracle lower bound.

`run_bench(BenchConfig(...))` returns the JSON document `topas bench` writes, `run_seeds` the
one over several seeds (paper rule with 95% CIs: `aggregate`); `lower_bound`,
`capacity_rps` and the trace format (`load_trace`, `write_trace_record`) are usable alone.
Plotting and progress bars import matplotlib/tqdm only when used.
"""

from .aggregate import Interval, mean_ci, over_seeds, paper_rule, percentile
from .capacity import capacity_of_tasks, capacity_rps, rate_for_load
from .hosttier import HostTier, parse_host_tier
from .lower_bound import LowerBound, lower_bound, srpt_mean_response
from .runner import BenchConfig, SimBackend, build_policy, run_bench, run_many, run_seeds, summarize
from .trace import TraceRecord, load_trace, parse_record, redraw_arrivals, write_trace_record

__all__ = [
    "BenchConfig",
    "HostTier",
    "Interval",
    "LowerBound",
    "SimBackend",
    "TraceRecord",
    "build_policy",
    "capacity_of_tasks",
    "capacity_rps",
    "load_trace",
    "lower_bound",
    "mean_ci",
    "over_seeds",
    "paper_rule",
    "parse_host_tier",
    "percentile",
    "parse_record",
    "rate_for_load",
    "redraw_arrivals",
    "run_bench",
    "run_many",
    "run_seeds",
    "srpt_mean_response",
    "summarize",
    "write_trace_record",
]
