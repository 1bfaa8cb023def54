"""Writing files so that a crash or a full disk never leaves a cut file behind: :func:`atomic` (tmp + rename),
:func:`written` (for a library that writes the file itself), JSON. Everything that writes a run's files uses these."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

from .errors import WriteFailed


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
