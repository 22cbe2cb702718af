"""Real test material for tests and benchmarks: a thin shim over `tftpu.datasets`.

Everything (names, hashes, the cache under ``$TFTPU_CACHE``, `get`, `image`, `mnist`, ...) is
`tftpu.datasets`'s. This module adds the one step the package must not do: the mtcnn weights ship
as joblib pickles, so here, on the test side, the pickle (hash-checked by `tftpu.datasets`) is
loaded once and written as a deterministic `.npz` whose own pinned hash `tftpu.datasets` checks.

    from tests import material
    path = material.get("selfie_segmentation.tflite")
    image = material.image("astronaut.png")          # uint8 HxWx3

Fetch everything and make the `.npz` files ahead of time (CI does):  python -m tests.material
"""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile

import numpy as np

from tftpu import datasets
from tftpu.datasets import (COLOUR_PHOTOS, CONVERTED, FILES, PHOTOS, WHEELS, cache_dir, digits,  # noqa: F401
                            image, images, licence, lfw_subset, mnist, names, save_photos, sha256)
from tftpu.errors import DatasetError
from tftpu.utils.files import write_bytes

MaterialError = DatasetError
DERIVED = {name: source for name, (source, _) in CONVERTED.items()}
_EPOCH = (1980, 1, 1, 0, 0, 0)


def npz_bytes(arrays: list[np.ndarray]) -> bytes:
    """`arr_0..arr_N` as an `.npz` with fixed timestamps and order, so the bytes (and hash) never change."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for i, a in enumerate(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(a, dtype=np.float32), allow_pickle=False)
            info = zipfile.ZipInfo(f"arr_{i}.npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            z.writestr(info, member.getvalue())
    return buf.getvalue()


def convert_mtcnn(name: str) -> None:
    """Make `name` (an mtcnn `.npz`) from its pinned pickle, once; the result must match its pin."""
    import joblib  # test-only dependency: reads the pinned, hash-verified pickle

    source, sha = CONVERTED[name]
    arrays = joblib.load(io.BytesIO(datasets.get(source).read_bytes()))
    if not (isinstance(arrays, list) and all(isinstance(a, np.ndarray) for a in arrays)):
        raise DatasetError(f"{source}: expected a list of numpy arrays")
    data = npz_bytes(arrays)
    got = hashlib.sha256(data).hexdigest()
    if got != sha:
        raise DatasetError(f"{name}: converted from {source} to sha256 {got}, not the pinned {sha}")
    write_bytes(cache_dir() / name, data)


def get(name: str):
    """`tftpu.datasets.get`, converting the mtcnn pickles to `.npz` first where needed."""
    if name in CONVERTED:
        path = cache_dir() / name
        if not (path.is_file() and sha256(path) == CONVERTED[name][1]):
            convert_mtcnn(name)
    return datasets.get(name)


def mtcnn_weights(net: str) -> list[np.ndarray]:
    """The real mtcnn weights of "rnet", "onet" or "pnet", in the package's order."""
    if net in ("rnet", "onet", "pnet"):
        get(f"mtcnn_{net}.npz")
    return datasets.mtcnn_weights(net)


def main() -> int:
    for name in names():
        path = get(name)
        print(f"{sha256(path)}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
