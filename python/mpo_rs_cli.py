"""The ``mpo-rs`` console script: signal handling first, then the command line.

:func:`console` runs any command line this way (the lab's ``mpo-lab`` script uses it too).

A stop request ends the command the way Ctrl-C does: the run unwinds, its hidden
temporary is removed, OUTPUT stays as it was, one line goes to stderr and the exit code
is 128 + the signal (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP). Importing
``mpo_rs`` loads numpy and the extension (a few tenths of a second), and a signal then
must be just as quiet, so the handlers go in before that import. This module sits outside
the package because importing any ``mpo_rs`` submodule runs ``mpo_rs/__init__.py`` first;
it imports only the standard library. Library users who import ``mpo_rs`` keep Python's
own signal handling.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading

PROG = "mpo-rs"


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: a stop request, like Ctrl-C (so no ``except Exception``
    swallows it on the way out, and code that cleans up after Ctrl-C does so after it too);
    ``signum`` says which signal. The package reads a stop as a KeyboardInterrupt with an
    optional ``signum`` and never imports this module."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# The last stop request, kept because its exception can be lost: a handler that runs while
# the import system or a finalizer is on the stack has its exception printed as
# "Exception ignored" and dropped, and the command would then run to the end. The
# unraisable hook below sends such a stop again; `main` also raises it after the import.
_received: int | None = None


def _terminate(signum: int, frame: object) -> None:
    global _received
    _received = signum
    raise Terminated(signum)


def _interrupt(signum: int, frame: object) -> None:
    global _received
    _received = signum
    raise KeyboardInterrupt


def _redeliver_lost_stop(unraisable: sys.UnraisableHookArgs) -> None:
    """A stop whose exception Python dropped (a handler that ran inside a weakref callback
    of the import system or inside a finalizer) is sent again, so it lands in ordinary code
    and stops the command; any other unraisable error is printed as Python prints it."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received is not None:
        # From another thread, a moment later: sent from here, the handler would run
        # before this hook returns, and its exception would be dropped again.
        try:
            threading.Timer(0.001, _thread.interrupt_main, (_received,)).start()
            return
        except RuntimeError:  # no new thread at interpreter shutdown: nothing left to stop
            pass
    sys.__unraisablehook__(unraisable)


def _install() -> None:
    sys.unraisablehook = _redeliver_lost_stop
    for sig, handler in (
        (signal.SIGINT, _interrupt),
        (signal.SIGTERM, _terminate),
        (getattr(signal, "SIGHUP", None), _terminate),
    ):
        # A signal the parent ignores (nohup, a background job) stays ignored.
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)


def _raise_lost_stop() -> None:
    """Raises the stop request whose exception was dropped while the package imported."""
    if _received == signal.SIGINT:
        raise KeyboardInterrupt
    if _received is not None:
        raise Terminated(_received)


def _stopped(prog: str, message: str, code: int) -> int:
    # A second signal while the first one's message is written must not add a traceback.
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)
    sys.stderr.write(f"{prog}: error: {message}\n")
    return code


def console(prog: str, target: str) -> int:
    """Runs the command line ``target`` ("module:function", a function of no arguments that
    returns the exit code) as the console script ``prog``: the stop handlers go in before
    ``module`` is imported, and a stop that escapes it is one line on stderr and the exit
    code 128 + the signal. Returns the exit code."""
    _install()
    try:
        import importlib  # after the handlers: nothing before them but what they need

        module, _, function = target.partition(":")
        command = getattr(importlib.import_module(module), function)
        _raise_lost_stop()
        return int(command())
    except Terminated as t:  # before KeyboardInterrupt, which it is
        return _stopped(prog, f"terminated by {t}", 128 + t.signum)
    except KeyboardInterrupt:
        return _stopped(prog, "interrupted", 128 + signal.SIGINT)


def main() -> int:
    """Entry point of the ``mpo-rs`` console script; returns the exit code."""
    return console(PROG, "mpo_rs.cli:main")


if __name__ == "__main__":
    sys.exit(main())
