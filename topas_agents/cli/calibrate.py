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
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ..costmodel import DEFAULT_PROFILE, Profile, load_profile
from ..errors import ConfigError
from .args import check_output, model_name, positive_int

WORDS = ("plan", "code", "test", "data", "user", "agent", "task", "value", "queue", "cache")
PREFILL_WORDS = (32, 128, 512, 1024)  # prompt sizes (words ~ tokens) for the prefill slope
BATCHES = (1, 2, 4, 8)
DECODE_TOKENS = 32  # output tokens per decode probe (long enough to amortize the prefill)
# Fewer extra steps than this between the long and the short probe time nothing but noise.
MIN_DECODE_STEPS = 8
REPEATS = 3  # prefill keeps the minimum (least disturbed); decode and bursts the median
CALL_PROBES = 9  # sequential minimal calls, reported beside the burst estimate
CALL_PROBE_WORDS = 8  # prompt of a minimal call: model time is then close to one batch-1 step
CALL_BURST = 16  # concurrent minimal calls per burst (fewer if the KV pool is small)
PROFILE_SUFFIXES = (".yaml", ".yml")  # what `load_profile` reads as a file, not a built-in name


class CallBurst(NamedTuple):
    """`calls` minimal calls sent at once: their prompt tokens and the wall time of all."""

    calls: int
    prompt_tokens: int
    wall_s: float


class Measurements(NamedTuple):
    """What `measure` takes through HTTP (each point: (x, seconds))."""

    prefill: list[tuple[int, float]]  # (prompt tokens, wall s of a 1-token call), min of repeats
    decode: list[tuple[int, float]]  # (batch size, decode step s)
    calls: list[CallBurst]  # CALL_PROBES single calls (calls=1), then REPEATS bursts


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="measure a live server and write a cost profile YAML",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, metavar="URL", help="OpenAI base URL (…/v1)")
    p.add_argument("--model", type=model_name, default=None, help="model id (default: the server's first /v1/models entry)")
    p.add_argument("--out", required=True, metavar="PROFILE.yaml")
    p.add_argument("--name", type=model_name, default=None, help="profile name (default: the output file's stem)")
    p.add_argument("--base-profile", default=DEFAULT_PROFILE, help="profile supplying unmeasured fields")
    p.add_argument("--kv-budget", type=positive_int, default=None,
                   help="KV budget tokens if the server cannot report it")
    p.add_argument("--api-key", default=None, metavar="KEY", help="the server's API key (default: $TOPAS_API_KEY)")
    p.set_defaults(run=run)


class Probe(NamedTuple):
    """One probe call: its wall time and the tokens the server says it read and generated."""

    seconds: float
    prompt_tokens: int
    completion_tokens: int


async def _call(client, url: str, model: str, prompt: str, tokens: int) -> Probe:
    t0 = time.perf_counter()
    r = await client.post(f"{url}/chat/completions", json={
        "model": model, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0.0,
        "messages": [{"role": "user", "content": prompt}]})
    if r.status_code != 200:
        raise ConfigError(f"calibrate: HTTP {r.status_code} from {url}: {r.text[:200]}")
    usage = r.json()["usage"]
    return Probe(time.perf_counter() - t0, int(usage["prompt_tokens"]), int(usage.get("completion_tokens") or 0))


def _prompt(n_words: int, rng: random.Random) -> str:
    return f"{rng.random():.12f} " + " ".join(rng.choice(WORDS) for _ in range(n_words))


def prefill_sizes(kv_budget: int | None) -> tuple[int, ...]:
    """Prompt sizes (words) that fit half the KV pool (a word is at most ~5 tokens here)."""
    if kv_budget is None:
        return PREFILL_WORDS
    fit = tuple(n for n in PREFILL_WORDS if n * 5 <= kv_budget // 2)
    return fit if len(fit) >= 2 else (8, max(16, kv_budget // 20))


async def measure(url: str, model: str, kv_budget: int | None = None, api_key: str | None = None) -> Measurements:
    """Prefill, decode-step and minimal-call points (see the module docstring)."""
    import httpx

    from ..integrations.task import auth_headers

    rng = random.Random(0)
    prefill: list[tuple[int, float]] = []
    decode: list[tuple[int, float]] = []
    async with httpx.AsyncClient(timeout=300, headers=auth_headers(api_key)) as c:
        await _call(c, url, model, _prompt(8, rng), 1)  # warm-up
        calls = [CallBurst(1, p.prompt_tokens, p.seconds)
                 for p in [await _call(c, url, model, _prompt(CALL_PROBE_WORDS, rng), 1) for _ in range(CALL_PROBES)]]
        k = burst_size(kv_budget)
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            done = await asyncio.gather(*(_call(c, url, model, _prompt(CALL_PROBE_WORDS, rng), 1) for _ in range(k)))
            calls.append(CallBurst(k, sum(p.prompt_tokens for p in done), time.perf_counter() - t0))
        for n in prefill_sizes(kv_budget):
            runs = [await _call(c, url, model, _prompt(n, rng), 1) for _ in range(REPEATS)]
            prefill.append((runs[0].prompt_tokens, min(p.seconds for p in runs)))
        for b in BATCHES:
            async def batch(tokens: int, b: int = b) -> tuple[float, int]:
                """(wall seconds, the most tokens a call of the batch generated: its steps)."""
                t0 = time.perf_counter()
                done = await asyncio.gather(*(_call(c, url, model, _prompt(16, rng), tokens) for _ in range(b)))
                return time.perf_counter() - t0, max(p.completion_tokens for p in done)
            decode.append((b, max(1e-6, statistics.median([_step_s(await batch(DECODE_TOKENS), await batch(1), url)
                                                           for _ in range(REPEATS)]))))
    return Measurements(prefill, decode, calls)


def _step_s(long: tuple[float, int], short: tuple[float, int], url: str) -> float:
    """Seconds per decode step from a long and a short batch, by the steps each generated (the
    server's usage): an engine that ignores min_tokens and stops early (the simulator's echo
    responder stopped at 24 of 32) made the step 25% short when 31 steps were assumed."""
    steps = long[1] - short[1]
    if steps < MIN_DECODE_STEPS:
        raise ConfigError(f"calibrate: {url} generated {long[1]} tokens for a {DECODE_TOKENS}-token probe "
                          f"(min_tokens is ignored, and it stops early); decode steps cannot be timed: give a "
                          "server that generates max_tokens (topas serve: --responder lorem)")
    return (long[0] - short[0]) / steps


def slope(points: list[tuple[int, float]]) -> float:
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


def burst_size(kv_budget: int | None) -> int:
    """CALL_BURST, or fewer so a burst's prompts fit half the KV pool (<= ~5 tokens a word)."""
    per_call = 5 * (CALL_PROBE_WORDS + 1)
    return CALL_BURST if kv_budget is None else max(2, min(CALL_BURST, kv_budget // 2 // per_call))


def fit_profile(base: Profile, name: str, model: str, budget: int, prefill: list[tuple[int, float]],
                decode: list[tuple[int, float]], calls: Sequence[CallBurst] = ()) -> Profile:
    """`base` with the measured terms: batch-1 decode step as tm_s, prefill slope as tc, and
    the per-call overhead from minimal `calls` (0 without them)."""
    tm = decode[0][1]
    fitted = dataclasses.replace(base, name=name, gpu="measured", model=model, kv_budget_tokens=budget,
                                 tm_s=tm, tc_s_per_token=slope(prefill) if rising(prefill) else decode_tc(tm, decode),
                                 lm_head_s=0.0, overhead_s=0.0, call_overhead_s=0.0)
    return dataclasses.replace(fitted, call_overhead_s=call_overhead(fitted, calls))


def rising(points: list[tuple[int, float]]) -> bool:
    """Whether the least-squares slope is positive (`slope` clamps it to 1e-9 otherwise)."""
    return slope(points) > 1e-9


def decode_tc(tm: float, decode: Sequence[tuple[int, float]]) -> float:
    """Least-squares tc in `step(b) = sqrt(tm^2 + (tc*b)^2)` over the batches b > 1 (0 if none)."""
    pts = [(b, t) for b, t in decode if b > 1]
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


def write_profile(out: Path, profile: Profile, url: str, base_name: str, prefill: list[tuple[int, float]],
                  decode: list[tuple[int, float]], calls: Sequence[CallBurst] = ()) -> None:
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
        raise ConfigError(f"--out {out}: cannot write: {exc.strerror or exc}") from None
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
        raise ConfigError(f"--out {out}: cannot write: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def check_profile_out(path: str) -> None:
    """`--out` names a profile file: `load_profile` reads only .yaml/.yml paths as files (any
    other was taken for a built-in name after the whole measurement, leaving the file)."""
    if Path(path).suffix not in PROFILE_SUFFIXES:
        raise ConfigError(f"--out {path}: a profile file must end in {' or '.join(PROFILE_SUFFIXES)}")


def run(args: argparse.Namespace) -> int:
    import httpx

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
    try:
        m = asyncio.run(measure(url, model, budget, key))
    except httpx.HTTPError as exc:
        raise ConfigError(f"calibrate: cannot reach {url}: {exc}") from None
    out = Path(args.out)
    profile = fit_profile(base, args.name or out.stem, model, budget, m.prefill, m.decode, m.calls)
    write_profile(out, profile, url, base.name, m.prefill, m.decode, m.calls)
    print(f"wrote {out}: tm_s {profile.tm_s:.5f}, tc_s_per_token {profile.tc_s_per_token:.3e}, "
          f"call_overhead_s {profile.call_overhead_s:.4f}, kv_budget_tokens {budget}")
    return 0
