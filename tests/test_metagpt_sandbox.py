"""The QA sandbox's writable project dir and its lifetime (integrations/metagpt/sandbox.py):
the generated project outside the sandbox dir is writable from inside, nothing else is, and
`sandbox(...)` removes what it made, also when the body fails."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from topas_agents.integrations.metagpt.sandbox import make_sandbox, remove_sandbox, sandbox, sandbox_available

if not sandbox_available():  # `make test` installs bubblewrap
    pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here", allow_module_level=True)


def _shim(box: Path, cwd: Path, code: str) -> subprocess.CompletedProcess:
    """`python -c CODE` exactly as MetaGPT's RunCode runs it: PATH resolves `python` to the shim."""
    env = {**os.environ, "PATH": f"{box / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["python", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def test_the_project_dir_is_writable_and_its_siblings_are_not(tmp_path):
    project, other = tmp_path / "workspace" / "proj", tmp_path / "workspace" / "other"
    with sandbox(tmp_path / "sandbox", writable=[project]) as box:
        project.mkdir(parents=True)  # MetaGPT creates it after the sandbox (bind-try)
        other.mkdir()
        r = _shim(box, project, "import os; open('out.txt', 'w').write(os.getcwd())")
        assert r.returncode == 0, r.stderr[-1000:]
        assert (project / "out.txt").read_text() == str(project)  # ran in the project dir, not in HOME
        r = _shim(box, project, f"open({str(other / 'x')!r}, 'w')")
        assert r.returncode != 0 and not (other / "x").exists()
        assert box.parent == tmp_path / "sandbox"
    assert not (tmp_path / "sandbox").exists() and (project / "out.txt").exists()


def test_sandbox_is_removed_when_the_body_fails_and_keeps_a_shared_parent(tmp_path):
    parent = tmp_path / "sandbox"
    other = make_sandbox(parent)  # another task's sandbox in the same parent
    with pytest.raises(RuntimeError), sandbox(parent) as box:
        assert (box / "bin" / "python").exists()
        raise RuntimeError("task failed")
    assert not box.exists() and sorted(parent.iterdir()) == [other]
    remove_sandbox(other)
    assert not other.exists()


def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    import venv

    def broken(self, env_dir):
        raise OSError("no space left on device")

    monkeypatch.setattr(venv.EnvBuilder, "create", broken)
    with pytest.raises(OSError):
        make_sandbox(tmp_path / "sandbox")
    assert list((tmp_path / "sandbox").iterdir()) == []
