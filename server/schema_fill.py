"""Placeholder arguments for a tool call: a JSON value for a function's JSON-schema
`parameters` (the echo responder's `tool_call` rule answers with them). A schema is client
input, so the filler is total (never raises on any JSON) and bounded (recursive `$ref`s or a
huge `minItems` / `minLength` cannot make the reply, or the work, large).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

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
