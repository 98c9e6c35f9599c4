"""Copy a child's output with its secrets masked.

SGLang logs its resolved arguments at start-up, API keys included (0.5.23's
`_server_args_for_logging` redacts only the watermark keys), so a keyed `topas serve --engine
sglang` would print the key to the user's terminal, or into a replica's log under
`topas serve --replicas N`. The launcher reads SGLang's output through pipes and writes it on
with every occurrence of a secret replaced by `MASK`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import BinaryIO

MASK = b"***"
_CHUNK = 65536


class SecretMask:
    """Streaming replacement of secrets in bytes. A chunk may end inside a secret: the longest
    tail that could begin one is held back until the next chunk (or `flush`), and nothing else
    is, so ordinary output passes through at once."""

    def __init__(self, secrets: Iterable[str]) -> None:
        forms: set[bytes] = set()
        for secret in secrets:
            if secret:
                forms.add(secret.encode("utf-8", "surrogateescape"))
                forms.add(repr(secret)[1:-1].encode("utf-8", "backslashreplace"))  # as a repr() prints it
        self._forms = sorted(forms, key=len, reverse=True)  # a longer form first: it may hold a shorter one
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._held + data
        for form in self._forms:
            buf = buf.replace(form, MASK)
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep:] if keep else b""
        return buf[:len(buf) - keep]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def _partial_tail(self, buf: bytes) -> int:
        """Length of the longest end of `buf` that is a proper beginning of some secret."""
        longest = 0
        for form in self._forms:
            for n in range(min(len(form) - 1, len(buf)), longest, -1):
                if buf.endswith(form[:n]):
                    longest = n
                    break
        return longest


def copy_masked(src: BinaryIO, dst: BinaryIO, mask: SecretMask) -> None:
    """Copy `src` to `dst` until end of file, through `mask`. A `dst` that cannot be written
    any more (a closed terminal) drops output, but `src` is still drained: a full pipe would
    block the child's next log line, and SGLang logs from its scheduler loop."""
    writable = True
    fd = src.fileno()
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except OSError:
            chunk = b""
        data = mask.feed(chunk) if chunk else mask.flush()
        if data and writable:
            try:
                dst.write(data)
                dst.flush()
            except (OSError, ValueError, AttributeError):  # closed, or no stream at all (None)
                writable = False
        if not chunk:
            return


def start_copies(pairs: Iterable[tuple[BinaryIO, BinaryIO]], secrets: Iterable[str]) -> list[threading.Thread]:
    """A daemon thread per (child stream, our stream) pair, each with its own `SecretMask`."""
    secrets = tuple(secrets)
    threads = [threading.Thread(target=copy_masked, args=(src, dst, SecretMask(secrets)),
                                name="topas-sglang-output", daemon=True) for src, dst in pairs]
    for thread in threads:
        thread.start()
    return threads
