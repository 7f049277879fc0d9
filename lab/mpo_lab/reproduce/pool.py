"""Worker processes for the reproduction's runs, built so that a stop always ends them.

:func:`run_jobs` runs ``fn(job)`` for each job in fresh Python processes and hands every
result to a callback in the calling thread. The stop path cannot deadlock, by construction:

- **No work in the signal handler.** While the jobs run, SIGINT, SIGTERM and SIGHUP only
  record their number (a handler that raised could land inside any lock a library holds,
  and the unwinding then wait on that lock for good). The calling thread sees the record
  within :data:`POLL_S` seconds.
- **No threads, no locks, no queues.** Each worker is a ``subprocess`` with two pipes (jobs
  in, results out), read with ``multiprocessing.connection.wait`` and a timeout; nothing
  here waits without a bound except a pipe read of a message that is being written.
- **Kill and reap from the calling thread.** On a stop, an error or a return, every worker
  gets SIGKILL (a run holds nothing a kill could corrupt: its result is saved by the
  caller) and is reaped; then the handlers are restored and :class:`StopRequested` (a
  KeyboardInterrupt, with the signal's number) is raised.
- **The workers never see a stop.** They run in sessions of their own (Ctrl-C, sent to the
  terminal's process group, does not reach them; nor does a hangup), ignore the three
  signals, and exit when the process that started them is gone.

Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["POLL_S", "WORKER_TAG", "StopRequested", "run_jobs", "worker_main"]

POLL_S = 0.2
"""The longest a recorded stop waits for the calling thread."""
STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
WORKER_TAG = "mpo_lab.reproduce.pool"
"""On every worker's command line (with the starting process's pid after it)."""
_BOOT = (
    "import json, sys\n"
    "sys.path[:] = json.loads(sys.argv[2])\n"
    "from mpo_lab.reproduce.pool import worker_main\n"
    "worker_main(sys.argv[3:])\n"
)


class StopRequested(KeyboardInterrupt):
    """A stop request (``signum``: SIGINT for Ctrl-C, SIGTERM, SIGHUP) ended :func:`run_jobs`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _RemoteTraceback(Exception):
    """A worker's traceback, as the cause of the exception it raised."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    jobs: Connection
    results: Connection
    ready: bool = False
    job: int | None = None

    def send(self, message: Any) -> None:
        self.jobs.send_bytes(pickle.dumps(message))

    def receive(self) -> Any:
        try:
            return pickle.loads(self.results.recv_bytes())
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            doing = "before it started a job" if self.job is None else "while running a job"
            raise ChildProcessError(
                f"a reproduce worker process (pid {self.proc.pid}) ended {doing}, exit code {self.proc.returncode}"
            ) from None


def _spawn() -> _Worker:
    job_read, job_write = os.pipe()
    result_read, result_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _BOOT,
                WORKER_TAG,
                json.dumps(sys.path),
                str(job_read),
                str(result_write),
                str(os.getpid()),
            ],
            pass_fds=(job_read, result_write),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        os.close(job_write)
        os.close(result_read)
        raise
    finally:
        os.close(job_read)
        os.close(result_write)
    return _Worker(proc, Connection(job_write, readable=False), Connection(result_read, writable=False))


def _end(pool: list[_Worker]) -> None:
    """Kills every worker, then reaps them (a SIGKILLed process exits at once)."""
    for w in pool:
        if w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
    for w in pool:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=10)
        w.jobs.close()
        w.results.close()


def run_jobs(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    order: Sequence[int],
    finished: Callable[[int, Any], None],
    workers: int,
    init: Callable[[], None] | None = None,
) -> None:
    """Runs ``fn(jobs[i])`` for each ``i`` of ``order`` (in that order) in ``workers``
    processes, each started with ``init()``; ``finished(i, result)`` is called in this
    thread as each result arrives. ``fn`` and ``init`` must be importable module-level
    functions, the jobs and results picklable. An exception a job raises is raised here
    (its worker's traceback as the cause), after every worker is ended; a worker that dies
    is a ChildProcessError. A stop request raises :class:`StopRequested`."""
    stops: list[int] = []
    previous: dict[int, Any] = {}
    pool: list[_Worker] = []
    try:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                current = signal.getsignal(sig)
                if current is not signal.SIG_IGN and current is not None:  # an ignored signal stays ignored
                    previous[sig] = current
                    signal.signal(sig, lambda signum, _frame: stops.append(signum))  # record, nothing else
        queue = list(order)
        while len(pool) < min(workers, len(queue)) and not stops:
            pool.append(_spawn())
            pool[-1].send(("init", init, None))
        by_pipe = {w.results: w for w in pool}
        while not stops and (queue or any(w.job is not None for w in pool)):
            for w in pool:
                if w.ready and w.job is None and queue:
                    w.job = queue.pop(0)
                    w.send(("job", fn, jobs[w.job]))
            for pipe in wait(list(by_pipe), timeout=POLL_S):
                w = by_pipe[pipe]  # type: ignore[index]
                kind, value, remote = w.receive()
                if kind == "ready":
                    w.ready = True
                elif kind == "ok":
                    i, w.job = w.job, None
                    assert i is not None
                    finished(i, value)
                else:
                    raise value from _RemoteTraceback(remote)
        if stops:
            raise StopRequested(stops[0])
    finally:
        _end(pool)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --------------------------------------------------------------------------- the worker side


def _watch_parent(parent: int) -> None:
    # A worker outlives a killed parent by at most a second (the pipes' EOF needs it idle).
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _reply(results: Connection, message: tuple[str, Any, Any]) -> None:
    try:
        data = pickle.dumps(message)
    except Exception as e:  # an unpicklable result or exception: its text, as an error
        failure = RuntimeError(f"{type(message[1]).__name__}: {message[1]} (not picklable: {e})")
        data = pickle.dumps(("error", failure, message[2] or ""))
    results.send_bytes(data)


def worker_main(argv: Sequence[str]) -> None:
    """A worker: ``argv`` is the job pipe's fd, the result pipe's fd and the starting
    process's pid. Messages in are ``("init", fn, None)`` (no reply) and ``("job", fn,
    job)``; replies are ``("ready", None, None)`` once, then ``("ok", result, None)`` or
    ``("error", exception, traceback)`` per job."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a stop is the starting process's to handle
    job_fd, result_fd, parent = (int(a) for a in argv)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    jobs, results = Connection(job_fd, writable=False), Connection(result_fd, readable=False)
    ready = False
    while True:
        try:
            data = jobs.recv_bytes()
        except EOFError:
            return
        try:
            kind, fn, job = pickle.loads(data)
        except Exception as e:  # e.g. the job's module does not import here
            _reply(results, ("error", e, traceback.format_exc()))
            continue
        if kind == "init":
            if fn is not None:
                fn()
            if not ready:
                _reply(results, ("ready", None, None))
                ready = True
            continue
        try:
            reply: tuple[str, Any, Any] = ("ok", fn(job), None)
        except BaseException as e:  # every failure goes back to the starting process
            reply = ("error", e, traceback.format_exc())
        _reply(results, reply)
