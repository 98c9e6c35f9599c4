"""Parsing of bench inputs given as text (CLI values, option files). Every failure is a
ConfigError whose message names the argument and the bad value."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, WorkflowError
from ..policies import available_policies, is_known_policy, option_value
from ..workflow import load_yaml_data

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_positive_floats(text: str, what: str) -> tuple[float, ...]:
    """`0.1,0.2` -> (0.1, 0.2); each value finite and > 0, none given twice (as --seeds: a
    repeated load or rate was simulated twice and weighted twice in the paper-rule average)."""
    values: list[float] = []
    for part in str(text).split(","):
        try:
            value = float(part.strip())
        except ValueError:
            raise ConfigError(f"{what}: expected positive numbers separated by commas, got {part.strip()!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{what}: must be a positive finite number, got {part.strip()!r}")
        if value in values:
            raise ConfigError(f"{what}: {value:g} is given twice in {text!r}")
        values.append(value)
    return tuple(values)


def parse_seed_list(text: str, what: str = "--seeds", most: int = 100) -> tuple[int, ...]:
    """`0,1,2` -> (0, 1, 2); non-negative integers, no repeats, at most `most` of them."""
    seeds = []
    for part in str(text).split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise ConfigError(f"{what}: expected non-negative integers separated by commas, got {part.strip()!r}") from None
        if value < 0:
            raise ConfigError(f"{what}: seeds must be non-negative, got {value}")
        seeds.append(value)
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{what}: a seed is given twice in {text!r}")
    if len(seeds) > most:
        raise ConfigError(f"{what}: at most {most} seeds per command, got {len(seeds)}")
    return tuple(seeds)


def parse_positive_int(text: str, what: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(f"{what}: expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise ConfigError(f"{what}: expected a positive integer, got {text!r}")
    return value


def parse_policy_list(text: str) -> tuple[str, ...]:
    """`fcfs,lpm` -> ('fcfs', 'lpm'); names must be registered, no blanks or repeats."""
    names = tuple(p.strip() for p in str(text).split(","))
    for name in names:
        if not name:
            raise ConfigError(f"--policies: empty name in {text!r}")
        if not is_known_policy(name):
            raise ConfigError(f"--policies: unknown policy '{name}' (known: {', '.join(available_policies())}; "
                              "or a policy of your own as module:factory)")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"--policies: '{dup}' given twice")
    return names




def options_record(policy_options: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """What --policy-opt / --policy-config set, for a result's JSON (a variant's runs say which
    variant they are): {policy: {key: str(value)}}, policies without options left out."""
    return {p: {k: str(v) for k, v in o.items()} for p, o in policy_options.items() if o}


def parse_policy_opts(items: Iterable[str], policies: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """`['topas.beta=0.5']` -> {'topas': {'beta': 0.5}}; values parsed as YAML scalars."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        where = f"--policy-opt {item!r}"
        head, eq, value = item.partition("=")
        name, dot, key = head.strip().rpartition(".")
        if not eq or not dot or not name or not _KEY.match(key):
            raise ConfigError(f"{where}: expected POLICY.KEY=VALUE, e.g. topas.beta=0.5")
        if name not in policies:
            raise ConfigError(f"{where}: policy '{name}' is not in --policies ({', '.join(policies)})")
        out.setdefault(name, {})[key] = option_value(value, where)
    return out


def load_policy_config(path: str | Path, policies: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """A YAML file mapping policy name -> {option: value}. Policies not benchmarked are
    allowed (one file can serve several runs) but must be registered names; their sections
    are dropped (a result's JSON recorded options that no run applied)."""
    where = f"--policy-config {path}"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:  # the workflow loader's guards: repeated keys, deep nesting, invalid YAML
        data = load_yaml_data(text)
    except WorkflowError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of policy name -> options")
    out: dict[str, dict[str, Any]] = {}
    for name, opts in data.items():
        if not is_known_policy(name):
            raise ConfigError(f"{where}: unknown policy '{name}' (known: {', '.join(available_policies())})")
        if opts is None:
            opts = {}
        if not isinstance(opts, dict) or not all(isinstance(k, str) and _KEY.match(k) for k in opts):
            raise ConfigError(f"{where}: options of '{name}' must be a mapping of option names to values")
        if name in policies:
            out[name] = dict(opts)
    return out


def merge_options(*layers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Later layers override earlier ones, key by key."""
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for name, opts in layer.items():
            out.setdefault(name, {}).update(opts)
    return out
