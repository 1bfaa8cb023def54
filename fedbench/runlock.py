"""One run at a time in a run directory, also across a cluster's nodes: :class:`RunDirLock`.

An exclusive ``fcntl.flock`` on ``<run dir>/.fedbench.lock`` (which names its holder: pid, host, start time, and a
heartbeat it refreshes) for the whole run. The kernel drops the lock when its process dies, however it dies, so the lock
file a killed run leaves behind is stale and taken over (with a message naming the dead holder); a live holder makes a
second run stop at once with one line naming the directory and the holder — also where the flock is node-local (a
cluster's shared filesystem): its fresh heartbeat refuses the second run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from .errors import RunDirBusy

LOCK_NAME = ".fedbench.lock"


HEARTBEAT_TIMEOUT_S = 120.0  # a lock whose holder's heartbeat is older is stale (the holder beats every 30 s)
LOCK_SIZE = 512  # the lock file's fixed size: a heartbeat rewrites it in place (no truncation a reader could see)


def timestamp(t: float | None = None) -> str:
    """Local time ``t`` (now by default) as a run dir's files write it: ISO 8601 with the UTC offset."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux's /proc), None where unknown; -1 if it is gone or a
    zombie (ended, not yet reaped)."""
    if not Path("/proc/self/stat").exists():
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return -1
    except (OSError, IndexError):
        return None
    return -1 if fields[0] in ("Z", "X") else int(fields[19])


def _alive_here(holder: dict) -> bool:
    """The lock's holder names a live process of this host other than this one (the same pid reused by another
    process since does not count: its start time differs)."""
    try:
        pid = int(holder["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    if pid == os.getpid():
        return False
    started = _process_start(pid)
    if started is None:  # no /proc: signal 0 says whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return started != -1 and holder.get("pid_start") in (None, started)


class RunDirLock:
    """Exclusive lock of a run directory for the whole run (see the module docstring), with a heartbeat.

    The kernel's ``flock`` is the lock where it works. On a cluster's shared filesystem it may be node-local (NFS
    mounted ``nolock``, Lustre ``localflock``): two jobs on two nodes both get it. So the holder also rewrites the
    lock file every ``timeout / 4`` s from a background thread (``heartbeat``: its clock, fsynced so that other nodes
    read it), and a newcomer that gets the flock still refuses while the file names another host (or another live
    process of this one) whose heartbeat is younger than ``timeout`` (:data:`HEARTBEAT_TIMEOUT_S`); an older one is
    stale and taken over, with a line that says so."""

    def __init__(self, run_dir: Path, timeout: float = HEARTBEAT_TIMEOUT_S):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.timeout = float(timeout)
        self.fd: int | None = None
        self._stop, self._mutex = threading.Event(), threading.Lock()  # the heartbeat's thread and the fd
        self._me: dict = {}

    def _holder(self, text: str) -> str:
        h = self._parse(text)
        return f"pid {h['pid']} on host {h['host']}, since {h['since']}" if h else "holder unknown"

    @staticmethod
    def _parse(text: str) -> dict | None:
        try:
            h = json.loads(text)
            return h if isinstance(h, dict) and {"pid", "host", "since"} <= set(h) else None
        except ValueError:
            return None

    def _read(self, fd: int) -> str:
        """The lock file's text; a few tries while it is empty or cut (its holder is writing it right now)."""
        text = ""
        for _ in range(20):
            text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            if self._parse(text):
                break
            time.sleep(0.05)
        return text

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    text = self._read(fd)
                    os.close(fd)
                    raise RunDirBusy(
                        f"{self.run_dir} is in use by another fedbench run ({self._holder(text)}); "
                        "wait for it to end, or choose another hydra.run.dir"
                    ) from None
                print(  # no flock here at all (ENOLCK): the heartbeat alone keeps a second run out
                    f"fedbench: warning: cannot flock {self.path} ({e.strerror}); only its heartbeat keeps another run "
                    "out",
                    file=sys.stderr,
                )
                break
            try:  # a previous holder may have removed the file between our open and our lock: lock the new one
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        old = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if old:  # a holder the flock does not show: gone (the kernel dropped its lock), or on another node
            self._take_over(fd, old if self._parse(old) else self._read(fd))
        self._me = {"pid": os.getpid(), "host": socket.gethostname(), "since": timestamp()}
        self._me["pid_start"] = _process_start(os.getpid())
        os.ftruncate(fd, 0)
        self.fd = fd
        self._beat()
        self._stop.clear()
        threading.Thread(target=self._beating, name="fedbench-lock-heartbeat", daemon=True).start()

    def _take_over(self, fd: int, old: str) -> None:
        """Refuse (closing ``fd``) if the old holder lives, by its heartbeat; else say that its stale lock is taken."""
        h = self._parse(old) or {}
        age = time.time() - h["heartbeat"] if isinstance(h.get("heartbeat"), (int, float)) else None
        here = h.get("host") == socket.gethostname()
        if age is not None and age < self.timeout and (not here or _alive_here(h)):
            os.close(fd)
            raise RunDirBusy(
                f"{self.path} names a live fedbench run ({self._holder(old)}, heartbeat {max(age, 0):.0f} s ago) "
                f"whose lock this host cannot see (a shared filesystem with node-local locks: NFS nolock, Lustre "
                f"localflock); wait for it to end (a dead one's lock is taken over once its heartbeat is "
                f"{self.timeout:.0f} s old), or choose another hydra.run.dir"
            )
        why = "that run is gone"
        if not here and age is not None:
            why = f"its heartbeat is {age:.0f} s old, over {self.timeout:.0f} s"
        print(f"fedbench: took over the stale lock of {self.run_dir} ({self._holder(old)}; {why})", file=sys.stderr)

    def _beat(self) -> None:
        """The holder's name and heartbeat, rewritten in place (a fixed size) and fsynced."""
        text = json.dumps({**self._me, "heartbeat": round(time.time(), 3)}).encode().ljust(LOCK_SIZE)
        with self._mutex:
            try:
                if self.fd is not None:
                    os.pwrite(self.fd, text, 0)
                    os.fsync(self.fd)
            except OSError:  # (a full disk has room for it: the file keeps its size)
                pass

    def _beating(self) -> None:
        while not self._stop.wait(self.timeout / 4):
            self._beat()

    def release(self) -> None:
        self._stop.set()
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it (see acquire for the other side)
        except OSError:
            pass
        with self._mutex:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False
