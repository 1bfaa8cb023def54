"""SIGTERM/SIGINT/SIGUSR2: save a checkpoint and exit cleanly; a second signal exits at once.

SIGUSR2 is SLURM's advance warning of a time limit or preemption (``sbatch --signal=USR2@90``; submitit's
default). Once the run is saved, :func:`hand_over` passes the signal on to the handler that was installed before
fedbench's — submitit's requeues the job, and the requeued job resumes from the saved round.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager


class Preempted(BaseException):
    """Raised in the main thread at the first SIGTERM/SIGINT/SIGUSR2 (a BaseException, like KeyboardInterrupt)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class PreemptionGuard:
    """While active, the first signal raises :class:`Preempted`; the second terminates immediately."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)

    def __init__(self):
        self.received: int | None = None
        self._old = {}
        self._deferred = False
        self._unraisablehook = None

    def _handler(self, signum, frame):
        if self.received is not None:
            print(
                f"fedbench: second {signal.Signals(signum).name}: exiting now without saving",
                file=sys.stderr,
                flush=True,
            )
            os._exit(128 + signum)
        self.received = signum
        if not self._deferred:
            raise Preempted(signum)

    def check(self) -> None:
        """Raise :class:`Preempted` if a signal came (its exception may have been swallowed by library code that
        was running when it arrived, e.g. a ``__del__`` or a broad ``except``)."""
        if self.received is not None:
            raise Preempted(self.received)

    @contextmanager
    def deferred(self):
        """A short section that must not be cut (recording the result): a signal is noted and handled after it."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False

    def _unraisable(self, u) -> None:
        """A signal that landed in a ``__del__`` or weakref callback: Python cannot raise there and would print a
        traceback ("Exception ignored in ..."); the signal is noted and :meth:`check` raises it, so stay quiet."""
        if not isinstance(u.exc_value, Preempted):
            self._unraisablehook(u)

    def __enter__(self):
        self._unraisablehook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        for s in self.SIGNALS:
            try:
                self._old[s] = signal.signal(s, self._handler)
            except (
                ValueError
            ):  # not the main thread (e.g. some launchers): no handler, periodic checkpoints still apply
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        sys.unraisablehook = self._unraisablehook
        return False


def hand_over(signum: int) -> None:
    """After a preempted run is saved (its guard exited, the previous handlers back): call the Python handler that
    was there before fedbench's, if any — submitit's USR2 handler requeues the job and exits. Python's own SIGINT
    handler (KeyboardInterrupt) and the default/ignore dispositions are left alone."""
    h = signal.getsignal(signum)
    if callable(h) and h is not signal.default_int_handler:
        h(signum, None)
