"""Reading `.npz` array archives (and, where a caller allows it, a lone `.npy`) without pickle.

Every way a file can be wrong (missing, a directory, not a zip, truncated, object arrays) becomes
one `ModelFileError` line naming the file, so tools can exit 2 without a traceback.

>>> arrays = load_npz("inputs.npz")                  # doctest: +SKIP
>>> arrays = load_npz("x.npy", allow_npy=True)       # {"x": array}  # doctest: +SKIP
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from tftpu.errors import ModelFileError

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _check_header(f, stored: int, member: str, path: Path) -> None:
    """Refuse an array whose header claims more data than the file holds, or more than memory,
    before numpy allocates it."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f, max_header_size=100_000)
    claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    where = f"array {member!r}" if member else "the array"
    if claimed > _memory_bytes():
        raise ModelFileError(path, f"{where} claims shape {tuple(shape)} ({claimed:,} bytes), more than this "
                                   f"machine's memory")
    if claimed > stored - f.tell():
        raise ModelFileError(path, f"{where} claims shape {tuple(shape)} ({claimed:,} bytes) but the file holds "
                                   f"{max(0, stored - f.tell()):,} (truncated or corrupt)")


def _check_headers(path: Path, npy: bool) -> None:
    if npy:
        with open(path, "rb") as f:
            _check_header(f, path.stat().st_size, "", path)
        return
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".npy"):
                with zf.open(info) as f:
                    _check_header(f, info.file_size, info.filename[:-4], path)


def load_npz(path, allow_npy: bool = False) -> dict[str, np.ndarray]:
    """All arrays of `.npz` file `path`, in archive order; with `allow_npy`, a single `.npy` file
    gives `{stem: array}`. Raises ModelFileError naming the file and what is wrong."""
    path = Path(path)
    kind = ".npz/.npy file" if allow_npy else ".npz archive"
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_NPY_MAGIC))
        if magic.startswith(_NPY_MAGIC):
            if not allow_npy:
                raise ModelFileError(path, "not an .npz archive (a single .npy array)")
            _check_headers(path, npy=True)
            return {path.stem: np.load(path, allow_pickle=False)}
        if magic[:4] not in _ZIP_MAGIC:
            raise ModelFileError(path, f"not an {kind} (not a zip archive)")
        _check_headers(path, npy=False)
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except ModelFileError:
        raise
    except FileNotFoundError:
        raise ModelFileError(path, "no such file") from None
    except IsADirectoryError:
        raise ModelFileError(path, f"is a directory, not an {kind}") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, SyntaxError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelFileError(path, f"not a readable {kind} ({reason})") from None
