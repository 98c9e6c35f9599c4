"""Builds the simulated engine for `--engine sim` from a ServerConfig."""

from __future__ import annotations

from collections.abc import Mapping

from ..costmodel import load_profile
from ..engine import Engine, EngineRequest, RequestFactory
from ..policies import make_live_policy
from ..workflow import Workflow
from .config import ServerConfig


def sim_engine_factory(config: ServerConfig,
                       workflows: Mapping[str, Workflow]) -> tuple[Engine, RequestFactory]:
    """A `SimEngine` on the configured profile and policy, plus its request type.

    `workflows` is the server's live registry mapping: workflows registered later over HTTP
    become visible to the engine (and its policy) without a restart.
    """
    from topas_agents.sim import SimEngine

    profile = load_profile(config.profile)
    policy = make_live_policy(config.policy, dict(config.policy_options))
    engine = SimEngine(profile, policy, kv_budget=config.kv_budget, workflows=workflows,
                       max_jump_s=config.max_jump_s)
    return engine, EngineRequest
