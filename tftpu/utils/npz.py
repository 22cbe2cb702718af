"""Reading `.npz` array archives (and, where a caller allows it, a lone `.npy`) without pickle.

Every way a file can be wrong (missing, a directory, not a zip, truncated, object arrays) becomes
one `ModelFileError` line naming the file, so tools can exit 2 without a traceback.

>>> arrays = load_npz("inputs.npz")                  # doctest: +SKIP
>>> arrays = load_npz("x.npy", allow_npy=True)       # {"x": array}  # doctest: +SKIP
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from tftpu.errors import ModelFileError

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"


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
            return {path.stem: np.load(path, allow_pickle=False)}
        if magic[:4] not in _ZIP_MAGIC:
            raise ModelFileError(path, f"not an {kind} (not a zip archive)")
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except ModelFileError:
        raise
    except FileNotFoundError:
        raise ModelFileError(path, "no such file") from None
    except IsADirectoryError:
        raise ModelFileError(path, f"is a directory, not an {kind}") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelFileError(path, f"not a readable {kind} ({reason})") from None
