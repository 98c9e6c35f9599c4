"""Topas: Task-Oriented Prefix-Aware Scheduler, and its ablations.

Factories (registered in `topas_agents.policies`) accept keyword options overriding
`TopasConfig` fields; values may be strings or numbers (validated, `ConfigError` otherwise).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .config import TopasConfig, make_config
from .paper_config import TOPAS_OPTIONS, TUNED_OPTIONS, PaperConfig, make_paper_config
from .paper_policy import TopasPaperPolicy
from .policy import TopasPolicy

__all__ = [
    "PaperConfig",
    "TopasConfig",
    "TopasPaperPolicy",
    "TopasPolicy",
    "make_config",
    "make_paper_config",
    "make_topas",
    "make_topas_base",
    "make_topas_noaging",
    "make_topas_noreuse",
    "make_topas_paper",
    "make_topas_paper_base",
    "make_topas_paper_full",
    "make_topas_paper_noaging",
    "make_topas_paper_noreuse",
    "make_topas_paper_tuned",
]


def make_topas(**options: Any) -> TopasPolicy:
    """`topas-core`: full Topas (reuse lookahead and log aging on), without the forecast
    guard that the registry's `topas` puts around it (policies/forecast.py)."""
    return TopasPolicy(make_config(**options), "topas-core")


def make_topas_base(**options: Any) -> TopasPolicy:
    """Ablation: no V_reuse (beta = 0) and no aging (rho = 0)."""
    return TopasPolicy(make_config(replace(TopasConfig(), beta=0.0, rho=0.0), **options), "topas-base")


def make_topas_noreuse(**options: Any) -> TopasPolicy:
    """Ablation: no V_reuse (beta = 0)."""
    return TopasPolicy(make_config(replace(TopasConfig(), beta=0.0), **options), "topas-noreuse")


def make_topas_noaging(**options: Any) -> TopasPolicy:
    """Ablation: no log aging (rho = 0)."""
    return TopasPolicy(make_config(replace(TopasConfig(), rho=0.0), **options), "topas-noaging")


def make_topas_paper(**options: Any) -> TopasPaperPolicy:
    """Topas as the paper prints it (section IV, Algorithm 1); options: `PaperConfig` fields."""
    return TopasPaperPolicy(make_paper_config(**options), "topas-paper")


def make_topas_paper_base(**options: Any) -> TopasPaperPolicy:
    """Paper ablation Topas-base (section V-C): no V_reuse (beta = 0), no aging (rho = 0)."""
    return TopasPaperPolicy(make_paper_config(PaperConfig(beta=0.0, rho=0.0), **options), "topas-paper-base")


def make_topas_paper_noreuse(**options: Any) -> TopasPaperPolicy:
    """Paper ablation: no V_reuse (beta = 0)."""
    return TopasPaperPolicy(make_paper_config(PaperConfig(beta=0.0), **options), "topas-paper-noreuse")


def make_topas_paper_noaging(**options: Any) -> TopasPaperPolicy:
    """Paper ablation: no aging (rho = 0)."""
    return TopasPaperPolicy(make_paper_config(PaperConfig(rho=0.0), **options), "topas-paper-noaging")


def make_topas_paper_tuned(**options: Any) -> TopasPaperPolicy:
    """The paper core with the named options of `topas` switched on (`TUNED_OPTIONS`)."""
    return TopasPaperPolicy(make_paper_config(make_paper_config(**TUNED_OPTIONS), **options), "topas-paper-tuned")


def make_topas_paper_full(**options: Any) -> TopasPaperPolicy:
    """The paper core with every named option at `topas`'s value (`TOPAS_OPTIONS`)."""
    return TopasPaperPolicy(make_paper_config(make_paper_config(**TOPAS_OPTIONS), **options), "topas-paper-full")
