"""MetaGPT 0.8.2 integration (imported as `topas_agents.integrations.metagpt`).

Importing this package never imports MetaGPT and has no side effects. MetaGPT reads its
config file and writes logs at import, so the order is always:

    from topas_agents.integrations.metagpt import prepare_metagpt, run_tasks, RunOptions
    prepare_metagpt(".topas/metagpt")            # env + config2.yaml, then imports metagpt
    results = asyncio.run(run_tasks([...], RunOptions(...)))

Modules (see docs/integrations.md):
- `config_file`: write/patch a MetaGPT `config2.yaml` under a project root (no MetaGPT).
- `environment`: `prepare_metagpt(root)`, the one place that sets MetaGPT's environment.
- `layout`: per-agent static prefix first (prompt restructuring; pure text, no MetaGPT).
- `provider`: `TopasOpenAILLM`, the labelling LLM provider; `metagpt_context`.
- `roles`, `team_leader`: labelled SOP roles and the project-defined TeamLeader star.
- `stock`: `enable(base_url=...)`, one call that labels a stock MetaGPT script (reversible hooks).
- `patches`: the one reversible patch (MetaGPT's retry/wait settings, for fast failure).
- `recorder`: per-call records and JSONL traces; `runner`: tasks as MetaGPT Team runs.
- `softwaredev`: the SoftwareDev prompts; `evaluation`: Poisson-arrival evaluation.
"""

from __future__ import annotations

from topas_agents._lazy import lazy_getattr

_LAZY = {
    "write_config": "config_file",
    "read_config": "config_file",
    "DEFAULT_ROOT": "config_file",
    "prepare_metagpt": "environment",
    "metagpt_available": "environment",
    "restructure": "layout",
    "static_prefix_tokens": "layout",
    "TopasOpenAILLM": "provider",
    "ProviderOptions": "provider",
    "register_topas_provider": "provider",
    "metagpt_context": "context",
    "fast_retries": "patches",
    "enable": "stock",
    "StockNames": "stock",
    "CallRecorder": "recorder",
    "RunOptions": "runner",
    "TaskSpec": "runner",
    "TaskResult": "runner",
    "run_task": "runner",
    "run_tasks": "runner",
    "load_softwaredev": "softwaredev",
    "SoftwareDevPrompt": "softwaredev",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
