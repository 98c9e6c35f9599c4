"""Parsing and validating workflow definitions (YAML/JSON text or mappings), linear in their
size and bounded by `WorkflowLimits`; errors name the bad field (`stages[1] (code).agent`)."""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass
from typing import Any

import yaml

from .errors import WorkflowError
from .labels import text_problem
from .workflow_model import _SURROGATE, AgentSpec, IntRange, StageSpec, Workflow, _clip, _topo_sort

_STAGE_KEYS = {"name", "agent", "after", "requests", "input_tokens", "output_tokens", "tool_wait_s"}
_AGENT_KEYS = {"name", "prefix_tokens"}
_TOP_KEYS = {"name", "agents", "stages", "description", "rates", "loads"}


@dataclass(frozen=True, slots=True)
class WorkflowLimits:
    """Size limits on a workflow definition (docs/server.md "Limits"). They bound what one
    upload can cost the server (parse time, memory, sampled rounds per task) while leaving
    room far above any real workflow (MetaGPT's has 5-9 stages)."""

    max_stages: int = 10_000  # a 10k-stage chain or fan-out still loads in well under a second
    max_agents: int = 10_000  # one agent per stage at most
    max_edges: int = 100_000  # total `after` entries (a 10k fan-in is 10k edges)
    max_name_chars: int = 256  # names of the workflow, agents and stages (= the label field limit)
    max_description_chars: int = 4096
    max_requests: int = 1000  # rounds per stage: sample_task materialises every round
    max_tokens: int = 1_000_000  # input/output tokens per round and agent prefix tokens
    max_tool_wait_s: float = 3600.0
    max_loads: int = 64  # entries of `loads` / `rates`
    max_load: float = 1000.0  # largest load or rate value
    max_depth: int = 32  # YAML/JSON nesting: libyaml's composer recurses and would crash deeper


DEFAULT_LIMITS = WorkflowLimits()


def _int_range(value: Any, where: str, *, minimum: int, maximum: int) -> IntRange:
    if isinstance(value, bool):
        raise WorkflowError(f"{where}: expected an integer or [lo, hi], got {_show(value)}")
    if isinstance(value, int):
        lo = hi = value
    elif (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        lo, hi = value
    else:
        raise WorkflowError(f"{where}: expected an integer or [lo, hi], got {_show(value)}")
    if lo < minimum or hi < lo or hi > maximum:
        raise WorkflowError(f"{where}: need {minimum} <= lo <= hi <= {maximum}, got {_show(value)}")
    return IntRange(lo, hi)


def _show(value: Any) -> str:
    """A short repr for error messages: user input is never echoed at length."""
    try:  # reprlib: bounded even for an alias-bomb list that repr would expand
        return _clip(reprlib.repr(value))
    except (ValueError, RecursionError):  # a > 4300-digit int, a deeply nested list
        return f"an unprintable {type(value).__name__}"


def _name(value: Any, where: str, limit: int = DEFAULT_LIMITS.max_name_chars) -> str:
    if not isinstance(value, str) or not value.strip():
        raise WorkflowError(f"{where}: expected a non-empty string, got {_show(value)}")
    if len(value) > limit:
        raise WorkflowError(f"{where}: longer than {limit} characters")
    problem = text_problem(value)  # labels name it: the same rules as a label's text
    if problem is not None:
        raise WorkflowError(f"{where}: {problem}")
    return value


def _check_keys(obj: Any, allowed: set[str], required: set[str], where: str) -> dict:
    if not isinstance(obj, dict):
        raise WorkflowError(f"{where}: expected a mapping, got {type(obj).__name__}")
    # YAML keys may be non-strings (`1: x`); compare as text so sorting never fails.
    unknown = sorted(_clip(str(k)) for k in obj if k not in allowed)
    if unknown:
        raise WorkflowError(f"{where}: unknown field '{unknown[0]}'")
    missing = sorted(required - set(obj))
    if missing:
        raise WorkflowError(f"{where}: missing field '{missing[0]}'")
    return obj


def _first_duplicate(names: list[str]) -> str | None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            return n
        seen.add(n)
    return None


def _parse_agent(obj: Any, i: int, limits: WorkflowLimits) -> AgentSpec:
    where = f"agents[{i}]"
    obj = _check_keys(obj, _AGENT_KEYS, _AGENT_KEYS, where)
    name = _name(obj["name"], f"{where}.name", limits.max_name_chars)
    tokens = obj["prefix_tokens"]
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens <= limits.max_tokens:
        raise WorkflowError(f"{where}.prefix_tokens: expected an integer >= 0 and <= {limits.max_tokens}, "
                            f"got {_show(tokens)}")
    return AgentSpec(name, tokens)


def _after(obj: dict, where: str, limits: WorkflowLimits, edges_before: int = 0) -> tuple[str, ...]:
    """A stage's dependencies: a list of stage names, or one name. Only a missing `after` or
    null means none: `0`, `false`, `{}` or `""` are mistakes, not "no dependencies".
    `edges_before`: `after` entries of the stages before, so the total limit fires before
    this list is scanned (YAML aliases can repeat one 100k-name list on every stage)."""
    after = obj.get("after")
    if after is None:
        return ()
    if isinstance(after, str) and after:
        after = [after]
    if not isinstance(after, list):
        raise WorkflowError(f"{where}.after: expected a list of stage names, got {_show(after)}")
    if len(after) > limits.max_edges:
        raise WorkflowError(f"{where}.after: more than {limits.max_edges} entries")
    if edges_before + len(after) > limits.max_edges:
        raise WorkflowError(f"stages: more than {limits.max_edges} dependencies in all")
    if not all(isinstance(a, str) for a in after):
        raise WorkflowError(f"{where}.after: expected a list of stage names, got {_show(after)}")
    dup = _first_duplicate(after)
    if dup is not None:
        raise WorkflowError(f"{where}.after: stage '{_clip(dup)}' listed twice")
    return tuple(after)


class _StagesSoFar:
    """What the stages parsed so far constrain the next one by: their names (a duplicate is an
    error at once, before its `after` list is read) and their `after` entries in all."""

    __slots__ = ("names", "edges")

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.edges = 0


def _parse_stage(obj: Any, i: int, agents: set[str] | frozenset[str], limits: WorkflowLimits,
                 before: _StagesSoFar) -> StageSpec:
    where = f"stages[{i}]"
    obj = _check_keys(obj, _STAGE_KEYS, {"name", "agent", "input_tokens", "output_tokens"}, where)
    name = _name(obj["name"], f"{where}.name", limits.max_name_chars)
    if name in before.names:
        raise WorkflowError(f"stages: duplicate stage '{name}'")
    where = f"stages[{i}] ({name})"
    agent = _name(obj["agent"], f"{where}.agent", limits.max_name_chars)
    if agent not in agents:
        raise WorkflowError(f"{where}.agent: unknown agent '{agent}'")
    wait = obj.get("tool_wait_s", 0.0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not (0 <= wait <= limits.max_tool_wait_s):
        raise WorkflowError(f"{where}.tool_wait_s: expected a finite number >= 0 and <= {limits.max_tool_wait_s:g}, "
                            f"got {_show(wait)}")
    after = _after(obj, where, limits, before.edges)
    before.names.add(name)
    before.edges += len(after)
    return StageSpec(
        name=name,
        agent=agent,
        after=after,
        requests=_int_range(obj.get("requests", 1), f"{where}.requests", minimum=1, maximum=limits.max_requests),
        input_tokens=_int_range(obj["input_tokens"], f"{where}.input_tokens", minimum=1,
                                maximum=limits.max_tokens),
        output_tokens=_int_range(obj["output_tokens"], f"{where}.output_tokens", minimum=1,
                                 maximum=limits.max_tokens),
        tool_wait_s=float(wait),
    )


def parse_workflow(data: Any, source: str = "<workflow>", *, limits: WorkflowLimits = DEFAULT_LIMITS) -> Workflow:
    """Validate a workflow mapping (as loaded from YAML). Errors name the bad field.
    Linear in the size of the definition; `limits` bound that size."""
    try:
        return _parse_workflow(data, limits)
    except WorkflowError as exc:
        raise WorkflowError(f"{source}: {exc}") from None


def _bounded_list(data: dict, key: str, limit: int) -> list:
    value = data[key]
    if not isinstance(value, list) or not value:
        raise WorkflowError(f"{key}: expected a non-empty list")
    if len(value) > limit:
        raise WorkflowError(f"{key}: more than {limit} entries")
    return value


def _numbers(data: dict, key: str, default: Any, limits: WorkflowLimits) -> tuple[float, ...]:
    """`loads` / `rates`: a short non-empty list of positive numbers."""
    values = data.get(key, default)
    if not isinstance(values, list | tuple) or not values or len(values) > limits.max_loads or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and 0 < x <= limits.max_load for x in values
    ):
        raise WorkflowError(f"{key}: expected a non-empty list of positive numbers (at most {limits.max_loads}, "
                            f"each <= {limits.max_load:g}), got {_show(values)}")
    dup = _first_duplicate([float(x) for x in values])
    if dup is not None:  # a repeated point would be simulated twice and weigh twice in averages
        raise WorkflowError(f"{key}: {dup:g} listed twice")
    return tuple(float(x) for x in values)


def _check_deps(stages: tuple[StageSpec, ...]) -> None:
    """Every dependency names another stage (their total is bounded as they are read)."""
    names = {s.name for s in stages}
    for i, s in enumerate(stages):
        for dep in s.after:
            if dep not in names:
                raise WorkflowError(f"stages[{i}] ({s.name}).after: unknown stage '{_clip(dep)}'")
            if dep == s.name:
                raise WorkflowError(f"stages[{i}] ({s.name}).after: a stage cannot depend on itself")


def _parse_workflow(data: Any, limits: WorkflowLimits) -> Workflow:
    data = _check_keys(data, _TOP_KEYS, {"name", "agents", "stages"}, "workflow")
    name = _name(data["name"], "name", limits.max_name_chars)
    raw_agents = _bounded_list(data, "agents", limits.max_agents)
    raw_stages = _bounded_list(data, "stages", limits.max_stages)
    agents = tuple(_parse_agent(a, i, limits) for i, a in enumerate(raw_agents))
    agent_names = [a.name for a in agents]
    dup = _first_duplicate(agent_names)
    if dup is not None:
        raise WorkflowError(f"agents: duplicate agent '{dup}'")
    known = frozenset(agent_names)
    so_far = _StagesSoFar()  # duplicates and the edge total are caught as the stages are read
    stages = tuple(_parse_stage(s, i, known, limits, so_far) for i, s in enumerate(raw_stages))
    _check_deps(stages)
    order = _topo_sort(stages)  # raises on cycles
    loads = _numbers(data, "loads", (0.3, 0.6, 0.9), limits)
    if "rates" in data:  # validated, then read by nothing: refused rather than silently ignored
        raise WorkflowError("rates: not read by any command; give operating points as `loads:` "
                            "(fractions of capacity) or `topas bench --rate R1,R2`")
    desc = data.get("description", "")
    if not isinstance(desc, str):
        raise WorkflowError(f"description: expected a string, got {type(desc).__name__}")
    if len(desc) > limits.max_description_chars or _SURROGATE.search(desc):
        raise WorkflowError(f"description: longer than {limits.max_description_chars} characters "
                            "or not valid Unicode")
    wf = Workflow(name, agents, stages, loads, desc)
    wf.__dict__["topo_order"] = order  # cached_property's slot: computed once, here
    return wf


def load_yaml_data(text: str, limits: WorkflowLimits = DEFAULT_LIMITS) -> Any:
    """`yaml.safe_load` for untrusted text: nesting is checked on the event stream first (the C
    composer recurses without a guard and segfaults on deep nesting); WorkflowError on errors."""
    if text.lstrip()[:1] in ("{", "["):  # JSON (a subset of YAML) parses ~50x faster as JSON
        try:
            return json.loads(text, object_pairs_hook=unique_json_keys)
        except RecursionError:
            raise WorkflowError(f"nested deeper than {limits.max_depth} levels") from None
        except ValueError:  # flow-style YAML such as `{name: x}`, or a > 4300-digit integer
            pass
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # C: ~4x faster on big uploads
    try:
        _check_events(yaml.parse(text, Loader=loader), limits.max_depth)
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise WorkflowError(f"invalid YAML{yaml_error_detail(exc)}") from None
    except (RecursionError, ValueError) as exc:  # ValueError: an integer of > 4300 digits
        raise WorkflowError(f"invalid YAML: {_clip(str(exc))}") from None


def unique_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads hook: a repeated key is an error (JSON and YAML loaders keep the last one
    silently, so `name: a ... name: b` registered `b`). WorkflowError is a ValueError, so other
    JSON readers (trace lines) catch it as one."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise WorkflowError(f"duplicate key {_clip(repr(key))}")
        out[key] = value
    return out


class _Frame:
    """An open collection on the event stream: a mapping's keys so far, and whether its next
    node is a key."""

    __slots__ = ("keys", "expect_key")

    def __init__(self, is_mapping: bool) -> None:
        self.keys: set[str] | None = set() if is_mapping else None
        self.expect_key = is_mapping


def _check_events(events: Any, max_depth: int) -> None:
    """One pass over the YAML event stream, before anything is built: nesting depth, and no
    mapping with the same scalar key twice."""
    stack: list[_Frame] = []
    for event in events:
        if isinstance(event, yaml.NodeEvent) and stack and stack[-1].keys is not None:
            top = stack[-1]
            if top.expect_key and isinstance(event, yaml.ScalarEvent):
                if event.value in top.keys:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    raise WorkflowError(f"duplicate key {_clip(repr(event.value))} at line {line}")
                top.keys.add(event.value)
            top.expect_key = not top.expect_key
        if isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            stack.append(_Frame(isinstance(event, yaml.MappingStartEvent)))
            if len(stack) > max_depth:
                raise WorkflowError(f"nested deeper than {max_depth} levels")
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            stack.pop()


def yaml_error_detail(exc: yaml.YAMLError) -> str:
    """' at line N: problem' for a YAML parse error (one line, for user-facing messages)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark else ""
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # ReaderError spans lines
    return f"{where}: {_clip(problem)}"
