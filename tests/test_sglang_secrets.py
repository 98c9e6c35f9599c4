"""SGLang's secrets under `topas serve --engine sglang`, without SGLang: which options are moved
off its command line into the owner-only config file, and how its output is masked
(server/sglang/launch.py, server/sglang/redact.py). The real-SGLang end of both is
tests/test_sglang_api_key.py."""

from __future__ import annotations

import io
import os
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.errors import ConfigError
from topas_agents.server.sglang.launch import move_api_key_to_config, secrets_of
from topas_agents.server.sglang.redact import MASK, SecretMask, copy_masked, start_copies

SGLANG = ["python", "-m", "sglang.launch_server", "--port", "9"]


def _moved(cmd: list[str], directory: Path) -> tuple[list[str], dict]:
    directory.mkdir()
    moved = move_api_key_to_config(cmd, directory)
    return moved, yaml.safe_load(Path(moved[-1]).read_text())


def test_both_keys_move_in_either_spelling(tmp_path):
    moved, settings_ = _moved([*SGLANG, "--api-key=k1", "--admin-api-key", "adm"], tmp_path / "a")
    assert moved[:5] == SGLANG and moved[5] == "--config" and len(moved) == 7
    assert settings_ == {"api-key": "k1", "admin-api-key": "adm"}
    moved, settings_ = _moved([*SGLANG, "--admin-api-key=a=b"], tmp_path / "b")  # only the first '=' splits
    assert settings_ == {"admin-api-key": "a=b"} and "a=b" not in " ".join(moved[:-1])


def test_secret_option_mistakes_are_named(tmp_path):
    with pytest.raises(ConfigError, match="--api-key is given twice"):
        move_api_key_to_config([*SGLANG, "--api-key", "a", "--api-key=b"], tmp_path)
    with pytest.raises(ConfigError, match="begins with '-'"):
        move_api_key_to_config([*SGLANG, "--api-key=-k"], tmp_path)
    user = tmp_path / "mine.yaml"
    user.write_text("admin_api_key: other\n")
    with pytest.raises(ConfigError, match="give the admin api key once"):
        move_api_key_to_config([*SGLANG, "--admin-api-key", "x", "--config", str(user)], tmp_path)
    # an empty value or none at all: SGLang's own parser names it, nothing is moved
    for cmd in ([*SGLANG, "--api-key="], [*SGLANG, "--admin-api-key"]):
        assert move_api_key_to_config(cmd, tmp_path) == cmd
    assert not list(tmp_path.glob("topas-*"))


def test_secrets_of_reads_the_command_line_and_the_users_config(tmp_path):
    user = tmp_path / "mine.yaml"
    user.write_text("api-key: from-file\nadmin_api_key: 12345\nport: 9\n")
    assert secrets_of([*SGLANG, "--api-key", "k", "--config", str(user)]) == ["k", "from-file", "12345"]
    assert secrets_of([*SGLANG, "--config", str(tmp_path / "missing.yaml")]) == []  # SGLang names it
    assert secrets_of(SGLANG) == []


_TEXT = st.text(alphabet=string.printable + "é", max_size=80)
_SECRET = st.text(alphabet=string.ascii_letters + string.digits + "-_'\\", min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(secret=_SECRET, parts=st.lists(_TEXT, max_size=6), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_masking_a_stream_cut_anywhere_equals_masking_it_whole(secret, parts, cuts):
    data = secret.join(parts).encode()  # the secret between every two parts
    mask = SecretMask([secret])
    out, start = b"", 0
    for cut in sorted(c for c in cuts if c <= len(data)) + [len(data)]:
        out += mask.feed(data[start:cut])
        start = cut
    out += mask.flush()
    whole = data
    for form in sorted({secret.encode(), repr(secret)[1:-1].encode()}, key=len, reverse=True):
        whole = whole.replace(form, MASK)
    assert out == whole
    assert secret.encode() not in out


def test_masking_holds_back_only_what_may_begin_a_secret():
    mask = SecretMask(["s3cr3t"])
    assert mask.feed(b"ready\n") == b"ready\n"  # ordinary output passes at once
    assert mask.feed(b"key=s3c") == b"key="
    assert mask.feed(b"r3t!\n") == MASK + b"!\n"
    assert SecretMask(["a\\b"]).feed(b"'a\\\\b' a\\b") == b"'" + MASK + b"' " + MASK  # also as repr() prints it


def test_a_closed_terminal_drops_output_but_the_pipe_is_drained():
    read_fd, write_fd = os.pipe()
    payload = b"x" * 200_000 + b"s3cr3t\n"  # more than a pipe holds: a stuck reader would block the writer

    class Closed(io.BytesIO):
        def write(self, data):
            raise OSError("terminal gone")

    with open(read_fd, "rb") as src:
        [thread] = start_copies([(src, Closed())], ["s3cr3t"])
        with open(write_fd, "wb") as w:
            w.write(payload)
        thread.join(10)
        assert not thread.is_alive()

    read_fd, write_fd = os.pipe()
    small = b"line s3c" + b"r3t\n" * 2  # within a pipe's buffer: written before it is read
    with open(write_fd, "wb") as w:
        w.write(small)
    sink = io.BytesIO()
    with open(read_fd, "rb") as src:
        copy_masked(src, sink, SecretMask(["s3cr3t"]))
    assert sink.getvalue() == small.replace(b"s3cr3t", MASK)


def test_the_launcher_masks_both_streams_and_returns_the_exit_status(capfd):
    import sys

    from topas_agents.server.sglang.launch import _run

    child = ("import sys, time; print('server_args={\"api_key\": \"K-42\"}'); "
             "sys.stderr.write('warn K-'); sys.stderr.flush(); time.sleep(0.2); "
             "sys.stderr.write('42 admin ADM\\n'); sys.exit(3)")
    assert _run([sys.executable, "-c", child], dict(os.environ), ["K-42", "ADM"]) == 3
    out, err = capfd.readouterr()
    assert out == 'server_args={"api_key": "***"}\n' and err == "warn *** admin ***\n"
    # without a key nothing is piped: the child writes to our streams itself
    assert _run([sys.executable, "-c", "print('K-42')"], dict(os.environ)) == 0
    assert capfd.readouterr().out == "K-42\n"


def test_no_stream_to_write_to_still_drains():
    read_fd, write_fd = os.pipe()
    with open(read_fd, "rb") as src:
        [thread] = start_copies([(src, None)], ["k"])
        with open(write_fd, "wb") as w:
            w.write(b"y" * 200_000)  # more than a pipe holds
        thread.join(10)
        assert not thread.is_alive()
