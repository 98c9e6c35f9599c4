"""The one percentile (topas_agents/percentile.py) equals numpy's default definition."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from topas_agents.percentile import percentile, percentile_or_none


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_equals_numpys_default(values, q):
    assert math.isclose(percentile(values, q), float(np.percentile(values, q)), rel_tol=1e-9, abs_tol=1e-6)


def test_hand_computed_and_empty():
    # ranks h = (4 - 1) * 0.5 = 1.5: halfway between 2 and 3
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert math.isnan(percentile([], 99)) and percentile_or_none([], 99) is None
