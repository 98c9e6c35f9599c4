"""One request in flight (`Call`, what the HTTP handler waits on) and its stats record."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from .api_errors import ApiError
from .tenancy import unqualify
from .tokens import pieces

if TYPE_CHECKING:
    from .openai_format import ToolCall

CallStatus = Literal["running", "ok", "cancelled", "failed"]


@dataclass(slots=True)
class CallRecord:
    """Per-call row of /v1/topas/stats: the label as the server saw and resolved it."""

    rid: str
    endpoint: str
    label: dict[str, Any] | None  # the label as sent (None: unlabelled)
    label_source: Literal["body", "headers", "none"]
    task_id: str
    stage: str
    agent: str
    workflow: str | None  # as labelled (registered or not)
    round: int
    prefix_tokens: int
    prefix_source: Literal["label", "workflow", "system", "unlabelled"]
    input_tokens: int
    output_tokens: int
    max_new_tokens: int
    arrival_s: float
    status: CallStatus = "running"
    first_token_s: float | None = None
    finish_s: float | None = None
    finish_reason: str | None = None
    tenant: str | None = None  # task_id and agent above are qualified with it (tenancy.py)

    @property
    def public_task_id(self) -> str:
        return unqualify(self.tenant, self.task_id)

    @property
    def public_agent(self) -> str:
        return unqualify(self.tenant, self.agent)

    def to_json(self) -> dict[str, Any]:
        """As the record's own tenant sees it (names unqualified, no tenant field). Built field
        by field: `dataclasses.asdict` (recursive deep copies) made a stats request with 10 000
        records take 0.3 s on the engine task, which froze serving meanwhile."""
        out = {name: getattr(self, name) for name in _PUBLIC_FIELDS}
        out.update(label=dict(self.label) if self.label is not None else None,
                   task_id=self.public_task_id, agent=self.public_agent)
        return out


_PUBLIC_FIELDS = tuple(f.name for f in fields(CallRecord) if f.name != "tenant")


class Call:
    """A submitted request: the response text, its simulated length and progress. A call
    answered with a tool call has `tool_call`, and `text` is its JSON arguments."""

    __slots__ = ("rid", "record", "text", "_pieces", "sim_tokens", "finish_reason", "tool_call", "generated",
                 "finished", "error", "changed")

    def __init__(self, rid: str, record: CallRecord, text: str, sim_tokens: int, finish_reason: str,
                 tool_call: ToolCall | None = None) -> None:
        self.rid = rid
        self.record = record
        self.text = text
        self._pieces = pieces(text)
        self.sim_tokens = sim_tokens
        self.finish_reason = finish_reason
        self.tool_call = tool_call
        self.generated = 0
        self.finished = False
        self.error: ApiError | None = None
        self.changed = asyncio.Event()

    @property
    def over(self) -> bool:
        return self.finished or self.error is not None

    def on_token(self, n_generated: int) -> None:
        self.generated = max(self.generated, min(n_generated, self.sim_tokens))
        self.changed.set()

    def on_finish(self) -> None:
        self.generated = self.sim_tokens
        self.finished = True
        self.changed.set()

    def fail(self, err: ApiError) -> None:
        if not self.over:
            self.error = err
            self.changed.set()

    def text_upto(self, n_generated: int) -> str:
        """The text delivered once `n_generated` of `sim_tokens` are decoded (proportional)."""
        m = len(self._pieces)
        k = m if n_generated >= self.sim_tokens else (n_generated * m) // self.sim_tokens
        return "".join(self._pieces[:k])

    async def wait_change(self, seen_generated: int) -> None:
        """Return once there is progress beyond `seen_generated`, a finish or a failure."""
        if self.over or self.generated != seen_generated:
            return
        self.changed.clear()
        await self.changed.wait()

    @property
    def usage(self) -> dict[str, int]:
        prompt = self.record.prefix_tokens + self.record.input_tokens
        return {"prompt_tokens": prompt, "completion_tokens": self.sim_tokens,
                "total_tokens": prompt + self.sim_tokens}
