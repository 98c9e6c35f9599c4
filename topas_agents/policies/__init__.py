"""Scheduling policies: small swappable classes behind one registry.

A policy is any object with `name: str` and `decide(snapshot) -> Decision`. It may keep
learned state (e.g. Topas's service profiles, folded in from `snapshot.events`), but it never
mutates the engine: engines apply the returned Decision.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError
from ..snapshot import Decision, Snapshot


@runtime_checkable
class Policy(Protocol):
    name: str

    def decide(self, snap: Snapshot) -> Decision: ...


# name -> "module:factory". Factories take keyword options (strings from the CLI are
# converted by the policy's own config class) and return a fresh Policy.
_REGISTRY: dict[str, str] = {
    "fcfs": "topas_agents.policies.baselines:FCFS",
    "lpm": "topas_agents.policies.baselines:LPM",
    "parrot": "topas_agents.policies.baselines:ParrotFCFS",
    "las": "topas_agents.policies.baselines:AutellixLAS",
    "spf": "topas_agents.policies.baselines:SPF",
    # peers outside the paper's baseline set (reported, not used as "the best baseline")
    "lpm-gated": "topas_agents.policies.baselines:LPMGated",
    "kvflow": "topas_agents.policies.kvflow:KVFlow",
    # the recommended policy: the core behind the forecast guard (policies/forecast.py)
    "topas": "topas_agents.policies.forecast:make_topas_guard",
    "topas-core": "topas_agents.policies.topas:make_topas",
    "topas-paper": "topas_agents.policies.topas:make_topas_paper",
    "topas-base": "topas_agents.policies.topas:make_topas_base",
    "topas-noreuse": "topas_agents.policies.topas:make_topas_noreuse",
    "topas-noaging": "topas_agents.policies.topas:make_topas_noaging",
    "topas-paper-base": "topas_agents.policies.topas:make_topas_paper_base",
    "topas-paper-noreuse": "topas_agents.policies.topas:make_topas_paper_noreuse",
    "topas-paper-noaging": "topas_agents.policies.topas:make_topas_paper_noaging",
    "topas-paper-tuned": "topas_agents.policies.topas:make_topas_paper_tuned",
    "topas-paper-full": "topas_agents.policies.topas:make_topas_paper_full",
}

_BUILTIN: dict[str, str] = dict(_REGISTRY)
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")

# The paper's five baselines (section V-A): "the best baseline" of every comparison is one of these.
BASELINES: tuple[str, ...] = ("fcfs", "lpm", "parrot", "las", "spf")
# Published peers we also run and report, outside the paper's comparison set.
PEERS: tuple[str, ...] = ("lpm-gated", "kvflow")


# Options a live engine forces on a policy: the forecast guard's inline forecasts run for
# seconds inside decide(), free on a simulated clock, a stalled serving loop on a live engine.
LIVE_OPTIONS: dict[str, dict[str, str]] = {"topas": {"forecast_mode": "background"}}


def available_policies() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def register_policy(name: str, target: str) -> None:
    """Register `module:factory` under `name` (plugins and tests may add policies; the
    built-in names cannot be taken: `fcfs` silently built another policy)."""
    if not isinstance(name, str) or not name or name != name.strip() or not name.isprintable():
        raise ConfigError(f"policy name must be a non-empty printable string, got {name!r}")
    if name in _BUILTIN and target != _BUILTIN[name]:
        raise ConfigError(f"policy '{name}' is built in and cannot be re-registered")
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        raise ConfigError(f"policy target must be 'module:factory', got {target!r}")
    _REGISTRY[name] = target


def make_policy(name: str, options: Mapping[str, Any] | None = None) -> Policy:
    """Build a fresh policy instance by registered name."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown policy '{name}' (known: {', '.join(_REGISTRY)})")
    if options is not None and (not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options)):
        raise ConfigError(f"policy '{name}': options must be a mapping of option name -> value, got {options!r:.80}")
    module, attr = _REGISTRY[name].split(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:  # a plugin's target that does not resolve
        raise ConfigError(f"policy '{name}' is not available yet (module '{exc.name}' is missing)") from None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"policy '{name}' is not available yet ({exc})") from None
    _check_option_names(name, factory, options or {})
    return factory(**dict(options or {}))


def _check_option_names(name: str, factory: Any, options: Mapping[str, Any]) -> None:
    """ConfigError naming the policy's options when `options` holds one its factory does not
    take (a factory with **options validates its own, as Topas's do). Without it an unknown
    option was a TypeError traceback out of `topas serve` or the SGLang plugin."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the factory's own error stands
        return
    if not options or any(p.kind is p.VAR_KEYWORD for p in params):
        return
    known = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"policy '{name}' has no option '{unknown[0]}' "
                          f"(its options: {', '.join(known) if known else 'none'})")


def close_policy(policy: object) -> None:
    """Release what a policy holds outside the process (the guard's forecast worker); a no-op
    for policies that hold nothing. Engines call it when they are done with the policy."""
    close = getattr(policy, "close", None)
    if callable(close):
        close()


def make_live_policy(name: str, options: Mapping[str, Any] | None = None) -> Policy:
    """`make_policy` for an engine that serves live traffic (`LIVE_OPTIONS` applied; giving
    one of them another value is an error, not a silent override)."""
    merged = dict(options or {})
    for key, value in LIVE_OPTIONS.get(name, {}).items():
        if str(merged.get(key, value)) != value:
            raise ConfigError(f"policy '{name}' on a live engine needs {key}={value} "
                              f"(got {merged[key]!r}: it would stall the serving loop)")
        merged[key] = value
    return make_policy(name, merged)
