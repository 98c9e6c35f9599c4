"""A progress bar over all simulated tasks of a bench (tqdm on stderr), or nothing."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class ProgressBar:
    """Counts finished tasks across runs. The simulator reports `(done, total)` per run;
    `run_callback` turns those into increments of one bar over the whole bench."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._bar: Any = None
        if enabled and total > 0:
            from tqdm import tqdm  # only when shown: keeps `topas bench --no-progress` lean

            self._bar = tqdm(total=total, unit="task", file=sys.stderr, leave=False,
                             dynamic_ncols=True)

    def run_callback(self, label: str) -> Callable[[int, int], None] | None:
        if self._bar is None:
            return None
        bar = self._bar
        bar.set_description(label, refresh=False)
        seen = 0

        def update(done: int, total: int) -> None:
            nonlocal seen
            if done > seen:
                bar.update(done - seen)
                seen = done

        return update

    def advance(self, n: int) -> None:
        """Count `n` tasks of a run that finished elsewhere (a worker process)."""
        if self._bar is not None:
            self._bar.update(n)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
