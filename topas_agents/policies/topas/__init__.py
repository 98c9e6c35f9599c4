"""Topas: Task-Oriented Prefix-Aware Scheduler, and its ablations.

Factories (registered in `topas_agents.policies`) accept keyword options overriding
`TopasConfig` fields; values may be strings or numbers (validated, `ConfigError` otherwise).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .config import TopasConfig, make_config
from .policy import TopasPolicy

__all__ = [
    "TopasConfig",
    "TopasPolicy",
    "make_config",
    "make_topas",
    "make_topas_base",
    "make_topas_noaging",
    "make_topas_noreuse",
]


def make_topas(**options: Any) -> TopasPolicy:
    """Full Topas: reuse lookahead and log aging on."""
    return TopasPolicy(make_config(**options), "topas")


def make_topas_base(**options: Any) -> TopasPolicy:
    """Ablation: no V_reuse (beta = 0) and no aging (rho = 0)."""
    return TopasPolicy(make_config(replace(TopasConfig(), beta=0.0, rho=0.0), **options), "topas-base")


def make_topas_noreuse(**options: Any) -> TopasPolicy:
    """Ablation: no V_reuse (beta = 0)."""
    return TopasPolicy(make_config(replace(TopasConfig(), beta=0.0), **options), "topas-noreuse")


def make_topas_noaging(**options: Any) -> TopasPolicy:
    """Ablation: no log aging (rho = 0)."""
    return TopasPolicy(make_config(replace(TopasConfig(), rho=0.0), **options), "topas-noaging")
