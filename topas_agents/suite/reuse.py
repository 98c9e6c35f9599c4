"""Baseline runs taken from an earlier suite JSON (`topas bench --suite random --reuse FILE`).

A suite run spends most of its baseline CPU on the same five stock schedulers every time a
variant of Topas is judged. Their runs depend only on the workflow, the arrival seed, the
load, the task count, the profile, the KV budget, the host tier and their own options (each
load's trace is drawn from the seed and the rate alone), so a run already in a suite JSON of
the same suite is the run this suite would make. What is checked before anything is reused:

* the file is a random-suite JSON with the same generator seed, task count, profile (name
  and every value), KV budget, and host tier for each baseline;
* every stored workflow that this suite generates under the same name is the same workflow
  (a generator change would otherwise pair new workflows with old runs);
* each reused baseline ran with the same options (`--policy-opt`) as now.

Only the baselines are reused: the policies being judged are the ones being changed. What is
not checked is the code: a change to a baseline or to the simulator since the file was
written is not detected, so the JSON says which file the baselines came from.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..bench.hosttier import parse_host_tier, resolve_host_tier
from ..bench.options import options_record
from ..costmodel import Profile, load_profile
from ..errors import ConfigError
from ..policies import available_policies
from .generate import GeneratedWorkflow, workflow_to_dict

# job key (workflow index, arrival seed) -> load -> baseline -> kept metrics
ReusedRuns = dict[tuple[int, int], dict[float, dict[str, dict[str, Any]]]]


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--reuse {path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--reuse {path}: not JSON ({exc})") from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise ConfigError(f"--reuse {path}: not a suite JSON (nested too deeply)") from None
    if not isinstance(doc, dict) or doc.get("suite") != "random" or not isinstance(doc.get("workflows"), list):
        raise ConfigError(f"--reuse {path}: not a random-suite JSON (topas bench --suite random --json)")
    return doc


def _check_setup(doc: Mapping[str, Any], path: Path, config: Any) -> None:
    want = {"gen_seed": config.gen_seed, "tasks": config.tasks, "profile": config.profile.name,
            "kv_budget": config.budget}
    for key, value in want.items():
        if doc.get(key) != value:
            raise ConfigError(f"--reuse {path}: its {key} is {doc.get(key)!r}, this suite's is {value!r}; "
                              "only runs of the same suite can be reused")
    _check_profile_values(doc, path, config.profile)
    _check_host_tier(doc, path, config)
    stored = doc.get("policy_options") or {}
    current = options_record(config.policy_options)
    for policy in config.baselines:
        if stored.get(policy) != current.get(policy):
            raise ConfigError(f"--reuse {path}: {policy} ran with options {stored.get(policy) or {}}, "
                              f"here {current.get(policy) or {}}")


def profile_record(profile: Profile) -> dict[str, Any]:
    """Every field of the cost profile, as the suite JSON stores it (`profile_values`)."""
    return dataclasses.asdict(profile)


def _check_profile_values(doc: Mapping[str, Any], path: Path, profile: Profile) -> None:
    """The same cost model, not just the same name: a calibrated or edited profile keeps its
    file's name (a 5x slower GPU under the A100's name was reused, and every verdict was
    wrong). A file written before the values were stored holds a built-in's name: its values."""
    stored = doc.get("profile_values")
    if stored is None:
        try:
            stored = profile_record(load_profile(str(doc.get("profile"))))
        except (ConfigError, OSError):
            raise ConfigError(f"--reuse {path}: it does not record its profile's values; rerun it") from None
    current = json.loads(json.dumps(profile_record(profile)))
    if not isinstance(stored, dict) or stored != current:
        diff = sorted(k for k in current if not isinstance(stored, dict) or stored.get(k) != current[k])
        raise ConfigError(f"--reuse {path}: its profile {doc.get('profile')!r} differs from this suite's in "
                          f"{', '.join(diff) or 'its fields'}; only runs on the same cost model can be reused")


def _check_host_tier(doc: Mapping[str, Any], path: Path, config: Any) -> None:
    """Each baseline has the host tier there as here (`paper` and `none` give them the same,
    and no `--host-tier` is the profile's default for everyone)."""
    def tiers(label: Any) -> dict[str, bool]:
        setup = parse_host_tier(label, available_policies()) if isinstance(label, str) else label
        tier = resolve_host_tier(setup, config.profile.host_tier)
        return {b: tier.has(b) for b in config.baselines}

    try:
        stored = tiers(doc.get("host_tier"))
    except ConfigError:
        raise ConfigError(f"--reuse {path}: its host_tier {doc.get('host_tier')!r} is not a setup") from None
    current = tiers(config.host_tier)
    if stored != current:
        raise ConfigError(f"--reuse {path}: its baselines ran with the host tier {stored}, here {current} "
                          f"(--host-tier {doc.get('host_tier')!r} there); only runs of the same setup can be reused")


def _same_workflow(stored: Any, gen: GeneratedWorkflow) -> bool:
    # A JSON round trip on both sides: the stored dict has lists where the generator has tuples.
    return json.loads(json.dumps(stored)) == json.loads(json.dumps(workflow_to_dict(gen.workflow)))


def _rows(stored_runs: Mapping[str, Any], seed: int, loads: Sequence[float],
          baselines: Sequence[str]) -> dict[float, dict[str, dict[str, Any]]]:
    by_load = stored_runs.get(str(seed)) or {}
    out: dict[float, dict[str, dict[str, Any]]] = {}
    for u in loads:
        rows = by_load.get(f"{u:g}") or {}
        kept = {p: dict(rows[p]) for p in baselines
                if isinstance(rows.get(p), dict) and not rows[p].get("error")}
        if kept:
            out[u] = kept
    return out


def load_reused(path: Path, config: Any, suite: Sequence[GeneratedWorkflow]) -> ReusedRuns:
    """The baselines' runs in `path` that this suite (`config`, a SuiteConfig, and its
    generated workflows) would make; ConfigError when the file is another suite's."""
    doc = _read(path)
    _check_setup(doc, path, config)
    stored = {w.get("name"): w for w in doc["workflows"] if isinstance(w, dict)}
    out: ReusedRuns = {}
    for gen in suite:
        entry = stored.get(gen.workflow.name)
        if entry is None:
            continue
        if not _same_workflow(entry.get("workflow"), gen):
            raise ConfigError(f"--reuse {path}: its {gen.workflow.name} is not the workflow this suite "
                              "generates under that name (was the generator changed?)")
        for seed in config.seeds:
            rows = _rows(entry.get("runs") or {}, seed, config.loads, config.baselines)
            if rows:
                out[gen.index, seed] = rows
    return out

