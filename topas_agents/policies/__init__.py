"""Scheduling policies: small swappable classes behind one registry.

A policy is any object with `name: str` and `decide(snapshot) -> Decision`. It may keep
learned state (e.g. Topas's service profiles, folded in from `snapshot.events`), but it never
mutates the engine: engines apply the returned Decision.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError
from ..snapshot import Decision, Snapshot


@runtime_checkable
class Policy(Protocol):
    name: str

    def decide(self, snap: Snapshot) -> Decision: ...


# name -> "module:factory". Factories take keyword options (the CLIs give them as YAML
# scalars: `option_value`) and return a fresh Policy.
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


# Installed packages add policies by name under this entry-point group, e.g. in their
# pyproject.toml: [project.entry-points."topas_agents.policies"] sif = "mypkg.policies:SIF"
ENTRY_POINT_GROUP = "topas_agents.policies"


@functools.cache  # installed packages do not change under a running process; a scan is ~7 ms
def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)
            if ep.name not in _BUILTIN and _TARGET.fullmatch(ep.value)}


def available_policies() -> tuple[str, ...]:
    """Registered names: the built-ins, `register_policy`'s and installed entry points'."""
    return tuple(dict.fromkeys([*_REGISTRY, *_entry_points()]))


def is_policy_path(name: str) -> bool:
    """`name` is a `module:factory` import path, usable wherever a policy name is (a policy of
    your own: `topas bench --policies fcfs,mypol:SIF`, `topas serve --policy mypol:SIF`)."""
    return isinstance(name, str) and _TARGET.fullmatch(name) is not None


def is_known_policy(name: str) -> bool:
    return name in _REGISTRY or is_policy_path(name) or name in _entry_points()


def _target(name: str) -> str:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if is_policy_path(name):
        # as uvicorn finds an app: the working directory is searched too (a console script's
        # sys.path holds its own bin directory, not the directory it runs in)
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        return name
    target = _entry_points().get(name)
    if target is None:
        raise ConfigError(f"unknown policy '{name}' (known: {', '.join(available_policies())}; or a "
                          "policy of your own as module:factory)")
    return target


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
    """Build a fresh policy instance by registered name, entry point or `module:factory` path.
    A factory's TypeError or ValueError (a bad option value) is a ConfigError naming the
    policy; what it builds must be a Policy (a `name` and a `decide`)."""
    target = _target(name)
    if options is not None and (not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options)):
        raise ConfigError(f"policy '{name}': options must be a mapping of option name -> value, got {options!r:.80}")
    module, attr = target.split(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:  # a plugin's target that does not resolve
        raise ConfigError(f"policy '{name}' is not available (module '{exc.name}' is missing)") from None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"policy '{name}' is not available ({exc})") from None
    _check_option_names(name, factory, options or {})
    try:
        policy = factory(**dict(options or {}))
    except ConfigError:  # the factory's own, already saying what is wrong (a ValueError too)
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"policy '{name}' options {dict(options or {})}: {exc}") from None
    if not callable(getattr(policy, "decide", None)) or not isinstance(getattr(policy, "name", None), str):
        raise ConfigError(f"policy '{name}': {target} built a {type(policy).__name__}, not a policy "
                          "(an object with a str `name` and `decide(snapshot) -> Decision`)")
    return policy


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


def option_value(text: str, where: str) -> Any:
    """A policy option given as text (`--policy-opt K=V`, an environment variable) as the YAML
    scalar it spells, as every entry point reads it."""
    import yaml

    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"{where}: cannot parse value {text!r}") from None


def close_policy(policy: object) -> None:
    """Release what a policy holds outside the process (the guard's forecast worker); a no-op
    for policies that hold nothing. Engines call it when they are done with the policy."""
    close = getattr(policy, "close", None)
    if callable(close):
        close()


def make_live_policy(name: str, options: Mapping[str, Any] | None = None) -> Policy:
    """`make_policy` for an engine that serves live traffic (`LIVE_OPTIONS` applied; giving
    one of them another value is an error, not a silent override)."""
    # values as `topas bench` gives them (YAML scalars: `flag=false` is False, `n=3` is 3): the
    # server passed the strings, so `if self.flag:` held for "false" and lpm-gated refused '3'
    merged = {k: option_value(v, f"policy '{name}' option {k}") if isinstance(v, str) else v
              for k, v in (options or {}).items()}
    for key, value in LIVE_OPTIONS.get(name, {}).items():
        if str(merged.get(key, value)) != value:
            raise ConfigError(f"policy '{name}' on a live engine needs {key}={value} "
                              f"(got {merged[key]!r}: it would stall the serving loop)")
        merged[key] = value
    return make_policy(name, merged)
