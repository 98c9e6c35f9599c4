"""QA code execution, only in a sandbox (QA is off by default).

MetaGPT 0.8.2's `RunCode` runs `python -m pip install -r requirements.txt`,
`python -m pip install pytest` and `python tests/test_x.py` as subprocesses, with `python`
taken from the PATH of `context.new_environ()`. `SandboxContext` overrides exactly that
method (a subclass; MetaGPT is not patched): PATH starts with the sandbox's `bin/`, whose
`python` runs the command inside bubblewrap (`bwrap`):

- **interpreter**: a throw-away venv in the sandbox made without pip, on the host's base
  interpreter. The base interpreter's site-packages, every system `dist-packages` and the
  stdlib's `ensurepip` are hidden (empty tmpfs), so `python -m pip`, `python -I -m pip`,
  `python3 -m pip`, `/usr/bin/python3 -m pip` and `subprocess.run([sys.executable, "-m",
  "pip"])` all fail with "No module named pip". The venv and `bin/` are read-only inside.
- **filesystem**: only `/usr`, the base interpreter's prefix, the loader's `/etc` files
  (read-only), the sandbox directory (writable: HOME, TMPDIR) and the `writable` directories
  given to `make_sandbox` (the generated project) exist; `/tmp` is a private tmpfs. Nothing
  else on the host can be read or written.
- **network**: none (`--unshare-all`: new network, PID, IPC, UTS and cgroup namespaces).
- **environment**: none of the caller's. Inside, bubblewrap starts from an empty one (PATH,
  HOME, TMPDIR, LANG and two pip guards); on the host the shim gets only PATH, HOME, TMPDIR
  and LANG, which is also all MetaGPT can print when a command fails.
- **resources**: CPU seconds, address space, file size and open files are capped
  (`SandboxLimits`; `prlimit` in the shim, `setrlimit` in `run_sandboxed`).

Without a working `bwrap`, `make_sandbox` raises ConfigError: generated code never runs
unsandboxed. The runner makes one sandbox per QA task (`sandbox(...)`: under the run's root,
removed when the task ends, also on failure) whose writable directory is that task's project,
`<root>/workspace/<project>/`, so the artifacts stay where MetaGPT users look for them.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import resource
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import venv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from topas_agents.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Per-process limits on generated code. MetaGPT kills a run after 10 s of wall time;
    these bound what it can use meanwhile (and what a forked child can)."""

    cpu_s: int = 30
    address_space_bytes: int = 2 * 2**30  # an interpreter plus test data; stops memory bombs
    file_bytes: int = 256 * 2**20  # largest file it may write (the disk is the host's)
    open_files: int = 256


DEFAULT_LIMITS = SandboxLimits()
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")


@functools.cache
def bwrap_path() -> str | None:
    """The bwrap binary if it can create a sandbox here (user namespaces may be disabled)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = subprocess.run([path, "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True,
                           timeout=30, check=False)
    return path if probe.returncode == 0 else None


def sandbox_available() -> bool:
    return bwrap_path() is not None


def _hidden_dirs() -> list[str]:
    """Where a pip could be imported from: every site/dist-packages outside the venv, and
    ensurepip (which would bootstrap one)."""
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    paths = {sysconfig.get_path(k, vars=base) for k in ("purelib", "platlib")}
    paths.add(str(Path(sysconfig.get_path("stdlib", vars=base)) / "ensurepip"))
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages",
                    "/usr/lib/python3/dist-packages", "/usr/lib/python3*/ensurepip"):
        paths.update(glob.glob(pattern))
    return sorted(p for p in paths if os.path.isdir(p))


def _system_binds() -> list[str]:
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):  # merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    for prefix in sorted(prefixes):
        if not prefix.startswith("/usr/"):
            args += ["--ro-bind", prefix, prefix]
    for path in _ETC:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in _hidden_dirs():
        args += ["--tmpfs", path]
    return args


def _resolved(writable: Sequence[str | Path]) -> list[Path]:
    return [Path(w).resolve() for w in writable]


def bwrap_argv(box: Path, cwd: str | Path | None = None, writable: Sequence[str | Path] = ()) -> list[str]:
    """`bwrap ... --chdir DIR --` (without the command): the sandbox's namespaces and
    filesystem view; DIR is `cwd` if it lies in the sandbox or a writable dir, else its home."""
    box = box.resolve()
    dirs = _resolved(writable)
    workdir = Path(cwd).resolve() if cwd is not None else box / "home"
    if not any(workdir.is_relative_to(d) for d in (box, *dirs)):
        workdir = box / "home"
    return [*_bwrap_head(box, dirs), "--chdir", str(workdir), "--"]


def _bwrap_head(box: Path, writable: Sequence[Path] = ()) -> list[str]:
    path = bwrap_path()
    if path is None:
        raise ConfigError("the QA sandbox needs a working bubblewrap (`apt-get install bubblewrap`)")
    env = {"PATH": f"{box / 'venv' / 'bin'}:/usr/bin:/bin", "HOME": str(box / "home"),
           "TMPDIR": str(box / "tmp"), "LANG": "C.UTF-8", "PYTHONNOUSERSITE": "1", "PIP_NO_INDEX": "1"}
    args = [path, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", str(box), str(box)]
    for w in writable:  # the project dir; `-try`: MetaGPT (re)creates it after the shim is made
        args += ["--bind-try", str(w), str(w)]
    args += ["--ro-bind", str(box / "venv"), str(box / "venv"),  # later binds win: read-only
            "--ro-bind", str(box / "bin"), str(box / "bin"),  # the shim runs on the host
            "--remount-ro", "/"]  # the sandbox root itself (a tmpfs holding the mount points)
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def _apply_limits(limits: SandboxLimits) -> None:
    for res, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.address_space_bytes),
                       (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_NOFILE, limits.open_files)):
        resource.setrlimit(res, (value, value))


def run_sandboxed(box: Path, args: list[str], *, cwd: str | Path | None = None, timeout_s: float = 60.0,
                  limits: SandboxLimits = DEFAULT_LIMITS, writable: Sequence[str | Path] = (),
                  **kw: Any) -> subprocess.CompletedProcess:
    """Run `python ARGS` in the sandbox (the shim does the same for MetaGPT's RunCode)."""
    argv = [*bwrap_argv(box, cwd, writable), str(box.resolve() / "venv" / "bin" / "python"), *args]
    return subprocess.run(argv, preexec_fn=lambda: _apply_limits(limits), timeout=timeout_s,  # noqa: PLW1509
                          check=False, **kw)


_SHIM = """#!/bin/sh
# topas-agents QA sandbox: MetaGPT's RunCode calls `python`; it runs inside bubblewrap.
case "$PWD" in {dirs}) dir="$PWD" ;; *) dir={home} ;; esac
exec {prlimit} --cpu={cpu} --as={mem} --fsize={fsize} --nofile={nofile} -- {bwrap_head} --chdir "$dir" -- {python} "$@"
"""


def require_sandbox() -> str:
    """ConfigError unless a sandbox can be built here; prlimit's path. `topas run --qa` calls it
    before MetaGPT loads and the embedded server starts (the error came after about 13 s)."""
    if not sandbox_available():
        raise ConfigError("--qa runs generated code only in a sandbox, which needs a working bubblewrap "
                          "(`apt-get install bubblewrap`, user namespaces enabled)")
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise ConfigError("the QA sandbox needs prlimit (util-linux)")
    return prlimit


def make_sandbox(parent: str | Path | None = None, limits: SandboxLimits = DEFAULT_LIMITS,
                 writable: Sequence[str | Path] = ()) -> Path:
    """A fresh sandbox dir: `bin/python` (the shim), `venv/` (no pip), `home/` and `tmp/`;
    `writable` dirs (the generated project) are bound read-write at their own paths. The
    caller removes it (`remove_sandbox`, or use `sandbox(...)`); a failed build removes itself."""
    prlimit = require_sandbox()
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="topas-qa-", dir=parent)).resolve()
    try:
        _build(root, limits, prlimit, _resolved(writable))
    except BaseException:
        remove_sandbox(root)
        raise
    return root


class _BaseInterpreterVenv(venv.EnvBuilder):
    """A venv whose interpreter is the base installation's own file. `venv` links to
    `sys._base_executable`, which Python 3.10 sets to the running venv's `bin/python` when
    the caller runs from a venv (3.11 resolves it to the base): a link into a directory the
    sandbox does not bind, so `--qa` could start no interpreter ("execvp ... No such file")."""

    def ensure_directories(self, env_dir: str | os.PathLike[str]) -> SimpleNamespace:
        context = super().ensure_directories(env_dir)
        context.executable = os.path.realpath(context.executable)
        context.python_dir, context.python_exe = os.path.split(context.executable)
        return context


def _build(root: Path, limits: SandboxLimits, prlimit: str, writable: list[Path]) -> None:
    for sub in ("bin", "home", "tmp"):
        (root / sub).mkdir()
    _BaseInterpreterVenv(with_pip=False, symlinks=True, clear=True).create(root / "venv")
    head = _bwrap_head(root, writable)  # the shim adds `--chdir "$dir" --`
    dirs = "|".join(f"{q}|{q}/*" for q in (shlex.quote(str(d)) for d in (root, *writable)))
    shim = root / "bin" / "python"
    shim.write_text(_SHIM.format(
        dirs=dirs, home=shlex.quote(str(root / "home")), prlimit=shlex.quote(prlimit),
        cpu=limits.cpu_s, mem=limits.address_space_bytes, fsize=limits.file_bytes, nofile=limits.open_files,
        bwrap_head=" ".join(shlex.quote(a) for a in head), python=shlex.quote(str(root / "venv" / "bin" / "python"))))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    (root / "bin" / "python3").symlink_to("python")


def remove_sandbox(box: str | Path) -> None:
    shutil.rmtree(box, ignore_errors=True)


@contextlib.contextmanager
def sandbox(parent: str | Path, writable: Sequence[str | Path] = (),
            limits: SandboxLimits = DEFAULT_LIMITS) -> Iterator[Path]:
    """`make_sandbox(parent, ...)`, removed on exit (also when the task fails), and
    `parent` too once no other sandbox is left in it."""
    box = make_sandbox(parent, limits, writable)
    try:
        yield box
    finally:
        remove_sandbox(box)
        with contextlib.suppress(OSError):  # not empty: another task's sandbox is still there
            Path(parent).rmdir()


def _sandbox_context_class() -> type:
    from .environment import require_prepared

    require_prepared(__name__)  # before any metagpt import
    from metagpt.context import Context

    class SandboxContext(Context):
        """A Context whose subprocess environment resolves `python` to the sandbox shim."""

        sandbox_dir: str = ""

        def new_environ(self) -> dict[str, str]:
            """What the shim needs on the host, and nothing of the caller's environment: the
            shim starts bubblewrap with a cleared environment of its own (`_bwrap_head`), so
            nothing else would reach the generated code, and MetaGPT logs this dict whole when
            a command fails, which its `pip install` calls always do here. With a copy of
            os.environ (MetaGPT's default) every QA run printed the user's environment, API
            keys included, to the terminal."""
            if not self.sandbox_dir:
                raise RuntimeError("SandboxContext without sandbox_dir")
            box = Path(self.sandbox_dir)
            return {"PATH": f"{box / 'bin'}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
                    "HOME": str(box / "home"), "TMPDIR": str(box / "tmp"), "LANG": "C.UTF-8"}

    return SandboxContext


def __getattr__(name: str) -> Any:
    """`SandboxContext` is built on first use: importing this module needs no MetaGPT."""
    if name == "SandboxContext":
        cls = _sandbox_context_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
