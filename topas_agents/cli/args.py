"""argparse value converters shared by every subcommand (one wording for every error)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


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
