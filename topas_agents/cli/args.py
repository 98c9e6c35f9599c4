"""Shared by every subcommand: argparse value converters (one wording for every error)
and the `--json OUT` writer."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def int_at_least(minimum: int) -> Callable[[str], int]:
    """Converter for an integer >= `minimum`."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return convert


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def write_json(path: str, data: Any) -> None:
    """Write `data` as indented JSON (no NaN/inf: they are not JSON) to `--json path`."""
    try:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write: {exc.strerror or exc}") from None
