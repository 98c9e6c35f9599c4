"""Responders decide the TEXT of a simulated response (the engine decides its timing).

- `echo` (default): tool rules first (`DEFAULT_TOOL_RULES`): `tool_call` answers a chat
  request that offers `tools` with a call of one of them (the forced one, else the one the
  last user message names, else the first), its arguments filled from the JSON schema (see
  `schema_fill.tool_arguments`); `tool_result` answers text once a tool result follows the last user
  message, so agent loops end (tool_choice "auto"); between them `structured_output` answers
  a `response_format` of `json_schema` with a value of the schema (`schema_fill.schema_value`)
  and `json_object` with `{"echo": <summary>}`. Then a strategy table of text rules,
  first match wins (see `DEFAULT_ECHO_RULES`): `content_block` returns a prompt's MetaGPT format example (`[CONTENT]...[/CONTENT]`),
  `code` returns a fenced python program when code is asked for, `summary` echoes a short
  summary of the last user message. Extend it with `EchoResponder().with_rule(...)` and
  `register_responder(name, factory)`.
- `lorem`: lorem ipsum of the requested length (max_tokens, else the stage's output
  profile, else 64 tokens); JSON as `structured_output` answers it when JSON is asked for,
  and a tool call as `tool_call` makes it when `tool_choice` forces one ("required" or a
  named function: an agent loop that forces a call breaks on text).
- `replay`: recorded responses from a JSONL file, matched by (stage, agent, round), else
  handed out in file order.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import ConfigError
from .config import ServerConfig
from .openai_format import NO_TOOLS, TEXT_FORMAT, ResponseFormat, ToolCall, ToolRequest
from .protocol import Message
from .schema_fill import schema_value, tool_arguments
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
    response_format: ResponseFormat = TEXT_FORMAT  # the request's `response_format`

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

# ---------------------------------------------------------------------------- echo rules

# `[CONTENT]...[/CONTENT]` blocks are found with one forward scan (`_last_block`), not with
# `\[CONTENT\](.*?)\[/CONTENT\]`: that regex retries from every opener without a closer,
# quadratic in the prompt (a 1 MB prompt of unclosed openers held the event loop ~19 s).
_OPEN = "[CONTENT]"
_CLOSE = "[/CONTENT]"
_OPEN_ANY_CASE = re.compile(re.escape(_OPEN), re.I)
_CLOSE_ANY_CASE = re.compile(re.escape(_CLOSE), re.I)
# The header alone: its trailing whitespace run is checked by `_WHITESPACE` (a `\s*\n\s*`
# in the regex backtracked quadratically over a long run of blank lines).
_FORMAT_HEADER = re.compile(r"##\s*format example", re.I)
_WHITESPACE = re.compile(r"\s*")
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


def structured_output_rule(ctx: ResponseContext) -> str | None:
    """JSON when the request's `response_format` asks for it (a client then parses the reply,
    as `client.beta.chat.completions.parse` does): a value of the `json_schema`, or for
    `json_object` an object with a summary of what it answers. Before `tool_result`, since
    the answer after a tool result must be in the format too."""
    fmt = ctx.response_format
    if fmt.kind == "json_schema":
        return schema_value(fmt.schema)
    if fmt.kind == "json_object":
        return json.dumps({"echo": _summary(ctx.tool_results[-1] if ctx.tool_results else ctx.last_user)})
    return None


def tool_result_rule(ctx: ResponseContext) -> str | None:
    """After a tool result: a plain answer quoting it (the agent's loop then ends)."""
    if not ctx.tool_results:
        return None
    return f"Echo: tool result: {_summary(ctx.tool_results[-1])}"


def _last_block(text: str) -> str | None:
    """The body of the last `[CONTENT]...[/CONTENT]` block, blocks taken left to right
    without overlap (what `re.findall(r"\\[CONTENT\\](.*?)\\[/CONTENT\\]", text, re.S)[-1]`
    gives), in linear time: once an opener has no closer after it, no later one has."""
    found, pos = None, 0
    while (start := text.find(_OPEN, pos)) >= 0:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        found, pos = text[start + len(_OPEN):end], end + len(_CLOSE)
    return found


def _example_opener(text: str, header_end: int) -> int | None:
    """Where the block after a format-example header starts: the header, whitespace holding a
    newline, then `[CONTENT]` (any case); None when the header has no block."""
    run_end = _WHITESPACE.match(text, header_end).end()
    if text.find("\n", header_end, run_end) < 0:
        return None
    opener = _OPEN_ANY_CASE.match(text, run_end)
    return opener.end() if opener else None


def _last_format_example(text: str) -> str | None:
    """The body of the last '## format example\\n[CONTENT]...[/CONTENT]' (case-insensitive),
    matches taken left to right without overlap, in linear time."""
    found, pos = None, 0
    while (header := _FORMAT_HEADER.search(text, pos)) is not None:
        body_start = _example_opener(text, header.end())
        if body_start is None:
            pos = header.start() + 1
            continue
        closer = _CLOSE_ANY_CASE.search(text, body_start)
        if closer is None:  # no later header's block can close either
            break
        found, pos = text[body_start:closer.start()], closer.end()
    return found


def content_block_rule(ctx: ResponseContext) -> str | None:
    """MetaGPT ActionNode prompts: '## format example\\n[CONTENT]\\n{json}\\n[/CONTENT]'."""
    for text in (ctx.last_user, ctx.full_text):
        found = _last_format_example(text)
        if found is None:
            found = _last_block(text)
        if found is not None:
            return f"[CONTENT]\n{found.strip()}\n[/CONTENT]"
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


# Consulted before the text rules: what the request's protocol asks for (a tool call, a JSON
# format); they pass (None) on requests without tools, tool results or a JSON response_format.
DEFAULT_TOOL_RULES: tuple[tuple[str, EchoRule], ...] = (
    ("tool_call", tool_call_rule),
    ("structured_output", structured_output_rule),
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

    def respond(self, ctx: ResponseContext) -> Reply:
        if ctx.tools.wanted and ctx.tools.choice.mode != "auto":  # a forced call: the agent loop expects one
            forced = tool_call_rule(ctx)
            if forced is not None:
                return forced
        structured = structured_output_rule(ctx)
        if structured is not None:  # a client that asked for JSON parses the reply
            return structured
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
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:  # a directory, unreadable, not UTF-8
            raise ConfigError(f"cannot read replay file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n}: invalid JSON: {exc.msg}") from None
            except (ValueError, RecursionError):  # a > 4300-digit integer, deep nesting (a traceback before)
                raise ConfigError(f"{path}:{n}: invalid JSON: too deeply nested or a number too long") from None
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
