"""Write or patch MetaGPT's `config2.yaml` under a project root (never anywhere else).

MetaGPT 0.8.2 reads `<METAGPT_PROJECT_ROOT>/config/config2.yaml` at import time and refuses
to import without an `llm:` section. `write_config` creates that file or patches only the
`llm` keys it is given, keeping every other key (and other `llm` keys) as they were.
No MetaGPT import here.

Precedence (MetaGPT's `Config.default()`): environment variables < `<root>/config/config2.yaml`
< `~/.metagpt/config2.yaml`, merged per TOP-LEVEL key: an `llm` section in the home file
replaces the project's whole `llm` section. So a project config is only effective where the
home file has no `llm`; `home_overrides` says which written keys the home file would replace
(`topas metagpt config` refuses then, or patches the home file with `--home`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from topas_agents.cli.args import check_api_key, model_name
from topas_agents.errors import ConfigError

DEFAULT_ROOT = Path(".topas/metagpt")
DEFAULT_MODEL = "topas-sim"
# MetaGPT's LLMConfig rejects an empty key; local servers ignore it.
DEFAULT_API_KEY = "sk-topas-local"


def config_path(root: str | Path) -> Path:
    return Path(root) / "config" / "config2.yaml"


def home_config_path() -> Path:
    """MetaGPT's per-user config (`metagpt.const.CONFIG_ROOT / "config2.yaml"`), read last."""
    return Path.home() / ".metagpt" / "config2.yaml"


def read_config(root: str | Path) -> dict[str, Any]:
    """The config mapping under `root` ({} when there is no file)."""
    return read_config_file(config_path(root))


def home_overrides(keys: tuple[str, ...] = ("llm",), home: Path | None = None) -> dict[str, Any]:
    """The top-level `keys` that the home config defines, with its values: MetaGPT loads it
    after the project config, so each of these replaces the project's value whole."""
    data = read_config_file(home or home_config_path())
    return {k: data[k] for k in keys if k in data}


def read_config_file(path: Path) -> dict[str, Any]:
    """The config mapping in `path` ({} when there is no file)."""
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def check_base_url(base_url: Any, source: str = "--base-url") -> str:
    """`base_url` without trailing slashes if it is an http(s) URL with a host and no spaces
    or control characters; ConfigError otherwise (written as is, such a URL failed at every
    call; `rstrip("/")` alone turned "http://" into "http:")."""
    if not isinstance(base_url, str):
        raise ConfigError(f"{source} must be a string, got {type(base_url).__name__}")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"{source} must start with http:// or https://, got {base_url!r}")
    if not parts.hostname or not base_url.isprintable() or any(c.isspace() for c in base_url):
        raise ConfigError(f"{source} must name a host, without spaces or control characters, got {base_url!r}")
    return base_url.rstrip("/")


def write_config(root: str | Path, base_url: str, model: str | None = None,
                 api_key: str | None = None) -> Path:
    """Create or patch `<root>/config/config2.yaml`; returns its path. See `write_config_file`."""
    return write_config_file(config_path(root), base_url, model=model, api_key=api_key)


def write_config_file(path: Path, base_url: str, model: str | None = None, api_key: str | None = None) -> Path:
    """Create or patch the config file `path`; returns it.

    Patched: `llm.api_type` (openai), `llm.base_url`, and `llm.model` / `llm.api_key` when
    given (or when missing: defaults). A new `llm` section also gets `stream: false`."""
    data = read_config_file(path)
    llm = data.get("llm")
    if llm is not None and not isinstance(llm, dict):
        raise ConfigError(f"{path}: 'llm' must be a mapping, got {type(llm).__name__}")
    new_section = llm is None
    llm = dict(llm or {})
    llm["api_type"] = "openai"
    llm["base_url"] = check_base_url(base_url)
    if model is not None or "model" not in llm:
        llm["model"] = DEFAULT_MODEL if model is None else check_model(model)
    if api_key is not None or "api_key" not in llm:
        # an explicit key is checked, not swapped for the default (an empty one was)
        llm["api_key"] = DEFAULT_API_KEY if api_key is None else check_api_key(api_key)
    if new_section:
        llm["stream"] = False
    data["llm"] = llm
    _atomic_write(path, yaml.safe_dump(data, sort_keys=False))
    return path


def check_model(model: Any) -> str:
    """`model` if a server can match it (the CLIs' `--model` rule, for callers in code)."""
    if not isinstance(model, str):
        raise ConfigError(f"--model must be a string, got {type(model).__name__}")
    try:
        return model_name(model)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"--model: {exc}") from None


def ensure_config(root: str | Path, base_url: str = "http://127.0.0.1:8000/v1") -> Path:
    """Make sure an importable config exists (written only if there is none)."""
    path = config_path(root)
    if not path.exists() or not isinstance(read_config(root).get("llm"), dict):
        write_config(root, base_url)
    return path


def _atomic_write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config2.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
