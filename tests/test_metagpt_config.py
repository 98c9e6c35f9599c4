"""MetaGPT config isolation: config2.yaml writing/patching and prepare_metagpt's footprint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from topas_agents.cli import main
from topas_agents.errors import ConfigError
from topas_agents.integrations.metagpt.config_file import (
    config_path,
    ensure_config,
    read_config,
    write_config,
)
from topas_agents.integrations.metagpt.environment import metagpt_available


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_write_config_creates_a_minimal_importable_file(tmp_path):
    path = write_config(tmp_path / "r", "http://127.0.0.1:9/v1/")
    assert path == tmp_path / "r" / "config" / "config2.yaml"
    assert _files(tmp_path) == {"r", "r/config", "r/config/config2.yaml"}
    llm = yaml.safe_load(path.read_text())["llm"]
    assert llm == {"api_type": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "topas-sim",
                   "api_key": "sk-topas-local", "stream": False}


def test_write_config_patches_llm_and_keeps_unrelated_keys(tmp_path):
    path = config_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(textwrap.dedent("""\
        llm:
          api_type: azure
          base_url: https://old.example/v1
          model: gpt-4
          api_key: sk-real
          timeout: 33
        mermaid:
          engine: nodejs
        repair_llm_output: true
        """))
    write_config(tmp_path, "http://127.0.0.1:8000/v1")
    data = read_config(tmp_path)
    assert data["mermaid"] == {"engine": "nodejs"} and data["repair_llm_output"] is True
    assert data["llm"] == {"api_type": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "gpt-4",
                           "api_key": "sk-real", "timeout": 33}  # model/key kept, no stream key added
    write_config(tmp_path, "http://h:1/v1", model="m2", api_key="k2")
    assert read_config(tmp_path)["llm"]["model"] == "m2" and read_config(tmp_path)["llm"]["api_key"] == "k2"


def test_bad_inputs_are_one_line_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="base-url"):
        write_config(tmp_path, "127.0.0.1:8000")
    for model in ("", " qwen", "qwen\n"):  # "" used to fall back to the default silently
        with pytest.raises(ConfigError, match="--model"):
            write_config(tmp_path, "http://h/v1", model=model)
    assert not config_path(tmp_path).exists()  # refused before anything is written
    config_path(tmp_path).parent.mkdir(parents=True)
    config_path(tmp_path).write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        write_config(tmp_path, "http://h/v1")
    config_path(tmp_path).write_text("llm: [1]\n")
    with pytest.raises(ConfigError, match="'llm' must be a mapping"):
        write_config(tmp_path, "http://h/v1")


@pytest.mark.skipif(not metagpt_available(), reason="needs metagpt")
def test_a_root_whose_workspace_is_a_file_is_a_one_line_error(tmp_path):
    # MetaGPT makes <root>/workspace as it is imported: a 48-line FileExistsError traceback
    from topas_agents.integrations.metagpt.environment import prepare_metagpt

    (tmp_path / "workspace").write_text("not a folder")
    with pytest.raises(ConfigError, match="workspace is a file, not a directory"):
        prepare_metagpt(tmp_path)


@pytest.mark.parametrize(("kwargs", "match"), [
    # before: "http://" was written as "http:", a URL with spaces as is, an int URL raised
    # AttributeError, and api_key "" was swapped for the default placeholder
    ({"base_url": "http://"}, "must name a host"),
    ({"base_url": "http://a b/v1 "}, "without spaces"),
    ({"base_url": 5}, "must be a string"),
    ({"base_url": "http://h/v1", "api_key": ""}, "--api-key"),
    ({"base_url": "http://h/v1", "api_key": "k\nX-Evil: 1"}, "--api-key"),
    ({"base_url": "http://h/v1", "api_key": 5}, "--api-key must be a string"),
    ({"base_url": "http://h/v1", "model": 5}, "--model must be a string"),
])
def test_write_config_refuses_what_would_fail_at_every_call(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        write_config(tmp_path, **kwargs)
    assert not config_path(tmp_path).exists()


def test_write_config_keeps_a_given_key_and_strips_only_trailing_slashes(tmp_path):
    write_config(tmp_path, "https://h:8000/v1//", api_key="sk-mine")
    llm = read_config(tmp_path)["llm"]
    assert (llm["base_url"], llm["api_key"]) == ("https://h:8000/v1", "sk-mine")


def test_ensure_config_writes_only_when_there_is_no_llm_section(tmp_path):
    ensure_config(tmp_path, "http://a/v1")
    ensure_config(tmp_path, "http://b/v1")
    assert read_config(tmp_path)["llm"]["base_url"] == "http://a/v1"


def test_cli_config_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))  # no ~/.metagpt/config2.yaml
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "mg"
    assert main(["metagpt", "config", "--base-url", "http://127.0.0.1:7/v1", "--root", str(root),
                 "--model", "qwen", "--api-key", "sk-secret"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["llm"]["model"] == "qwen" and out["llm"]["api_key"] == "sk-***"  # never echoes the key
    assert read_config(root)["llm"]["api_key"] == "sk-secret"
    assert _files(tmp_path) == {"mg", "mg/config", "mg/config/config2.yaml"}
    assert main(["metagpt", "config", "--base-url", "nope", "--root", str(root)]) == 2
    assert "base-url" in capsys.readouterr().err


def _home_with_llm(tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "home"
    (home / ".metagpt").mkdir(parents=True)
    (home / ".metagpt" / "config2.yaml").write_text(
        "llm:\n  api_type: openai\n  base_url: https://home.example/v1\n  api_key: sk-home\n  model: gpt-4\n"
        "repair_llm_output: true\n")
    monkeypatch.setenv("HOME", str(home))
    return home / ".metagpt" / "config2.yaml"


def test_cli_config_refuses_when_the_home_config_would_win(tmp_path, capsys, monkeypatch):
    home_file = _home_with_llm(tmp_path, monkeypatch)
    root = tmp_path / "mg"
    assert main(["metagpt", "config", "--base-url", "http://127.0.0.1:7/v1", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert str(home_file) in err and "https://home.example/v1" in err and "--home" in err
    assert not config_path(root).exists()  # nothing written
    assert main(["metagpt", "config", "--base-url", "http://127.0.0.1:7/v1", "--root", str(root), "--force"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["effective"] is False and out["overridden_by"] == str(home_file)
    assert read_config(root)["llm"]["base_url"] == "http://127.0.0.1:7/v1"


def test_cli_config_home_patches_the_winning_file(tmp_path, capsys, monkeypatch):
    home_file = _home_with_llm(tmp_path, monkeypatch)
    assert main(["metagpt", "config", "--base-url", "http://127.0.0.1:7/v1", "--home"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["config"] == str(home_file) and out["effective"] is True and out["llm"]["api_key"] == "sk-***"
    # the user's own key now goes to the Topas server with every call: said, never echoed
    assert "keeps its api_key (sk-***)" in captured.err and "sk-home" not in captured.err
    data = yaml.safe_load(home_file.read_text())
    assert data["repair_llm_output"] is True  # other keys kept
    assert data["llm"] == {"api_type": "openai", "base_url": "http://127.0.0.1:7/v1", "api_key": "sk-home",
                           "model": "gpt-4"}
    # a home file without a key gets the placeholder: nothing to warn about, then or later
    home_file.write_text("llm:\n  api_type: openai\n  base_url: https://home.example/v1\n  model: gpt-4\n")
    for _ in range(2):
        assert main(["metagpt", "config", "--base-url", "http://127.0.0.1:7/v1", "--home"]) == 0
        assert "keeps its api_key" not in capsys.readouterr().err


def _metagpt_default_llm(tmp_path: Path, root: Path, home: Path) -> dict:
    """MetaGPT's own `Config.default()` in a fresh interpreter (its config loads at import)."""
    code = ("import json; from metagpt.config2 import Config; c = Config.default();"
            "print(json.dumps({'base_url': c.llm.base_url, 'model': c.llm.model}))")
    env = {k: v for k, v in os.environ.items() if k != "AGENTOPS_LOGGING_TO_FILE"}
    env.update(HOME=str(home), METAGPT_PROJECT_ROOT=str(root), AGENTOPS_LOGGING_TO_FILE="False")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.metagpt
@pytest.mark.skipif(not metagpt_available(), reason="metagpt is not installed")
def test_documented_precedence_is_metagpts(tmp_path, monkeypatch, capsys):
    """The reason for the refusal, checked against MetaGPT itself: the home llm wins whole."""
    home_file = _home_with_llm(tmp_path, monkeypatch)
    root = tmp_path / "mg"
    assert main(["metagpt", "config", "--base-url", "http://127.0.0.1:7/v1", "--root", str(root),
                 "--model", "qwen", "--force"]) == 0
    assert _metagpt_default_llm(tmp_path, root, home_file.parent.parent) == {
        "base_url": "https://home.example/v1", "model": "gpt-4"}
    assert main(["metagpt", "config", "--base-url", "http://127.0.0.1:7/v1", "--home", "--model", "qwen"]) == 0
    assert _metagpt_default_llm(tmp_path, root, home_file.parent.parent)["base_url"] == "http://127.0.0.1:7/v1"
    home_file.unlink()  # no home file: the project config is what MetaGPT uses
    assert _metagpt_default_llm(tmp_path, root, home_file.parent.parent) == {
        "base_url": "http://127.0.0.1:7/v1", "model": "qwen"}
    capsys.readouterr()


@pytest.mark.metagpt
@pytest.mark.skipif(not metagpt_available(), reason="metagpt is not installed")
def test_plain_metagpt_starts_in_the_installed_venv(tmp_path):
    """`metagpt --help` and `import metagpt.software_company` (it imports agentops)."""
    home, root = tmp_path / "home", tmp_path / "root"
    home.mkdir()
    write_config(root, "http://127.0.0.1:9/v1")
    env = {**os.environ, "HOME": str(home), "METAGPT_PROJECT_ROOT": str(root), "AGENTOPS_LOGGING_TO_FILE": "False"}
    metagpt_cli = Path(sys.executable).with_name("metagpt")
    out = subprocess.run([str(metagpt_cli), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "idea" in out.stdout.lower()
    code = "import metagpt.software_company as s; print(callable(s.generate_repo))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.metagpt
@pytest.mark.skipif(not metagpt_available(), reason="metagpt is not installed")
def test_prepare_metagpt_writes_nothing_outside_its_root(tmp_path):
    """A fresh interpreter (MetaGPT reads its root once per process), an empty HOME and CWD."""
    root, home, cwd = tmp_path / "root", tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    code = textwrap.dedent(f"""
        from topas_agents.integrations.metagpt.environment import prepare_metagpt
        rt = prepare_metagpt({str(root)!r}, log_level="ERROR")
        import metagpt.team, metagpt.const, metagpt.provider
        from topas_agents.integrations.metagpt import context
        ctx = context.metagpt_context("http://127.0.0.1:9/v1", rt.root, "proj_x")
        print(metagpt.const.METAGPT_ROOT, ctx.config.workspace.path, context.artifacts_dir(ctx), ctx.config.llm.stream)
        """)
    env = {k: v for k, v in os.environ.items() if k not in ("METAGPT_PROJECT_ROOT", "AGENTOPS_LOGGING_TO_FILE")}
    env["HOME"] = str(home)
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    mg_root, workspace, artifacts, stream = out.stdout.split()
    assert Path(mg_root) == root.resolve() and Path(workspace) == root.resolve() / "workspace"
    assert Path(artifacts) == root.resolve() / "workspace" / "proj_x"  # MetaGPT's layout, not nested twice
    assert stream == "False"
    # two dependency notices printed on every run, about their own futures (see environment.py)
    assert "Google will stop supporting" not in out.stderr and "No redis installed" not in out.stderr
    # MetaGPT's import-time INFO line (at log level ERROR), requests' warning about chardet 7
    assert "PROJECT_ROOT set from environment variable" not in out.stderr
    assert "doesn't match a supported version" not in out.stderr
    assert _files(cwd) == set() and _files(home) == set()
    assert {"config/config2.yaml", "logs", "workspace"} <= _files(root)
