"""A run directory's files across the run's sessions, each always true: what a run leaves there and what a later
session of it does with them (one run at a time in the dir: :class:`~fedbench.runlock.RunDirLock`, fedbench/runlock.py).

* :class:`Status` — ``status.json``: ``running`` (with the round, the time and an ETA), ``complete`` (only once the
  summary is written), ``failed`` / ``diverged`` / ``preempted`` (with the reason), rewritten atomically;
  :func:`process_gone`: a ``running`` one whose process is dead.
* :func:`write_json` / :func:`atomic` (from :mod:`fedbench.files`, re-exported) — temporary file + rename: a reader
  never sees a half-written file, a failed write leaves no temporary file and raises
  :class:`~fedbench.errors.WriteFailed` naming the path and the cause (:func:`written`: the same for a file a library
  writes itself).
* :class:`RunDir` — the dir across a run's sessions (what :meth:`fedbench.run.Run.execute` does with it): a complete
  run skipped, another config's refused, old files archived (resume=false), a refused config's empty dir removed, a
  failure recorded, metrics.jsonl trimmed on resume; :func:`summary` is summary.json's content; :func:`follow` runs a
  rank > 0 of a distributed run in a private dir (rank 0 alone writes the run dir).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from . import provenance
from .errors import ConfigError, Diverged, RunDirBusy, RunFailed, WriteFailed, describe, signal_name  # noqa: F401
from .files import atomic, read_json, write_json, written  # noqa: F401  (re-exported: a run's file writes)
from .runlock import HEARTBEAT_TIMEOUT_S, LOCK_NAME, RunDirLock, timestamp  # noqa: F401  (re-exported: the lock)


class Status:
    """``status.json`` of a run: every change is written at once (atomically), so it always says what is true."""

    def __init__(self, run_dir: Path, **fields):
        self.path = Path(run_dir) / "status.json"
        self.data = {
            "status": "running",
            "round": 0,
            **fields,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "commit": provenance.commit(),  # the code and the machine that made it (the run's records keep them)
            "machine": provenance.machine(),
            "started": timestamp(),
        }
        self._t0 = time.time()
        self._r0: int | None = None

    def set(self, **fields) -> None:
        self.data.update(fields)
        self.data["updated"] = timestamp()
        try:
            write_json(self.path, self.data)
        except WriteFailed as e:  # a full disk has no room for the temporary copy: rewrite the file where it is
            if not self.overwrite_in_place():
                raise e from None

    def overwrite_in_place(self) -> bool:
        """status.json rewritten in its own blocks (a full disk: the last word of a failing run is still true).
        Not atomic: a reader that finds it cut rebuilds it from the run's files (:meth:`RunDir.previous`)."""
        text = json.dumps(self.data, default=str).encode()
        try:
            with open(self.path, "r+b") as f:
                if len(text) > max(os.fstat(f.fileno()).st_blksize, os.fstat(f.fileno()).st_size):
                    return False
                f.write(text)
                f.truncate()
                f.flush()
            return True
        except OSError:
            return False

    def progress(self, t: int, rounds: int) -> None:
        """Round ``t`` of ``rounds`` is done: the round, and an ETA from this session's pace."""
        if self._r0 is None:
            self.start_rounds(t - 1)
        per_round = (time.time() - self._t0) / max(t - self._r0, 1)
        left = per_round * (rounds - t)
        self.set(
            round=t,
            seconds_per_round=round(per_round, 3),
            eta_s=round(left),
            eta=timestamp(time.time() + left),
        )

    def start_rounds(self, t0: int) -> None:
        """The rounds start after round ``t0`` now (the ETA counts from here, setup excluded)."""
        self._r0, self._t0 = t0, time.time()


def is_interrupted_write(p: Path) -> bool:
    """``p`` is the temporary file of an :func:`atomic` write (``<name>.tmp<pid>``)."""
    return p.is_file() and p.name.rsplit(".tmp", 1)[-1].isdigit()


def process_gone(status: dict) -> str | None:
    """Why a ``running`` status.json is not true any more (its process, on this host, is dead: killed with -9, out of
    memory, the machine rebooted), or None. A run on another host is taken at its word (its pid means nothing here)."""
    if not isinstance(status, dict) or status.get("status") != "running" or status.get("host") != socket.gethostname():
        return None
    try:
        pid = int(status["pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return (
            f"its process (pid {pid} on {status['host']}) ended without saying how (killed?) after round "
            f"{status.get('round', 0)}; the same command resumes it from its last checkpoint"
        )
    except (KeyError, TypeError, ValueError, PermissionError):  # PermissionError: alive, another user's
        return None
    return None


# ---- the run directory's lifecycle (fedbench.run.Run.execute) ------------------------------------------------------
def check_writable(run_dir: Path, min_free_mb: float = 0) -> None:
    """Fail before training if the run dir cannot be written or its disk is (nearly) full."""
    import shutil

    probe = run_dir / ".write_probe"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as e:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
        raise ConfigError(
            "hydra.run.dir",
            str(run_dir),
            f"an existing or creatable, writable directory with free space ({e.strerror})",
        ) from None
    free = shutil.disk_usage(run_dir).free / 2**20
    if free < min_free_mb:
        raise ConfigError(
            "hydra.run.dir",
            str(run_dir),
            f"a disk with at least checkpoint.min_free_mb={min_free_mb:g} MB free (only {free:.0f} MB left)",
        )


def follow(run) -> dict:
    """A rank > 0's run (fedbench/distributed.py: rank 0 alone writes the run dir): what rank 0 says (skip it, or
    go), then the same setup and rounds in a private temporary dir, writing nothing of the run (no console, metrics,
    W&B, checkpoint, model); a failure is told to rank 0."""
    from omegaconf import OmegaConf

    from .distributed import RankFailed
    from .preemption import PreemptionGuard

    world = run.world
    kind, payload = world.receive()
    if kind == "skip":
        run.skipped = True
        return payload
    if kind != "go":
        raise RankFailed(f"rank 0 stopped: {payload}")
    world.said, run.skipped, quiet = 1, False, OmegaConf.to_container(run.cfg, resolve=True)
    quiet["logger"].update(console=False, jsonl=False, wandb={**quiet["logger"]["wandb"], "mode": "disabled"})
    quiet["checkpoint"].update(every=0, final_model=False, on_signal=False)
    run.cfg = OmegaConf.create(quiet)
    world.register()
    with tempfile.TemporaryDirectory(prefix=f"fedbench-rank{world.rank}-") as d:
        run.run_dir, run.rundir, run.provenance = Path(d), RunDir(d, run.cfg), {}
        try:
            with PreemptionGuard() as run.guard:
                return run._guarded()
        except BaseException as e:
            world.tell_failure(e)
            if world.said == 1 and world.receive()[0] == "stop":  # rank 0 stopped before the rounds too
                raise
            if world.said == 2 and (isinstance(e, (RankFailed, Diverged)) or world.leader_stopped(60)):
                raise  # every rank stopped at the same point (a sweep's next job finds them all)
            # this process alone stopped: it leaves the run (its launcher then stops rank 0, which records why), so that
            # no process waits at a collective the others never reach (a sweep's next job)
            print(f"fedbench: rank {world.rank}: {describe(e)}; this process leaves the run", file=sys.stderr)
            raise SystemExit(1) from e


class RunDir:
    """The directory of one run across its sessions: what an earlier session left there (skip a complete run, refuse
    another config's, archive on resume=false), a config refused before the run, how a failed run ended (status.json),
    the files of a fresh dir a bad config leaves behind, metrics.jsonl trimmed for a resumed run."""

    def __init__(self, path: Path, cfg, group: str | None = None):
        self.path, self.cfg, self.group = Path(path), cfg, group
        self.previous_status: dict = {}  # status.json of the session before (its W&B run id)

    @property
    def fingerprint(self) -> str:
        from .checkpoint import fingerprint

        return fingerprint(self.cfg)

    @contextmanager
    def locked(self):
        """Hold the dir's lock (:class:`RunDirLock`) for the body, which draws pictures only with ``logger.pictures``
        (:func:`fedbench.plots.drawing`); a fresh dir that :meth:`failures` found a bad config in goes once the lock is
        released."""
        from .plots import drawing

        self.fresh, self.remove = not self.path.is_dir() or not any(self.path.iterdir()), False
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            lock = RunDirLock(self.path)
            lock.acquire()
        except OSError as e:
            raise ConfigError(
                "hydra.run.dir", str(self.path), f"an existing or creatable, writable directory ({e.strerror})"
            ) from None
        try:
            with drawing(bool(self.cfg.logger.pictures)):  # the run's PNGs only with logger.pictures (none are results)
                yield
        finally:
            lock.release()
            if self.remove:
                try:
                    self.path.rmdir()
                except OSError:
                    pass

    @contextmanager
    def failures(self, record):
        """Any exception or signal in the body ends with ``record(e)`` (status.json says how the run ended) — but a
        bad config found in a fresh dir leaves no run dir behind (a sweep's job keeps it)."""
        try:
            yield
        except BaseException as e:
            self.remove = self.fresh and self.group is None and isinstance(e, ConfigError)
            if self.remove:
                self.remove_own_files()
            else:
                record(e)
            raise

    def start(self, status: Status, provenance: dict) -> None:
        """status.json ``running`` (the first write), then Hydra's files in .hydra/ (``hydra.output_subdir: null``)."""
        from omegaconf import OmegaConf

        status.set()
        for name, node in provenance.items():
            (self.path / ".hydra").mkdir(exist_ok=True)
            with atomic(self.path / ".hydra" / name) as f:
                f.write(OmegaConf.to_yaml(node))

    def write_inputs(self, data) -> Path | None:
        """partition_counts.csv, partition.png (returned; None if the run draws no pictures) and the resolved
        config.yaml."""
        import numpy as np
        from omegaconf import OmegaConf

        from .plots import heatmap

        with atomic(self.path / "partition_counts.csv") as f:
            np.savetxt(f, data.counts, fmt="%d", delimiter=",", header=",".join(data.classes), comments="")
        with written(self.path / "partition.png") as png:  # a full disk: one line naming the file
            png = heatmap(data.counts, png, f"partition: {self.cfg.partition.name}", "class", "client", cmap="Blues")
        with atomic(self.path / "config.yaml") as f:
            f.write(OmegaConf.to_yaml(self.cfg, resolve=True))
        return png

    def previous(self, owner: bool) -> dict | None:
        """What the run dir already holds: a complete run with this config is skipped (resume=true), a run with another
        config refused; as the dir's ``owner`` (under its lock) resume=false moves the old files to previous/<time>/.
        A status.json cut by a crash is rebuilt from the summary, the saved config and the checkpoint."""
        self.previous_status = {}
        if not self.path.is_dir():
            return None
        if owner:
            self.remove_interrupted_writes()
        old, problem = read_json(self.path / "status.json")
        if problem:
            if owner:
                print(
                    f"fedbench: {self.path}/status.json is unreadable ({problem}); rebuilding it from the run's files",
                    file=sys.stderr,
                )
            old = None
        old = old if isinstance(old, dict) else {}
        summary, _ = read_json(self.path / "summary.json")
        summary = summary if isinstance(summary, dict) else None
        if not self.cfg.resume:
            if owner and any(p.name not in (LOCK_NAME, "previous") for p in self.path.iterdir()):
                archive = self.path / "previous" / time.strftime("%Y%m%d-%H%M%S")
                archive.mkdir(parents=True, exist_ok=True)
                for p in list(self.path.iterdir()):
                    if p.name not in (LOCK_NAME, "previous"):
                        os.replace(p, archive / p.name)
                print(f"fedbench: resume=false: previous files of {self.path} moved to {archive}", file=sys.stderr)
            return None
        recorded = (  # config.yaml last: a torn one may still parse (the checkpoint's is checksummed)
            old.get("config_fingerprint")
            or (summary or {}).get("config_fingerprint")
            or self.checkpoint_fingerprint()
            or self.saved_fingerprint()
        )
        from .checkpoint import fingerprints

        if recorded is not None and recorded not in fingerprints(self.cfg):
            raise ConfigError(
                "resume",
                True,
                f"{self.path} holds a run with a different config; use another "
                "hydra.run.dir, or resume=false to start over there (old files are kept in previous/)",
            )
        complete = old.get("status") == "complete" or (
            problem is not None and (summary or {}).get("status") == "complete"
        )
        damage = self.metrics_damage() if complete and summary is not None else None
        if complete and summary is not None and damage is None:
            print(f"fedbench: {self.path} is already complete; skipped (resume=false starts it over)", file=sys.stderr)
            return summary
        if damage and owner:  # its rows after the last checkpoint are nowhere else: they are computed again
            from .checkpoint import directory

            saved = sorted(directory(self.path).glob("round_*.pt"))
            start = f"from its checkpoint {saved[-1].name}" if saved else "from the start (no checkpoint kept)"
            print(
                f"fedbench: {self.path} is complete but its metrics.jsonl {damage}; running it again {start} to "
                "rewrite every row (the same results)",
                file=sys.stderr,
            )
        self.previous_status = old
        return None

    def remove_interrupted_writes(self) -> None:
        """The temporary files of writes a killed run left (``<name>.tmp<pid>``, :func:`atomic`): never read, so they
        go once this run owns the dir (no other fedbench process writes here while it holds the lock)."""
        from .checkpoint import directory

        for d in (self.path, directory(self.path)):
            for p in d.glob("*.tmp*"):
                if is_interrupted_write(p):
                    p.unlink(missing_ok=True)

    def finish_complete(self) -> None:
        """A skipped complete run whose process was killed right after status.json said ``complete`` (before it pruned
        its checkpoints and wrote its round table, or in the middle of a write): what it left undone, under the dir's
        lock (not at all while another process holds it), so that a complete run's dir is the same however it ended."""
        from .checkpoint import directory, prune
        from .console import round_table
        from .plots import drawing

        keep = int(self.cfg.checkpoint.keep_complete)
        tables = [self.path / "metrics.csv", *([self.path / "curves.png"] if self.cfg.logger.pictures else [])]
        stray = [p for d in (self.path, directory(self.path)) for p in d.glob("*.tmp*") if is_interrupted_write(p)]
        if len(list(directory(self.path).glob("round_*.pt"))) <= keep and all(p.exists() for p in tables) and not stray:
            return
        try:
            with RunDirLock(self.path):
                self.remove_interrupted_writes()
                prune(self.path, keep)
                if not all(p.exists() for p in tables):
                    with drawing(bool(self.cfg.logger.pictures)):
                        round_table(self.path)
        except RunDirBusy:
            return
        except Exception as e:  # a convenience: the complete run's record is its summary and metrics.jsonl
            print(f"fedbench: could not finish {self.path}: {describe(e)}", file=sys.stderr)

    def checkpoint_fingerprint(self) -> str | None:
        """The config fingerprint in the newest intact checkpoint (for a run whose status.json is gone or torn)."""
        from .checkpoint import load_latest

        try:
            saved = load_latest(self.path, "cpu", warn=lambda msg: None)
        except Exception:
            return None
        return (saved or {}).get("config_fingerprint")

    def saved_fingerprint(self) -> str | None:
        """The fingerprint of the run dir's resolved config.yaml (for a run whose status.json is gone)."""
        from omegaconf import OmegaConf

        from .checkpoint import fingerprint

        try:
            return fingerprint(OmegaConf.load(self.path / "config.yaml"))
        except Exception:
            return None

    def refused(self, e: ConfigError) -> None:
        """A config refused before the run began: the empty dir Hydra made for it goes (a sweep's job keeps it, with
        status.json saying why, for the sweep's summary and report: an empty dir would read as "pending"); rank 0's
        alone in a run of several processes (fedbench/distributed.py)."""
        from .distributed import is_follower

        if is_follower():
            return
        try:
            if not self.path.is_dir() or any(self.path.iterdir()):
                return
            if self.group is None:
                self.path.rmdir()
            else:
                Status(self.path).set(status="failed", error=describe(e))
        except OSError:  # the config error is what the caller reports
            pass

    def record_failure(self, e: BaseException, status: Status | None, boundary: dict | None, loggers) -> None:
        """status.json says how the run ended (and a signal saves the last finished round, ``boundary``, first)."""
        from . import checkpoint as ckpt
        from .preemption import Preempted

        state = "preempted" if isinstance(e, Preempted) else "diverged" if isinstance(e, Diverged) else "failed"
        try:
            if isinstance(e, Preempted) and boundary is not None:
                e.checkpoint = ckpt.save(
                    self.path, boundary["round"], boundary["state"], keep=int(self.cfg.checkpoint.keep)
                )
            if status is not None:
                status.set(status=state, error=describe(e))
        except Exception as again:  # e.g. the disk is full: say so, the original error is reported by the caller
            print(f"fedbench: could not record the failure in {self.path}: {describe(again)}", file=sys.stderr)
        if loggers is not None:
            try:
                loggers.finish(state)
            except Exception:
                pass
        if state == "failed" and not isinstance(e, (ConfigError, RunFailed, OSError, Preempted)):
            import traceback

            try:  # an unexpected error: its traceback is kept for a bug report (the console gets one line)
                (self.path / "traceback.txt").write_text("".join(traceback.format_exception(e)))
                e.traceback_file = self.path / "traceback.txt"
            except OSError:
                pass

    def record_complete(self, summary: dict, status: Status, guard) -> None:
        """summary.json, then status.json ``complete``: the result is recorded whole (a signal waits until it is)."""
        with guard.deferred():
            _fsync(self.path / "metrics.jsonl")  # on disk before the run says complete (a power cut, fedbench.loggers)
            write_json(self.path / "summary.json", summary)
            status.set(status="complete", round=int(self.cfg.rounds), eta_s=0)
        if guard.received:
            print(
                f"fedbench: {signal_name(guard.received)} received while finishing; {self.path} is complete",
                file=sys.stderr,
            )

    def remove_own_files(self) -> None:
        """Everything this run wrote in its (fresh) dir, but the lock file (released last)."""
        import shutil

        for p in self.path.iterdir():
            if p.name != LOCK_NAME:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    def restore_metrics(self, t0: int, lines: list[str] | None) -> None:
        """metrics.jsonl as it was when the checkpoint of round ``t0`` was written: ``lines``, the checkpoint's copy of
        every line since the run began, written back atomically and fsynced (rounds after ``t0`` are logged again by
        this session). Its rows never come from the file, which a crash may have cut, emptied or lost (a power cut
        may keep a checkpoint, fsynced, and lose the metrics lines written before it, never fsynced); a file that
        lacked a row or held a cut line is kept next to it. A checkpoint without the lines (written before fedbench
        kept them) trims the file (:meth:`trim_metrics`)."""
        if lines is None:
            return self.trim_metrics(t0)
        path, text = self.path / "metrics.jsonl", "".join(lines)
        old = path.read_text(errors="replace") if path.exists() else ""
        if not self.cfg.logger.jsonl and not old:  # (logger.jsonl=false now and then: no file to restore)
            return
        lacked = not old.startswith(text)
        what = f"lacked rows up to round {t0}" if lacked else "ended with a cut line (a crash while writing)"
        self._rewrite_metrics(text, old, (lacked or _cut_line(old[len(text) :])) and what, f"round {t0}")

    def trim_metrics(self, t0: int) -> None:
        """metrics.jsonl keeps the rows of rounds <= t0: later ones are logged again by this session, so every round
        appears once. A line cut by a kill or a full disk is dropped, and the file as it was kept next to it."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return
        old = path.read_text(errors="replace")
        keep = "".join(ln + "\n" for ln in old.splitlines() if (row := _row(ln)) and row["round"] <= t0)
        self._rewrite_metrics(keep, old, _cut_line(old) and "ended with a cut line (a crash while writing)")

    def _rewrite_metrics(self, text: str, old: str, damage: str | bool, source: str = "") -> None:
        """metrics.jsonl becomes ``text`` (atomically, fsynced); with ``damage`` (what was wrong with it) a line says
        so and the file as it was, ``old``, is kept as ``metrics.jsonl.torn-<time>``."""
        path = self.path / "metrics.jsonl"
        if damage:
            kept = ""
            if old.strip():
                copy_path = path.with_name(f"metrics.jsonl.torn-{time.strftime('%Y%m%d-%H%M%S')}")
                with atomic(copy_path) as f:
                    f.write(old)
                kept = f", the file as it was is kept as {copy_path.name}"
            how = f"rewritten from the checkpoint of {source}" if source else "dropped it"
            print(f"fedbench: {path} {damage}; {how}{kept}", file=sys.stderr)
        with atomic(path) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def metrics_damage(self) -> str | None:
        """What a complete run's metrics.jsonl lacks (a cut line, a round without its row), or None."""
        if not self.cfg.logger.jsonl:
            return None
        path = self.path / "metrics.jsonl"
        text = path.read_text(errors="replace") if path.exists() else None
        if text is None or _cut_line(text):
            return "is missing" if text is None else "has a cut line"
        rows = [row for ln in text.splitlines() if (row := _row(ln))]
        logged = {row["round"] for row in rows if not any(k.startswith("image/") for k in row)}  # (a picture's row)
        missing = sorted(set(range(int(self.cfg.rounds) + 1)) - logged)
        return f"has no row for round(s) {', '.join(map(str, missing))}" if missing else None


def _fsync(path: Path) -> None:
    """What was written to ``path`` (by any process, through any descriptor) is on disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _row(line: str) -> dict | None:
    """A line of metrics.jsonl as its row (a JSON object with an integer round), or None (blank, cut, not a row)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("round"), int) else None


def _cut_line(text: str) -> bool:
    """``text`` (lines of metrics.jsonl) holds a line that is not JSON (cut by a crash while it was written)."""
    return any(ln.strip() and _row(ln) is None for ln in text.splitlines())


def summary(run) -> dict:
    """summary.json of a complete run: its metrics summarized (best / last / final), round times, the evaluator's last
    result, what the algorithm and the new clients add (their ``finish`` / ``summary`` write their artefacts)."""
    import math

    import numpy as np

    from .communication import totals
    from .evaluation import summarize

    cfg, times = run.cfg, run.times
    return {
        "status": "complete",
        "rounds": int(cfg.rounds),
        "config_fingerprint": run.rundir.fingerprint,
        "metrics": summarize(run.history, int(cfg.eval.final_window)),
        "time_per_round": float(np.mean(times)) if times else math.nan,
        "wall_time": float(np.sum(times)),
        "final": {k: v for k, v in run.evaluator.last.items()},
        "communication": totals(run.history),  # MB up, down and both over the run (fedbench/communication.py)
        **run.algorithm.finish(run.run_dir),
        **(run.new_clients.summary(run.run_dir) if run.new_clients else {}),
    }
