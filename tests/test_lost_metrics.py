"""Nothing lost (issue 54): whatever a kill or a power cut does to ``metrics.jsonl`` (its last row cut while the
round's checkpoint is intact, the file emptied, a complete run's last row cut), the same command ends with every
round's row, as the uninterrupted run wrote it; and the run dir's lock where the filesystem's flock is node-local (a
cluster's NFS ``nolock`` or Lustre ``localflock``): a fresh heartbeat from another host refuses a second run, a stale
one is taken over with a line that says so. Each fault is made on a real run's files and the real ``fedbench`` entry
point runs again (fedbench_here: in this process, as tests/test_faults.py)."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults import FAST, fedbench_here, one_line, snapshot, status

from fedbench.errors import RunDirBusy
from fedbench.runlock import HEARTBEAT_TIMEOUT_S, LOCK_NAME, RunDirLock, _process_start

ARGS = [*(a for a in FAST if not a.startswith("rounds=")), "rounds=4"]
ARGS += ["checkpoint.every=1", "checkpoint.keep=5", "checkpoint.keep_complete=5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A complete 4-round run with a checkpoint after rounds 1-3 kept: the reference, and the files a test damages."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    code, err = fedbench_here(*ARGS, f"hydra.run.dir={tmp / 'run'}", tmp_path=tmp)
    assert code == 0, err[-3000:]
    return tmp / "run"


def lines_by_round(run_dir: Path, named: Path | None = None) -> dict[int, list[str]]:
    """metrics.jsonl's lines (every one must parse), by round, in order (a picture's path in the run dir as if the dir
    were ``named``: the copy of a run names the files of its own dir)."""
    out: dict[int, list[str]] = {}
    text = (run_dir / "metrics.jsonl").read_text()
    for ln in (text.replace(str(run_dir), str(named)) if named else text).splitlines(keepends=True):
        out.setdefault(json.loads(ln)["round"], []).append(ln)
    return out


def untimed(line: str) -> dict:
    """A row without its wall-clock times (a round run again takes its own time; everything else is the same)."""
    return {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}


def assert_every_row_as_uninterrupted(run_dir: Path, reference: Path, t0: int) -> None:
    """Rounds <= t0 (from the checkpoint) byte for byte; later rounds (run again) equal but for their times; the
    same in metrics.csv, and the same summary."""
    got, want = lines_by_round(run_dir, named=reference), lines_by_round(reference)
    assert sorted(got) == sorted(want) == list(range(5))
    for t in want:
        if t <= t0:
            assert got[t] == want[t], t
        else:
            assert [untimed(ln) for ln in got[t]] == [untimed(ln) for ln in want[t]], t

    def table(d):
        with open(d / "metrics.csv") as f:
            return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in csv.DictReader(f)]

    assert table(run_dir) == table(reference) and len(table(run_dir)) == 5
    done = json.loads((run_dir / "summary.json").read_text())
    assert done["metrics"] == json.loads((reference / "summary.json").read_text())["metrics"]
    assert status(run_dir)["status"] == "complete"


def killed_after(reference: Path, tmp_path: Path, t0: int) -> Path:
    """A copy of the run as a kill right after round ``t0``'s checkpoint leaves it: no summary, no later checkpoint,
    status running, metrics.jsonl with the rows up to round t0 (as written: a power cut may lose them)."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    for f in ("summary.json", "model.pt", "metrics.csv"):
        (run_dir / f).unlink()
    for t in range(t0 + 1, 5):
        for suffix in (".pt", ".sha256"):
            (run_dir / "checkpoints" / f"round_{t:06d}{suffix}").unlink(missing_ok=True)
    (run_dir / "status.json").write_text(json.dumps({**status(reference), "status": "running", "round": t0}))
    rows = lines_by_round(reference)
    (run_dir / "metrics.jsonl").write_text("".join(ln for t in range(t0 + 1) for ln in rows[t]))
    return run_dir


def test_a_cut_last_row_whose_checkpoint_is_intact_is_written_again(tmp_path, uninterrupted):
    """kill -9 (or a power cut) after round 3: its checkpoint is on disk, its metrics row only half (issue 54 case 1:
    the resume moved the cut file aside and round 3 was never written again)."""
    run_dir = killed_after(uninterrupted, tmp_path, 3)
    text = (run_dir / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # round 3's, cut
    code, err = fedbench_here(*ARGS, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and "after round 3" in err, err[-3000:]
    assert_every_row_as_uninterrupted(run_dir, uninterrupted, 3)
    assert "rewritten from the checkpoint of round 3" in err
    torn = [f for f in run_dir.iterdir() if f.name.startswith("metrics.jsonl.torn-")]
    assert len(torn) == 1 and torn[0].read_text() == text[: len(text) - len(text.splitlines()[-1]) // 2 - 1]


def test_an_emptied_metrics_file_is_rewritten_from_the_checkpoint(tmp_path, uninterrupted):
    """metrics.jsonl empty after a kill (issue 54 case 2: the resume did not notice; rounds 0-2 were missing)."""
    run_dir = killed_after(uninterrupted, tmp_path, 2)
    (run_dir / "metrics.jsonl").write_text("")
    code, err = fedbench_here(*ARGS, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and "after round 2" in err, err[-3000:]
    assert_every_row_as_uninterrupted(run_dir, uninterrupted, 2)
    assert "lacked rows up to round 2" in err


def test_a_complete_run_whose_last_row_is_cut_is_run_again_not_skipped(tmp_path, uninterrupted):
    """A complete run whose last metrics row is cut (issue 54 case 3: 'already complete; skipped', exit 0, the row
    left broken). Its checkpoints are gone (keep_complete=0, the default): it runs again from the start."""
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    text = (run_dir / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text(text[: len(text) - 20])
    same = [a for a in ARGS if not a.startswith("checkpoint.keep_complete=")]
    code, err = fedbench_here(*same, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0, err[-3000:]
    assert "already complete" not in err and "is complete but its metrics.jsonl has a cut line" in err
    assert "from the start" in err
    assert_every_row_as_uninterrupted(run_dir, uninterrupted, -1)
    before = snapshot(run_dir)  # repaired: the next same command skips it and touches nothing
    code, err = fedbench_here(*same, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and "already complete; skipped" in err and snapshot(run_dir) == before


def test_a_complete_run_missing_a_row_runs_again_from_its_last_kept_checkpoint(tmp_path, uninterrupted):
    """A complete run whose round-4 row is lost (whole lines, none cut): the round without a row is found, and the
    run goes on from the newest checkpoint it kept (round 3), rounds 0-3 written back as they were."""
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    rows = lines_by_round(uninterrupted)
    (run_dir / "metrics.jsonl").write_text("".join(ln for t in range(4) for ln in rows[t]))
    code, err = fedbench_here(*ARGS, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and "has no row for round(s) 4" in err and "round_000003.pt" in err, err[-3000:]
    assert "after round 3" in err
    assert_every_row_as_uninterrupted(run_dir, uninterrupted, 3)


# ---- the run dir's lock where flock is node-local ---------------------------------------------------------------
def holder(host: str, age: float, pid: int = 4242, **extra) -> str:
    """A lock file's text as a holder writes it, its heartbeat ``age`` seconds old."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return json.dumps({"pid": pid, "host": host, "since": since, "heartbeat": time.time() - age, **extra})


def test_a_fresh_heartbeat_from_another_host_refuses_the_run_and_writes_nothing(tmp_path):
    """The lock file's flock is free (no process here holds it), but its holder on another node beat 10 s ago: the
    second run stops at once with one line naming the lock file and why, exit 1, the dir untouched."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_NAME).write_text(holder("node-b17", 10))
    before = snapshot(run_dir)
    start = time.time()
    code, err = fedbench_here(*ARGS, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    took = time.time() - start  # the process starts slowly on a loaded machine: the age it prints grows by as much
    line = one_line(err)
    assert code == 1 and str(run_dir / LOCK_NAME) in line, err
    age = re.search(r"heartbeat (\d+) s ago", line)
    assert age and 10 <= int(age[1]) <= 10 + took + 1, line
    assert "pid 4242 on host node-b17" in line and "nolock" in line
    assert snapshot(run_dir) == before


def test_a_stale_heartbeat_from_another_host_is_taken_over_with_a_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    age = HEARTBEAT_TIMEOUT_S + 30
    (run_dir / LOCK_NAME).write_text(holder("node-b17", age))
    code, err = fedbench_here(*ARGS, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and status(run_dir)["status"] == "complete", err[-3000:]
    assert f"took over the stale lock of {run_dir} (pid 4242 on host node-b17" in err
    said = re.search(rf"its heartbeat is (\d+) s old, over {HEARTBEAT_TIMEOUT_S:.0f} s\)", err)
    assert said and age <= int(said.group(1)) < age + 60, err  # (its age when the run got to the lock)
    assert not (run_dir / LOCK_NAME).exists()  # released at the end


def test_the_holder_keeps_its_heartbeat_fresh(tmp_path):
    """A holder's heartbeat is refreshed while it holds the lock: copied to a lock file whose flock is free (as on
    another node) well after the timeout, it still refuses a newcomer; once released, no more beats."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    lock = RunDirLock(a, timeout=1.0)  # a beat every 0.25 s
    lock.acquire()
    try:
        first = json.loads((a / LOCK_NAME).read_text())["heartbeat"]
        time.sleep(2.5)  # 2.5 timeouts
        seen = json.loads((a / LOCK_NAME).read_text())
        assert seen["heartbeat"] > first + 1.5 and seen["pid"] == os.getpid()
        (b / LOCK_NAME).write_text(json.dumps({**seen, "host": "node-b17"}))
        with pytest.raises(RunDirBusy, match="heartbeat [01] s ago"):
            RunDirLock(b, timeout=1.0).acquire()
    finally:
        lock.release()
    assert (b / LOCK_NAME).read_text().startswith(json.dumps({**seen, "host": "node-b17"}))  # refused: untouched


def test_a_live_process_of_this_host_with_a_fresh_heartbeat_refuses_and_a_reused_pid_does_not(tmp_path):
    """Where flock does not work at all, this host's live holder is known by its pid and its start time: a fresh
    heartbeat of a live process refuses; the same pid with another start time (a pid reused since) is taken over."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = _process_start(other.pid)
        if started is None:
            pytest.skip("no /proc here: a process's start time is unknown")
        here = socket.gethostname()
        (tmp_path / LOCK_NAME).write_text(holder(here, 5, pid=other.pid, pid_start=started))
        with pytest.raises(RunDirBusy, match=f"pid {other.pid} on host {here}"):
            RunDirLock(tmp_path).acquire()
        (tmp_path / LOCK_NAME).write_text(holder(here, 5, pid=other.pid, pid_start=started + 1))
        lock = RunDirLock(tmp_path)
        lock.acquire()
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        lock.release()
    finally:
        other.kill()
        other.wait()
