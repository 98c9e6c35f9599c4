"""Wall-clock seconds of the engine's policy decisions, bounded for a long-lived engine."""

from __future__ import annotations

import collections
import itertools

import numpy as np

from topas_agents.percentile import percentile

# Decisions whose times are kept (for the p99 and for /metrics readers). A server makes about
# 1.5 decisions a call and kept every time: 31 000 after 20 000 calls, 31 MiB and 0.24 s per
# stats request (a numpy copy and a p99 on the engine task) at a million. 100 000 is more than
# any benchmark run makes, so their p99 is over all decisions; a server's is over the latest.
KEPT_DECISIONS = 100_000


class DecisionTimes:
    """Count and sum of every decision's time (the mean is over all of them); the times of
    the last `kept` (the p99, and `since` for readers that keep their place by index)."""

    def __init__(self, kept: int = KEPT_DECISIONS) -> None:
        self._kept: collections.deque[float] = collections.deque(maxlen=kept)
        self.count = 0
        self.sum_s = 0.0

    def add(self, seconds: float) -> None:
        self._kept.append(seconds)
        self.count += 1
        self.sum_s += seconds

    def since(self, start: int) -> list[float]:
        """The times of decisions `start`, `start + 1`, ... that are still kept, in order."""
        n = self.count - max(start, self.count - len(self._kept))
        if n <= 0:
            return []
        return list(itertools.islice(reversed(self._kept), n))[::-1]

    def mean_ms(self) -> float:
        return 1e3 * self.sum_s / self.count if self.count else 0.0

    def p99_ms(self) -> float:
        return percentile(np.fromiter(self._kept, float, len(self._kept)) * 1e3, 99) if self._kept else 0.0
