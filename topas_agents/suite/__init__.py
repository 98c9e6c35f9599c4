"""The random-workflow suite (GitHub issue 9): seeded random workflow DAGs of many shapes,
every policy on each at several loads and seeds, and the distribution of `topas`'s ratio to
the best baseline with the worst cases written out as replayable YAMLs (docs/suite.md).

`run_suite_cli(args)` is what `topas bench --suite random` calls; heavy modules load lazily.
"""

from __future__ import annotations

from .._lazy import lazy_getattr

_LAZY = {
    "run_suite_cli": "cli",
    "SuiteConfig": "runner",
    "run_suite": "runner",
    "generate_suite": "generate",
    "generate_workflow": "generate",
    "workflow_to_yaml": "generate",
    "workflow_to_dict": "generate",
    "GenConfig": "generate",
    "SHAPES": "shapes",
}

__getattr__ = lazy_getattr(__name__, _LAZY)
__all__ = sorted(_LAZY)
