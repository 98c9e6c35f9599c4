"""`topas calibrate --server URL`: measure a live OpenAI-compatible server, write a profile.

    topas calibrate --server http://127.0.0.1:30000/v1 --out my-gpu.yaml [--base-profile NAME]

Measured through HTTP only (so any engine works):
- prefill time vs uncached prompt tokens: one call per size, `max_tokens=1`, a unique first
  word so nothing is cached; the slope of wall time over prompt tokens is `tc_s_per_token`;
- decode step time vs batch size: `b` concurrent calls of exactly D output tokens (`min_tokens`
  = `max_tokens`) minus the same with 1 token, divided by D-1; the batch-1 step is `tm_s`
  (lm_head and per-step overhead are folded into it and written as 0);
- the KV budget from SGLang's `/get_server_info` (`max_total_num_tokens`) when available.
Not measurable over HTTP, so copied from `--base-profile` and listed as such in the file's
header: kv_bytes_per_token, hbm_bytes_per_s, attention FLOP terms, swap bandwidth, host_tier.
The measured points are written as comments so the fit can be checked.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import time
from pathlib import Path

from ..costmodel import DEFAULT_PROFILE, Profile, load_profile
from ..errors import ConfigError

WORDS = ("plan", "code", "test", "data", "user", "agent", "task", "value", "queue", "cache")
PREFILL_WORDS = (32, 128, 512, 1024)  # prompt sizes (words ~ tokens) for the prefill slope
BATCHES = (1, 2, 4, 8)
DECODE_TOKENS = 32  # output tokens per decode probe (long enough to amortize the prefill)
REPEATS = 3  # the minimum of repeats is kept: the least-disturbed measurement


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="measure a live server and write a cost profile YAML",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, metavar="URL", help="OpenAI base URL (…/v1)")
    p.add_argument("--model", default=None, help="model id (default: the server's first /v1/models entry)")
    p.add_argument("--out", required=True, metavar="PROFILE.yaml")
    p.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    p.add_argument("--base-profile", default=DEFAULT_PROFILE, help="profile supplying unmeasured fields")
    p.add_argument("--kv-budget", type=int, default=None, help="KV budget tokens if the server cannot report it")
    p.set_defaults(run=run)


async def _call(client, url: str, model: str, prompt: str, tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = await client.post(f"{url}/chat/completions", json={
        "model": model, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0.0,
        "messages": [{"role": "user", "content": prompt}]})
    if r.status_code != 200:
        raise ConfigError(f"calibrate: HTTP {r.status_code} from {url}: {r.text[:200]}")
    return time.perf_counter() - t0, int(r.json()["usage"]["prompt_tokens"])


def _prompt(n_words: int, rng: random.Random) -> str:
    return f"{rng.random():.12f} " + " ".join(rng.choice(WORDS) for _ in range(n_words))


def prefill_sizes(kv_budget: int | None) -> tuple[int, ...]:
    """Prompt sizes (words) that fit half the KV pool (a word is at most ~5 tokens here)."""
    if kv_budget is None:
        return PREFILL_WORDS
    fit = tuple(n for n in PREFILL_WORDS if n * 5 <= kv_budget // 2)
    return fit if len(fit) >= 2 else (8, max(16, kv_budget // 20))


async def measure(url: str, model: str, kv_budget: int | None = None
                  ) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(prompt tokens, prefill s) points and (batch, decode step s) points."""
    import httpx

    rng = random.Random(0)
    prefill: list[tuple[int, float]] = []
    decode: list[tuple[int, float]] = []
    async with httpx.AsyncClient(timeout=300) as c:
        await _call(c, url, model, _prompt(8, rng), 1)  # warm-up
        for n in prefill_sizes(kv_budget):
            runs = [await _call(c, url, model, _prompt(n, rng), 1) for _ in range(REPEATS)]
            prefill.append((runs[0][1], min(t for t, _ in runs)))
        for b in BATCHES:
            async def batch(tokens: int, b: int = b) -> float:
                t0 = time.perf_counter()
                await asyncio.gather(*(_call(c, url, model, _prompt(16, rng), tokens) for _ in range(b)))
                return time.perf_counter() - t0
            short = min([await batch(1) for _ in range(REPEATS)])
            long = min([await batch(DECODE_TOKENS) for _ in range(REPEATS)])
            decode.append((b, max(1e-6, (long - short) / (DECODE_TOKENS - 1))))
    return prefill, decode


def slope(points: list[tuple[int, float]]) -> float:
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return max(1e-9, sum((x - mx) * (y - my) for x, y in points) / var) if var else 1e-9


def _kv_budget(url: str, given: int | None) -> int | None:
    import httpx

    if given is not None:
        return given
    try:
        info = httpx.get(url.removesuffix("/v1") + "/get_server_info", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None
    value = info.get("max_total_num_tokens") or (info.get("internal_states") or [{}])[0].get("max_total_num_tokens")
    return int(value) if value else None


def fit_profile(base: Profile, name: str, model: str, budget: int, prefill: list[tuple[int, float]],
                decode: list[tuple[int, float]]) -> Profile:
    """`base` with the measured terms: batch-1 decode step as tm_s, prefill slope as tc."""
    return dataclasses.replace(base, name=name, gpu="measured", model=model, kv_budget_tokens=budget,
                               tm_s=decode[0][1], tc_s_per_token=slope(prefill), lm_head_s=0.0, overhead_s=0.0)


def write_profile(out: Path, profile: Profile, url: str, base_name: str, prefill: list[tuple[int, float]],
                  decode: list[tuple[int, float]]) -> None:
    import yaml

    header = [f"Measured by `topas calibrate --server {url}` on {time.strftime('%Y-%m-%d %H:%M:%S')}.",
              "prefill (prompt tokens, s): " + ", ".join(f"({n}, {t:.4f})" for n, t in prefill),
              "decode step (batch, s): " + ", ".join(f"({b}, {t:.5f})" for b, t in decode),
              f"copied from {base_name} (not measurable over HTTP): kv_bytes_per_token, hbm_bytes_per_s, "
              "attn_flops_per_token_pair, attn_flops_per_s, swap_bytes_per_s, host_tier"]
    body = yaml.safe_dump(dataclasses.asdict(profile), sort_keys=False)
    out.write_text("".join(f"# {line}\n" for line in header) + body)
    load_profile(out)  # what we wrote must load


def run(args: argparse.Namespace) -> int:
    import httpx

    url = args.server.rstrip("/")
    base = load_profile(args.base_profile)
    budget = _kv_budget(url, args.kv_budget)
    try:
        model = args.model or httpx.get(f"{url}/models", timeout=30).json()["data"][0]["id"]
        prefill, decode = asyncio.run(measure(url, model, budget))
    except httpx.HTTPError as exc:
        raise ConfigError(f"calibrate: cannot reach {url}: {exc}") from None
    if budget is None:
        raise ConfigError("calibrate: the server does not report its KV pool size; pass --kv-budget TOKENS")
    out = Path(args.out)
    profile = fit_profile(base, args.name or out.stem, model, budget, prefill, decode)
    write_profile(out, profile, url, base.name, prefill, decode)
    print(f"wrote {out}: tm_s {profile.tm_s:.5f}, tc_s_per_token {profile.tc_s_per_token:.3e}, "
          f"kv_budget_tokens {budget}")
    return 0
