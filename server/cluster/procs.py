"""Child processes of a cluster: the replicas and smg, started and stopped together.

Each child runs in its own session (process group) so a stop reaches whatever it spawned
(an SGLang server forks its scheduler processes), and asks the kernel to SIGTERM it when
the launching thread dies (PR_SET_PDEATHSIG): a launcher killed with SIGKILL leaves no orphans.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1
# An ANSI escape sequence (CSI: colours, bold, cursor moves). smg colours its log lines even
# into a file, and a tail quoted in an error ("smg exited ...; its log ends:") showed them raw.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """`text` without ANSI escape sequences."""
    return _ANSI_ESCAPE.sub("", text)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """One started child process and where its output goes."""

    name: str
    argv: tuple[str, ...]
    proc: subprocess.Popen[bytes]
    log_path: Path | None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL now (tests use this to simulate a replica dying)."""
        self.signal_group(signal.SIGKILL)
        self.proc.wait(10)

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, n: int = 20) -> str:
        """The log's last `n` lines, as plain text for an error message."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(strip_ansi(self.log_path.read_text(errors="replace")).splitlines()[-n:])


def start_child(name: str, argv: Sequence[str], *, log_dir: Path | None,
                env: Mapping[str, str] | None = None, append: bool = False) -> Child:
    """Start `argv` in its own session. `append`: keep the log of an earlier run (a restart).

    The kernel SIGTERMs the child when the *thread* that started it exits (PR_SET_PDEATHSIG
    is per thread), so start children from a thread that lives as long as the cluster."""
    log_path = log_dir / f"{name}.log" if log_dir is not None else None
    log = _open_log(log_path, append) if log_path is not None else None
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, env=full_env, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    return Child(name, tuple(argv), proc, log_path, log)


def _open_log(path: Path, append: bool) -> IO[bytes]:
    """A child's log, readable by its owner only: SGLang prints its arguments at start-up, the
    API key among them, and the directory may be one the caller named (`run_replicas(log_dir=...)`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o600)
    os.fchmod(fd, 0o600)  # a log left by an earlier run keeps its mode through O_CREAT
    return os.fdopen(fd, "ab" if append else "wb")


def stop_children(children: Sequence[Child], timeout_s: float) -> None:
    """SIGTERM every child's group, wait up to `timeout_s` in all, then SIGKILL what is left."""
    for child in children:
        if child.alive():
            child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(max(0.0, deadline - time.monotonic()))
    for child in children:
        # the group too: a child's own children (SGLang's schedulers) may outlive it
        child.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(5)
        child.close_log()
