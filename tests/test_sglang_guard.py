"""`topas` (the core behind the forecast guard) as the scheduler of a real SGLang server: its
forecast runs in a background worker process spawned from SGLang's scheduler process while
the server keeps serving, and its scores land at a later decision (logged by the policy)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")

from sglang_cpu import serving  # noqa: E402

from topas_agents.realbench.client import run_tasks  # noqa: E402

# A forecast after the 3rd labelled task, small enough to finish in seconds on two cores.
OPTIONS = ["forecast_first=3", "forecast_tasks=6", "forecast_seeds=0", "forecast_candidates=lpm,parrot"]


def test_guard_forecasts_in_the_background_while_serving(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = serving.serve_namespace

    def with_options(*args: Any, **kwargs: Any) -> Any:
        ns = namespace(*args, **kwargs)
        ns.policy_opt = list(OPTIONS)
        return ns

    monkeypatch.setattr(serving, "serve_namespace", with_options)
    with serving.module_server(tmp_path, "topas", kv_tokens=3000) as server:
        plans = serving.plans(server.workflow, server.tokens, n_tasks=3, output_tokens=8, prefix="first")
        asyncio.run(run_tasks(server.base_url, "model", server.workflow, plans, timeout_s=300))
        log = server.text
        deadline = time.monotonic() + 120
        while "topas: forecast at" not in log() and time.monotonic() < deadline:
            # later decisions apply the landed forecast: keep the scheduler deciding
            more = serving.plans(server.workflow, server.tokens, n_tasks=1, output_tokens=4,
                                 prefix=f"more{int(time.monotonic() * 1000)}")
            asyncio.run(run_tasks(server.base_url, "model", server.workflow, more, timeout_s=120))
            time.sleep(1.0)
        text = log()
        assert "topas: forecast at" in text, text[-3000:]
        line = next(ln for ln in text.splitlines() if "topas: forecast at" in ln)
        assert "topas-core 1.000" in line and "lpm " in line and "parrot " in line
        assert "forecast failed" not in text and not server.records("error")
        assert {r["policy"] for r in server.records("loaded")} == {"topas"}
