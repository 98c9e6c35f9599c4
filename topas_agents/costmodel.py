"""Serving cost profiles: how long prefill, decode and prefix swaps take on one GPU.

A profile is plain data (a YAML file in `topas_agents/profiles/`, sources cited there).
Both the simulated engine and the policies (Topas prices service time and swaps with it)
use the same `Profile`, so estimates and simulated reality agree by construction.

`call_overhead_s` is the one term outside the engine: the time a call spends in HTTP,
tokenization, detokenization and client work, charged by the offline driver (the client
it plays), never by the engine or the policies' service estimates (docs/simulator.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import ConfigError, WorkflowError
from .workflow import load_yaml_data

DEFAULT_PROFILE = "a100-80g-qwen2.5-32b"
_PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    gpu: str
    model: str
    kv_bytes_per_token: int
    kv_budget_tokens: int
    tm_s: float  # weight-read bound per forward step
    tc_s_per_token: float  # compute per token in a step (MLP + linear)
    lm_head_s: float
    overhead_s: float  # scheduler / launch overhead per step
    hbm_bytes_per_s: float  # effective rate for reading KV during decode
    attn_flops_per_token_pair: float
    attn_flops_per_s: float
    swap_bytes_per_s: float  # host <-> device link
    host_tier: bool  # evicted prefixes go to CPU memory (else they are dropped)
    # Per call, outside the model: HTTP, (de)tokenization and client work, seconds. Default 0:
    # the shipped GPU profiles are fits to model time alone (their sources time forward
    # passes, not HTTP calls), so they have no measured value to give, and their results stay
    # as they were. `topas calibrate --server` measures it on a live server.
    call_overhead_s: float = 0.0

    def step_s(self, new_tokens: int, context_tokens: int, attn_pairs: float = 0.0) -> float:
        """One forward step over `new_tokens` tokens reading `context_tokens` of KV.

        T = sqrt(Tm^2 + (Tc*N)^2) + lm_head + KV read + prefill attention + overhead.
        """
        dense = math.hypot(self.tm_s, self.tc_s_per_token * new_tokens)
        kv_read = context_tokens * self.kv_bytes_per_token / self.hbm_bytes_per_s
        attn = attn_pairs * self.attn_flops_per_token_pair / self.attn_flops_per_s
        return dense + self.lm_head_s + kv_read + attn + self.overhead_s

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """A decode step for `batch` requests whose KV totals `context_tokens`."""
        return self.step_s(batch, context_tokens)

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Prefill of `new_tokens` uncached tokens after `cached_tokens` reused ones."""
        if new_tokens <= 0:
            return 0.0
        pairs = new_tokens * (cached_tokens + new_tokens / 2)
        return self.step_s(new_tokens, 0, pairs)

    def swap_s(self, tokens: int) -> float:
        """Moving `tokens` of KV over the host link (either direction)."""
        return tokens * self.kv_bytes_per_token / self.swap_bytes_per_s

    def request_service_s(self, prefix: int, input_tokens: int, output_tokens: int,
                          prefix_cached: bool = True) -> float:
        """Batch-1 service estimate for one request (used for profiles and lower bounds)."""
        uncached = input_tokens + (0 if prefix_cached else prefix)
        cached = prefix if prefix_cached else 0
        ctx = prefix + input_tokens + output_tokens / 2
        return self.prefill_s(uncached, cached) + output_tokens * self.decode_step_s(1, int(ctx))


def available_profiles() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in _PROFILE_DIR.glob("*.yaml")))


def _as_int(value: Any) -> int:
    """An integer field's value: a bool (YAML `true`) is not a count and a fraction is not
    truncated (`kv_budget_tokens: 17500.5` silently became 17500)."""
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int):
        return value
    number = float(value)  # a float, or a string such as "1.5e5" (see `_coerce`)
    if not number.is_integer():
        raise ValueError
    return int(number)


def _as_float(value: Any) -> float:
    if isinstance(value, bool):  # `tm_s: true` is a typo, not 1.0 s
        raise ValueError
    return float(value)


def _as_str(value: Any) -> str:
    """A text field: a scalar, not blank (an empty `name` labelled results with nothing)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value).strip():
        raise ValueError
    return str(value)


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError
    return value


_CONVERTERS = {"int": _as_int, "float": _as_float, "str": _as_str, "bool": _as_bool}
_KINDS = {"int": "an integer", "float": "a number", "str": "a non-empty string", "bool": "true or false"}


def _coerce(key: str, kind: str, value: Any, path: Path) -> Any:
    # PyYAML reads `1.5e12` (no sign in the exponent) as a string: coerce by field type.
    try:
        return _CONVERTERS[kind](value)
    except (ValueError, TypeError, KeyError, OverflowError):
        raise ConfigError(f"{path}: field '{key}' must be {_KINDS.get(kind, kind)}, got {value!r}") from None


def _read_profile_data(path: Path) -> Any:
    """The parsed YAML of a profile file; ConfigError for a directory, an unreadable or binary
    file, invalid YAML, a repeated key or deep nesting (`load_yaml_data`: the workflow
    loader's guards, which a profile needs as much)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read profile file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return load_yaml_data(text)
    except WorkflowError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE, **overrides: Any) -> Profile:
    """Load a built-in profile by name or a YAML file by path; `overrides` replace fields."""
    path = Path(name_or_path)
    if path.suffix.lower() not in (".yaml", ".yml"):  # as workflows: any suffix's case, any file
        builtin = _PROFILE_DIR / f"{name_or_path}.yaml"
        if len(path.parts) == 1 and builtin.exists():  # a bare name; "/x/gpu" read /x/gpu.yaml
            path = builtin
        elif not path.is_file():
            raise ConfigError(
                f"unknown profile '{name_or_path}' (built-in: {', '.join(available_profiles())}; or give a "
                "profile file's path)"
            )
    if not path.exists():
        raise ConfigError(f"profile file not found: {path}")
    data = _read_profile_data(path)
    fields = {f.name: f.type for f in dataclasses.fields(Profile)}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    unknown = sorted(set(data) - set(fields))
    optional = {f.name for f in dataclasses.fields(Profile) if f.default is not dataclasses.MISSING}
    missing = sorted(set(fields) - set(data) - optional)
    if unknown or missing:
        raise ConfigError(f"{path}: unknown fields {unknown}, missing fields {missing}")
    profile = Profile(**{k: _coerce(k, fields[k], v, path) for k, v in data.items()})
    _check_values(profile, path)
    bad = sorted(set(overrides) - set(fields))
    if bad:
        raise ConfigError(f"unknown profile field '{bad[0]}'")
    profile = replace(profile, **overrides) if overrides else profile
    _check_step_times(profile, path)
    return profile


# Rates the cost model divides by: zero would make every step infinite.
_DIVISORS = ("hbm_bytes_per_s", "attn_flops_per_s", "swap_bytes_per_s")
# Times per forward step, per token of a step, or per call. Real ones are milliseconds (a
# CPU-served small model: well under a second); 10 s leaves room for any such server. A
# larger one is a typo or a unit error, and made nonsense runs: `tm_s: 1e308` overflowed the
# capacity estimate and failed as "arrival rate must be > 0 tasks/s, got 0.0".
MAX_TIME_S = 10.0
_TIMES = ("tm_s", "tc_s_per_token", "lm_head_s", "overhead_s", "call_overhead_s")


# A forward step of one token takes at least this long (the fastest real decode steps take
# milliseconds). Below it the simulator counted steps into the astronomical: a profile with
# every time 0 and a 1e100 B/s bandwidth hung it, and `topas serve` with it never answered.
MIN_STEP_S = 1e-6
# A decode step over the whole KV budget, a prefill of a SGLang chunk (8192 tokens) and moving
# the whole budget over the host link each take at most this long; more is a unit error
# (`kv_bytes_per_token: 1e300` made every step infinite: an OverflowError traceback).
MAX_STEP_S = 600.0
_CHUNK_TOKENS = 8192


def _check_step_times(profile: Profile, path: Path) -> None:
    """What the simulator derives from the values is a usable time (see MIN_STEP_S, MAX_STEP_S)."""
    budget = profile.kv_budget_tokens
    with contextlib.suppress(OverflowError):
        shortest = profile.step_s(1, 0)
        if not shortest >= MIN_STEP_S:
            raise ConfigError(f"{path}: a one-token forward step takes {shortest:.3g} s under these values "
                              f"(tm_s, tc_s_per_token, lm_head_s, overhead_s); it must be at least {MIN_STEP_S:g} s")
        derived = {"a decode step over the whole KV budget (kv_bytes_per_token x kv_budget_tokens / "
                   "hbm_bytes_per_s)": profile.decode_step_s(1, budget),
                   f"a prefill of {_CHUNK_TOKENS} tokens (attn_flops_per_token_pair / attn_flops_per_s)":
                       profile.prefill_s(_CHUNK_TOKENS),
                   "moving the whole KV budget to or from the host (swap_bytes_per_s)":
                       budget * profile.kv_bytes_per_token / profile.swap_bytes_per_s}
        for what, seconds in derived.items():
            if not (math.isfinite(seconds) and seconds <= MAX_STEP_S):
                raise ConfigError(f"{path}: {what} takes {seconds:.3g} s under these values; "
                                  f"at most {MAX_STEP_S:g} s is a real engine (a unit error?)")
        return
    raise ConfigError(f"{path}: the step times overflow under these values (a unit error?)")


def _check_values(profile: Profile, path: Path) -> None:
    """Times and sizes are finite and >= 0, rates and sizes that scale work > 0: a NaN or an
    infinite rate gave nonsense runs or an unrelated error later (NaN `tc_s_per_token` was
    reported as "arrival rate must be > 0"); times are at most MAX_TIME_S."""
    for f in dataclasses.fields(Profile):
        value = getattr(profile, f.name)
        if f.type not in ("int", "float"):
            continue
        positive = f.name in _DIVISORS or f.name in ("kv_bytes_per_token", "kv_budget_tokens")
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            need = "> 0" if positive else ">= 0"
            raise ConfigError(f"{path}: {f.name} must be a finite number {need}, got {value!r}")
        if f.name in _TIMES and value > MAX_TIME_S:
            raise ConfigError(f"{path}: {f.name} must be at most {MAX_TIME_S:g} s, got {value!r}")
