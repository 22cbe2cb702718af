"""Atomic output files: write to a temporary file beside the target, then rename.

A failed or interrupted run never leaves a half-written model, weight file or report.

>>> with atomic_write("out.txt", "w") as f:  # doctest: +SKIP
...     f.write("done")
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb"):
    """Open a temp file beside `path` for writing; rename it onto `path` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes(path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_write(path, "wb") as f:
        f.write(data)


def write_text(path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_write(path, "w") as f:
        f.write(text)
