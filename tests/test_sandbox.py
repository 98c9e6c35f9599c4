"""The QA sandbox (integrations/metagpt/sandbox.py): every known way to reach a pip fails,
writes outside the sandbox directory fail, there is no network, and resources are capped.
Runs through the same shim MetaGPT's RunCode calls (`<box>/bin/python`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from topas_agents.integrations.metagpt.sandbox import (
    SandboxLimits,
    make_sandbox,
    run_sandboxed,
    sandbox_available,
)

if not sandbox_available():  # `make test` installs bubblewrap; say so loudly elsewhere
    pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here", allow_module_level=True)


@pytest.fixture(scope="module")
def box(tmp_path_factory) -> Path:
    root = make_sandbox(tmp_path_factory.mktemp("sb"))
    (root / "work").mkdir()
    return root


def _shim(box: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python ARGS` exactly as RunCode runs it: PATH resolves `python` to the shim."""
    env = {**os.environ, "PATH": f"{box / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["python", *args], cwd=box / "work", env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


PIP_BYPASSES = [
    ("-m", "pip", "--version"),
    ("-mpip", "--version"),
    ("-I", "-m", "pip", "--version"),
    ("-c", "import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-m', 'pip', '--version']).returncode)"),
    ("-c", "import subprocess, sys; sys.exit(subprocess.run(['python3', '-m', 'pip', '--version']).returncode)"),
    ("-c", "import subprocess, sys, shutil; sys.exit(subprocess.run([shutil.which('python3', path='/usr/bin'), "
           "'-m', 'pip', '--version']).returncode)"),
    ("-c", "import pip"),
    ("-m", "ensurepip", "--user"),
]


@pytest.mark.parametrize("args", PIP_BYPASSES, ids=lambda a: " ".join(a)[:40])
def test_no_pip_is_reachable(box, args):
    r = _shim(box, *args)
    assert r.returncode != 0, r.stdout
    assert "No module named" in r.stderr, r.stderr[-500:]


def test_python3_on_the_path_is_the_shim_too(box):
    env = {**os.environ, "PATH": f"{box / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["python3", "-m", "pip", "--version"], cwd=box / "work", env=env, capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode != 0 and "No module named pip" in r.stderr


def test_generated_code_runs_and_writes_its_workspace(box):
    r = _shim(box, "-c", "open('out.txt', 'w').write('hi'); print(open('out.txt').read())")
    assert r.returncode == 0 and r.stdout.strip() == "hi"
    assert (box / "work" / "out.txt").read_text() == "hi"


@pytest.mark.parametrize("target", [
    str(Path(__file__).resolve().parent / "PWNED"),  # the repository
    os.path.expanduser("~/PWNED"),
    "/etc/PWNED", "/usr/PWNED",
    "{box}/bin/python",  # the shim itself runs on the host: it must stay read-only
    "{box}/venv/pyvenv.cfg",
])
def test_writes_outside_the_workspace_fail(box, target):
    target = target.format(box=box)
    before = Path(target).read_bytes() if Path(target).exists() else None
    r = _shim(box, "-c", f"open({target!r}, 'w').write('x')")
    assert r.returncode != 0
    assert (Path(target).read_bytes() if Path(target).exists() else None) == before


def test_the_host_filesystem_is_not_visible(box):
    repo = str(Path(__file__).resolve().parent.parent)
    r = _shim(box, "-c", f"import os; print(os.path.exists({repo!r}), os.path.exists('/root/.ssh'))")
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"]


def test_no_network(box):
    code = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)"
    r = _shim(box, "-c", code)
    assert r.returncode != 0 and ("unreachable" in r.stderr or "OSError" in r.stderr)


def test_cpu_and_memory_are_capped(box):
    r = run_sandboxed(box, ["-c", "x = bytearray(3 * 2**30)"], capture_output=True, text=True)
    assert r.returncode != 0 and "MemoryError" in r.stderr
    tight = SandboxLimits(cpu_s=1)
    r = run_sandboxed(box, ["-c", "while True: pass"], capture_output=True, text=True, limits=tight,
                      timeout_s=120)
    assert r.returncode != 0  # SIGXCPU/SIGKILL after 1 CPU second


def test_the_shim_caps_resources_too(box):
    r = _shim(box, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_CPU)[0], "
                         "resource.getrlimit(resource.RLIMIT_AS)[0])")
    assert r.returncode == 0
    cpu, mem = map(int, r.stdout.split())
    assert cpu == SandboxLimits().cpu_s and mem == SandboxLimits().address_space_bytes
