"""The SoftwareDev prompts (MetaGPT, Hong et al., ICLR 2024, Table 8): loader.

`datasets/softwaredev/prompts.jsonl` holds the 11 prompts the paper publishes, one JSON
object per line: {"id": int, "name": str, "prompt": str}. The full 70-task SoftwareDev set
is not public (see datasets/softwaredev/README.md). No MetaGPT import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from topas_agents.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SoftwareDevPrompt:
    id: int
    name: str
    prompt: str

    @property
    def task_id(self) -> str:
        return f"sd{self.id:02d}"


def dataset_path() -> Path:
    from topas_agents import datasets

    return Path(datasets.__file__).parent / "softwaredev" / "prompts.jsonl"


def load_softwaredev(limit: int | None = None, path: str | Path | None = None) -> tuple[SoftwareDevPrompt, ...]:
    """The prompts in file order (the first `limit` of them)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    path = Path(path) if path is not None else dataset_path()
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    out: list[SoftwareDevPrompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            item = SoftwareDevPrompt(int(obj["id"]), str(obj["name"]), str(obj["prompt"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}:{n}: expected {{id, name, prompt}}: {exc}") from None
        if not item.prompt.strip():
            raise ConfigError(f"{path}:{n}: empty prompt")
        out.append(item)
    if len({p.id for p in out}) != len(out):
        raise ConfigError(f"{path}: duplicate ids")
    return tuple(out[:limit] if limit is not None else out)
