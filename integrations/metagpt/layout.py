"""Per-agent static prefix first: move each prompt's static text in front of its context.

MetaGPT 0.8.2 sends `[system: role prefix, user: prompt]`, and most prompts put their large
static part (ActionNode format example, node instructions, constraints; code-review
examples; checklists) AFTER the dynamic context, so no two calls share more than the short
role prefix. `restructure` rewrites a call to

    system: <role prefix>\\n\\n<the action's static text>      # identical across tasks
    user:   <the dynamic context, in its original order>

by matching the known MetaGPT templates (`SPLITTERS`, first match wins). Blocks are only
moved, never reworded, except that a filename inside an otherwise static block is replaced
by `<FILENAME>` and named in the user message. Unknown prompts are left as they are.

`static_prefix_tokens` counts the leading system messages with the embedded server's own
approximate tokenizer (`topas_agents.server.tokens`), so the label's `prefix_tokens`
matches what the server would estimate from the system messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from topas_agents.server.tokens import message_tokens

Messages = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Split:
    static: str
    dynamic: str


@dataclass(frozen=True, slots=True)
class Shaped:
    messages: Messages
    template: str | None  # the splitter that matched (None: unchanged)
    prefix_tokens: int


Splitter = Callable[[str], "Split | None"]

_SEP = "\n\n-----\n\n## "


def context_first(text: str) -> Split | None:
    """ActionNode SIMPLE_TEMPLATE (WritePRD, WriteDesign, WriteTasks, ...) and the project's
    TeamLeader: `## context\\n<ctx>\\n\\n-----\\n\\n## format example ...` -> static tail."""
    body = text.lstrip("\n")
    if not body.startswith("## context\n"):
        return None
    cut = body.rfind(_SEP)
    if cut < 0:
        return None
    return Split(static=body[cut + len("\n\n-----\n\n"):], dynamic=body[:cut] + "\n")


_WRITE_CODE = re.compile(
    r"(?s)^(?P<s0>\nNOTICE\nRole: You are a professional engineer; the main goal is to write .*?"
    r"\nATTENTION:[^\n]*\n)\n(?P<d0># Context\n.*\n## Code: [^\n]*\. Write code with triple quoto[^\n]*\n)"
    r"(?P<s1>1\. Only One file.*)$")


def write_code(text: str) -> Split | None:
    """WriteCode: NOTICE header + the 7 numbered rules are static; the context, the format
    example and the instruction line name the file, so they stay dynamic."""
    m = _WRITE_CODE.match(text)
    if m is None:
        return None
    return Split(static=m["s0"].lstrip("\n") + "\n" + m["s1"], dynamic=m["d0"])


_REVIEW = re.compile(
    r"(?s)^(?P<s0>\n# System\nRole: You are a professional software engineer, and your main task is to "
    r"review and revise the code\..*?\nATTENTION:[^\n]*\n)\n(?P<d0># Context\n.*?\n## Code to be Reviewed: "
    r"(?P<fn>[^\n]+)\n```Code\n.*\n```\n)(?P<s1>\n+-----\n\n# Code Review Format example 1\n.*)$")


def code_review(text: str) -> Split | None:
    """WriteCodeReview: header + review format examples and instructions are static (the
    file name in them becomes <FILENAME>); context and code are dynamic."""
    m = _REVIEW.match(text)
    if m is None:
        return None
    fn = m["fn"].strip()
    s1 = m["s1"].lstrip("\n").replace(fn, "<FILENAME>")
    dynamic = f"{m['d0']}\n<FILENAME> is `{fn}`.\n"
    return Split(static=m["s0"].lstrip("\n") + "\n" + s1, dynamic=dynamic)


_REWRITE = re.compile(
    r"(?s)^(?P<s0>\n# System\nRole: You are a professional software engineer, and your main task is to "
    r"review and revise the code\..*?\nATTENTION:[^\n]*\n)\n(?P<d0># Context\n.*)"
    r"(?P<s1>\n# Instruction: rewrite the `(?P<fn>[^`\n]+)` based on the Code Review and Actions\n.*)$")


def code_rewrite(text: str) -> Split | None:
    """WriteCodeReview's rewrite after an LBTM review: header and rewrite instruction are
    static (file name -> <FILENAME>); context, code and the review are dynamic."""
    m = _REWRITE.match(text)
    if m is None:
        return None
    fn = m["fn"].strip()
    s1 = m["s1"].lstrip("\n").replace(fn, "<FILENAME>")
    return Split(static=m["s0"].lstrip("\n") + "\n" + s1, dynamic=f"{m['d0']}\n<FILENAME> is `{fn}`.\n")


_SUMMARIZE = re.compile(
    r"(?s)^(?P<s0>\nNOTICE\nRole: You are a professional software engineer, and your main task is to review "
    r"the code\..*?\nATTENTION:[^\n]*\n)\n(?P<d0>-----\n# System Design\n.*?)"
    r"(?P<s1>\n## Code Review All: Please read all historical files.*)$")


def summarize_code(text: str) -> Split | None:
    m = _SUMMARIZE.match(text)
    if m is None:
        return None
    return Split(static=m["s0"].lstrip("\n") + m["s1"], dynamic=m["d0"])


_IS_PASS = re.compile(r"(?s)^(?P<d0>.*?)\n\n----\n(?P<s0>Does the above log indicate anything that needs to "
                      r"be done\?\n.*)$")


def is_pass(text: str) -> Split | None:
    """Engineer._is_pass: the yes/no question is static, the summary dynamic."""
    m = _IS_PASS.match(text)
    if m is None:
        return None
    return Split(static=m["s0"].replace("the above log", "the log in the user message"),
                 dynamic=m["d0"].lstrip("\n") + "\n")


_RUN_CODE = re.compile(r"(?s)^(?P<s0>\nRole: You are a senior development and qa engineer, your role is "
                       r"summarize the code running result\..*?Here is the code info:\n)(?P<d0>.*)"
                       r"(?P<s1>Now you should begin your analysis\n---\n## instruction:.*)$")


def run_code(text: str) -> Split | None:
    m = _RUN_CODE.match(text)
    if m is None:
        return None
    return Split(static=m["s0"].lstrip("\n") + m["s1"], dynamic=m["d0"])


_HEADS = {
    "write_test": re.compile(r"(?s)^(?P<s0>\nNOTICE\n1\. Role: You are a QA engineer;.*?\n-----\n## Given the "
                             r"following code, please write appropriate test cases[^\n]*\n)(?P<d0>.*)$"),
    "debug_error": re.compile(r"(?s)^(?P<s0>\nNOTICE\n1\. Role: You are a Development Engineer or QA "
                              r"engineer;.*?\nThe message is as follows:\n)(?P<d0>.*)$"),
}


def _head(name: str) -> Splitter:
    def split(text: str) -> Split | None:
        m = _HEADS[name].match(text)
        return None if m is None else Split(static=m["s0"].lstrip("\n"), dynamic=m["d0"])

    split.__name__ = name
    return split


SPLITTERS: tuple[tuple[str, Splitter], ...] = (
    ("context_first", context_first),
    ("write_code", write_code),
    ("code_review", code_review),
    ("code_rewrite", code_rewrite),
    ("summarize_code", summarize_code),
    ("is_pass", is_pass),
    ("run_code", run_code),
    ("write_test", _head("write_test")),
    ("debug_error", _head("debug_error")),
)


def static_prefix_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """Tokens of the leading system messages (the server's estimate, framing included)."""
    total = 0
    for m in messages:
        if m.get("role") not in ("system", "developer") or not isinstance(m.get("content"), str):
            break
        total += message_tokens(m["content"])
    return total


def _shape(messages: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """(system text, user text) when the call is the plain [system?, user] shape."""
    if not messages or any(not isinstance(m.get("content"), str) for m in messages):
        return None
    if len(messages) == 1 and messages[0].get("role") == "user":
        return "", messages[0]["content"]
    if len(messages) == 2 and messages[0].get("role") == "system" and messages[1].get("role") == "user":
        return messages[0]["content"], messages[1]["content"]
    return None


def restructure(messages: Sequence[dict[str, Any]],
                splitters: Sequence[tuple[str, Splitter]] = SPLITTERS) -> Shaped:
    """The call with its static text moved into the system message (see module doc)."""
    original = [dict(m) for m in messages]
    shape = _shape(messages)
    if shape is not None:
        system, user = shape
        for name, split in splitters:
            found = split(user)
            if found is not None:
                head = f"{system.rstrip()}\n\n{found.static}" if system.strip() else found.static
                out = [{"role": "system", "content": head}, {"role": "user", "content": found.dynamic}]
                return Shaped(out, name, static_prefix_tokens(out))
    return Shaped(original, None, static_prefix_tokens(original))


def keep(messages: Sequence[dict[str, Any]]) -> Shaped:
    """The stock layout (restructuring off): only the system message is a static prefix."""
    original = [dict(m) for m in messages]
    return Shaped(original, None, static_prefix_tokens(original))
