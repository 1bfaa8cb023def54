"""Runs that outlive a GPU window (scripts/device_pack.py with scripts/device_claims.py): a run preempted at the end of
one device call comes back as its checkpoint, within what the device tool returns, is kept here, and the next call —
on a fresh machine, in another directory — resumes it to the metrics an uninterrupted run logs."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from test_gpu_check import SCRIPTS, _module

REPO = SCRIPTS.parent
ROUNDS = 8  # FedKA's smoke scale at 8 rounds instead of 1: a run preempted after round 2 has rounds left to resume


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    """conf/ (FEDBENCH_CONF) with FedKA's smoke scale at ``ROUNDS`` rounds; everything else as committed."""
    d = tmp_path_factory.mktemp("conf") / "conf"
    shutil.copytree(REPO / "conf", d)
    f = d / "claims" / "fedka.yaml"
    old = "overrides: [dataset=digits, model=mlp, rounds=1, batch_size=32]"
    assert f.read_text().count(old) == 1, "FedKA's smoke scale changed: update this test's copy"
    f.write_text(f.read_text().replace(old, old.replace("rounds=1", f"rounds={ROUNDS}")))
    return d


def device_claims(out: Path, work: Path, *more: str) -> list[str]:
    """A device call as README "On a GPU" writes it: device_run.sh around device_claims.py, its --out below $OUT."""
    cmd = ["bash", str(SCRIPTS / "device_run.sh"), "--out", str(out), "--", "python", "scripts/device_claims.py"]
    return cmd + ["--scale", "smoke", "fedka:table1", "--seeds", "0", "--parallel", "2", "--out", str(out / "dc"),
                  "--work", str(work), "checkpoint.every=1", *more]  # fmt: skip


def rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without what differs between two identical runs: times, and where a picture lies."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
        out.append({k: Path(v).name if k.startswith("image/") else v for k, v in row.items()})
    return out


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def test_a_run_preempted_in_one_window_resumes_in_the_next_from_what_came_back(conf, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "FEDBENCH_CONF": str(conf), "FEDBENCH_DATA": str(tmp_path)}
    # an uninterrupted window, beside window 1 (its metrics are the ones to match)
    out3, work3 = tmp_path / "ref" / "out", tmp_path / "ref" / "work"
    ref = subprocess.Popen(device_claims(out3, work3, "--budget", "600"), env=env, stdout=subprocess.DEVNULL)
    # window 1: stopped (SIGTERM to device_claims, the budget's own path) once a run has 2 rounds behind it
    out1, work1 = tmp_path / "w1" / "out", tmp_path / "w1" / "work"
    first = device_claims(out1, work1, "--budget", "600", "--carried", str(tmp_path / ".device-runs"))  # none yet
    proc = subprocess.Popen(first, env=env, stdout=subprocess.DEVNULL)
    sweep1 = work1 / "claims" / "smoke" / "fedka"
    for _ in range(3000):
        if any(json.loads(f.read_text() or "{}").get("round", 0) >= 2 for f in sweep1.glob("*/status.json")):
            break
        time.sleep(0.05)
    script = subprocess.run(
        ["pgrep", "-f", r"^\S*python\S* scripts/device_claims.py .*" + str(out1)], capture_output=True, text=True
    )
    os.kill(int(script.stdout.split()[0]), signal.SIGTERM)
    assert proc.wait(timeout=300) == 0
    report = (out1 / "dc" / "report.txt").read_text()
    stopped = {d.name: status(d)["round"] for d in sweep1.iterdir() if d.is_dir()}
    assert {status(sweep1 / d)["status"] for d in stopped} == {"preempted"} and max(stopped.values()) >= 2, report
    assert all(r < ROUNDS for r in stopped.values())
    packed = {d for d, r in stopped.items() if r > 0}  # a run stopped in round 1 has nothing to keep
    assert f"checkpoints: {len(packed)} unfinished run(s) in 1 file(s)" in report, report
    assert "--carried $FEDBENCH_DATA/.device-runs: no such folder, no runs carried" in report  # tmp_path: placeholder
    files = [f for f in out1.rglob("*") if f.is_file()]
    assert len(files) <= 8 and all(f.stat().st_size <= 16 * 2**20 for f in files)
    assert {f.name for f in files} >= {"console.txt", "report.txt", "claims.tar.gz", "checkpoints.tar.000"}

    # here: what the device tool copied back, unpacked; the runs kept where the next call's carry takes them
    back, here = tmp_path / "back1", tmp_path / "here"
    shutil.copytree(out1, back)
    unpack = [sys.executable, str(SCRIPTS / "device_pack.py"), "unpack"]
    store, finished = here / ".device-runs", here / "outputs"
    p = subprocess.run([*unpack, str(back), "--store", str(store), "--finished", str(finished)], capture_output=True,
                       text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert p.returncode == 0 and "MiB would travel with carry" in p.stdout, p.stdout + p.stderr
    assert len(list(store.glob("smoke-fedka-*.tar.gz"))) == len(packed)

    # window 2: a fresh machine (nothing of window 1 but the carried archives), another absolute path
    out2, work2 = tmp_path / "elsewhere" / "w2" / "out", tmp_path / "elsewhere" / "w2" / "work"
    shutil.rmtree(tmp_path / "w1")
    p = subprocess.run(device_claims(out2, work2, "--budget", "600", "--carried", str(store)), env=env,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    console = (out2 / "dc" / "console.txt").read_text()
    assert p.returncode == 0, console[-3000:]
    sweep2 = work2 / "claims" / "smoke" / "fedka"
    assert (out2 / "dc" / "report.txt").read_text().count("device_claims: carried smoke-fedka-") == len(packed)
    for name in stopped:
        assert status(sweep2 / name)["status"] == "complete"
        where = f"$FEDBENCH_DATA/{(sweep2 / name).relative_to(tmp_path)}"  # tmp_path as its placeholder
        resumed = f"fedbench: resuming {where} after round {stopped[name]}"
        assert (resumed in console) == (name in packed), (name, stopped, console[-3000:])

    # the uninterrupted window's metrics, row by row
    assert ref.wait(timeout=600) == 0
    sweep3 = work3 / "claims" / "smoke" / "fedka"
    for name in stopped:
        assert rows(sweep2 / name) == rows(sweep3 / name) and len(rows(sweep3 / name)) >= ROUNDS + 1, name

    # what window 2 brought back: the finished runs for the records, none left to carry
    shutil.copytree(out2, tmp_path / "back2")
    assert not list((out2 / "dc").glob("checkpoints.tar.*"))
    p = subprocess.run([*unpack, str(tmp_path / "back2"), "--store", str(store), "--finished", str(finished)],
                       capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert p.returncode == 0 and not list(store.glob("*.tar.gz")), p.stdout + p.stderr
    assert {status(finished / "claims" / "smoke" / "fedka" / n)["status"] for n in stopped} == {"complete"}


def fake_run(root: Path, name: str, state: str, round_: int, ckpt_bytes: int, seconds: float) -> Path:
    """A run dir as fedbench leaves it: status.json, metrics.jsonl (``seconds`` of compute over its rounds), a picture,
    and its two newest checkpoints with their checksums (random, so incompressible, bytes)."""
    d = root / "claims" / "smoke" / "fedka" / name
    (d / "checkpoints").mkdir(parents=True)
    (d / "status.json").write_text(json.dumps({"status": state, "round": round_}))
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps({"round": t, "time/round": seconds / round_}) + "\n" for t in range(1, round_ + 1))
    )
    (d / "curves.png").write_bytes(os.urandom(5000))
    (d / ".fedbench.lock").write_text("{}")
    for t in (round_ - 1, round_):
        data = os.urandom(ckpt_bytes)
        (d / "checkpoints" / f"round_{t:06d}.pt").write_bytes(data)
        (d / "checkpoints" / f"round_{t:06d}.sha256").write_text(hashlib.sha256(data).hexdigest())
    return d


def test_the_packer_splits_to_the_limits_names_what_cannot_fit_and_reassembles(tmp_path, monkeypatch):
    """With 6 files of 64 KiB, 256 KiB in all (3 files taken by others: 3 parts of 64 KiB left): the unfinished runs
    this call touched, the most compute first, split over as many parts as they need; a run larger than the room is
    named with its size, one that no longer fits after the others too; a finished run and an untouched one are not
    packed; what unpacks is each run's files byte for byte, without pictures, the lock or the older checkpoint; a
    missing part is refused."""
    dp = _module("device_pack")
    KiB = 1024
    monkeypatch.setattr(dp, "FILES", 6)
    monkeypatch.setattr(dp, "FILE_BYTES", 64 * KiB)
    monkeypatch.setattr(dp, "TOTAL_BYTES", 256 * KiB)
    monkeypatch.setattr(dp, "MARGIN", 4 * KiB)
    work, out = tmp_path / "work", tmp_path / "out"
    untouched = fake_run(work, "untouched", "preempted", 3, 10 * KiB, 9.0)
    before = dp.statuses(work / "claims")
    a = fake_run(work, "a", "preempted", 5, 70 * KiB, 30.0)  # 70 KiB: more than one part on its own
    b = fake_run(work, "b", "failed", 4, 90 * KiB, 50.0)  # the most compute: first
    fake_run(work, "c", "preempted", 4, 300 * KiB, 80.0)  # larger than all the room there is
    fake_run(work, "g", "preempted", 3, 420 * KiB, 90.0)  # over twice the room: not even compressed
    fake_run(work, "e", "preempted", 2, 40 * KiB, 20.0)  # the least compute: no room left after a and b
    fake_run(work, "done", "complete", 6, 10 * KiB, 60.0)
    (untouched / "status.json").write_text((untouched / "status.json").read_text())  # rewritten, the same
    out.mkdir()
    for name, size in (("report.txt", 3 * KiB), ("console.txt", 20 * KiB), ("smi.csv", 11 * KiB)):
        (out / name).write_bytes(os.urandom(size))
    todo = dp.unfinished(work / "claims", before)
    assert sorted(d.name for d in todo) == ["a", "b", "c", "e", "g"]  # not the complete run, not the untouched one
    lines = dp.pack_checkpoints(todo, work, out, out)
    files = [f for f in out.iterdir() if f.is_file()]
    parts = sorted(out.glob("checkpoints.tar.*"))
    assert [p.name for p in parts] == ["checkpoints.tar.000", "checkpoints.tar.001", "checkpoints.tar.002"], lines
    assert len(files) <= 6 and all(f.stat().st_size <= 64 * KiB for f in files)
    assert sum(f.stat().st_size for f in files) <= 256 * KiB - 4 * KiB
    assert lines[0].startswith("checkpoints: 2 unfinished run(s) in 3 file(s)"), lines
    assert lines[0].index("claims/smoke/fedka/b (round 4") < lines[0].index("claims/smoke/fedka/a (round 5")
    too_big = next(x for x in lines if "/c (round 4" in x)
    assert too_big.startswith("checkpoint not brought back") and "0.3 MiB): more than the 0.2 MiB" in too_big
    no_room = next(x for x in lines if "/e (round 2" in x)
    assert "no room left after 2 run(s) with more compute" in no_room, lines
    not_made = next(x for x in lines if "/g (round 3" in x)
    assert "(round 3, 0.4 MiB before compression): more than the 0.2 MiB" in not_made and len(lines) == 4, lines

    store, finished = tmp_path / "store", tmp_path / "outputs"
    dp.unpack(out, store, finished)
    for run in (a, b):
        with tarfile.open(store / dp.archive_name(run.relative_to(work).as_posix())) as tar:
            tar.extractall(tmp_path / "x", filter="data")
        got = tmp_path / "x" / run.relative_to(work)
        kept = sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file())
        t = status(run)["round"]
        assert kept == [f"checkpoints/round_{t:06d}.pt", f"checkpoints/round_{t:06d}.sha256", "metrics.jsonl",
                        "status.json"]  # fmt: skip
        assert all((got / k).read_bytes() == (run / k).read_bytes() for k in kept)
    assert len(list(store.iterdir())) == 2

    parts[1].unlink()  # a part the device tool did not bring back
    with pytest.raises(SystemExit, match=r"the parts checkpoints.tar.NNN are \[0, 2\], not 0..1"):
        dp.unpack(out, tmp_path / "store2", finished)

    data = os.urandom(20 * KiB)  # run a moves on to round 6: packed anew, from its new checkpoint
    (a / "checkpoints" / "round_000006.pt").write_bytes(data)
    (a / "checkpoints" / "round_000006.sha256").write_text(hashlib.sha256(data).hexdigest())
    (a / "status.json").write_text(json.dumps({"status": "preempted", "round": 6}))
    lines = dp.pack_checkpoints([a], work, out, out)
    assert lines[0].startswith("checkpoints: 1 unfinished run(s) in 1 file(s)") and "/a (round 6, 0.0 MiB)" in lines[0]
    lines = dp.pack_checkpoints([], work, out, out)  # nothing left unfinished: no parts left behind
    assert lines == [] and not list(out.glob("checkpoints.tar.*"))


def test_the_travelling_tree_is_measured_and_an_over_full_store_refused(tmp_path):
    """The unpack's last word: the MiB the next call would carry, or, over the limit, the largest runs to set aside."""
    dp = _module("device_pack")
    store = tmp_path / ".device-runs"
    store.mkdir()
    (store / "smoke-fedka-aaaaaaaaaaaa.tar.gz").write_bytes(os.urandom(3 * 2**20))
    (store / "smoke-fedka-bbbbbbbbbbbb.tar.gz").write_bytes(os.urandom(2**20))
    kit = _module("device_kit")
    kit_paths = [p for p in (".whl", ".device-data") if (REPO / p).exists()]  # carried too, when this checkout has them
    line, _ = dp.travel(store)
    mib = float(line.split()[0])
    assert line == f"{mib:.1f} MiB would travel with carry {json.dumps([*kit_paths, str(store)])} (limit 64 MiB)"
    assert 3.9 <= mib - kit.travel_mib(kit_paths) <= 4.1  # the store's 4 MiB (other files may change meanwhile)
    line, over = dp.travel(store, limit_mib=mib + 2.5)
    assert not over and line.startswith(f"{mib:.1f} MiB would travel")
    line, over = dp.travel(store, limit_mib=mib + 1.5)
    assert over and "(the largest: smoke-fedka-aaaaaaaaaaaa.tar.gz 3.0 MiB, smoke-fedka-bbbb" in line, line


@pytest.mark.slow
def test_from_plan_makes_the_plans_first_look_runs_in_its_order(tmp_path):
    """`device_claims --from-plan`: the jobs are the runs `fedbench-claims plan` plans for the first look, in its
    order (FedKA's tune seeds 5-7 before the judged seeds, only the tuned row's chosen value there), not every run the
    experiment lacks seed by seed. From the committed records alone (no run dir, no data)."""
    from fedbench.claims import committed_records
    from fedbench.claims.plan import plan_paper
    from fedbench.claims.spec import load

    dc = _module("device_claims")
    work = tmp_path / "work" / "claims"
    jobs, _ = dc.plan(["fedka:tuned"], "paper", work, None, [], from_plan=True)
    everything, _ = dc.plan(["fedka:tuned"], "paper", work, None, [])
    planned = [r for p in plan_paper(load("fedka"), "paper", committed_records("fedka")) for r in p.runs]
    arm = "experiment/fedka/arm@_global_"
    labels = [f"{arm}={dict(r.key).get(arm)} seed={dict(r.key)['seed']}" for r in planned if r.look == 1]
    tuned = {job[2] for job in everything}  # a run another claim's experiment plans is the same run when shared
    assert [job[2] for job in jobs] == [x for x in dict.fromkeys(labels) if x in tuned]
    assert len(jobs) < len(everything)
    assert [job[2].rsplit("=", 1)[1] for job in jobs[:15]] == ["5"] * 5 + ["6"] * 5 + ["7"] * 5
    assert everything[0][2].endswith("seed=0")  # the seed-by-seed order it replaces
