"""Benchmarking: policies on workflows in the simulator, against an oracle lower bound.

`run_bench(BenchConfig(...))` returns the JSON document `topas bench` writes; `lower_bound`,
`capacity_rps` and the trace format (`load_trace`, `write_trace_record`) are usable alone.
Plotting and progress bars import matplotlib/tqdm only when used.
"""

from .capacity import capacity_of_tasks, capacity_rps, rate_for_load
from .lower_bound import LowerBound, lower_bound, srpt_mean_response
from .runner import BenchConfig, SimBackend, build_policy, run_bench, summarize
from .trace import TraceRecord, load_trace, parse_record, redraw_arrivals, write_trace_record

__all__ = [
    "BenchConfig",
    "LowerBound",
    "SimBackend",
    "TraceRecord",
    "build_policy",
    "capacity_of_tasks",
    "capacity_rps",
    "load_trace",
    "lower_bound",
    "parse_record",
    "rate_for_load",
    "redraw_arrivals",
    "run_bench",
    "srpt_mean_response",
    "summarize",
    "write_trace_record",
]
