"""Finding lone UTF-16 surrogates in parsed JSON (they make every later JSON encoding fail).

`json.loads` turns a `\\ud800` escape without its pair into a lone surrogate; raw bytes
cannot hold one (invalid UTF-8 fails decoding), so a body without such an escape is clean.
"""

from __future__ import annotations

import re
from typing import Any

MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # a surrogate escape: maybe unpaired
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(obj: Any) -> bool:
    """Whether any string (key or value) in a parsed JSON document holds a lone surrogate.
    Iterative: safe on the deepest document json.loads accepts."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            if _SURROGATE.search(x):
                return True
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False
