"""A non-editable install (`pip install .`, `pip install git+URL`, a wheel) ships every module
and data file of the four source roots. pyproject lists the packages by hand (server/,
integrations/ and datasets/ are mapped under topas_agents.*), so a new subpackage or data
folder missing from that list would install and import nowhere but here, in the editable
checkout every other test uses."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# where each source root lands in the installed package
ROOTS = {"topas_agents": "topas_agents", "server": "topas_agents/server",
         "integrations": "topas_agents/integrations", "datasets": "topas_agents/datasets"}


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=REPO, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / ".git").exists() or shutil.which("git") is None, reason="needs the git checkout")
def test_the_wheel_ships_every_tracked_module_and_data_file(tmp_path):
    src = tmp_path / "src"  # a clean tree of what git tracks: no build/ or egg-info of the checkout
    for rel in _tracked("pyproject.toml", "README.md", "LICENSE", *ROOTS):
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("topas_agents-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = {ROOTS[rel.split("/", 1)[0]] + "/" + rel.split("/", 1)[1] for rel in _tracked(*ROOTS)}
    assert len(expected) > 100 and not sorted(expected - shipped)
    entry_points = next(n for n in shipped if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "topas = " in text and "[sglang.srt.plugins]" in text  # the CLI and the SGLang plugin seam
