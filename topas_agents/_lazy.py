"""Lazy package attributes: heavy submodules load on first attribute access, not at import."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package`: `table` maps attribute -> module path
    (absolute, or relative to `package` when it has no dot)."""

    def __getattr__(name: str) -> Any:
        if name in table:
            target = table[name]
            module = target if "." in target else f"{package}.{target}"
            return getattr(importlib.import_module(module), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
