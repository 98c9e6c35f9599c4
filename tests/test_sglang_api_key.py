"""`topas serve --engine sglang` with an API key, on real SGLang: the key reaches SGLang (calls
without it are refused, calls with it served) and is on no command line of the launcher's
process group. A command line is world-readable (`ps`); the launcher hands SGLang the key in
an owner-only `--config` file, removed when SGLang exits.

The product's launcher runs as a user runs it (`python -m topas_agents.server --engine
sglang`), with the key in $TOPAS_API_KEY (the way to keep it off the launcher's own command
line too), on CPU where there is no CUDA (tests/sglang_cpu). SGLang logs its arguments, the
key among them; the launcher's copy of its output masks it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")

import httpx  # noqa: E402
from sglang_cpu.serving import STARTUP_TIMEOUT_S, Server, engine_args, free_port, serving_env, wait_healthy  # noqa: E402

from topas_agents.server.sglang import launch, make_tiny_model  # noqa: E402

KEY = "k-sglang-secret-7f3a"
ADMIN_KEY = "adm-sglang-secret-91c2"  # SGLang's --admin-api-key, given after `--`


def _group_cmdlines(pgid: int) -> dict[int, str]:
    """The command line of every live process in process group `pgid`."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # after the comm field: state, ppid, pgrp
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue  # exited while listed
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_key_reaches_sglang_and_no_command_line(tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_tiny_model.build(model)
    shim = launch.write_entry_point_shim(tmp_path / "shim")
    port = free_port()
    cmd = [sys.executable, "-m", "topas_agents.server", "--engine", "sglang", "--policy", "topas",
           "--port", str(port), "--", *engine_args(model, 3000), f"--admin-api-key={ADMIN_KEY}"]
    env = {**os.environ, **serving_env(shim), "TOPAS_API_KEY": KEY}
    output = tmp_path / "server.log"
    with open(output, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = Server(proc, port, tmp_path / "none.jsonl", output, model, 0.0)
    try:
        wait_healthy(server, STARTUP_TIMEOUT_S)
        lines = _group_cmdlines(proc.pid)
        assert len(lines) >= 2 and not [line for line in lines.values() if KEY in line], lines
        # the admin key is on the launcher's own line (typed there), on none of the processes it starts
        assert not [line for pid, line in lines.items() if pid != proc.pid and ADMIN_KEY in line], lines
        sglang = next(line.split() for line in lines.values() if "sglang.launch_server" in line)
        config = Path(sglang[sglang.index("--config") + 1])
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert yaml.safe_load(config.read_text()) == {"api-key": KEY, "admin-api-key": ADMIN_KEY}

        base = f"http://127.0.0.1:{port}/v1"
        assert httpx.get(base + "/models", timeout=30).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        models = httpx.get(base + "/models", headers=auth, timeout=30)
        assert models.status_code == 200
        body = {"model": models.json()["data"][0]["id"], "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "topas": {"task_id": "keyed-1", "stage": "s1", "agent": "a"}}
        assert httpx.post(base + "/chat/completions", json=body, timeout=60).status_code == 401
        r = httpx.post(base + "/chat/completions", json=body, headers=auth, timeout=120)
        assert r.status_code == 200, r.text
    finally:
        server.stop()
    assert not config.exists()  # the launcher removes the key's file with its directory
    log = output.read_text(errors="replace")
    # SGLang logs its arguments at start-up (`server_args={... 'api_key': KEY ...}`): the
    # launcher masks the key in its copy of SGLang's output
    assert "'api_key': '***'" in log and "'admin_api_key': '***'" in log, log[-3000:]
    assert KEY not in log and ADMIN_KEY not in log
