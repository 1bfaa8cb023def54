"""No machine path in what the project commits (the developers' rule: write ../shared/data or $FEDBENCH_DATA, never
/work/..., /tmp/...): the documents, and the GPU reports committed as they came back (docs/results/gpu/; the device
scripts write this machine's paths as $OUT, $FEDBENCH_DATA, <repo>, <tmp>, ~: scripts/gpu_report.py)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# an absolute path under a machine's own folders; not a relative one (../tmp/x), nor a URL's path (host/home/...)
MACHINE_PATH = re.compile(r"(?<![\w.$<>~/-])/(?:root|tmp|work|home)/[^\s\"',:;)]*")


def machine_paths_in(text: str) -> list[str]:
    return MACHINE_PATH.findall(text)


def test_the_pattern_finds_absolute_machine_paths_only():
    text = "out /root/out; data: /tmp/tmp.k0P/x, from /work/main\nrun ~/x <repo>/y $OUT/z ../tmp/a https://h.io/home/b"
    assert machine_paths_in(text) == ["/root/out", "/tmp/tmp.k0P/x", "/work/main"]
    assert machine_paths_in("/home/ann/data") == ["/home/ann/data"]


def test_no_machine_path_in_the_docs_or_the_gpu_reports():
    files = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*") if p.is_file())]
    assert any(p.match("docs/results/gpu/*/report.txt") for p in files)  # the reports are among them
    found = []
    for p in files:
        data = p.read_bytes()
        if b"\0" in data:  # a picture
            continue
        found += [f"{p.relative_to(REPO)}: {m}" for m in machine_paths_in(data.decode(errors="replace"))]
    assert not found, "\n".join(found)
