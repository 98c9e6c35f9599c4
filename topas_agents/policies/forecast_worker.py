"""The forecast guard's background worker: one child interpreter that runs forecasts.

It is a child interpreter running `main()` below, not a multiprocessing pool. A spawned pool
re-imports the parent's `__main__`: a user's script that embeds the server
(`start_server_in_thread`) without the `if __name__ == "__main__":` guard ran again inside the
worker (its server, its calls, its files), and the worker itself never started. This child
imports only this package. Jobs and results travel as length-prefixed pickles over its stdin
and stdout; its stderr is the parent's, so a failure there is visible. One job at a time: the
guard never has two forecasts in flight.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future, InvalidStateError
from typing import IO, Any

_HEADER = struct.Struct("!Q")
# The child's entry. `-c` (like `-m`) puts the working directory first on sys.path: dropped, so
# a folder the server was started from (an older checkout, a stray `numpy.py`) cannot shadow
# the parent's modules; the package's own root comes through PYTHONPATH.
_BOOT = "import sys; del sys.path[0]; from topas_agents.policies.forecast_worker import main; sys.exit(main())"
_EOF = object()
# close(): how long the worker may take to exit after SIGTERM before it is killed.
CLOSE_GRACE_S = 5.0


class ForecastWorkerDied(RuntimeError):
    """The worker process ended (killed, out of memory, or unable to start)."""


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _write(stream: IO[bytes], data: bytes) -> None:
    """One message: its pickled `data`, after its length."""
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    """The next message, or _EOF when the other side closed the stream (or died) mid-way."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return _EOF
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    return pickle.loads(data) if len(data) == size else _EOF


def _settle(future: Future[Any] | None, result: Any = None, exc: BaseException | None = None) -> None:
    if future is None or future.done():
        return
    with contextlib.suppress(InvalidStateError):  # the writer and the reader may both settle it
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)


class ForecastWorker:
    """A running worker: `submit(job)` returns a Future of `run_forecast(job)`."""

    def __init__(self) -> None:
        import topas_agents

        root = os.path.dirname(os.path.dirname(os.path.abspath(topas_agents.__file__)))
        env = dict(os.environ)  # the package must import in the child even when not installed
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env, close_fds=True)
        self._lock = threading.Lock()
        self._future: Future[Any] | None = None
        self._reader = threading.Thread(target=self._read_results, name="topas-forecast-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def submit(self, job: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._future is not None:
                raise RuntimeError("a forecast is already in flight on this worker")
            if self._proc.poll() is not None:
                raise ForecastWorkerDied(f"the forecast worker (pid {self.pid}) exited with {self._proc.returncode}")
            self._future = future
        # Written by a thread: a job larger than the pipe's buffer would otherwise block the
        # caller's decide() until the worker reads it (up to its start-up, about a second).
        threading.Thread(target=self._send, args=(_dumps(job), future), name="topas-forecast-writer",
                         daemon=True).start()
        return future

    def _send(self, data: bytes, future: Future[Any]) -> None:
        try:
            assert self._proc.stdin is not None
            _write(self._proc.stdin, data)
        except (OSError, ValueError) as exc:  # a broken pipe (it died), or closed by close()
            with self._lock:
                if self._future is future:
                    self._future = None
            _settle(future, exc=ForecastWorkerDied(f"the forecast worker (pid {self.pid}) is gone: {exc}"))

    def _read_results(self) -> None:
        assert self._proc.stdout is not None
        while True:
            try:
                message = _read(self._proc.stdout)
            except (OSError, ValueError, pickle.UnpicklingError, EOFError):
                message = _EOF
            with self._lock:
                future, self._future = self._future, None
            if message is _EOF:
                self._proc.stdout.close()
                code = self._proc.wait()
                _settle(future, exc=ForecastWorkerDied(f"the forecast worker (pid {self.pid}) exited with {code}"))
                return
            ok, value = message
            _settle(future, value if ok else None, None if ok else value)

    def close(self) -> None:
        """Stop the worker, a forecast in flight included, and wait for it to exit."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(CLOSE_GRACE_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):  # a broken pipe: nothing left to flush
                self._proc.stdin.close()
        self._reader.join(CLOSE_GRACE_S)  # it reads the end of the stream, settles, closes it


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - any exception that does not pickle travels as its text
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def main() -> int:
    """The worker's loop: a job in, its scores (or its exception) out, until stdin closes."""
    from .forecast_run import run_forecast

    # Ctrl-C in a terminal reaches the whole process group: the parent stops this worker
    # itself (close(), or the end of stdin), without a KeyboardInterrupt traceback from here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the result stream
    while (job := _read(inp)) is not _EOF:
        try:
            message: tuple[bool, Any] = (True, run_forecast(job))
        except Exception as exc:  # noqa: BLE001 - the guard reports it and keeps its policy
            message = (False, _picklable(exc))
        try:
            _write(out, _dumps(message))
        except OSError:  # the parent is gone
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
