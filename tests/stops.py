"""Reading a child's stderr with a deadline, for the tests that signal a running command:
a child that hangs fails the test after the deadline instead of hanging the test run."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO


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
