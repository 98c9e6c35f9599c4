"""Progress of `topas docs` on stderr: which bench runs and how many are done.

A `--quick` run takes tens of minutes and a full one hours; the task bar of `topas bench`
(`bench/progress.py`) was all it showed, and only on a terminal, without saying which bench
it counted. Here, on a terminal: a tqdm bar over the benches, with each bench's task bar
(`run_many(progress=True)`) under it; elsewhere (a log, CI, a pipe, where tqdm's
carriage-return redraws would pile up on one line): a plain line as each bench starts.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


class DocsProgress:
    """Reports the `total` benches of a `topas docs` run, each run inside `bench`."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total = total
        self.done = 0
        self._t0 = time.monotonic()
        self._lines = enabled and not sys.stderr.isatty()
        self._bar: Any = None
        if enabled and not self._lines:
            from tqdm import tqdm  # as bench/progress.py: only when shown

            self._bar = tqdm(total=total, unit="bench", desc="docs", file=sys.stderr, leave=False,
                             dynamic_ncols=True)

    @property
    def bars(self) -> bool:
        """Whether each bench's own task bar (`run_many`'s) is shown under this one."""
        return self._bar is not None

    @contextmanager
    def bench(self, name: str, what: str) -> Iterator[None]:
        """Bench `name` (`what` it runs) runs inside; counted done when it ends without error."""
        if self._bar is not None:
            self._bar.set_description(f"docs {name}")
        elif self._lines:
            print(f"docs: bench {self.done + 1}/{self.total}: {name}, {what} "
                  f"({_clock(time.monotonic() - self._t0)} elapsed)", file=sys.stderr, flush=True)
        yield
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def __enter__(self) -> DocsProgress:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self._bar is not None:
            self._bar.close()
        if exc_type is None and (self._lines or self._bar is not None):
            print(f"docs: {self.done} benches in {_clock(time.monotonic() - self._t0)}", file=sys.stderr, flush=True)
