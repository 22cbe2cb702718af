"""Weight files: `.npz` archives written deterministically (sorted keys, fixed zip timestamps).

`save_npz` gives byte-identical files for the same arrays, unlike `np.savez`, whose zip entries
carry the current time. `load_npz` never unpickles.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

from tftpu.utils import npz as _npz
from tftpu.utils.files import atomic_write

_EPOCH = (1980, 1, 1, 0, 0, 0)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The `.npz` archive of `arrays` (keys sorted, timestamps fixed, stored uncompressed)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            one = io.BytesIO()
            np.lib.format.write_array(one, np.asarray(arrays[key], order="C"), allow_pickle=False)
            zf.writestr(info, one.getvalue())
    return buf.getvalue()


def save_npz(path, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to `path` atomically and deterministically."""
    data = npz_bytes(arrays)
    with atomic_write(path, "wb") as f:
        f.write(data)


def load_npz(path) -> dict[str, np.ndarray]:
    """Read every array of an `.npz` (or a single `.npy`); ModelFileError if it is not one.
    bfloat16 arrays (which numpy writes as 2-byte voids, `<V2`) come back as bfloat16."""
    arrays = _npz.load_npz(path, allow_npy=True)
    for key, arr in arrays.items():
        if arr.dtype == np.dtype("V2"):
            import ml_dtypes
            arrays[key] = arr.view(ml_dtypes.bfloat16)
    return arrays
