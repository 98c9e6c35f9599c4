"""Placeholder arguments for a tool call: a JSON value for a function's JSON-schema
`parameters` (the echo responder's `tool_call` rule answers with them). A schema is client
input, so the filler is total (never raises on any JSON) and bounded (recursive `$ref`s or a
huge `minItems` / `minLength` cannot make the reply, or the work, large).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .pattern_fill import pattern_example

# Bounds on the placeholder arguments: a schema is client input, and recursive `$ref`s or a
# huge `minItems`/`minLength` must not make the reply (or the work) large.
MAX_SCHEMA_DEPTH = 12
MAX_SCHEMA_NODES = 2000
MAX_ARRAY_ITEMS = 4
# A tuple's positions are all required (a 6-position tuple cut to 4 failed validation); past
# this many (a schema is client input) the node budget bounds the work anyway.
MAX_TUPLE_ITEMS = 64
MAX_STRING_CHARS = 256
# A `const`/`default`/`enum` literal is copied into the arguments only up to this size (JSON
# characters; a generated placeholder replaces a bigger one), and all copied literals of one
# call together up to the total: an 8 MB default under 2000 `required` names was serialized
# once per visit (~29 s on the event loop), and the reply must stay far below the server's
# `max_response_chars` (256 KiB), where it would be cut.
MAX_LITERAL_CHARS = 4096
MAX_LITERAL_TOTAL_CHARS = 64 * 1024
# Digits in a JSON number per bit of a Python int (log10(2), rounded up): sizes an int literal
# without printing it.
_DIGITS_PER_BIT = 0.302
_FORMAT_EXAMPLES = {"date-time": "1970-01-01T00:00:00Z", "date": "1970-01-01", "time": "00:00:00",
                    "email": "user@example.com", "idn-email": "user@example.com",
                    "uri": "https://example.com", "iri": "https://example.com",
                    "uri-reference": "https://example.com", "iri-reference": "https://example.com",
                    "uuid": "00000000-0000-0000-0000-000000000000", "ipv4": "192.0.2.1", "ipv6": "2001:db8::1",
                    "hostname": "example.com", "idn-hostname": "example.com", "duration": "P1D",
                    "json-pointer": "/a", "relative-json-pointer": "0", "regex": ".*", "uri-template": "/{id}",
                    "byte": "AAAA"}


def _finite(value: Any) -> float | None:
    """A schema bound as a float; None when absent, not a number, or not finite as a float
    (an integer beyond ~1.8e308 overflows float(): such a bound is ignored, never a 500)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _json_size_at_most(value: Any, limit: int) -> bool:
    """Whether `value` plausibly serializes within about `limit` characters, decided by a walk
    that stops once past the limit (so a huge literal costs O(limit), not O(its size))."""
    stack, size = [value], 0
    while stack:
        item = stack.pop()
        size += 2  # a scalar's or a container's shortest text, plus a separator
        if isinstance(item, str):
            size += len(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            size += int(item.bit_length() * _DIGITS_PER_BIT)
        elif isinstance(item, Mapping | list | tuple):
            size += 2 * len(item)  # counted before its items are visited: a huge one stops here
            if size <= limit:
                stack.extend([*item.keys(), *item.values()] if isinstance(item, Mapping) else item)
        if size > limit:
            return False
    return True


def _literal_json_chars(value: Any) -> int | None:
    """The JSON size of a literal from the schema (const, enum, default) that serializes as
    strict JSON within MAX_LITERAL_CHARS; None for any other."""
    if not _json_size_at_most(value, MAX_LITERAL_CHARS):
        return None
    try:
        text = json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return None
    return len(text) if len(text) <= MAX_LITERAL_CHARS else None


class _SchemaFiller:
    """A JSON value for a JSON schema: required properties only, type-appropriate
    placeholders; total (never raises on any JSON input), bounded by the limits above."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.budget = MAX_SCHEMA_NODES
        self.literal_chars_left = MAX_LITERAL_TOTAL_CHARS

    def value(self, schema: Any, depth: int = 0) -> Any:
        if not isinstance(schema, Mapping) or depth > MAX_SCHEMA_DEPTH or self.budget <= 0:
            return None
        self.budget -= 1
        enum = schema.get("enum")
        literals = [schema[key] for key in ("const", "default") if key in schema]
        literals += [enum[0]] if isinstance(enum, list) and enum else []
        for literal in literals:
            if self._take_literal(literal):
                return literal
        if isinstance(schema.get("$ref"), str):
            return self.value(self._resolve(schema["$ref"]), depth + 1)
        for key in ("anyOf", "oneOf", "allOf"):
            found = schema.get(key)
            subs = [x for x in found if isinstance(x, Mapping)] if isinstance(found, list) else []
            if subs:  # the first alternative that is not null (allOf: its first part)
                return self.value(next((x for x in subs if x.get("type") != "null"), subs[0]), depth + 1)
        return self._typed(schema, self._type(schema), depth)

    def _take_literal(self, literal: Any) -> bool:
        """Whether `literal` goes into the arguments: strict JSON, small, and within what is
        left of the per-call literal budget (then charged to it)."""
        chars = _literal_json_chars(literal)
        if chars is None or chars > self.literal_chars_left:
            return False
        self.literal_chars_left -= chars
        return True

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
            return self._required_properties(props, required, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema)
        if kind in ("integer", "number"):
            return self._number(schema, kind == "integer")
        return False if kind == "boolean" else None

    def _required_properties(self, props: Mapping[str, Any], required: list, depth: int) -> dict[str, Any]:
        """Each required name once (a name listed 2000 times is filled once, not 2000 times),
        until the node budget runs out (later names would all be null: left out)."""
        out: dict[str, Any] = {}
        for name in dict.fromkeys(n for n in required if isinstance(n, str)):
            if self.budget <= 0:
                break
            out[name] = self.value(props.get(name, {}), depth + 1)
        return out

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        """`minItems` items: the tuple positions first (`prefixItems`, or a list under `items`
        as older drafts write it: pydantic's `tuple[float, float]`), then `items`."""
        n = max(0, min(int(_finite(schema.get("minItems")) or 0), MAX_ARRAY_ITEMS))
        items = schema.get("items", {})
        prefix = schema.get("prefixItems", items if isinstance(items, list) else [])
        prefix = prefix[:MAX_TUPLE_ITEMS] if isinstance(prefix, list) else []
        rest = items if isinstance(items, Mapping) else {}
        return [self.value(sub, depth + 1) for sub in prefix] + \
            [self.value(rest, depth + 1) for _ in range(n - len(prefix))]

    @staticmethod
    def _string(schema: Mapping[str, Any]) -> str:
        """A format's example, else a string the `pattern` matches within the length bounds,
        else "example" padded or cut to them (padding would break a pattern's string)."""
        shortest = min(int(_finite(schema.get("minLength")) or 0), MAX_STRING_CHARS)
        longest = _finite(schema.get("maxLength"))
        text = _FORMAT_EXAMPLES.get(str(schema.get("format")))
        if text is None:  # a pattern's repeats stretched to minLength, within maxLength
            limit = MAX_STRING_CHARS if longest is None else max(0, min(int(longest), MAX_STRING_CHARS))
            built = pattern_example(schema.get("pattern"), limit, shortest)
            if built is not None and len(built) >= shortest:
                return built
        text = "example" if text is None else text
        text = text.ljust(shortest, "x")
        return text[: max(0, int(longest))] if longest is not None and longest < len(text) else text

    @staticmethod
    def _number(schema: Mapping[str, Any], integer: bool) -> int | float:
        """0 when the bounds and `multipleOf` allow it, else a value inside them: the lower
        bound (just above it when exclusive), the upper one, or their midpoint when both are
        exclusive, rounded to the multiple. Exclusive bounds were moved by 1, also on floats: a
        `gt=0, lt=1` confidence got 1.0, outside its own schema."""
        low = _Bound.of(schema, "minimum", "exclusiveMinimum")
        high = _Bound.of(schema, "maximum", "exclusiveMaximum")
        step = _finite(schema.get("multipleOf"))
        step = step if step is not None and step > 0 else (1.0 if integer else None)

        def fits(x: float) -> bool:
            return math.isfinite(x) and low.below(x) and high.above(x) and (not integer or float(x).is_integer())

        if step is not None:  # the multiples of the step: 0, else the first past each bound
            candidates = [0.0]
            if low.value is not None and (k := _steps(low.value, step, math.ceil)) is not None:
                candidates.append((k + 1 if low.exclusive and k * step <= low.value else k) * step)
            if high.value is not None and (k := _steps(high.value, step, math.floor)) is not None:
                candidates.append((k - 1 if high.exclusive and k * step >= high.value else k) * step)
        else:
            candidates = [0.0]
            if low.value is not None:
                candidates.append(low.value if not low.exclusive else
                                  (low.value + high.value) / 2 if high.value is not None else low.value + 1)
            if high.value is not None:
                candidates.append(high.value if not high.exclusive else high.value - 1)
        # none fits: the range is empty (or too fine for a float); the last finite candidate
        x = next((c for c in candidates if fits(c)), next(c for c in reversed(candidates) if math.isfinite(c)))
        return int(round(x)) if integer else x


def _steps(value: float, step: float, rounding: Any) -> int | None:
    """`rounding(value / step)`, None when that is not a finite number (1e10 / 1e-300: the
    bound cannot be met on that grid by any float the reply could carry)."""
    ratio = value / step
    if not math.isfinite(ratio):
        return None
    k = int(rounding(ratio))
    return k if math.isfinite(k * step) else None


@dataclass(frozen=True, slots=True)
class _Bound:
    """One side of a number's range: its value and whether it is exclusive (draft 6+ writes
    `exclusiveMinimum: 0`, draft 4 `minimum: 0, exclusiveMinimum: true`)."""

    value: float | None
    exclusive: bool
    lower: bool

    @classmethod
    def of(cls, schema: Mapping[str, Any], inclusive_key: str, exclusive_key: str) -> _Bound:
        lower = inclusive_key == "minimum"
        exclusive = _finite(schema.get(exclusive_key))
        if exclusive is not None:
            return cls(exclusive, True, lower)
        return cls(_finite(schema.get(inclusive_key)), schema.get(exclusive_key) is True, lower)

    def below(self, x: float) -> bool:
        """Whether `x` is on the allowed side of this lower bound."""
        return self.value is None or (x > self.value if self.exclusive else x >= self.value)

    def above(self, x: float) -> bool:
        """Whether `x` is on the allowed side of this upper bound."""
        return self.value is None or (x < self.value if self.exclusive else x <= self.value)


def tool_arguments(parameters: Mapping[str, Any]) -> str:
    """The JSON text of placeholder arguments for a function's `parameters` schema: always a
    JSON object (the OpenAI contract), `{}` when the schema describes something else."""
    value = _SchemaFiller(parameters).value(parameters)
    return json.dumps(value if isinstance(value, dict) else {}, separators=(", ", ": "))


def schema_value(schema: Mapping[str, Any]) -> str:
    """The JSON text of a placeholder value of `schema` (a structured-output reply): any JSON
    value the schema describes, `{}` for an empty schema (any value; an object is the usual)."""
    if not schema:
        return "{}"
    return json.dumps(_SchemaFiller(schema).value(schema), separators=(", ", ": "))
