"""Output files: written whole or not at all, with the permissions a plain write would give.

Each file goes to a temporary file beside its target, then is renamed onto it, so a failed or
interrupted run never leaves a half-written model, weight file or report. An output that cannot
be written (a directory, a missing or read-only parent, a full disk, a name too long) is one
`OutputError` naming the path, raised before anything is written where it can be known then.

>>> with atomic_write("out.txt", "w") as f:  # doctest: +SKIP
...     f.write("done")
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from tftpu.errors import OutputError, UsageError

_UMASK: list[int] = []


def umask() -> int:
    """The process umask (read once; from /proc where it can be read without changing it)."""
    if not _UMASK:
        value = None
        with contextlib.suppress(OSError, ValueError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("Umask:"):
                    value = int(line.split()[1], 8)
        if value is None:
            value = os.umask(0o022)
            os.umask(value)
        _UMASK.append(value)
    return _UMASK[0]


def _reason(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on the device"
    if e.errno == errno.EROFS:
        return "read-only file system"
    if e.errno == errno.ENAMETOOLONG:
        return "file name too long"
    return e.strerror or str(e)


def check_writable(*paths) -> None:
    """Refuse outputs that cannot be files before anything is written: a path that is not a
    str or os.PathLike, an existing directory or other non-regular file (a device would be
    replaced by the rename), a parent that is a file, a name longer than the file system allows."""
    for given in paths:
        if not isinstance(given, (str, os.PathLike)) or not str(given):
            raise UsageError(f"output path {given!r}: expected a file path")
    for p in map(Path, paths):
        if len(os.fsencode(p.name)) > 255:
            raise OutputError(p, "file name too long")
        try:
            if p.is_dir():
                raise OutputError(p, "is a directory")
            if p.exists() and not p.is_file():
                raise OutputError(p, "is not a regular file (a device, fifo or socket): it would be replaced")
            parent = next((q for q in p.parents if q.exists()), None)
        except OSError as e:
            raise OutputError(p, _reason(e)) from None
        if parent is not None and not parent.is_dir():
            raise OutputError(p, f"{parent} is not a directory")


_WRITE_ERRORS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO, errno.EACCES, errno.EPERM,
                 errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR, errno.EFBIG, errno.ENOENT}


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb", encoding: str | None = None):
    """Open a temp file beside `path` for writing; rename it onto `path` only on success."""
    check_writable(path)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OutputError(path, _reason(e)) from None
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in _WRITE_ERRORS:
            raise OutputError(path, _reason(e)) from None
        raise


def temp_dir_beside(path) -> Path:
    """A new empty directory beside the directory output `path`, to be renamed onto it once
    complete; OutputError naming `path` where none can be made (a read-only or missing parent,
    a parent that is a file, a name too long)."""
    path = Path(path)
    if len(os.fsencode(path.name)) > 255:
        raise OutputError(path, "file name too long")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=path.parent))
    except OSError as e:
        raise OutputError(path, _reason(e)) from None


def write_bytes(path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_write(path, "wb") as f:
        f.write(data)


def write_text(path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)
