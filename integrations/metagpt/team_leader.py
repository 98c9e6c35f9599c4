"""A project-defined TeamLeader for MetaGPT 0.8.2 (which has none) and the star workflow

    TL -> ProductManager -> TL -> Architect -> TL -> ProjectManager -> TL -> Engineer -> TL

Each TL hop is one LLM call (`TLReview`: review the last output, brief the next specialist)
labelled `tl1` ... `tl5` (stages of `datasets/workloads/metagpt-tl.yaml`). Routing is
deterministic: the TL forwards the specialist's ORIGINAL message content (MetaGPT's
PrepareDocuments uses the first message as the requirement) with the `cause_by` the next
specialist reacts to, addressed to that specialist only. The specialists' watch lists are
narrowed so that they react to the TL alone, never to each other.

TL prompt: built in MetaGPT's own context-first layout (`## context ... ----- ## instructions`)
so that `layout.restructure` treats it like every other prompt (static part first when
restructuring is on; stock order when it is off).
"""

from __future__ import annotations

from .environment import require_prepared

require_prepared(__name__)  # before any metagpt import
# ruff: noqa: E402

import contextlib
from typing import Any

from metagpt.actions import (
    Action,
    UserRequirement,
    WriteCode,
    WriteCodeReview,
    WriteDesign,
    WritePRD,
    WriteTasks,
)
from metagpt.actions.fix_bug import FixBug
from metagpt.actions.prepare_documents import PrepareDocuments
from metagpt.actions.summarize_code import SummarizeCode
from metagpt.actions.write_code_plan_and_change_an import WriteCodePlanAndChange
from metagpt.roles import Role
from metagpt.schema import Message
from metagpt.utils.common import any_to_str

from topas_agents.integrations.task import fields_in_force
from topas_agents.labels import label

from .roles import LabelledRole

TL_NAME = "Mike"
MAX_CONTEXT_CHARS = 6000  # of the forwarded output, in the TL's prompt

# cause_by of the message the TL receives -> (hop number, next specialist's name, cause_by
# the next specialist must see); None: the Engineer is done, the TL reports.
ROUTE: dict[str, tuple[int, str | None, Any]] = {
    any_to_str(UserRequirement): (1, "Alice", UserRequirement),
    any_to_str(WritePRD): (2, "Bob", WritePRD),
    any_to_str(WriteDesign): (3, "Eve", WriteDesign),
    any_to_str(WriteTasks): (4, "Alex", WriteTasks),
    any_to_str(SummarizeCode): (5, None, None),
}
ROSTER = {"Alice": "Product Manager", "Bob": "Architect", "Eve": "Project Manager", "Alex": "Engineer"}

TL_INSTRUCTIONS = """## instructions
You lead a software team and every piece of work passes through you. The team:
- Alice, Product Manager: turns the user's requirement into a PRD (goals, user stories, requirement pool).
- Bob, Architect: turns the PRD into a system design (implementation approach, file list, data structures, call flow).
- Eve, Project Manager: turns the design into a task list ordered by dependency, with required packages.
- Alex, Engineer: writes every file in the task list, reviews it, and summarizes the code.
The order is fixed: you -> Alice -> you -> Bob -> you -> Eve -> you -> Alex -> you.

When a specialist's output arrives:
1. Check it against the user's original requirement. Name anything missing, contradictory or out of scope.
2. Keep what is good. Ask for nothing that the requirement does not need; do not redesign.
3. Write concrete guidance for the next specialist: what to focus on, which decisions from earlier
   outputs they must keep (names, files, interfaces), and which risks to avoid.
4. When the Engineer has finished, summarize for the user what was built and what is left unclear.
Be brief: the specialists read your guidance together with the full documents.

## format
## Review
<two to five sentences>
## Next
<name of the next specialist, or DONE>: <one paragraph of guidance, or the summary for the user>
"""


def tl_prompt(requirement: str, last_role: str, content: str, next_name: str | None) -> str:
    """The TL's prompt for one hop (MetaGPT's context-first layout; see module doc)."""
    if len(content) > MAX_CONTEXT_CHARS:
        content = content[:MAX_CONTEXT_CHARS] + "\n... (truncated)"
    nxt = f"{next_name} ({ROSTER[next_name]})" if next_name else "DONE (report to the user)"
    context = (f"### Original requirement\n{requirement}\n\n### Latest output, from {last_role}\n{content}\n\n"
               f"### Next\n{nxt}")
    return f"\n## context\n{context}\n\n-----\n\n{TL_INSTRUCTIONS}"


class TLReview(Action):
    """One TL hop: review the last output, brief the next specialist (one LLM call)."""

    name: str = "TLReview"

    async def run(self, requirement: str, last: Message, next_name: str | None) -> str:
        return await self._aask(tl_prompt(requirement, last.role, last.content, next_name))


class TeamLeader(LabelledRole):
    name: str = TL_NAME
    profile: str = "Team Leader"
    goal: str = "deliver the user's requirement by routing work between specialists and reviewing every result"
    constraints: str = "keep the fixed order of specialists; review before forwarding; be brief"
    topas_stage: str = "tl1"
    topas_agent: str = "team_leader"
    topas_stages: list[str] = ["tl1", "tl2", "tl3", "tl4", "tl5"]
    topas_finished: bool = False
    requirement: str = ""
    reviews: list[str] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.set_actions([TLReview])
        self._watch(list(ROUTE))

    def _stage(self, hop: int) -> str:
        return self.topas_stages[hop - 1] if hop <= len(self.topas_stages) else f"tl{hop}"

    async def _act(self) -> Message:
        msg = self.rc.news[-1]
        hop, next_name, cause = ROUTE[msg.cause_by]
        if hop == 1:
            self.requirement = msg.content
        labelled = "task_id" in fields_in_force()
        with label(stage=self._stage(hop), agent=self.topas_agent) if labelled else contextlib.nullcontext():
            review = await self.rc.todo.run(self.requirement, msg, next_name)
        self.reviews.append(review)
        if next_name is None:
            self.topas_finished = True
            return Message(content=review, role=self.profile, cause_by=TLReview, sent_from=self, send_to="<none>")
        return Message(content=msg.content, role=self.profile, cause_by=cause, sent_from=self, send_to={next_name})


def wire_star(tl: TeamLeader, pm: Role, architect: Role, project_manager: Role, engineer: Role) -> None:
    """Narrow the specialists' watch lists so they only react to the TL (call after the
    roles are hired: `Environment.add_roles` resets addresses)."""
    never = [TLReview]  # nobody publishes TLReview to them: only messages addressed by name count
    pm._watch([PrepareDocuments])
    architect._watch(never)
    project_manager._watch(never)
    engineer._watch([SummarizeCode, WriteCode, WriteCodeReview, FixBug, WriteCodePlanAndChange])
    # the Engineer's final message is hard-coded to "Edward" (the QA engineer's name)
    tl.set_addresses({any_to_str(tl), tl.name, "Edward"})
