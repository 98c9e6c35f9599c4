"""Shared by every subcommand: argparse value converters (one wording for every error)
and the `--json OUT` writer."""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError, TopasError


def int_at_least(minimum: int) -> Callable[[str], int]:
    """Converter for an integer >= `minimum`."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return convert


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def int_between(lo: int, hi: int, why: str = "") -> Callable[[str], int]:
    """Converter for an integer in [lo, hi] (`why` says where the bound comes from)."""
    def convert(text: str) -> int:
        value = int_at_least(lo)(text)
        if value > hi:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo}, {hi}]{why}, got {text!r}")
        return value

    return convert


def check_api_key(key: Any, source: str = "--api-key") -> str:
    """`key` if an HTTP header can carry it as `Authorization: Bearer KEY` (printable ASCII,
    no surrounding spaces: httpx, hence the openai client, encodes header text as ASCII, so
    any other key failed with a UnicodeEncodeError traceback); ConfigError otherwise."""
    if not isinstance(key, str):  # a key given in code (write_config, enable)
        raise ConfigError(f"{source} must be a string, got {type(key).__name__}")
    if not key or key != key.strip() or not key.isprintable() or not key.isascii():
        raise ConfigError(f"{source} must be non-empty printable ASCII without surrounding spaces")
    return key


def client_api_key(args: argparse.Namespace) -> str | None:
    """`--api-key`, else TOPAS_API_KEY (read here, at the CLI edge, only): the key a
    client command (`run`, `eval`, `bench --server`, `calibrate`) sends."""
    if getattr(args, "api_key", None):
        return check_api_key(args.api_key)
    env = os.environ.get("TOPAS_API_KEY")
    return check_api_key(env, "TOPAS_API_KEY") if env else None


def model_name(text: str) -> str:
    """Converter for a model id sent to or reported by a server: an empty one fell back to a
    default without a word, and one with surrounding spaces or control characters matched no
    served model (every call a 404)."""
    if not text or text != text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"expected a non-empty printable name without surrounding spaces, got {text!r}")
    return text


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _finite(data: Any) -> Any:
    """`data` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def write_json(path: str, data: Any) -> None:
    """Write `data` as indented JSON to `--json path`; a non-finite float (a run where no task
    completed, say) is written as null, since NaN and Infinity are not JSON."""
    try:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(_finite(data), indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write: {exc.strerror or exc}") from None


def check_output(flag: str, path: str | Path | None, kind: Literal["file", "dir"] = "file") -> None:
    """Fail before a run that can take hours, not after it: ConfigError unless `path` (a file,
    or a directory a command writes into) can be written. Leaves nothing behind: the writers
    create missing folders when they write, so a run that fails before writing leaves no empty
    folder; a missing folder passes when a folder can be made in its nearest existing ancestor."""
    if path is None:
        return
    if not str(path).strip():
        raise ConfigError(f"{flag}: empty path")
    try:
        _check_writable(flag, Path(path), kind)
    except OSError as exc:  # a name too long even to stat, a loop of links, ...
        raise ConfigError(f"{flag} {path}: cannot write: {exc.strerror or exc}") from None


def _check_writable(flag: str, out: Path, kind: Literal["file", "dir"]) -> None:
    path = out
    folder = out if kind == "dir" else out.parent
    blocker = next((a for a in (folder, *folder.parents) if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise ConfigError(f"{flag} {path}: cannot write: {blocker} is a file, not a directory")
    if kind == "file" and out.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory")
    existing = next(a for a in (folder, *folder.parents, Path(".")) if a.exists())
    # creating a folder inside `existing` needs write and search permission on it
    if not os.access(existing, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ConfigError(f"{flag} {path}: cannot write: permission denied")
    missing = [a.name for a in (folder, *folder.parents) if a != existing and not a.exists()]
    if kind == "file":
        missing.append(out.name)
    _try_writing(existing, out if kind == "file" and out.exists() else None, missing)


def _try_writing(existing: Path, file: Path | None, new_names: Sequence[str]) -> None:
    """Write access tried, not read from the mode bits: as root `os.access` says yes even to
    /proc, and a 300-character name passed it too; both failed after the run, losing its
    output. Leaves nothing: an existing file is opened for appending and closed, a probe
    folder is made in `existing` and removed."""
    pathconf = getattr(os, "pathconf", None)  # POSIX; a limit of -1 or 0 means none is fixed
    name_max = pathconf(existing, "PC_NAME_MAX") if pathconf is not None else 0
    if name_max > 0 and any(len(os.fsencode(name)) > name_max for name in new_names):
        raise OSError(errno.ENAMETOOLONG, f"a file or folder name is longer than {name_max} bytes")
    if file is not None:
        with open(file, "ab"):
            return
    os.rmdir(tempfile.mkdtemp(prefix=".topas-write-probe-", dir=existing))


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> frozenset[str]:
    """The options `argv` names explicitly (each by its first long flag, e.g. "--scale"), told
    apart from defaults by parsing `argv` again with `parser` (a fresh copy of the one used)
    whose defaults are all suppressed: an option absent from the result was not given. A flag
    given with its default value counts as given (it is still meant to apply)."""
    flags: dict[str, str] = {}
    pending = [parser]
    while pending:
        p = pending.pop()
        p.set_defaults(**{k: argparse.SUPPRESS for k in p._defaults})  # noqa: SLF001 - argparse keeps no public list
        for action in p._actions:  # noqa: SLF001
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                pending.extend(action.choices.values())
                continue
            if action.option_strings:
                action.default = argparse.SUPPRESS
                longs = [s for s in action.option_strings if s.startswith("--")]
                flags[action.dest] = (longs or action.option_strings)[0]
    namespace = parser.parse_args(list(argv))
    return frozenset(flags[dest] for dest in vars(namespace) if dest in flags)


def run_module(main: Callable[[], int]) -> None:
    """A `python -m topas_agents...` entry point: exits with `main()`'s status, and a
    TopasError (an unknown workload, profile or policy) is one line on stderr, exit 2, as with
    `topas` itself, not a traceback."""
    try:
        code = main()
    except TopasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    raise SystemExit(code)
