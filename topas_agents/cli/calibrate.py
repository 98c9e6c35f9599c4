"""`topas calibrate --server URL`: measure a live OpenAI-compatible server, write a profile.

    topas calibrate --server http://127.0.0.1:30000/v1 --out my-gpu.yaml [--base-profile NAME]

Measured through HTTP only (so any engine works):
- prefill time vs uncached prompt tokens: one call per size, `max_tokens=1`, a unique first
  word so nothing is cached; the slope of wall time over prompt tokens;
- decode step time vs batch size: `b` concurrent calls of exactly D output tokens (`min_tokens`
  = `max_tokens`) minus the same with 1 token, divided by D-1 (the median over `REPEATS`
  such pairs: one disturbed pair must not set the step); the batch-1 step is `tm_s` (lm_head
  and per-step overhead are folded into it and written as 0);
- `tc_s_per_token`, the per-token compute of a step `sqrt(tm^2 + (tc*N)^2)`, is the prefill
  slope; if noise leaves no rising slope (a CPU-served model with a small pool: the prompt
  sizes that fit differ too little), the least-squares fit of that form to the decode
  batches instead (on a GPU decode batches grow by KV reads more than by this term, so they
  are not used when the slope is there);
- the per-call overhead (`call_overhead_s`: HTTP, tokenization, detokenization, client
  work), from minimal calls (a few prompt tokens, `max_tokens=1`): a burst of k concurrent
  ones takes k front-end services plus one batched prefill, so the overhead is the median
  over `REPEATS` bursts of (wall time - the fitted profile's prefill of their tokens) / k.
  The simulator charges it on one FIFO front-end (docs/simulator.md), and a burst measures
  exactly that service time with the server busy. `CALL_PROBES` sequential single calls are
  measured too and written beside it (their latency also holds idle wake-ups). Without the
  term the simulator counts model time only, which on a small or CPU-served model can be a
  fraction of what a client sees;
- the KV budget from SGLang's `/get_server_info` (`max_total_num_tokens`), or from our own
  server's `/v1/topas/stats` (`kv.budget`; behind `topas serve --replicas`, the replicas'
  common budget), when available (`--kv-budget` otherwise).
Not measurable over HTTP, so copied from `--base-profile` and listed as such in the file's
header: kv_bytes_per_token, hbm_bytes_per_s, attention FLOP terms, swap bandwidth, host_tier.
The measured points are written as comments so the fit can be checked.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ..costmodel import DEFAULT_PROFILE, Profile, available_profiles, load_profile
from ..errors import ConfigError
from .args import check_output, model_name, positive_int
from .calibrate_probe import (
    DECODE_TOKENS,
    PREFILL_WORDS,
    CallBurst,
    DecodePoint,
    PrefillPoint,
    _step_s,
    burst_size,
    measure,
    prefill_sizes,
    reason,
)

# The probes moved to calibrate_probe; what callers imported from here still is.
__all__ = ["DECODE_TOKENS", "PREFILL_WORDS", "CallBurst", "_step_s", "burst_size", "measure", "prefill_sizes",
           "add_parser", "run", "fit_profile", "write_profile", "slope", "decode_tc", "call_overhead"]
# Suffixes `load_profile` reads as a file whatever the path (`check_profile_out`).
PROFILE_SUFFIXES = (".yaml", ".yml")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="measure a live server and write a cost profile YAML",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, metavar="URL", help="OpenAI base URL (…/v1)")
    p.add_argument("--model", type=model_name, default=None, help="model id (default: the server's first /v1/models entry)")
    p.add_argument("--out", required=True, metavar="PATH",
                   help="profile file to write (any name; `--profile PATH` loads it)")
    p.add_argument("--name", type=model_name, default=None, help="profile name (default: the output file's stem)")
    p.add_argument("--base-profile", default=DEFAULT_PROFILE, help="profile supplying unmeasured fields")
    p.add_argument("--kv-budget", type=positive_int, default=None,
                   help="KV budget tokens if the server cannot report it")
    p.add_argument("--api-key", default=None, metavar="KEY", help="the server's API key (default: $TOPAS_API_KEY)")
    p.set_defaults(run=run)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points, clamped to 1e-9 (a flat or falling fit)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return max(1e-9, sum((x - mx) * (y - my) for x, y in points) / var) if var else 1e-9


_STATS = "/v1/topas/stats?calls=0"


def _server_json(url: str, path: str, api_key: str | None) -> object:
    """The server's `path` (from its root) as JSON; None when it has none (another engine) or
    cannot be reached. A refused key is a ConfigError (it was read as "reports no KV pool size")."""
    import httpx

    from ..integrations.task import auth_headers, refused_key_message

    try:
        rsp = httpx.get(url.removesuffix("/v1") + path, headers=auth_headers(api_key), timeout=10)
    except httpx.HTTPError:
        return None
    if rsp.status_code in (401, 403):
        raise ConfigError(refused_key_message(url, api_key, rsp.status_code))
    try:
        return rsp.json() if rsp.status_code == 200 else None
    except ValueError:
        return None


def _kv_budget(url: str, given: int | None, api_key: str | None = None, stats: object = None) -> int | None:
    """`given`, else SGLang's pool size, else a Topas server's budget (from `stats`, its
    `/v1/topas/stats` when the caller has it already)."""
    if given is not None:
        return given
    found = _sglang_budget(_server_json(url, "/get_server_info", api_key))
    return found if found is not None else _topas_budget(stats if stats is not None else
                                                         _server_json(url, _STATS, api_key))


def _budget(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _sglang_budget(info: object) -> int | None:
    """SGLang's `/get_server_info`: `max_total_num_tokens`, top level or per scheduler."""
    states = info.get("internal_states") if isinstance(info, dict) else None
    for source in (info, *(states if isinstance(states, list) else ())):
        value = _budget(source.get("max_total_num_tokens")) if isinstance(source, dict) else None
        if value is not None:
            return value
    return None


def _simulated_time_scale(stats: object) -> float | None:
    """A `topas serve --engine sim`'s time scale, as its stats report it (None: another engine)."""
    server = stats.get("server") if isinstance(stats, dict) else None
    if not isinstance(server, dict):
        return None
    scale = server.get("time_scale") if server.get("engine") == "sim" else None
    return float(scale) if isinstance(scale, int | float) and not isinstance(scale, bool) else None


def _topas_budget(stats: object) -> int | None:
    """Our server's `/v1/topas/stats`: `kv.budget`; behind a cluster front, the replicas'
    budget when they all report the same one (a call runs on one replica)."""
    if not isinstance(stats, dict):
        return None
    kv = stats.get("kv")
    if isinstance(kv, dict):
        return _budget(kv.get("budget"))
    rows = stats.get("replicas")
    budgets = {_budget((row.get("kv") or {}).get("budget")) for row in rows if isinstance(row, dict)
               and isinstance(row.get("kv"), dict)} if isinstance(rows, list) else set()
    return budgets.pop() if len(budgets) == 1 else None


def fit_profile(base: Profile, name: str, model: str, budget: int, prefill: Sequence[PrefillPoint],
                decode: Sequence[DecodePoint], calls: Sequence[CallBurst] = ()) -> Profile:
    """`base` with the measured terms: batch-1 decode step as tm_s, prefill slope as tc, and
    the per-call overhead from minimal `calls` (0 without them)."""
    _, tm = decode[0]  # (batch 1, its step): unpacked, so plain (batch, s) pairs fit too
    fitted = dataclasses.replace(base, name=name, gpu="measured", model=model, kv_budget_tokens=budget,
                                 tm_s=tm, tc_s_per_token=slope(prefill) if rising(prefill) else decode_tc(tm, decode),
                                 lm_head_s=0.0, overhead_s=0.0, call_overhead_s=0.0)
    return dataclasses.replace(fitted, call_overhead_s=call_overhead(fitted, calls))


def rising(points: Sequence[tuple[float, float]]) -> bool:
    """Whether the least-squares slope is positive (`slope` clamps it to 1e-9 otherwise)."""
    return slope(points) > 1e-9


def decode_tc(tm: float, decode: Sequence[DecodePoint]) -> float:
    """Least-squares tc in `step(b) = sqrt(tm^2 + (tc*b)^2)` over the batches b > 1 (0 if none)."""
    pts = [(batch, step_s) for batch, step_s in decode if batch > 1]
    den = sum(b**4 for b, _ in pts)
    return math.sqrt(max(0.0, sum(b * b * (t * t - tm * tm) for b, t in pts) / den)) if den else 0.0


def call_overhead(profile: Profile, calls: Sequence[CallBurst]) -> float:
    """Per-call front-end time, >= 0: the median over the bursts (or, with none, over the
    single calls) of (wall time - modelled time) / calls.

    A `max_tokens=1` call is one prefill in the simulator (the prefill yields the token), and
    a burst's prompts are prefilled together: modelled time `prefill_s(prompt tokens)`,
    nothing cached (each prompt starts with a unique word)."""
    bursts = [b for b in calls if b.calls > 1] or list(calls)
    if not bursts:
        return 0.0
    return max(0.0, statistics.median((b.wall_s - profile.prefill_s(b.prompt_tokens)) / b.calls for b in bursts))


def write_profile(out: Path, profile: Profile, url: str, base_name: str, prefill: Sequence[PrefillPoint],
                  decode: Sequence[DecodePoint], calls: Sequence[CallBurst] = ()) -> None:
    import yaml

    header = [f"Measured by `topas calibrate --server {url}` on {time.strftime('%Y-%m-%d %H:%M:%S')}.",
              "prefill (prompt tokens, s): " + ", ".join(f"({n}, {t:.4f})" for n, t in prefill),
              "decode step (batch, s): " + ", ".join(f"({b}, {t:.5f})" for b, t in decode),
              "minimal calls (calls at once, prompt tokens, wall s): "
              + ", ".join(f"({b.calls}, {b.prompt_tokens}, {b.wall_s:.4f})" for b in calls)
              + f" -> call_overhead_s {profile.call_overhead_s:.4f} (bursts: (wall - modelled prefill) / calls)",
              f"copied from {base_name} (not measurable over HTTP): kv_bytes_per_token, hbm_bytes_per_s, "
              "attn_flops_per_token_pair, attn_flops_per_s, swap_bytes_per_s, host_tier"]
    body = yaml.safe_dump(dataclasses.asdict(profile), sort_keys=False)
    _write_checked(out, "".join(f"# {line}\n" for line in header) + body)


def _write_checked(out: Path, text: str) -> None:
    """Write `text` to `out` only if it loads as a profile: it goes to a temporary file beside
    `out` first (same suffix, so `load_profile` reads it as a file), which replaces `out` once
    it loads and is removed otherwise (a failed command leaves no file, and keeps an older one)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # check_output leaves missing folders to the writer
        fd, name = tempfile.mkstemp(prefix=f".{out.stem}.", suffix=out.suffix, dir=out.parent)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write: {exc.strerror or reason(exc)}") from None
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 is not what a plain write gives
        load_profile(tmp)  # what we wrote must load
        os.replace(tmp, out)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(str(tmp), str(out))) from None
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write: {exc.strerror or reason(exc)}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def check_profile_out(path: str) -> None:
    """`--out` may be any path, as `--profile` loads a file of any suffix, but one: a bare name
    (no folder, no .yaml/.yml) that is a built-in profile's. `load_profile` reads that name as
    the built-in, so the measured file could never be loaded by it (`./NAME` is the same
    path); refused before the measuring, not found out after it."""
    given = Path(path)
    if given.suffix.lower() not in PROFILE_SUFFIXES and len(given.parts) == 1 and given.name in available_profiles():
        raise ConfigError(f"--out {path}: `--profile {path}` would load the built-in profile {given.name}, not "
                          f"this file; give it a {' or '.join(PROFILE_SUFFIXES)} suffix or another name")


def run(args: argparse.Namespace) -> int:
    url = args.server.rstrip("/")
    check_output("--out", args.out)  # before minutes of measuring, not after
    check_profile_out(args.out)
    base = load_profile(args.base_profile)
    from ..realbench.client import first_model_id
    from .args import client_api_key

    key = client_api_key(args)
    model = args.model or first_model_id(url, key)
    stats = _server_json(url, _STATS, key)  # read once: the budget and the time scale
    budget = _kv_budget(url, args.kv_budget, key, stats)
    scale = _simulated_time_scale(stats)
    if scale is not None and scale != 1:
        print(f"note: {url} is a simulated server at --time-scale {scale:g}: it serves {scale:g}x faster than the "
              "model it simulates, while the fields taken from --base-profile (KV read, attention, swap) stay "
              "in real time; the profile will not reproduce it (calibrate a --time-scale 1 server)", file=sys.stderr)
    if budget is None:
        raise ConfigError("calibrate: the server does not report its KV pool size; pass --kv-budget TOKENS")
    m = asyncio.run(measure(url, model, budget, key))  # a failed call: a ConfigError naming it
    out = Path(args.out)
    profile = fit_profile(base, args.name or out.stem, model, budget, m.prefill, m.decode, m.calls)
    write_profile(out, profile, url, base.name, m.prefill, m.decode, m.calls)
    print(f"wrote {out}: tm_s {profile.tm_s:.5f}, tc_s_per_token {profile.tc_s_per_token:.3e}, "
          f"call_overhead_s {profile.call_overhead_s:.4f}, kv_budget_tokens {budget}")
    return 0
