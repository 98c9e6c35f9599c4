"""`prepare_metagpt(root)`: the ONE place that sets up MetaGPT's process environment.

MetaGPT 0.8.2 decides its root directory and loads `config2.yaml` when `metagpt` is first
imported (module-level `Config.default()`), writes a daily log under `<root>/logs/` and
creates `<root>/workspace/`. So before the first `import metagpt...` this function:

1. writes `<root>/config/config2.yaml` if it is missing (the import fails without one);
2. sets `METAGPT_PROJECT_ROOT=<root>` (else MetaGPT uses the CWD) and
   `AGENTOPS_LOGGING_TO_FILE=False` (else agentops, if installed, logs into the CWD);
3. imports MetaGPT and sets its log level (loguru; stderr + `<root>/logs/`).

Everything per run (LLM endpoint, workspace, project name) is a fresh `Config` built by
`provider.metagpt_context`, so one process can run many tasks against many servers. The
root itself is fixed for the life of the process once MetaGPT is imported.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from topas_agents.errors import ConfigError

from .config_file import DEFAULT_ROOT, ensure_config, home_config_path, home_overrides

log = logging.getLogger("topas.metagpt")


@dataclass(frozen=True, slots=True)
class MetaGPTRuntime:
    root: Path  # MetaGPT's METAGPT_ROOT in this process
    config_file: Path
    version: str


def metagpt_available() -> bool:
    """True if the metagpt package can be imported (without importing it)."""
    return importlib.util.find_spec("metagpt") is not None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("metagpt")
    except PackageNotFoundError:
        return "unknown"


def require_prepared(module: str) -> None:
    """Guard for modules that import MetaGPT: `prepare_metagpt` must have run first, or
    MetaGPT would pick the CWD as its root (and fail without a config there)."""
    if "metagpt.const" not in sys.modules:
        raise ConfigError(f"{module} imports MetaGPT: call "
                          "topas_agents.integrations.metagpt.prepare_metagpt(root) first")


def prepare_metagpt(root: str | Path = DEFAULT_ROOT, *, log_level: str = "WARNING") -> MetaGPTRuntime:
    """Set MetaGPT's environment for `root`, import it, and return where it lives.

    Idempotent. If MetaGPT was already imported with another root, that root stays in
    force (MetaGPT cannot move it) and a warning is logged; per-run workspaces still go
    where each run's Config says."""
    if not metagpt_available():
        raise ConfigError("metagpt is not installed: run `make install` (pip install -e '.[metagpt]', "
                          "then pip install --no-deps metagpt==0.8.2)")
    root = Path(root).resolve()
    from topas_agents.cli.args import check_output

    # MetaGPT makes <root>/workspace as it is imported: a file there was a 48-line traceback
    check_output("--root", root / "workspace", "dir")
    if "metagpt.const" in sys.modules:
        from metagpt.const import METAGPT_ROOT

        active = Path(METAGPT_ROOT).resolve()
        if active != root:
            log.warning("metagpt already imported with root %s; keeping it (asked for %s)", active, root)
        return MetaGPTRuntime(active, ensure_config(active), _version())
    config_file = ensure_config(root)
    if home_overrides():
        # our runs build their own Config per run, but MetaGPT's import-time global one (used by
        # `Context()` without a config, e.g. stock scripts) takes llm from the home file
        log.warning("%s has an 'llm' section: it overrides %s for MetaGPT's global config",
                    home_config_path(), config_file)
    os.environ["METAGPT_PROJECT_ROOT"] = str(root)
    os.environ.setdefault("AGENTOPS_LOGGING_TO_FILE", "False")
    _quiet_dependency_notices()
    _log_imports_at(log_level)
    from metagpt.logs import define_log_level

    define_log_level(print_level=log_level.upper())
    return MetaGPTRuntime(root, config_file, _version())


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def _log_imports_at(level: str) -> None:
    """MetaGPT logs through loguru, whose default sink prints everything; `metagpt.const` logs
    'PROJECT_ROOT set from environment variable' at INFO when it is imported, before
    `define_log_level` (which replaces every loguru sink) has run. The same stderr sink at the
    run's level, set first, hides it at WARNING and shows it at INFO, as MetaGPT's own sink would."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=level.upper())


def _quiet_dependency_notices() -> None:
    """Two import-time notices of MetaGPT's dependencies, printed on every run and about their
    own futures, not the run: google-api-core's FutureWarning on Python 3.11 support, and
    qianfan's "No redis installed" (a rate limiter for its own SDK, unused here). Only these
    two messages are dropped; everything else from those packages still shows."""
    warnings.filterwarnings("ignore", message=r"You are using a Python version .* which Google will stop",
                            category=FutureWarning)
    qianfan = logging.getLogger("qianfan")
    if not any(isinstance(f, _DropMessage) for f in qianfan.filters):
        qianfan.addFilter(_DropMessage("No redis installed"))
