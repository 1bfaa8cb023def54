#!/usr/bin/env python
"""Runs that outlive a GPU window: what a device call brings back of its runs, and how the unfinished ones travel to
the next call (README "On a GPU", "Runs longer than one window").

A device call returns only the files under its ``$OUT``: at most 8, each at most 16 MiB, 64 MiB together (the device
tool's limits). ``scripts/device_claims.py`` writes two kinds of archive there, after each finished job and at its end:

    claims.tar.gz       the runs under ``--work`` without their checkpoints: the finished ones are recorded from it
    checkpoints.tar.NNN every unfinished run the call touched (preempted, failed, killed, or still running), as one
                        ``<scale>-<paper>-<hash>.tar.gz`` each — its run dir with the newest intact checkpoint, without
                        pictures, older checkpoints, the lock or cut writes (all fedbench needs to resume it exactly) —
                        in one tar cut into parts that fit the files and bytes the other files leave. The runs with
                        the most compute in them go first; one that does not fit is named in report.txt with its size.

Here, between calls, one command takes what came back (the folder the device tool copied ``$OUT`` to):

    python scripts/device_pack.py unpack FROM [--store .device-runs] [--finished outputs]

It extracts claims.tar.gz into ``outputs/claims`` (then ``fedbench-claims record PAPER --scale S --runs
outputs/claims``, as before), puts each run's archive into ``.device-runs/`` (replacing the older one of that run),
removes from there the runs that have finished, and checks that the tree the next call carries (``.whl``,
``.device-data``, ``.device-runs`` and the working tree) stays within the 64 MiB the device tool takes. The next call
carries ``.device-runs`` and ``device_claims.py --carried .device-runs`` extracts the archives into its ``--work``
before planning, so each run resumes in its own run dir, from its checkpoint, bit for bit: a run dir is named after
its overrides alone, and neither its files nor its checkpoint depend on where it lies (the config fingerprint leaves
out hydra.* and the data and cache roots). The archives, not the run dirs, travel: run dirs' names have ``=``, ``+``
and ``,``, which the device tool may not copy.

    python scripts/device_pack.py size RUN_DIR...   # what each run would take packed, in MiB
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from fedbench.checkpoint import _sha256, directory  # noqa: E402
from fedbench.claims.runner import OUTCOMES  # noqa: E402
from fedbench.rundir import LOCK_NAME, is_interrupted_write  # noqa: E402

MiB = 2**20
FILES, FILE_BYTES, TOTAL_BYTES = 8, 16 * MiB, 64 * MiB  # what the device tool brings back from $OUT
MARGIN = MiB  # for what report.txt and console.txt still get after the last pack
PARTS = "checkpoints.tar"  # its parts: checkpoints.tar.000, .001, ... (concatenated: one tar)
TAR_END = 22 * 512  # the most a tar adds after its members: two end blocks, then padding to a 10 KiB record


def pack_finished(root: Path, archive: Path) -> None:
    """``claims.tar.gz``: the runs under ``root`` without their checkpoints (rewritten whole each time)."""
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(root, arcname="claims", filter=lambda ti: None if ti.name.endswith((".pt", ".ckpt")) else ti)
    tmp.replace(archive)


def statuses(runs: Path) -> dict[Path, bytes]:
    """Each run dir under ``runs`` (``<scale>/<paper>/<run dir>``) and its status.json as it is now."""
    out = {}
    for f in sorted(runs.glob("*/*/*/status.json")):
        try:
            out[f.parent] = f.read_bytes()
        except OSError:
            pass
    return out


def unfinished(runs: Path, before: dict[Path, bytes]) -> list[Path]:
    """The run dirs under ``runs`` whose status.json changed since ``before`` (this call made or resumed them) and
    says they are not finished (no outcome: preempted, failed, running, or cut)."""
    out = []
    for d, text in statuses(runs).items():
        if before.get(d) == text:
            continue
        try:
            status = json.loads(text).get("status")
        except ValueError:
            status = None
        if status not in OUTCOMES:
            out.append(d)
    return out


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint whose checksum holds (the one fedbench resumes from)."""
    for path in sorted(directory(run_dir).glob("round_*.pt"), reverse=True):
        side = path.with_suffix(".sha256")
        try:
            if side.read_text().strip() == _sha256(path):
                return path
        except OSError:  # pruned while we looked: an older one, or a newer one next time
            continue
    return None


def round_of(checkpoint: Path) -> int:
    return int(checkpoint.stem.split("_")[1])


def run_files(run_dir: Path, checkpoint: Path) -> list[Path]:
    """What a run needs to resume: its dir but pictures, the lock, cut writes, previous/ and the other checkpoints."""
    keep = {checkpoint, checkpoint.with_suffix(".sha256")}
    out = []
    for f in sorted(run_dir.rglob("*")):
        rel = f.relative_to(run_dir)
        if not f.is_file() or f.suffix == ".png" or f.name == LOCK_NAME or is_interrupted_write(f):
            continue
        if rel.parts[0] == "previous" or (rel.parts[0] == "checkpoints" and f not in keep):
            continue
        out.append(f)
    return out


def archive_name(rel: str) -> str:
    """The name a run's archive travels under: letters, digits, ``-`` and ``.`` only (``rel``: claims/<scale>/
    <paper>/<run dir>)."""
    _, scale, paper, _ = rel.split("/")
    return f"{scale}-{paper}-{hashlib.sha1(rel.encode()).hexdigest()[:12]}.tar.gz"


def archive(run_dir: Path, rel: str, limit: float = float("inf")) -> tuple[bytes | None, int, int] | None:
    """(the run's files as a .tar.gz under ``rel``, its checkpoint's round, their bytes before compression); the
    archive is None, not made, when those bytes are over ``limit``. None without a checkpoint past round 0 (nothing to
    keep) or when its files changed under us (the next pack takes it)."""
    try:  # a checkpoint over the limit on its own is not even read (CAFeMe's: 864 MiB)
        newest = max(directory(run_dir).glob("round_*.pt"), default=None)
        if newest is not None and round_of(newest) > 0 and newest.stat().st_size > limit:
            return None, round_of(newest), newest.stat().st_size
    except OSError:
        return None
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None or round_of(checkpoint) == 0:
        return None
    buf = io.BytesIO()
    try:
        files = run_files(run_dir, checkpoint)
        raw = sum(f.stat().st_size for f in files)
        if raw > limit:
            return None, round_of(checkpoint), raw
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:  # checkpoints barely compress
            for f in files:
                tar.add(f, arcname=f"{rel}/{f.relative_to(run_dir).as_posix()}", recursive=False)
    except OSError:
        return None
    return buf.getvalue(), round_of(checkpoint), raw


_made: dict[Path, tuple] = {}  # run dir -> (what it was made from, its archive): a pack after each job redoes none


def run_archive(run_dir: Path, work: Path, limit: float = float("inf")) -> tuple[str, bytes | None, int, int] | None:
    """(its archive's name, :func:`archive`) of a run dir under ``work``, made again only when the run moved on."""
    rel = run_dir.relative_to(work).as_posix()
    try:
        key = (limit, (run_dir / "status.json").read_bytes(), (run_dir / "metrics.jsonl").stat().st_size)
    except OSError:
        key = None
    if key is None or _made.get(run_dir, (None,))[0] != key:
        got = archive(run_dir, rel, limit)
        _made[run_dir] = (key, None if got is None else (archive_name(rel), *got))
    return _made[run_dir][1]


def compute_seconds(run_dir: Path, upto: int) -> float:
    """The seconds of training and evaluation (``time/*``) a run's metrics.jsonl logs up to round ``upto``."""
    total = 0.0
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("round", 0) <= upto:
            total += sum(v for k, v in row.items() if k.startswith("time/") and isinstance(v, (int, float)))
    return total


def room(root: Path, skip: list[Path]) -> tuple[int, int]:
    """(files, bytes) the checkpoint parts may take under ``root`` beside the files there (but those under ``skip``
    and the parts themselves), within the device tool's limits and ``MARGIN``."""
    others = [
        f
        for f in root.rglob("*")
        if f.is_file() and not f.name.startswith(PARTS + ".") and not any(f.is_relative_to(s) for s in skip)
    ]
    files = FILES - len(others)
    left = TOTAL_BYTES - MARGIN - sum(f.stat().st_size for f in others)
    return max(files, 0), max(min(left, files * FILE_BYTES), 0)


def padded(n: int) -> int:
    return 512 + -(-n // 512) * 512  # a member's header and its data in whole blocks


def pack_checkpoints(run_dirs: list[Path], work: Path, out: Path, root: Path, skip: list[Path] = ()) -> list[str]:
    """Write the runs' archives as ``out/checkpoints.tar.NNN`` within the room ``root`` leaves (:func:`room`), the
    runs with the most compute first; the lines for report.txt: what was packed, and each run left out, with its size
    and why. Parts of an earlier pack that this one does not need are removed."""
    files, cap = room(root, [*skip, work])
    made = []
    for d in run_dirs:
        got = run_archive(d, work, limit=2 * cap)  # (gzip never halves a checkpoint: FedKA's 3.36 MiB -> 3.09)
        if got is not None:
            made.append((compute_seconds(d, got[2]), d, *got))
    made.sort(key=lambda m: -m[0])
    bundle, used, lines, packed = io.BytesIO(), TAR_END, [], []
    with tarfile.open(fileobj=bundle, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for seconds, d, name, data, t, raw in made:
            size = f"{len(data) / MiB:.1f} MiB" if data is not None else f"{raw / MiB:.1f} MiB before compression"
            what = f"{d.relative_to(work).as_posix()} (round {t}, {size})"
            if data is None or padded(len(data)) + TAR_END > cap:
                lines.append(
                    f"checkpoint not brought back: {what}: more than the {cap / MiB:.1f} MiB the other files leave of "
                    f"the {FILES} files of {FILE_BYTES // MiB} MiB, {TOTAL_BYTES // MiB} MiB together, a device call "
                    f"returns ({files} file(s) free)"
                )
            elif used + padded(len(data)) > cap:
                lines.append(
                    f"checkpoint not brought back: {what}: no room left after {len(packed)} run(s) with more compute "
                    f"({(cap - used) / MiB:.1f} of {cap / MiB:.1f} MiB left)"
                )
            else:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                used += padded(len(data))
                packed.append(what)
    data = bundle.getvalue() if packed else b""
    parts = [data[i : i + FILE_BYTES] for i in range(0, len(data), FILE_BYTES)]
    assert len(parts) <= files and len(data) <= cap, (len(parts), files, len(data), cap)
    out.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(parts):
        tmp = work / f".{PARTS}.{i:03d}.tmp"
        tmp.write_bytes(part)
        tmp.replace(out / f"{PARTS}.{i:03d}")
    for old in out.glob(f"{PARTS}.*"):
        if not old.name[len(PARTS) + 1 :].isdigit() or int(old.name[len(PARTS) + 1 :]) >= len(parts):
            old.unlink()
    if packed:
        lines.insert(
            0,
            f"checkpoints: {len(packed)} unfinished run(s) in {len(parts)} file(s) {PARTS}.NNN "
            f"({len(data) / MiB:.1f} MiB): {'; '.join(packed)}",
        )
    return lines


def read_parts(parts: list[Path]) -> bytes:
    """The parts of one pack, in order, as one tar (a missing part is an error, not a shorter archive)."""
    numbers = sorted(int(p.name[len(PARTS) + 1 :]) for p in parts)
    if numbers != list(range(len(numbers))):
        raise SystemExit(f"device_pack: the parts {PARTS}.NNN are {numbers}, not 0..{len(numbers) - 1}: one is missing")
    by_number = {int(p.name[len(PARTS) + 1 :]): p for p in parts}
    return b"".join(by_number[i].read_bytes() for i in range(len(numbers)))


def run_dir_of(archive: tarfile.TarFile) -> str:
    """The one run dir (claims/<scale>/<paper>/<run dir>) every member of a run's archive lies in."""
    tops = {"/".join(n.split("/")[:4]) for n in archive.getnames()}
    if len(tops) != 1 or not all(len(t.split("/")) == 4 and t.startswith("claims/") for t in tops):
        raise SystemExit(f"device_pack: a run archive holds {sorted(tops)[:3]}, not one claims/<scale>/<paper>/<run>")
    return tops.pop()


def unpack(src: Path, store: Path, finished: Path) -> list[str]:
    """What a device call brought back (under ``src``): claims.tar.gz into ``finished``, each run's archive into
    ``store`` (checked whole first), and the runs finished now out of ``store``; the lines to print."""
    lines = []
    for claims in sorted(src.rglob("claims.tar.gz")):
        with tarfile.open(claims) as tar:
            tar.extractall(finished, filter="data")
        lines.append(f"{claims.relative_to(src)}: finished runs into {finished / 'claims'}")
    parts = sorted(src.rglob(f"{PARTS}.*"))
    if len({p.parent for p in parts}) > 1:
        raise SystemExit(f"device_pack: parts of {PARTS} in several folders: {sorted({str(p.parent) for p in parts})}")
    store.mkdir(parents=True, exist_ok=True)
    if parts:
        with tarfile.open(fileobj=io.BytesIO(read_parts(parts))) as outer:
            for member in outer.getmembers():
                data = outer.extractfile(member).read()
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as run:
                    rel = run_dir_of(run)
                    for m in run.getmembers():  # every byte read: a cut or corrupted archive fails here
                        if m.isfile():
                            run.extractfile(m).read()
                if member.name != archive_name(rel):
                    raise SystemExit(f"device_pack: {member.name} holds {rel}, whose archive is {archive_name(rel)}")
                tmp = store / f".{member.name}.tmp"
                tmp.write_bytes(data)
                tmp.replace(store / member.name)
                lines.append(f"{store / member.name}: {rel} ({len(data) / MiB:.1f} MiB)")
    for status in sorted((finished / "claims").glob("*/*/*/status.json")):
        try:
            done = json.loads(status.read_text()).get("status") in OUTCOMES
        except (OSError, ValueError):
            continue
        kept = store / archive_name(status.parent.relative_to(finished).as_posix())
        if done and kept.exists():
            kept.unlink()
            lines.append(f"{kept}: removed, the run has finished ({status.parent.relative_to(finished)})")
    return lines


def carry_in(store: Path, work: Path) -> list[str]:
    """On the device: each run archive in ``store`` extracted into ``work`` (so ``work/claims/...``), unless that
    run dir is there already (a warm machine's own copy is at least as new)."""
    lines = []
    for a in sorted(store.glob("*.tar.gz")):
        with tarfile.open(a) as tar:
            rel = run_dir_of(tar)
            if (work / rel).exists():
                lines.append(f"carried {a.name}: {rel} is here already; kept")
                continue
            tar.extractall(work, filter="data")
        lines.append(f"carried {a.name}: {rel}")
    return lines


def travel(store: Path, limit_mib: float | None = None) -> tuple[str, bool]:
    """What the next call would carry (the working tree, ``.whl``, ``.device-data`` and ``store``) against the device
    tool's limit (scripts/device_kit.py, 2 MiB kept for what the tree gains meanwhile): the line, and whether it is
    over."""
    from device_kit import LIMIT_MIB, travel_mib

    limit = LIMIT_MIB if limit_mib is None else limit_mib
    store = store.resolve()
    name = store.relative_to(REPO).as_posix() if store.is_relative_to(REPO) else str(store)  # carry names it so
    carried = [p for p in (".whl", ".device-data", name) if (REPO / p).exists()]
    mib = travel_mib(carried)
    if mib <= limit - 2:
        return f"{mib:.1f} MiB would travel with carry {json.dumps(carried)} (limit {limit:g} MiB)", False
    big = sorted(store.glob("*.tar.gz"), key=lambda p: -p.stat().st_size)
    return (
        f"device_pack: {mib:.1f} MiB would travel with carry {json.dumps(carried)}, over the {limit:g} MiB the device "
        f"tool carries (2 MiB kept): the next call cannot carry every run; move some of {store}'s archives aside "
        f"(the largest: {', '.join(f'{p.name} {p.stat().st_size / MiB:.1f} MiB' for p in big[:3])})",
        True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("unpack", help="what a device call brought back: finished runs out, unfinished ones kept")
    u.add_argument("src", type=Path, help="the folder the device tool copied $OUT's files to")
    u.add_argument("--store", type=Path, default=Path(".device-runs"), help="the unfinished runs' archives (carried)")
    u.add_argument("--finished", type=Path, default=Path("outputs"), help="claims.tar.gz goes to FINISHED/claims")
    s = sub.add_parser("size", help="MiB each run dir would take packed")
    s.add_argument("run_dirs", type=Path, nargs="+")
    args = ap.parse_args()
    if args.cmd == "size":
        for d in args.run_dirs:
            got = archive(d, d.name)
            print(
                f"{d}: "
                + (
                    f"{len(got[0]) / MiB:.2f} MiB packed, {got[2] / MiB:.2f} MiB before (round {got[1]})"
                    if got
                    else "no checkpoint past round 0"
                )
            )
        return 0
    if not args.src.is_dir():
        print(f"device_pack: src {args.src} is not a folder (the device tool's files_at)", file=sys.stderr)
        return 2
    for line in unpack(args.src, args.store, args.finished):
        print(line)
    line, over = travel(args.store)
    print(line, file=sys.stderr if over else sys.stdout)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
