"""A child's log tail, as quoted in the errors the launcher raises ("smg exited ...; its log
ends:"), is plain text: smg colours its log lines even into a file."""

from __future__ import annotations

import sys

from topas_agents.server.cluster.procs import start_child, stop_children, strip_ansi

# as smg 1.13.0 writes a line (tracing's colours: dim, yellow, italic, reset)
SMG_LINE = ("\x1b[2m2026-12-07 18:42:16\x1b[0m \x1b[33m WARN\x1b[0m \x1b[2msmg::posture\x1b[0m\x1b[2m:\x1b[0m "
            "worker gone \x1b[3mworker\x1b[0m\x1b[2m=\x1b[0mhttp://127.0.0.1:9")


def test_strip_ansi_leaves_the_text_only():
    assert strip_ansi(SMG_LINE) == "2026-12-07 18:42:16  WARN smg::posture: worker gone worker=http://127.0.0.1:9"
    assert strip_ansi("\x1b[1;31mbold red\x1b[0m \x1b[?25l\x1b[2K[not an escape]") == "bold red [not an escape]"
    assert strip_ansi("plain [0m text") == "plain [0m text"  # brackets without ESC are text


def test_a_childs_tail_has_no_colour_codes(tmp_path):
    script = f"import sys; print({SMG_LINE!r}); print('\\x1b[31mlast line\\x1b[0m'); sys.exit(1)"
    child = start_child("smg", (sys.executable, "-c", script), log_dir=tmp_path)
    try:
        child.proc.wait(10)
    finally:
        stop_children([child], 1.0)
    assert "\x1b" in (tmp_path / "smg.log").read_text()  # the log itself is as written
    assert child.tail().splitlines() == [
        "2026-12-07 18:42:16  WARN smg::posture: worker gone worker=http://127.0.0.1:9", "last line"]
    assert child.tail(1) == "last line"
