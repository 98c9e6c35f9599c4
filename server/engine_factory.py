"""Builds the simulated engine for `--engine sim` from a ServerConfig."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..costmodel import load_profile
from ..engine import Engine, EngineRequest, RequestFactory
from ..policies import make_live_policy
from ..workflow import Workflow
from .config import ServerConfig


def check_startup_workflows_fit(config: ServerConfig, workflows: Mapping[str, Workflow]) -> None:
    """ConfigError (one line, before serving) when a `--workflow` has a call that can never run
    under the KV budget: every labelled call of it would be a 400 (`topas bench` refuses the
    same configuration)."""
    fits = workflow_fit_check(config)
    for wf in workflows.values():
        fits(wf)


def workflow_fit_check(config: ServerConfig) -> Callable[[Workflow], None]:
    """The check above for one workflow, the budget looked up once: uploads
    (`POST /v1/topas/workflows`) are held to what `--workflow` is held to at startup."""
    from topas_agents.bench.work import check_fits

    budget = config.kv_budget or load_profile(config.profile).kv_budget_tokens
    return lambda wf: check_fits(wf, budget)


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
