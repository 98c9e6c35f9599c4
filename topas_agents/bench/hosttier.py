"""Which policies get the CPU host tier in a bench (`topas bench --host-tier`).

With a host tier an evicted prefix is kept in CPU memory and swapped back over the link;
without one it is dropped and recomputed (prefilled) when next needed. Two setups matter:

* `all` (symmetric): every policy has the tier, as SGLang with its hierarchical cache gives
  every scheduler.
* `paper`: only Topas variants (every registered name starting with `topas`: topas,
  topas-paper and the ablations) move prefixes to CPU; the baselines run on stock SGLang,
  evict LRU and recompute. This is the setup of the paper's evaluation (section V-A: the
  baselines are SGLang schedulers; Topas adds explicit prefix residency control).

`none` gives nobody the tier; a comma-separated policy list gives it to exactly those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError
from ..policies import is_policy_path

HostTierMode = Literal["all", "none", "paper", "policies"]
TOPAS_PREFIX = "topas"  # names of Topas and its variants (the `paper` setup's tier holders)


@dataclass(frozen=True, slots=True)
class HostTier:
    """A host-tier setup: `mode`, and for mode `policies` the names that have the tier."""

    mode: HostTierMode
    policies: tuple[str, ...] = ()

    def has(self, policy: str) -> bool:
        """Whether `policy` runs with the CPU host tier in this setup."""
        if self.mode == "all":
            return True
        if self.mode == "none":
            return False
        if self.mode == "paper":
            return policy.startswith(TOPAS_PREFIX)
        return policy in self.policies

    @property
    def label(self) -> str:
        """What `--host-tier` would be given to get this setup."""
        return ",".join(self.policies) if self.mode == "policies" else self.mode

    def per_policy(self, policies: Sequence[str]) -> dict[str, bool]:
        return {p: self.has(p) for p in policies}


ALL = HostTier("all")
NONE = HostTier("none")
PAPER = HostTier("paper")


def resolve_host_tier(setup: HostTier | bool | None, profile_default: bool) -> HostTier:
    """A setup from what a BenchConfig holds: None means the profile's `host_tier` for every
    policy; a bool means that value for every policy."""
    if setup is None:
        return ALL if profile_default else NONE
    if isinstance(setup, bool):
        return ALL if setup else NONE
    return setup


def parse_host_tier(text: str, known: Sequence[str]) -> HostTier:
    """`all` | `none` | `paper` | `POLICY[,POLICY...]` (registered names, no repeats)."""
    value = str(text).strip()
    if value in ("all", "none", "paper"):
        return HostTier(value)  # type: ignore[arg-type]
    names = tuple(p.strip() for p in value.split(","))
    for name in names:
        if not name:
            raise ConfigError(f"--host-tier: empty policy name in {text!r}")
        if name not in known and not is_policy_path(name):
            raise ConfigError(f"--host-tier: expected all, none, paper or policy names; "
                              f"unknown policy '{name}' (known: {', '.join(known)})")
    if len(set(names)) != len(names):
        raise ConfigError(f"--host-tier: a policy is given twice in {text!r}")
    return HostTier("policies", names)
