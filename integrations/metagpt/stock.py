"""`enable(...)`: label a stock MetaGPT 0.8.2 script with one call.

    from metagpt.roles import Architect, Engineer, ProductManager, ProjectManager
    from metagpt.team import Team
    from topas_agents.integrations.metagpt import enable

    with enable(base_url="http://127.0.0.1:8000/v1"):       # or: handle = enable(...); handle.disable()
        team = Team()                                         # build roles AFTER enable (they make
        team.hire([ProductManager(), Architect(), ProjectManager(), Engineer()])   # their LLM then)
        asyncio.run(team.run(n_round=5, idea="Create a 2048 game"))

While enabled, every LLM call a role makes carries a label: **agent** from the role's class
(`ProductManager` -> `product_manager`), **stage** from the action the role is working on
(`role.rc.todo`: `WritePRD` -> `write_prd`; the Engineer's review/summary actions count as
`write_code`, the QA actions as `qa`: the built-in `metagpt-sop` names), **task** a fresh id
per `Team.run` (`<task_prefix>-<hex>`), closed on the server when the run ends (task-done
call). A task scope set by the caller (`task(...)`, `label(task_id=...)`) is used instead and
left to the caller to close. Labels set explicitly (our labelled roles, `label(stage=...)`)
win over the derived ones.

What it changes, all undone by `disable()` / leaving the `with` block (never at import):
* MetaGPT's provider registry builds `StockTopasLLM` (our labelling provider, static prefix
  first) for `api_type: openai`, and with `base_url` for every api_type, pointed at `base_url`
  (so `~/.metagpt/config2.yaml` cannot redirect the calls);
* `Role.run` records which role is running (a contextvar; nothing else changes);
* `Team.run` runs inside the task scope and sends the task-done call.
Only one `enable` at a time. Needs MetaGPT imported (a stock script imports it first, or call
`prepare_metagpt(root)`).
"""

from __future__ import annotations

from .environment import require_prepared

require_prepared(__name__)  # before any metagpt import
# ruff: noqa: E402

import contextvars
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any

from metagpt.configs.llm_config import LLMConfig, LLMType
from metagpt.roles.role import Role
from metagpt.team import Team

from topas_agents.cli.args import check_api_key
from topas_agents.errors import ConfigError, LabelError
from topas_agents.integrations.task import aclose_task, fields_in_force, new_task_id
from topas_agents.labels import Label, check_label_text, current_label, label, label_from_mapping

from .config_file import check_base_url, check_model
from .provider import ProviderOptions, TopasOpenAILLM, register_llm

if TYPE_CHECKING:
    from .recorder import CallRecorder

# Action class -> stage where snake_case(class name) is not the built-in workflows' name.
STAGE_ALIASES: Mapping[str, str] = MappingProxyType({
    "WriteCodeReview": "write_code", "SummarizeCode": "write_code", "WriteCodePlanAndChange": "write_code",
    "FixBug": "write_code", "WriteTest": "qa", "RunCode": "qa", "DebugError": "qa",
})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake(name: str) -> str:
    """`WritePRD` -> `write_prd`, `QaEngineer` -> `qa_engineer`."""
    return _CAMEL.sub("_", name).lower()


@dataclass(frozen=True, slots=True)
class StockNames:
    """How roles and actions are named in labels (class name -> name; default snake_case)."""

    stages: Mapping[str, str] = field(default_factory=lambda: STAGE_ALIASES)
    agents: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Checked here, not at a role's first call: an int stage was refused by the server
        # only mid-run, and a newline in an agent name broke the call's headers.
        for kind, field_name, names in (("stages", "stage", self.stages), ("agents", "agent", self.agents)):
            if not isinstance(names, Mapping):
                raise ConfigError(f"StockNames.{kind} must be a mapping of class name -> name, got {type(names).__name__}")
            for cls, name in names.items():
                try:
                    check_label_text(field_name, name)
                except LabelError as exc:
                    raise ConfigError(f"StockNames.{kind}[{cls!r}]: {exc}") from None

    def agent_of(self, role: Any) -> str:
        cls = type(role).__name__
        return self.agents.get(cls) or snake(cls)

    def stage_of(self, role: Any) -> str:
        """The stage of the action the role works on now (its first action before it has
        picked one, e.g. while `_think` asks the LLM which action to take)."""
        action = role.rc.todo or (role.actions[0] if role.actions else None)
        if action is None:
            return self.agent_of(role)
        cls = type(action).__name__
        return self.stages.get(cls) or snake(cls)


_ROLE: contextvars.ContextVar[Any] = contextvars.ContextVar("topas_mg_stock_role", default=None)
_ACTIVE: list[Enabled] = []  # at most one


class StockTopasLLM(TopasOpenAILLM):
    """The labelling provider whose label falls back to the running stock role."""

    topas_names: StockNames = StockNames()

    def topas_label(self) -> Label | None:
        lab = current_label()
        if lab is not None:  # explicit labels win
            return lab
        role, fields = _ROLE.get(), fields_in_force()
        if role is None or "task_id" not in fields:
            return None  # not inside a task, or not made by a role: unlabelled
        names = self.topas_names
        return label_from_mapping({**fields, "stage": names.stage_of(role), "agent": names.agent_of(role)})


@dataclass(frozen=True, slots=True)
class StockOptions:
    base_url: str | None = None  # None: keep each role's configured endpoint
    model: str | None = None
    api_key: str | None = None
    workflow: str | None = None  # sent in labels; must be registered with the server if it checks
    task_prefix: str = "metagpt"
    close_tasks: bool = True  # send the task-done call when a Team.run ends
    provider: ProviderOptions = ProviderOptions()
    names: StockNames = field(default_factory=StockNames)


class Enabled:
    """The active hooks; `disable()` (or leaving the `with` block) restores MetaGPT."""

    def __init__(self, options: StockOptions, recorder: CallRecorder | None) -> None:
        self.options = options
        self.recorder = recorder
        self.task_ids: list[str] = []  # the ids started by Team.run, in order
        self._undo: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ install / undo
    def _install(self) -> None:
        self._patch_registry()
        self._patch_method(Role, "run", _role_run)
        self._patch_method(Team, "run", _team_run(self))

    def _patch_method(self, cls: type, name: str, make: Callable[[Any], Any]) -> None:
        original = cls.__dict__[name]
        setattr(cls, name, make(original))
        self._undo.append(lambda: setattr(cls, name, original))

    def _patch_registry(self) -> None:
        keys = list(LLMType) if self.options.base_url else [LLMType.OPENAI]
        self._undo.append(register_llm(self._make_llm, keys))

    def _make_llm(self, config: LLMConfig) -> StockTopasLLM:
        o = self.options
        update = {"api_type": LLMType.OPENAI, "base_url": o.base_url, "model": o.model, "api_key": o.api_key}
        config = config.model_copy(update={k: v for k, v in update.items() if v is not None})
        llm = StockTopasLLM(config, o.provider, self.recorder)
        llm.topas_names = o.names
        return llm

    def disable(self) -> None:
        while self._undo:
            self._undo.pop()()
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def __enter__(self) -> Enabled:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.disable()


def _role_run(original: Callable[..., Any]) -> Callable[..., Any]:
    async def run(self: Any, with_message: Any = None) -> Any:
        token = _ROLE.set(self)  # read by StockTopasLLM when this role's actions call the LLM
        try:
            return await original(self, with_message)
        finally:
            _ROLE.reset(token)

    return run


def _team_run(hooks: Enabled) -> Callable[[Any], Any]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if "task_id" in fields_in_force():  # the caller's task scope: theirs to close
                return await original(self, *args, **kwargs)
            o = hooks.options
            task_id = new_task_id(o.task_prefix)
            hooks.task_ids.append(task_id)
            try:
                with label(task_id=task_id, workflow=o.workflow):
                    return await original(self, *args, **kwargs)
            finally:
                if o.close_tasks:  # to the endpoint, and with the key, that the roles' calls use
                    llm = self.env.context.config.llm
                    await aclose_task(o.base_url or llm.base_url, task_id, o.api_key or llm.api_key)

        return run

    return make


def enable(base_url: str | None = None, *, model: str | None = None, api_key: str | None = None,
           workflow: str | None = None, task_prefix: str = "metagpt", close_tasks: bool = True,
           restructure: bool = True, send_max_tokens: bool = True, recorder: CallRecorder | None = None,
           names: StockNames | None = None) -> Enabled:
    """Label stock MetaGPT roles and teams until `disable()` (see module doc)."""
    if _ACTIVE:
        raise ConfigError("topas MetaGPT labelling is already enabled: disable() it first")
    _check_enable_args(base_url, model, api_key, workflow, task_prefix, names)
    provider = ProviderOptions(restructure=restructure, send_max_tokens=send_max_tokens)
    options = StockOptions(base_url=base_url, model=model, api_key=api_key, workflow=workflow,
                           task_prefix=task_prefix, close_tasks=close_tasks, provider=provider,
                           names=names or StockNames())
    hooks = Enabled(options, recorder)
    try:
        hooks._install()
    except Exception:
        hooks.disable()
        raise
    _ACTIVE.append(hooks)
    return hooks


def _check_enable_args(base_url: Any, model: Any, api_key: Any, workflow: Any, task_prefix: Any,
                       names: Any) -> None:
    """What `enable` is given, checked now: each of these was accepted and failed only at
    `Team.run`, or when its task-done call went out."""
    if base_url is not None:
        check_base_url(base_url, "base_url")
    if model is not None:
        check_model(model)
    if api_key is not None:
        check_api_key(api_key)
    try:
        if workflow is not None:
            check_label_text("workflow", workflow)
        check_label_text("task_id", task_prefix)  # task ids are f"{task_prefix}-{hex}"
    except LabelError as exc:
        raise ConfigError(f"enable(): {exc}") from None
    if names is not None and not isinstance(names, StockNames):
        raise ConfigError(f"enable(names=...) must be a StockNames, got {type(names).__name__}")
