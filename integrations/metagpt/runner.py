"""Tasks as MetaGPT Team runs: one task = one `Team.run` with its own id, Context,
workspace and project name, every LLM call labelled (task, stage, agent, prefix_tokens).

    prepare_metagpt(root)
    results = await run_tasks([TaskSpec("t1", "Create a snake game.")],
                              RunOptions(base_url="http://127.0.0.1:8000/v1", workflow="sop"))

Artifacts: `<root>/workspace/<project>/` (MetaGPT's layout; the project name is unique per
task). With `qa`, the QaEngineer's test runs happen in a per-task bubblewrap sandbox under
`<root>/sandbox/` that can write only that project dir; it is removed when the task ends.

A `Team.run` that returns None (MetaGPT swallows exceptions and returns None) or raises,
or that ends before its workflow finished (the Engineer's summary for SOP, the TL's last
hop for TL), is a FAILED task with an error message, never a silent pass.
"""

from __future__ import annotations

from .environment import require_prepared

require_prepared(__name__)  # before any metagpt import
# ruff: noqa: E402

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from metagpt.team import Team

from topas_agents.errors import ConfigError
from topas_agents.integrations.task import aclose_task
from topas_agents.labels import label
from topas_agents.workflow import Workflow, load_workflow

from .config_file import DEFAULT_API_KEY, DEFAULT_MODEL, DEFAULT_ROOT
from .context import artifacts_dir, metagpt_context, project_dir, project_name_for
from .patches import fast_retries, never_retry
from .provider import ProviderOptions, TopasOpenAILLM
from .recorder import CallRecord, CallRecorder
from .roles import StageMap, describe_error, make_role
from .sandbox import SandboxContext, sandbox, sandbox_available
from .server_gone import WATCH, ServerGoneError
from .team_leader import TeamLeader, wire_star

WorkflowKind = Literal["sop", "tl"]
WORKFLOWS: dict[str, str] = {"sop": "metagpt-sop", "tl": "metagpt-tl"}
DEFAULT_ROUNDS = {("sop", False): 8, ("sop", True): 20, ("tl", False): 14, ("tl", True): 14}


@dataclass(frozen=True, slots=True)
class RunOptions:
    base_url: str  # OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1
    workflow: WorkflowKind = "sop"
    root: Path = DEFAULT_ROOT  # MetaGPT root: config, logs, workspace/<project>/
    model: str = DEFAULT_MODEL
    api_key: str = DEFAULT_API_KEY
    restructure: bool = True  # static prefix first (layout.py)
    send_max_tokens: bool = True  # False: let the simulator sample output lengths
    max_tokens: int = 4096
    code_review: bool = True
    qa: bool = False  # hire the QaEngineer (SOP only); code runs only in a sandbox
    n_round: int | None = None  # None: DEFAULT_ROUNDS
    parse_retries: int | None = None  # None: MetaGPT's own (6 attempts, waits); else fast_retries
    retry_wait_s: float = 0.0
    timeout_s: int = 600
    client_max_retries: int | None = None
    notify_server: bool = True  # POST /v1/topas/tasks/{id}/done after each task

    def __post_init__(self) -> None:
        if self.workflow not in WORKFLOWS:
            raise ConfigError(f"workflow must be one of {sorted(WORKFLOWS)}, got {self.workflow!r}")
        if self.qa and self.workflow != "sop":
            raise ConfigError("--qa applies to the SOP workflow only (the TL team has no QaEngineer)")
        if self.parse_retries is not None and self.parse_retries < 1:
            raise ConfigError(f"parse_retries must be >= 1, got {self.parse_retries}")
        if self.qa and not sandbox_available():  # generated code never runs unsandboxed
            raise ConfigError("--qa runs generated code only in a sandbox, which needs a working bubblewrap "
                              "(`apt-get install bubblewrap`, user namespaces enabled)")

    @property
    def rounds(self) -> int:
        return self.n_round or DEFAULT_ROUNDS[(self.workflow, self.qa)]


@dataclass(frozen=True, slots=True)
class TaskSpec:
    task_id: str
    prompt: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class TaskResult:
    task_id: str
    name: str
    workflow: str  # the label's workflow name
    success: bool
    error: str | None
    stages: tuple[str, ...]  # in the order their first call completed
    calls_per_stage: dict[str, int]
    calls: int
    prefix_tokens: dict[str, int]  # stage -> largest static prefix sent
    unmatched_prompts: int  # calls whose prompt no layout splitter recognised
    client_gaps_s: float  # time between one call's end and the next call's start (MetaGPT's own
    # processing), in the recorder's clock (simulated seconds on the embedded server)
    artifacts: str
    wall_s: float
    jct_s: float | None = None  # the server's JCT (simulated seconds), if it reports one
    server: dict[str, Any] = field(default_factory=dict)  # the server's view of the task

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def label_workflow(kind: WorkflowKind, qa: bool = False) -> Workflow:
    """The workflow tasks are labelled with: metagpt-tl, metagpt-sop (with QA) or
    metagpt-sop-noqa (the built-in SOP without its QA stage, as run by default)."""
    if kind == "sop" and not qa:
        return load_workflow("metagpt-sop-noqa")  # a derived built-in: SGLang can load it by name
    return load_workflow(WORKFLOWS[kind])


def stage_map(wf: Workflow) -> StageMap:
    tl_stages = {f"tl{i}": f"tl{i}" for i in range(1, 6)}
    return StageMap.from_workflow(wf, extra=tl_stages)


@dataclass
class _Team:
    team: Team
    roles: list[Any]
    finished: Callable[[], bool]
    send_to: str


def _build_team(options: RunOptions, ctx: Any, stages: StageMap, llm: Callable[[], TopasOpenAILLM]) -> _Team:
    def role(key: str, **kw: Any) -> Any:
        return make_role(key, stages, context=ctx, llm=llm(), **kw)

    pm, architect, pjm = role("product_manager"), role("architect"), role("project_manager")
    engineer = role("engineer", use_code_review=options.code_review)
    team = Team(context=ctx)
    if options.workflow == "sop":
        roles = [pm, architect, pjm, engineer] + ([role("qa_engineer")] if options.qa else [])
        team.hire(roles)
        return _Team(team, roles, lambda: engineer.topas_finished, "")
    hops = [s for s, (_, agent) in sorted(stages.by_role.items()) if s.startswith("tl")]
    tl_agent = stages.stage("tl1")[1]
    tl = TeamLeader(context=ctx, llm=llm(), topas_agent=tl_agent,
                    topas_stages=[stages.stage(h)[0] for h in hops])
    roles = [tl, pm, architect, pjm, engineer]
    team.hire(roles)
    wire_star(tl, pm, architect, pjm, engineer)
    return _Team(team, roles, lambda: tl.topas_finished, tl.name)


def _context(options: RunOptions, name: str, box: Path | None) -> Any:
    """The task's Context; with a QA sandbox `box`, one whose `python` is the sandbox shim."""
    common = dict(model=options.model, api_key=options.api_key, max_tokens=options.max_tokens,
                  timeout_s=options.timeout_s)
    if box is None:
        return metagpt_context(options.base_url, options.root, name, **common)
    ctx = metagpt_context(options.base_url, options.root, name, context_cls=SandboxContext, **common)
    ctx.sandbox_dir = str(box)
    return ctx


async def _run_team(t: _Team, spec: TaskSpec, options: RunOptions, wf: Workflow) -> str | None:
    """Run the team; returns the error (None: the workflow finished)."""
    first = wf.topo_order[0]
    try:
        with label(task_id=spec.task_id, workflow=wf.name, stage=first, agent=wf.stage(first).agent):
            history = await t.team.run(n_round=options.rounds, idea=spec.prompt, send_to=t.send_to)
    except Exception as exc:  # any failure of the run is the task's failure
        return describe_error(exc)
    role_error = next((r.topas_error for r in t.roles if getattr(r, "topas_error", "")), None)
    if history is None:
        return f"Team.run returned None: {role_error or 'MetaGPT swallowed an exception (see its log)'}"
    if role_error:
        return role_error
    if not t.finished():
        return f"the workflow did not finish within {options.rounds} rounds"
    return None


async def run_task(spec: TaskSpec, options: RunOptions, recorder: CallRecorder | None = None) -> TaskResult:
    """Run one task (see module doc); never raises for a failed run."""
    recorder = recorder if recorder is not None else CallRecorder()
    wf = label_workflow(options.workflow, options.qa)
    name = project_name_for(spec.task_id)
    with contextlib.ExitStack() as stack:  # the QA sandbox goes when the task ends, whatever happens
        box = (stack.enter_context(sandbox(Path(options.root).resolve() / "sandbox",
                                           writable=[project_dir(options.root, name)]))
               if options.qa else None)
        ctx = _context(options, name, box)
        provider = ProviderOptions(restructure=options.restructure, send_max_tokens=options.send_max_tokens,
                                   client_max_retries=options.client_max_retries)
        t = _build_team(options, ctx, stage_map(wf), lambda: TopasOpenAILLM(ctx.config.llm, provider, recorder))
        t0 = time.monotonic()
        try:
            error = await _run_team(t, spec, options, wf)
        except BaseException:  # interrupted (Ctrl-C, cancelled): the server ends it as failed
            await _notify_done(options, spec, failed=True)
            raise
        wall = time.monotonic() - t0
    # a failed run is a failed task on the server too: before, its done call gave it a JCT
    await _notify_done(options, spec, failed=error is not None)
    calls = recorder.for_task(spec.task_id)
    per_stage = Counter(r.stage for r in calls)
    prefix: dict[str, int] = {}
    for r in calls:
        prefix[r.stage] = max(prefix.get(r.stage, 0), r.prefix_tokens)
    return TaskResult(
        task_id=spec.task_id, name=spec.name, workflow=wf.name, success=error is None, error=error,
        stages=tuple(dict.fromkeys(r.stage for r in calls)), calls_per_stage=dict(per_stage), calls=len(calls),
        prefix_tokens=prefix, unmatched_prompts=sum(r.template is None for r in calls),
        client_gaps_s=round(client_gaps(calls), 3),
        artifacts=str(artifacts_dir(ctx)), wall_s=round(wall, 3))


async def _notify_done(options: RunOptions, spec: TaskSpec, failed: bool) -> None:
    if options.notify_server:
        # a 404 is expected: --server may be plain SGLang/vLLM, which has no done endpoint
        await aclose_task(options.base_url, spec.task_id, options.api_key, missing_ok=True, failed=failed)


def client_gaps(calls: Sequence[CallRecord]) -> float:
    """Sum of the idle gaps between a task's consecutive calls (the task makes one call at a
    time in both workflows)."""
    ordered = sorted(calls, key=lambda r: r.t_submit)
    return sum(max(0.0, b.t_submit - a.t_done) for a, b in zip(ordered, ordered[1:], strict=False))


async def run_tasks(specs: Sequence[TaskSpec], options: RunOptions, recorder: CallRecorder | None = None,
                    arrivals_s: Sequence[float] | None = None,
                    on_done: Callable[[TaskResult], None] | None = None) -> list[TaskResult]:
    """Run tasks concurrently; task i starts `arrivals_s[i]` wall seconds after the first."""
    ids = [s.task_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ConfigError("task ids must be unique")
    recorder = recorder if recorder is not None else CallRecorder()
    arrivals = list(arrivals_s) if arrivals_s is not None else [0.0] * len(specs)
    t0 = time.monotonic()

    async def one(spec: TaskSpec, at: float) -> TaskResult:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        result = await run_task(spec, options, recorder)
        if on_done is not None:
            on_done(result)
        return result

    retries = (fast_retries(options.parse_retries, options.retry_wait_s) if options.parse_retries
               else contextlib.nullcontext())
    WATCH.forget(options.base_url)  # a new run starts from a live server (its probe passed)
    with retries, never_retry(ServerGoneError):
        return list(await asyncio.gather(*(one(s, a) for s, a in zip(specs, arrivals, strict=True))))


def attach_server_view(results: Sequence[TaskResult], stats: dict[str, Any] | None) -> list[TaskResult]:
    """Results with the server's JCT and per-task view (stages, calls, labels) filled in."""
    if not stats:
        return list(results)
    tasks = {t["task_id"]: t for t in stats.get("tasks", {}).get("items", [])}
    calls: dict[str, list[dict[str, Any]]] = {}
    for c in stats.get("calls", []):
        calls.setdefault(c["task_id"], []).append(c)
    out = []
    for r in results:
        task = tasks.get(r.task_id, {})
        seen = calls.get(r.task_id, [])
        view = {"done": task.get("done"), "done_reason": task.get("done_reason"),
                "stages": {k: v.get("calls") for k, v in task.get("stages", {}).items()},
                "calls": len(seen),
                "labels": sorted({(c["stage"], c["agent"]) for c in seen}),
                "label_sources": sorted({c["label_source"] for c in seen})}
        # a failed task's server JCT (if the server concluded it at all) is not the task's JCT
        out.append(dataclasses.replace(r, jct_s=task.get("jct_s") if r.success else r.jct_s, server=view))
    return out
