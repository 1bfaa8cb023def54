"""SIGTERM/SIGINT: save a checkpoint and exit cleanly; a second signal exits at once."""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager


class Preempted(BaseException):
    """Raised in the main thread at the first SIGTERM/SIGINT (a BaseException, like KeyboardInterrupt)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class PreemptionGuard:
    """While active, the first signal raises :class:`Preempted`; the second terminates immediately."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self._old = {}
        self._deferred = False

    def _handler(self, signum, frame):
        if self.received is not None:
            print(f"fedbench: second {signal.Signals(signum).name}: exiting now without saving", file=sys.stderr, flush=True)
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

    def __enter__(self):
        for s in self.SIGNALS:
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread (e.g. some launchers): no handler, periodic checkpoints still apply
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False
