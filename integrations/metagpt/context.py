"""`metagpt_context(...)`: a fresh MetaGPT `Context` per run (needs MetaGPT imported).

MetaGPT mutates the run's Config (`project_path`) and deletes an existing project directory
of the same name, so every run gets its own Config and a unique project name; the generated
repository is at `<root>/workspace/<project_name>/`, as with MetaGPT's own CLI (its source
package is `<that>/<project_name>/`). Streaming is off (MetaGPT's default streams and prints every chunk),
and cost accounting is off (an unknown model only produces warnings). Diagrams are rendered as
the user's MetaGPT config says, and not at all where its renderer is missing (`mermaid_config`).
"""

from __future__ import annotations

from .environment import require_prepared

require_prepared(__name__)  # before any metagpt import
# ruff: noqa: E402

import re
import shutil
import uuid
from pathlib import Path

from metagpt.config2 import Config
from metagpt.config2 import config as global_config
from metagpt.configs.llm_config import LLMConfig
from metagpt.configs.mermaid_config import MermaidConfig
from metagpt.configs.workspace_config import WorkspaceConfig
from metagpt.context import Context

from .config_file import DEFAULT_API_KEY, DEFAULT_MODEL


def project_name_for(task_id: str) -> str:
    """A unique, importable project name (MetaGPT makes it the source package name)."""
    slug = re.sub(r"\W+", "_", task_id).strip("_").lower() or "task"
    if slug[0].isdigit():
        slug = f"t_{slug}"
    return f"{slug}_{uuid.uuid4().hex[:6]}"


def llm_config(base_url: str, *, model: str = DEFAULT_MODEL, api_key: str = DEFAULT_API_KEY,
               max_tokens: int = 4096, timeout_s: int = 600) -> LLMConfig:
    return LLMConfig(api_type="openai", base_url=base_url, api_key=api_key, model=model, stream=False,
                     max_token=max_tokens, timeout=timeout_s, calc_usage=False)


def metagpt_context(base_url: str, root: str | Path, project_name: str | None = None, *,
                    model: str = DEFAULT_MODEL, api_key: str = DEFAULT_API_KEY, max_tokens: int = 4096,
                    timeout_s: int = 600, code_review_k_times: int = 2,
                    context_cls: type[Context] = Context) -> Context:
    """A new Context whose workspace is `<root>/workspace/` and whose project (the artifacts)
    is `<root>/workspace/<project_name>/`. `project_name` defaults to a fresh unique one."""
    name = project_name or project_name_for("topas")
    workspace = workspace_dir(root)
    config = Config(llm=llm_config(base_url, model=model, api_key=api_key, max_tokens=max_tokens,
                                   timeout_s=timeout_s),
                    workspace=WorkspaceConfig(path=workspace), project_name=name,
                    code_review_k_times=code_review_k_times, mermaid=mermaid_config())
    return context_cls(config=config)


def mermaid_config() -> MermaidConfig:
    """How a run renders MetaGPT's diagrams: the user's `mermaid` settings (MetaGPT's global
    config, whose `path` its renderer reads in any case), with engine 'none' where the default
    engine's `mmdc` (Node's mermaid-cli) is not installed. Without it MetaGPT spawns a shell per
    diagram that prints 'no mermaid' to the terminal, then logs a warning and renders nothing;
    the diagrams' `.mmd` sources are written either way."""
    mermaid = global_config.mermaid.model_copy()
    if mermaid.engine == "nodejs" and shutil.which(mermaid.path) is None:
        mermaid.engine = "none"
    return mermaid


def workspace_dir(root: str | Path) -> Path:
    return Path(root).resolve() / "workspace"


def project_dir(root: str | Path, project_name: str) -> Path:
    """Where MetaGPT puts the project `project_name` of a context made by `metagpt_context`."""
    return workspace_dir(root) / project_name


def artifacts_dir(ctx: Context) -> Path:
    return Path(ctx.config.workspace.path) / ctx.config.project_name
