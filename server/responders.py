"""Responders decide the TEXT of a simulated response (the engine decides its timing).

- `echo` (default): tool rules first (`DEFAULT_TOOL_RULES`): `tool_call` answers a chat
  request that offers `tools` with a call of one of them (the forced one, else the one the
  last user message names, else the first), its arguments filled from the JSON schema (see
  `tool_arguments`); `tool_result` answers text once a tool result follows the last user
  message, so agent loops end (tool_choice "auto"). Then a strategy table of text rules,
  first match wins (see `DEFAULT_ECHO_RULES`): `content_block` returns a prompt's MetaGPT format example (`[CONTENT]...[/CONTENT]`),
  `code` returns a fenced python program when code is asked for, `summary` echoes a short
  summary of the last user message. Extend it with `EchoResponder().with_rule(...)` and
  `register_responder(name, factory)`.
- `lorem`: lorem ipsum of the requested length (max_tokens, else the stage's output
  profile, else 64 tokens).
- `replay`: recorded responses from a JSONL file, matched by (stage, agent, round), else
  handed out in file order.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError
from .config import ServerConfig
from .openai_format import NO_TOOLS, ToolCall, ToolRequest
from .protocol import Message
from .tokens import truncate


@dataclass(frozen=True, slots=True)
class ResponseContext:
    kind: str  # "chat" | "completion"
    messages: tuple[Message, ...]
    last_user: str
    task_id: str
    stage: str
    agent: str
    round: int
    labelled: bool
    target_tokens: int | None  # length hint: max_tokens, else the stage profile, else None
    tools: ToolRequest = NO_TOOLS  # the chat request's `tools` and `tool_choice`

    @property
    def full_text(self) -> str:
        return "\n".join(m.content for m in self.messages)

    @property
    def tool_results(self) -> tuple[str, ...]:
        """Tool (or legacy function) results after the last user message."""
        out: list[str] = []
        for m in reversed(self.messages):
            if m.role == "user":
                break
            if m.role in ("tool", "function"):
                out.append(m.content)
        return tuple(reversed(out))


# A responder answers text, or (chat requests that offer tools) a call of one of them.
Reply = str | ToolCall


class Responder(Protocol):
    name: str

    def respond(self, ctx: ResponseContext) -> Reply: ...


EchoRule = Callable[[ResponseContext], "Reply | None"]

# ---------------------------------------------------------------------------- tool arguments

# Bounds on the placeholder arguments: a schema is client input, and recursive `$ref`s or a
# huge `minItems`/`minLength` must not make the reply (or the work) large.
MAX_SCHEMA_DEPTH = 12
MAX_SCHEMA_NODES = 2000
MAX_ARRAY_ITEMS = 4
MAX_STRING_CHARS = 256
_FORMAT_EXAMPLES = {"date-time": "1970-01-01T00:00:00Z", "date": "1970-01-01", "time": "00:00:00",
                    "email": "user@example.com", "uri": "https://example.com", "uuid": "00000000-0000-0000-0000-000000000000"}


def _finite(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _plain_json(value: Any) -> bool:
    """A literal from the schema (const, enum, default) that serializes as strict JSON."""
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


class _SchemaFiller:
    """A JSON value for a JSON schema: required properties only, type-appropriate
    placeholders; total (never raises on any JSON input), bounded by the limits above."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.budget = MAX_SCHEMA_NODES

    def value(self, schema: Any, depth: int = 0) -> Any:
        if not isinstance(schema, Mapping) or depth > MAX_SCHEMA_DEPTH or self.budget <= 0:
            return None
        self.budget -= 1
        for key in ("const", "default"):
            if key in schema and _plain_json(schema[key]):
                return schema[key]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and _plain_json(enum[0]):
            return enum[0]
        if isinstance(schema.get("$ref"), str):
            return self.value(self._resolve(schema["$ref"]), depth + 1)
        for key in ("anyOf", "oneOf", "allOf"):
            found = schema.get(key)
            subs = [x for x in found if isinstance(x, Mapping)] if isinstance(found, list) else []
            if subs:  # the first alternative that is not null (allOf: its first part)
                return self.value(next((x for x in subs if x.get("type") != "null"), subs[0]), depth + 1)
        return self._typed(schema, self._type(schema), depth)

    def _resolve(self, ref: str) -> Any:
        """A local reference (`#/$defs/X`, `#/definitions/X`); anything else is unknown."""
        if not ref.startswith("#"):
            return None
        node: Any = self.root
        for part in (p for p in ref[1:].split("/") if p):
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, Mapping) else None
        return node

    @staticmethod
    def _type(schema: Mapping[str, Any]) -> str | None:
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if isinstance(k, str) and k != "null"), "null" if kind else None)
        if isinstance(kind, str):
            return kind
        return "object" if "properties" in schema else "array" if "items" in schema else None

    def _typed(self, schema: Mapping[str, Any], kind: str | None, depth: int) -> Any:
        if kind == "object":
            props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
            required = schema.get("required") if isinstance(schema.get("required"), list) else []
            return {name: self.value(props.get(name, {}), depth + 1) for name in required if isinstance(name, str)}
        if kind == "array":
            n = min(int(_finite(schema.get("minItems")) or 0), MAX_ARRAY_ITEMS)
            return [self.value(schema.get("items", {}), depth + 1) for _ in range(max(0, n))]
        if kind == "string":
            text = _FORMAT_EXAMPLES.get(str(schema.get("format")), "example")
            shortest = min(int(_finite(schema.get("minLength")) or 0), MAX_STRING_CHARS)
            longest = _finite(schema.get("maxLength"))
            text = text.ljust(shortest, "x")
            return text[: max(0, int(longest))] if longest is not None and longest < len(text) else text
        if kind in ("integer", "number"):
            return self._number(schema, kind == "integer")
        return False if kind == "boolean" else None

    @staticmethod
    def _number(schema: Mapping[str, Any], integer: bool) -> int | float:
        """0 moved into [minimum, maximum] (exclusive bounds moved by 1)."""
        lo, hi = _finite(schema.get("minimum")), _finite(schema.get("maximum"))
        if _finite(schema.get("exclusiveMinimum")) is not None:
            lo = _finite(schema["exclusiveMinimum"]) + 1
        if _finite(schema.get("exclusiveMaximum")) is not None:
            hi = _finite(schema["exclusiveMaximum"]) - 1
        x = 0.0
        if lo is not None and x < lo:
            x = float(math.ceil(lo)) if integer else lo
        elif hi is not None and x > hi:
            x = float(math.floor(hi)) if integer else hi
        return int(x) if integer else x


def tool_arguments(parameters: Mapping[str, Any]) -> str:
    """The JSON text of placeholder arguments for a function's `parameters` schema: always a
    JSON object (the OpenAI contract), `{}` when the schema describes something else."""
    value = _SchemaFiller(parameters).value(parameters)
    return json.dumps(value if isinstance(value, dict) else {}, separators=(", ", ": "))


# ---------------------------------------------------------------------------- echo rules

_FORMAT_EXAMPLE = re.compile(r"##\s*format example\s*\n\s*\[CONTENT\](.*?)\[/CONTENT\]", re.S | re.I)
_ANY_BLOCK = re.compile(r"\[CONTENT\](.*?)\[/CONTENT\]", re.S)
_CODE_ASK = re.compile(r"```python|\bwrite\s+(?:the\s+)?code\b", re.I)
_CODE_FILE = re.compile(r"##\s*Code:\s*([\w./-]+\.py)")

SAMPLE_PROGRAM = '''\
def main() -> None:
    """Entry point of the generated program."""
    print("hello from the topas simulated engine")


if __name__ == "__main__":
    main()
'''


_TOOL_WORD = re.compile(r"[\w-]+")  # what a function name can be (openai_format.TOOL_NAME)


def tool_call_rule(ctx: ResponseContext) -> ToolCall | None:
    """Call a tool when the request offers some, unless (tool_choice "auto") a tool result
    already answers the last user message. "required" and a forced function always call."""
    req = ctx.tools
    if ctx.kind != "chat" or not req.wanted or (req.choice.mode == "auto" and ctx.tool_results):
        return None
    spec = req.spec(req.choice.name) if req.choice.mode == "function" and req.choice.name else None
    if spec is None:  # one pass over the message, whatever the number of tools
        words = set(_TOOL_WORD.findall(ctx.last_user.lower()))
        spec = next((t for t in req.tools if t.name.lower() in words), req.tools[0])
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", spec.name, tool_arguments(spec.parameters))


def tool_result_rule(ctx: ResponseContext) -> str | None:
    """After a tool result: a plain answer quoting it (the agent's loop then ends)."""
    if not ctx.tool_results:
        return None
    return f"Echo: tool result: {_summary(ctx.tool_results[-1])}"


def content_block_rule(ctx: ResponseContext) -> str | None:
    """MetaGPT ActionNode prompts: '## format example\\n[CONTENT]\\n{json}\\n[/CONTENT]'."""
    for text in (ctx.last_user, ctx.full_text):
        found = _FORMAT_EXAMPLE.findall(text) or _ANY_BLOCK.findall(text)
        if found:
            return f"[CONTENT]\n{found[-1].strip()}\n[/CONTENT]"
    return None


def code_rule(ctx: ResponseContext) -> str | None:
    text = ctx.full_text
    if not _CODE_ASK.search(text):
        return None
    files = _CODE_FILE.findall(text)
    header = f"# {files[-1]}\n" if files else ""
    return f"```python\n{header}{SAMPLE_PROGRAM}```\n"


def _summary(text: str, max_words: int = 30, max_word_chars: int = 40) -> str:
    words = text.split(maxsplit=max_words)
    shown = [w if len(w) <= max_word_chars else w[:max_word_chars] + "..." for w in words[:max_words]]
    return " ".join(shown) + (" ..." if len(words) > max_words else "")


def summary_rule(ctx: ResponseContext, max_words: int = 30, max_word_chars: int = 40) -> str:
    summary = _summary(ctx.last_user, max_words, max_word_chars)
    return f"Echo: {summary}" if summary else "Echo: (empty prompt)"


# MetaGPT 0.8.2 prompts that are not ActionNode ones (added by the MetaGPT integration;
# each answer is the minimal reply MetaGPT's parser accepts, see docs/integrations.md).
_MG_REVIEW = "ONLY ANSWER LGTM/LBTM"  # WriteCodeReview's instruction (not in its rewrite prompt)
_MG_IS_PASS = "otherwise, answer 'YES'"  # Engineer._is_pass
_MG_SUMMARIZE = "## Code Review All: Please read all historical files"  # SummarizeCode
_MG_RUN_CODE = "NoOne OR Engineer OR QaEngineer"  # RunCode's summary of a test run
_MG_THINK = "Just answer a number between 0-"  # Role._think with several actions


def metagpt_rule(ctx: ResponseContext) -> str | None:
    text = ctx.full_text
    if _MG_REVIEW in text:
        files = re.findall(r"## Code to be Reviewed:\s*(\S+)", text)
        name = files[-1] if files else "the file"
        return (f"## Code Review: {name}\n1. Yes.\n2. Yes.\n3. Yes.\n4. Yes.\n5. Yes.\n6. Yes.\n\n"
                "## Actions\npass\n\n## Code Review Result\nLGTM")
    if _MG_IS_PASS in text:
        return "YES"
    if _MG_SUMMARIZE in text:
        return "## Code Review All\nNo bugs found.\n\n## Summary\nAll files are implemented.\n\n## TODOs\n{}"
    if _MG_RUN_CODE in text:
        return ("---\n## instruction:\nNo errors.\n## File To Rewrite:\nNone\n## Status:\nPASS\n"
                "## Send To:\nNoOne\n---")
    if _MG_THINK in text:
        return "0"
    return None


# Consulted before the text rules; they pass (None) on requests without tools or tool results.
DEFAULT_TOOL_RULES: tuple[tuple[str, EchoRule], ...] = (
    ("tool_call", tool_call_rule),
    ("tool_result", tool_result_rule),
)
DEFAULT_ECHO_RULES: tuple[tuple[str, EchoRule], ...] = (
    ("content_block", content_block_rule),
    ("metagpt", metagpt_rule),
    ("code", code_rule),
    ("summary", summary_rule),
)


class EchoResponder:
    name = "echo"

    def __init__(self, rules: tuple[tuple[str, EchoRule], ...] = DEFAULT_ECHO_RULES,
                 tool_rules: tuple[tuple[str, EchoRule], ...] = DEFAULT_TOOL_RULES) -> None:
        self.rules = rules
        self.tool_rules = tool_rules

    def with_rule(self, name: str, rule: EchoRule, before: str | None = None) -> EchoResponder:
        """A new EchoResponder with `rule` inserted before rule `before` (None: appended
        before the final catch-all). Rules return None to pass."""
        names = [n for n, _ in self.rules]
        at = names.index(before) if before in names else max(0, len(self.rules) - 1)
        return EchoResponder(self.rules[:at] + ((name, rule),) + self.rules[at:], self.tool_rules)

    def respond(self, ctx: ResponseContext) -> Reply:
        for _, rule in (*self.tool_rules, *self.rules):
            out = rule(ctx)
            if out is not None:
                return out
        return ""


# ---------------------------------------------------------------------------- lorem

_LOREM = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do",
          "eiusmod", "tempor", "incididunt", "ut", "labore", "et", "dolore", "magna", "aliqua")


class LoremResponder:
    name = "lorem"

    def __init__(self, default_tokens: int = 64) -> None:
        self.default_tokens = default_tokens

    def respond(self, ctx: ResponseContext) -> str:
        target = ctx.target_tokens or self.default_tokens
        # every word is at least one token, so `target` words always suffice
        words = [_LOREM[(ctx.round + k) % len(_LOREM)] for k in range(target)]
        return truncate(" ".join(words), target)


# ---------------------------------------------------------------------------- replay


class ReplayResponder:
    """Lines: {"content": str, "stage"?: str, "agent"?: str, "round"?: int}. A call takes
    the next unused record with its (stage, agent, round), else the next in file order;
    both cycle when exhausted."""

    name = "replay"

    def __init__(self, records: list[dict]) -> None:
        if not records:
            raise ConfigError("replay file has no records")
        self.records = records
        self._by_key: dict[tuple, list[int]] = {}
        for i, r in enumerate(records):
            self._by_key.setdefault((r.get("stage"), r.get("agent"), r.get("round")), []).append(i)
        self._key_pos: dict[tuple, int] = {}
        self._pos = 0

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayResponder:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"replay file not found: {path}")
        records = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n}: invalid JSON: {exc.msg}") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("content"), str):
                raise ConfigError(f"{path}:{n}: each line needs a string 'content'")
            if rec.get("round") is not None and (isinstance(rec["round"], bool) or not isinstance(rec["round"], int)):
                raise ConfigError(f"{path}:{n}: 'round' must be an integer")
            records.append(rec)
        return cls(records)

    def respond(self, ctx: ResponseContext) -> str:
        key = (ctx.stage, ctx.agent, ctx.round)
        if key in self._by_key:
            idx = self._by_key[key]
            pos = self._key_pos.get(key, 0)
            self._key_pos[key] = pos + 1
            return self.records[idx[pos % len(idx)]]["content"]
        rec = self.records[self._pos % len(self.records)]
        self._pos += 1
        return rec["content"]


# ---------------------------------------------------------------------------- registry

ResponderFactory = Callable[[ServerConfig], Responder]

_RESPONDERS: dict[str, ResponderFactory] = {
    "echo": lambda cfg: EchoResponder(),
    "lorem": lambda cfg: LoremResponder(),
    "replay": lambda cfg: ReplayResponder.from_file(cfg.replay_file or ""),
}


def available_responders() -> tuple[str, ...]:
    return tuple(_RESPONDERS)


def register_responder(name: str, factory: ResponderFactory) -> None:
    """Make `--responder NAME` build `factory(config)` (integrations add their own)."""
    _RESPONDERS[name] = factory


def make_responder(config: ServerConfig) -> Responder:
    if config.responder not in _RESPONDERS:
        raise ConfigError(f"unknown responder '{config.responder}' (known: {', '.join(_RESPONDERS)})")
    return _RESPONDERS[config.responder](config)
