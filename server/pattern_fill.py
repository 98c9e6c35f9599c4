"""A short string that matches a JSON-schema `pattern`, for the placeholder arguments of
`schema_fill`. It is built from the regex's parse tree and never checked by matching: the
pattern is client input, and matching a test string against `(a+)+$` can backtrack for ever on
the event loop. Literals, classes, ranges, categories, repeats (their minimum), groups,
alternation (the first branch), anchors and backreferences are built; a construct it cannot
build safely (a lookaround, a conditional) gives None, and the caller keeps its placeholder.
"""

from __future__ import annotations

import re

try:  # Python 3.11+
    from re import _parser as sre  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_parse as sre  # type: ignore[no-redef]

# A pattern longer than this is not parsed (the parse is linear, but this is client input).
MAX_PATTERN_CHARS = 1024
# Parse-tree nodes visited per pattern: nested repeats of empty groups (`(((){250}){250}){250}`)
# build nothing, so the length bound alone would let them take 15 million steps.
MAX_BUILD_STEPS = 10_000

_CATEGORY_CHAR = {"CATEGORY_DIGIT": "0", "CATEGORY_WORD": "a", "CATEGORY_SPACE": " ",
                  "CATEGORY_NOT_DIGIT": "a", "CATEGORY_NOT_WORD": "-", "CATEGORY_NOT_SPACE": "a"}
_CATEGORY_TEST = {"CATEGORY_DIGIT": str.isdigit, "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
                  "CATEGORY_SPACE": str.isspace, "CATEGORY_NOT_DIGIT": lambda c: not c.isdigit(),
                  "CATEGORY_NOT_WORD": lambda c: not (c.isalnum() or c == "_"),
                  "CATEGORY_NOT_SPACE": lambda c: not c.isspace()}
# Characters tried, in order, for a negated class ([^a-z]).
_NEGATED_CANDIDATES = "a0A-_ .x9Z"


class _Unbuildable(Exception):
    pass


def pattern_example(pattern: object, max_chars: int, min_chars: int = 0) -> str | None:
    """A string of at most `max_chars` that `pattern` matches, its repeats run past their
    minimum while it is shorter than `min_chars` (a `minLength` beside the pattern: `[a-z]+`
    built "a" for a minimum of 3); None when there is none here."""
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN_CHARS:
        return None
    try:
        tree = sre.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError):
        return None
    if tree.state.flags & re.IGNORECASE:  # a negated class or character would need both cases
        return None
    builder = _Builder(max_chars, min_chars)
    try:
        builder.emit(tree)
    except (_Unbuildable, RecursionError):
        return None
    return "".join(builder.out)


class _Builder:
    def __init__(self, max_chars: int, min_chars: int = 0) -> None:
        self.max_chars = max_chars
        self.min_chars = min_chars
        self.out: list[str] = []
        self.groups: dict[int, str] = {}
        self.steps = 0

    def length(self) -> int:
        return sum(map(len, self.out))

    def put(self, text: str) -> None:
        self.out.append(text)
        if self.length() > self.max_chars:
            raise _Unbuildable

    def emit(self, items: object) -> None:
        for op, av in items:  # type: ignore[attr-defined]
            self.steps += 1
            if self.steps > MAX_BUILD_STEPS:
                raise _Unbuildable
            name = str(op)
            if name == "LITERAL":
                self.put(chr(av))
            elif name in ("NOT_LITERAL", "ANY"):
                self.put("a" if av != ord("a") else "b")
            elif name == "IN":
                self.put(_class_char(av))
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, high, sub = av
                if low > self.max_chars:
                    raise _Unbuildable
                for _ in range(low):
                    self.emit(sub)
                count = low
                while count < high and self.length() < self.min_chars:  # stretched towards minLength
                    before = self.length()
                    self.emit(sub)
                    count += 1
                    if self.length() == before:  # the repeated part builds nothing
                        break
            elif name == "SUBPATTERN":
                start = len("".join(self.out))
                self.emit(av[-1])
                if av[0] is not None:
                    self.groups[av[0]] = "".join(self.out)[start:]
            elif name == "ATOMIC_GROUP":
                self.emit(av)
            elif name == "BRANCH":
                self.emit(av[1][0])
            elif name == "GROUPREF":
                self.put(self.groups.get(av, ""))
            elif name != "AT":  # anchors: the built string is the whole text
                raise _Unbuildable  # lookarounds, conditionals


def _class_char(items: list) -> str:
    """A character in the class `[...]` (or, negated, one outside it)."""
    negated = bool(items) and str(items[0][0]) == "NEGATE"
    members = items[1:] if negated else items
    if not negated:
        for op, av in members:
            name = str(op)
            if name == "LITERAL":
                return chr(av)
            if name == "RANGE":
                return chr(av[0])
            if name == "CATEGORY" and str(av) in _CATEGORY_CHAR:
                return _CATEGORY_CHAR[str(av)]
        raise _Unbuildable
    for c in _NEGATED_CANDIDATES:
        if not any(_member(c, op, av) for op, av in members):
            return c
    raise _Unbuildable


def _member(c: str, op: object, av: object) -> bool:
    name = str(op)
    if name == "LITERAL":
        return ord(c) == av
    if name == "RANGE":
        return av[0] <= ord(c) <= av[1]  # type: ignore[index]
    test = _CATEGORY_TEST.get(str(av)) if name == "CATEGORY" else None
    if test is None:
        raise _Unbuildable
    return bool(test(c))
