"""For the tests that signal a running command: the stop signals as an interactive shell
leaves them (:func:`default_stop_signals`), and a child's stderr read with a deadline (a
child that hangs fails the test after the deadline instead of hanging the test run)."""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO


def default_stop_signals() -> None:
    """Undoes what a background start did to the suite: a job started with ``&`` (or under
    ``nohup``) inherits SIGINT (SIGHUP) as ignored, and so would every command the tests
    start, since an ignored signal stays ignored across ``exec`` and mpo_rs rightly leaves an
    ignored signal alone. The tests signal their children and check the handlers, so they set
    the signals as an interactive shell has them: Python's Ctrl-C handler, SIGTERM and
    SIGHUP at their default. Called by the conftests before any test runs."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


class Lines:
    """The lines of ``stream`` (a child's text stderr), read by a thread of their own."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def until(self, wanted: Callable[[str], bool], timeout: float) -> str | None:
        """The first new line ``wanted`` accepts, or None at the end of the stream; an
        AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no such line within {timeout} s; seen: {''.join(self.seen)}") from None
            if line is None:
                return None
            self.seen.append(line)
            if wanted(line):
                return line

    def rest(self, timeout: float) -> str:
        """Every line from here to the end of the stream (AssertionError after ``timeout``)."""
        start = len(self.seen)
        self.until(lambda _: False, timeout)
        return "".join(self.seen[start:])


def wait(proc: subprocess.Popen[str], timeout: float) -> int:
    """``proc``'s exit code; a child still running after ``timeout`` s is killed and fails the test."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the command did not end within {timeout} s of its stop (a hang)") from None
