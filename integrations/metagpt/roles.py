"""Labelled MetaGPT roles: subclasses that run every LLM call under their agent/stage label.

Needs MetaGPT imported (`prepare_metagpt`). No MetaGPT class is modified: each stock SOP
role gets a subclass whose `run` (one observe-think-act turn, which makes all of the role's
LLM calls, including the ones the Engineer makes from actions it creates on the fly) is
wrapped in `topas_agents.label(agent=..., stage=...)`. The task id comes from the label the
runner puts around `Team.run`; asyncio tasks created by MetaGPT inherit it (contextvars).

Stage and agent names come from the workflow the task is labelled with
(`datasets/workloads/metagpt-sop.yaml`, `metagpt-tl.yaml`): `StageMap`.
"""

from __future__ import annotations

from .environment import require_prepared

require_prepared(__name__)  # before any metagpt import
# ruff: noqa: E402

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metagpt.actions.summarize_code import SummarizeCode
from metagpt.roles import Architect, Engineer, ProductManager, ProjectManager, QaEngineer, Role
from metagpt.schema import Message
from metagpt.utils.common import any_to_str

from topas_agents.errors import ConfigError
from topas_agents.integrations.task import fields_in_force
from topas_agents.labels import label
from topas_agents.workflow import Workflow

# role key -> stage name in the built-in MetaGPT workloads
ROLE_STAGES = {
    "product_manager": "write_prd",
    "architect": "write_design",
    "project_manager": "write_tasks",
    "engineer": "write_code",
    "qa_engineer": "qa",
}


@dataclass(frozen=True, slots=True)
class StageMap:
    """How a workflow's stages map onto roles: role key -> (stage, agent)."""

    workflow: str
    by_role: Mapping[str, tuple[str, str]]

    def stage(self, role_key: str) -> tuple[str, str]:
        try:
            return self.by_role[role_key]
        except KeyError:
            raise ConfigError(f"workflow '{self.workflow}' has no stage for role '{role_key}'") from None

    @classmethod
    def from_workflow(cls, wf: Workflow, roles: Mapping[str, str] = ROLE_STAGES,
                      extra: Mapping[str, str] | None = None) -> StageMap:
        """Map each role key to its stage in `wf` (missing stages are skipped: e.g. QA);
        `extra` adds role keys -> stage names (the TeamLeader's hops)."""
        by_role = {}
        for key, stage in {**roles, **(extra or {})}.items():
            if wf.has_stage(stage):
                by_role[key] = (stage, wf.stage(stage).agent)
        return cls(wf.name, by_role)


class LabelledRole(Role):
    """Base of the labelled roles: `run` is wrapped in the role's agent/stage label, and
    the first exception a turn raises is kept in `topas_error` (MetaGPT's `Team.run`
    swallows it and returns None; the runner reports it)."""

    topas_stage: str = ""
    topas_agent: str = ""
    topas_error: str = ""

    async def run(self, with_message: Any = None) -> Message | None:
        try:
            if "task_id" not in fields_in_force():  # not inside a labelled task: leave calls unlabelled
                return await super().run(with_message)
            with label(stage=self.topas_stage, agent=self.topas_agent):
                return await super().run(with_message)
        except Exception as exc:
            self.topas_error = self.topas_error or describe_error(exc)
            raise


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*$")


def describe_error(exc: BaseException) -> str:
    """One line naming the root error. MetaGPT re-raises role errors as
    `Exception(<formatted traceback>)` and wraps parse failures in tenacity RetryErrors:
    report the first non-retry error line of that text (else its last line), or the line that
    says the server stopped answering (server_gone.py), which says more than its root cause."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR_LINE.match(ln) and not ln.startswith("tenacity.RetryError")]
    gone = next((ln for ln in errors if ln.split(":", 1)[0].endswith("ServerGoneError")), None)
    if gone is not None:
        return gone[:500]
    if errors:
        return errors[0][:500]
    text = lines[-1] if lines else ""
    return (text if ":" in text else f"{type(exc).__name__}: {text or 'no message'}")[:500]


class TopasProductManager(ProductManager, LabelledRole):
    topas_stage: str = "write_prd"
    topas_agent: str = "product_manager"


class TopasArchitect(Architect, LabelledRole):
    topas_stage: str = "write_design"
    topas_agent: str = "architect"


class TopasProjectManager(ProjectManager, LabelledRole):
    topas_stage: str = "write_tasks"
    topas_agent: str = "project_manager"


class TopasEngineer(Engineer, LabelledRole):
    topas_stage: str = "write_code"
    topas_agent: str = "engineer"
    topas_finished: bool = False  # published its final SummarizeCode message

    async def _act(self) -> Message | None:
        msg = await super()._act()
        if msg is not None and msg.cause_by == any_to_str(SummarizeCode) and "Edward" in msg.send_to:
            self.topas_finished = True
        return msg


class TopasQaEngineer(QaEngineer, LabelledRole):
    topas_stage: str = "qa"
    topas_agent: str = "qa_engineer"


ROLE_CLASSES: dict[str, type] = {
    "product_manager": TopasProductManager,
    "architect": TopasArchitect,
    "project_manager": TopasProjectManager,
    "engineer": TopasEngineer,
    "qa_engineer": TopasQaEngineer,
}


def make_role(key: str, stages: StageMap, **kwargs: Any) -> Any:
    """Build the labelled role `key` (pass `context=` and `llm=`: see docs)."""
    stage, agent = stages.stage(key)
    return ROLE_CLASSES[key](topas_stage=stage, topas_agent=agent, **kwargs)
