"""QA code execution, only in a sandbox (QA is off by default).

MetaGPT 0.8.2's `RunCode` runs `python -m pip install -r requirements.txt`,
`python -m pip install pytest` and `python tests/test_x.py` as subprocesses, with `python`
taken from the PATH of `context.new_environ()`. `SandboxContext` overrides exactly that
method (a subclass; MetaGPT is not patched): PATH starts with a shim directory whose
`python` refuses every `-m pip` command (exit 0, so the run goes on without installing)
and runs anything else with this interpreter (`-s`: no user site-packages), with HOME and
TMPDIR inside the sandbox directory. The runner also puts the QA run's workspace in a
temporary directory. Nothing is ever installed into the running interpreter.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
import tempfile
from pathlib import Path

from .environment import require_prepared

require_prepared(__name__)  # before any metagpt import
# ruff: noqa: E402

from metagpt.context import Context

SHIM = """#!/bin/sh
# topas-agents QA sandbox: MetaGPT's RunCode calls `python`; never install anything.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "topas sandbox: refused 'pip $3' (QA never installs packages)" >&2
  exit 0
fi
exec {python} -s "$@"
"""


def make_sandbox(parent: str | Path | None = None) -> Path:
    """A fresh sandbox dir with `bin/python` (the shim), `home/` and `tmp/`."""
    root = Path(tempfile.mkdtemp(prefix="topas-qa-", dir=parent))
    for sub in ("bin", "home", "tmp"):
        (root / sub).mkdir()
    shim = root / "bin" / "python"
    shim.write_text(SHIM.format(python=shlex.quote(sys.executable)))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return root


class SandboxContext(Context):
    """A Context whose subprocess environment resolves `python` to the sandbox shim."""

    sandbox_dir: str = ""

    def new_environ(self) -> dict[str, str]:
        env = super().new_environ()
        if not self.sandbox_dir:
            raise RuntimeError("SandboxContext without sandbox_dir")
        box = Path(self.sandbox_dir)
        env["PATH"] = f"{box / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["HOME"] = str(box / "home")
        env["TMPDIR"] = str(box / "tmp")
        env["PIP_NO_INDEX"] = "1"  # belt and braces: a pip reached another way has no index
        env.pop("PYTHONSTARTUP", None)
        return env
