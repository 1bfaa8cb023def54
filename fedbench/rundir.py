"""A run directory's guard: one run at a time (a lock), a ``status.json`` that is always true, atomic writes.

* :class:`RunDirLock` — an exclusive ``fcntl.flock`` on ``<run dir>/.fedbench.lock`` (which names its holder: pid,
  host, start time) for the whole run. The kernel drops the lock when its process dies, however it dies, so the lock
  file a killed run leaves behind is stale and taken over (with a message naming the dead holder); a live holder
  makes a second run stop at once with one line naming the directory and the holder.
* :class:`Status` — ``status.json``: ``running`` (with the round, the time and an ETA), ``complete`` (only once the
  summary is written), ``failed`` / ``diverged`` / ``preempted`` (with the reason), rewritten atomically.
* :func:`write_json` / :func:`atomic` — temporary file + rename: a reader never sees a half-written file, a failed
  write leaves no temporary file and raises :class:`~fedbench.errors.WriteFailed` naming the path and the cause
  (:func:`written`: the same for a file a library writes itself).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import RunDirBusy, WriteFailed

LOCK_NAME = ".fedbench.lock"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@contextmanager
def atomic(path: Path, mode: str = "w"):
    """Open a temporary file next to ``path`` for writing; on success it replaces ``path`` atomically, on any
    failure it is removed (an OSError becomes :class:`WriteFailed` naming ``path``)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            yield f
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise WriteFailed(path, e) from None
        raise


@contextmanager
def written(path: Path):
    """For a library that writes ``path`` itself (matplotlib, NumPy): an OSError removes the cut file and becomes
    :class:`WriteFailed` naming ``path`` (their own errors do not always name it)."""
    try:
        yield path
    except OSError as e:
        Path(path).unlink(missing_ok=True)
        raise WriteFailed(path, e) from None


def write_json(path: Path, obj) -> None:
    """Atomic JSON write (tmp + rename)."""
    text = json.dumps(obj, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    with atomic(path) as f:
        f.write(text)


def read_json(path: Path) -> tuple[object | None, str | None]:
    """(content, None), (None, None) if absent, or (None, why) if it cannot be read (e.g. a torn write)."""
    try:
        return json.loads(Path(path).read_text()), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"


class RunDirLock:
    """Exclusive lock of a run directory for the whole run (see the module docstring)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.fd: int | None = None

    def _holder(self, text: str) -> str:
        try:
            h = json.loads(text)
            return f"pid {h['pid']} on host {h['host']}, since {h['since']}"
        except (ValueError, KeyError, TypeError):
            return "holder unknown"

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                text = ""
                for _ in range(20):   # the holder writes its name right after taking the lock
                    text = os.pread(fd, 4096, 0).decode(errors="replace")
                    if text:
                        break
                    time.sleep(0.05)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunDirBusy(f"{self.run_dir} is in use by another fedbench run ({self._holder(text)}); "
                                     "wait for it to end, or choose another hydra.run.dir") from None
                print(f"fedbench: warning: cannot lock {self.run_dir} ({e.strerror}); make sure no other run uses it",
                      file=sys.stderr)
                self.fd = None
                return
            try:   # a previous holder may have removed the file between our open and our lock: lock the new one
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        old = os.pread(fd, 4096, 0).decode(errors="replace")
        if old.strip():   # its holder died without releasing it (the kernel dropped the lock itself)
            print(f"fedbench: took over the stale lock of {self.run_dir} ({self._holder(old)}; that run is gone)",
                  file=sys.stderr)
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, me, 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)   # while still holding it (see acquire for the other side)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


class Status:
    """``status.json`` of a run: every change is written at once (atomically), so it always says what is true."""

    def __init__(self, run_dir: Path, **fields):
        self.path = Path(run_dir) / "status.json"
        self.data = {"status": "running", "round": 0, **fields, "pid": os.getpid(), "host": socket.gethostname(),
                     "started": _now()}
        self._t0 = time.time()
        self._r0: int | None = None

    def set(self, **fields) -> None:
        self.data.update(fields)
        self.data["updated"] = _now()
        write_json(self.path, self.data)

    def progress(self, t: int, rounds: int) -> None:
        """Round ``t`` of ``rounds`` is done: the round, and an ETA from this session's pace."""
        if self._r0 is None:
            self.start_rounds(t - 1)
        per_round = (time.time() - self._t0) / max(t - self._r0, 1)
        left = per_round * (rounds - t)
        self.set(round=t, seconds_per_round=round(per_round, 3), eta_s=round(left),
                 eta=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() + left)))

    def start_rounds(self, t0: int) -> None:
        """The rounds start after round ``t0`` now (the ETA counts from here, setup excluded)."""
        self._r0, self._t0 = t0, time.time()
