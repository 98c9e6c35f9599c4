"""SoftwareDev evaluation: Poisson arrivals of the dataset's prompts, one MetaGPT Team run
per task, against the embedded simulator once per policy (or one external server).

Rate units: tasks per simulated second on the embedded server (arrival offsets are divided
by `time_scale` to get wall time); against `--server`, tasks per second of that server's clock
(simulated seconds on a simulated server, which reports its time scale; wall seconds on a real
engine), so a rate means the same load embedded or not. JCT is the
server's (`/v1/topas/stats`; simulated seconds on a simulated engine, embedded or not) when
it reports one, else the client's (first call submitted -> last call done, recorder clock).
Per policy, `jcts_s` lists every task's JCT in task order (null: the task failed), so a CDF
can be redrawn from the JSON; `plot_eval` draws it. Failed tasks are counted and
excluded from the JCT statistics. `in LLM` (mean_llm_s) is JCT minus the client's own time
between a task's calls (MetaGPT's processing, scaled by time_scale on the embedded server):
the part of the JCT that the server's scheduling decides.
"""

from __future__ import annotations

from topas_agents.percentile import percentile_or_none

from .environment import require_prepared

require_prepared(__name__)  # before any metagpt import
# ruff: noqa: E402

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topas_agents.errors import ConfigError
from topas_agents.sim.driver import poisson_arrivals

from .cli_support import max_tokens_options
from .config_file import DEFAULT_ROOT
from .recorder import CallRecord, CallRecorder, scaled_clock
from .runner import (
    RunOptions,
    TaskResult,
    TaskSpec,
    WorkflowKind,
    attach_server_view,
    label_workflow,
    run_tasks,
)
from .server_api import ServerInfo, embedded_server, fetch_stats, probe_server, register_workflow, server_info
from .softwaredev import SoftwareDevPrompt

EXTERNAL = "external"


@dataclass(frozen=True, slots=True)
class EvalConfig:
    workflow: WorkflowKind = "sop"
    rate: float = 0.02  # tasks per second of the server's clock (simulated on a simulated server)
    policies: tuple[str, ...] = ("fcfs", "topas")
    tasks: int = 11  # prompts are cycled when more tasks than prompts
    server: str | None = None  # external OpenAI base URL; None: embedded simulator per policy
    time_scale: float = 50.0
    profile: str | None = None
    kv_budget: int | None = None
    seed: int = 0
    root: Path = DEFAULT_ROOT
    restructure: bool = True
    parse_retries: int | None = 2
    model: str | None = None
    max_tokens: int | None = None  # None: omitted (embedded) / MetaGPT's 4096 (--server); 0: omit
    api_key: str | None = None  # --server's key (None: MetaGPT's placeholder)
    task_id_prefix: str | None = None  # ids P-<dataset id>; None: the dataset ids (a fresh server per policy)

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ConfigError(f"--rate must be a positive number, got {self.rate}")
        if self.tasks < 1:
            raise ConfigError(f"--tasks must be >= 1, got {self.tasks}")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ConfigError(f"--time-scale must be a positive number, got {self.time_scale}")


def make_specs(prompts: Sequence[SoftwareDevPrompt], n: int, prefix: str | None = None) -> list[TaskSpec]:
    """`n` tasks over the prompts in order, cycling (ids stay unique), as `prefix-<id>` if given."""
    if not prompts:
        raise ConfigError("no prompts")
    out = []
    head = f"{prefix}-" if prefix is not None else ""
    for i in range(n):
        p = prompts[i % len(prompts)]
        suffix = "" if i < len(prompts) else f"r{i // len(prompts)}"
        out.append(TaskSpec(f"{head}{p.task_id}{suffix}", p.prompt, p.name))
    return out


def eval_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """The simulator's arrival process for `seed` (`sim.driver.poisson_arrivals`), moved so the
    first task starts at once: the same gaps as a simulated run of the same seed, without an
    idle first wait of real time."""
    times = poisson_arrivals(n, rate, seed)
    return [t - times[0] for t in times] if times else []


def _quantile(values: Sequence[float], q: float) -> float | None:
    return percentile_or_none(values, 100 * q)


def client_jct(records: Sequence[CallRecord]) -> float | None:
    return (max(r.t_done for r in records) - min(r.t_submit for r in records)) if records else None


def summarize(results: Sequence[TaskResult]) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    jcts = [r.jct_s for r in ok if r.jct_s is not None]
    # JCT minus the client's own time between calls: the part the server's scheduling decides
    llm = [r.jct_s - r.client_gaps_s for r in ok if r.jct_s is not None]
    return {"tasks": len(results), "succeeded": len(ok), "failed": len(results) - len(ok),
            "mean_jct_s": sum(jcts) / len(jcts) if jcts else None, "p99_jct_s": _quantile(jcts, 0.99),
            "mean_llm_s": sum(llm) / len(llm) if llm else None,
            "calls": sum(r.calls for r in results),
            "mean_wall_s": sum(r.wall_s for r in results) / len(results) if results else None}


async def _run_policy(policy: str, url: str, config: EvalConfig, specs: list[TaskSpec], arrivals: list[float],
                      clock_scale: float, on_done: Callable[[TaskResult], None]) -> tuple[list[TaskResult],
                                                                                         CallRecorder]:
    wf = label_workflow(config.workflow)
    key = config.api_key if config.server is not None else None
    register_workflow(url, wf, key)
    recorder = CallRecorder(scaled_clock(clock_scale))
    extra: dict[str, Any] = {"model": config.model} if config.model else {}
    if key:
        extra["api_key"] = key
    extra.update(max_tokens_options(config.max_tokens, external=config.server is not None))
    options = RunOptions(base_url=url, workflow=config.workflow, root=config.root,
                         restructure=config.restructure, parse_retries=config.parse_retries, **extra)
    results = await run_tasks(specs, options, recorder, arrivals_s=[a / clock_scale for a in arrivals],
                              on_done=on_done)
    results = attach_server_view(results, fetch_stats(url, api_key=key))
    fixed = []
    for r in results:  # no server JCT (external server without stats): the client's; a failed
        if r.jct_s is None and r.success:  # task has none (its span was counted as a short task)
            r = dataclasses.replace(r, jct_s=client_jct(recorder.for_task(r.task_id)))
        fixed.append(r)
    return fixed, recorder


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="task", file=sys.stderr, leave=False, dynamic_ncols=True)


async def evaluate(config: EvalConfig, prompts: Sequence[SoftwareDevPrompt], *, progress: bool = False,
                   trace_dir: Path | None = None) -> dict[str, Any]:
    """Run every policy; returns the JSON document (`summary` per policy + per-task rows)."""
    specs = make_specs(prompts, config.tasks, config.task_id_prefix)
    arrivals = eval_arrivals(len(specs), config.rate, config.seed)
    policies = config.policies if config.server is None else (EXTERNAL,)
    external = _external_info(config)
    scale = config.time_scale if external is None else external.time_scale if external.simulated else None
    bar = _progress(len(specs) * len(policies), progress)
    out: dict[str, Any] = {"workflow": label_workflow(config.workflow).name, "rate": config.rate,
                           "tasks": len(specs), "time_scale": scale, "server": config.server or "embedded",
                           "seed": config.seed, "policies": {}}
    note = ServerInfo(engine="sim", responder="echo").artifacts_note if external is None else external.artifacts_note
    if note:
        out["artifacts_note"] = note
    try:
        for policy in policies:
            if bar is not None:
                bar.set_description(policy)
            done = (lambda r: bar.update(1)) if bar is not None else (lambda r: None)
            t0 = time.monotonic()
            if config.server is None:
                with embedded_server(policy=policy, time_scale=config.time_scale, profile=config.profile,
                                     kv_budget=config.kv_budget, seed=config.seed) as handle:
                    results, recorder = await _run_policy(policy, handle.url, config, specs, arrivals,
                                                          config.time_scale, done)
            else:
                results, recorder = await _run_policy(policy, config.server, config, specs, arrivals,
                                                      external.clock_scale, done)
            if trace_dir is not None:
                from .recorder import save_trace

                save_trace(trace_dir / f"{policy}.jsonl", recorder.records)
            out["policies"][policy] = {"summary": {**summarize(results), "wall_s": round(time.monotonic() - t0, 2)},
                                       "jcts_s": [r.jct_s if r.success else None for r in results],
                                       "results": [r.to_json() for r in results]}
    finally:
        if bar is not None:
            bar.close()
    return out


def _external_info(config: EvalConfig) -> ServerInfo | None:
    """The --server's self-description (None: embedded); a dead server fails here, at once."""
    if config.server is None:
        return None
    probe_server(config.server, config.api_key)  # one line in seconds, not MetaGPT's minutes of retries
    return server_info(config.server, config.api_key)


def plot_eval(doc: dict[str, Any], directory: str | Path) -> list[Path]:
    """`DIR/jct_cdf.png` (per-task JCT CDF, one line per policy) and `DIR/jct_summary.png`
    (mean and p99 JCT per policy) from an `evaluate` document."""
    from topas_agents.bench.plots import plot_jct_bars, plot_jct_cdf

    unit = "simulated s" if doc.get("time_scale") else "s"
    where = (f"embedded, time scale {doc['time_scale']:g}" if doc["server"] == "embedded"
             else f"server {doc['server']}")
    title = (f"SoftwareDev on {doc['workflow']}: {doc['tasks']} tasks per policy\n"
             f"Poisson rate {doc['rate']:g} tasks/{unit}, seed {doc['seed']} ({where})")
    out = Path(directory)
    policies = doc["policies"]
    return [plot_jct_cdf({p: e["jcts_s"] for p, e in policies.items()}, out / "jct_cdf.png", title=title,
                         unit=unit),
            plot_jct_bars({p: e["summary"] for p, e in policies.items()}, out / "jct_summary.png", title=title,
                          unit=unit)]


def format_table(doc: dict[str, Any]) -> str:
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    unit = "sim s" if doc.get("time_scale") else "s"
    head = (f"{'policy':<10} {'tasks':>5} {'ok':>4} {'mean JCT':>10} {'p99 JCT':>10} {'in LLM':>10} "
            f"{'calls':>6}  ({unit})")
    rows = [head, "-" * len(head)]
    for policy, entry in doc["policies"].items():
        s = entry["summary"]
        rows.append(f"{policy:<10} {s['tasks']:>5} {s['succeeded']:>4} {num(s['mean_jct_s']):>10} "
                    f"{num(s['p99_jct_s']):>10} {num(s['mean_llm_s']):>10} {s['calls']:>6}")
    return "\n".join(rows)
