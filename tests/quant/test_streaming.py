"""Streaming calibration inputs: a directory, a glob, TFRecords (encoded images or serialized
tensors, plain or GZIP), a tf.data.Dataset or a generator give the byte-identical table of the
in-memory list; unreadable files are named (or skipped when asked); no sample is kept."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import tftpu
from tests import material
from tests.tools.test_deploy import cnn
from tftpu import errors, quant

PRE = dict(mean=[127.5], scale=[1 / 127.5])


@pytest.fixture(scope="module")
def model():
    return cnn()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Six real photos (skimage's, via tftpu.datasets) as PNG files of varied sizes."""
    d = tmp_path_factory.mktemp("photos")
    for i, name in enumerate(material.COLOUR_PHOTOS[:6]):
        import tensorflow as tf
        img = material.image(name, (24 + 4 * i, 20 + 2 * i))
        (d / f"{i:02d}_{name.split('.')[0]}.png").write_bytes(tf.io.encode_png(img).numpy())
    return d


def _example(features: dict) -> bytes:
    import tensorflow as tf
    feats = {}
    for k, v in features.items():
        if isinstance(v, bytes):
            feats[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
        else:
            feats[k] = tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(v).tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def _write(path, records, gzip=False):
    import tensorflow as tf
    with tf.io.TFRecordWriter(str(path), "GZIP" if gzip else None) as w:
        for r in records:
            w.write(r)
    return path


def _table_bytes(model, samples, path, method="mse"):
    quant.calibrate(model, samples, method).save(path)
    return path.read_bytes()


def test_every_source_gives_the_in_memory_table(model, photos, tmp_path):
    import tensorflow as tf
    listed = quant.load_samples(model, photos, **PRE)
    assert len(listed) == 6
    want = _table_bytes(model, listed, tmp_path / "list.txt")
    files = sorted(photos.iterdir())
    images = _write(tmp_path / "images.tfrecord", [_example({"image/encoded": p.read_bytes()}) for p in files])
    _write(tmp_path / "images.tfrecord.gz", [_example({"image/encoded": p.read_bytes()}) for p in files], gzip=True)
    name = model.input_names[0]
    serialized = _write(tmp_path / "tensors.tfr", [_example({name: tf.io.serialize_tensor(s[name]).numpy()})
                                                   for s in listed])
    flat = _write(tmp_path / "flat.tfrecords", [_example({"any_key": s[name]}) for s in listed])
    encoded = tf.data.Dataset.from_tensor_slices([str(p) for p in files]).map(tf.io.read_file)
    sources = {
        "directory": photos, "glob": str(photos / "*.png"), "paths": [str(p) for p in files],
        "tfrecord of images": images, "gzip tfrecord": tmp_path / "images.tfrecord.gz",
        "tf.data of encoded images": encoded,
        "tf.data of (image, label)": tf.data.Dataset.from_tensor_slices(
            (np.concatenate([s[name] for s in listed]), np.arange(6))).batch(4),
    }
    for label, source in sources.items():
        stream = quant.iter_samples(model, source, **PRE)
        assert _table_bytes(model, stream, tmp_path / "s.txt") == want, label
    for label, source in {"serialized tensors": serialized, "flat floats": flat,
                          "generator": (s for s in listed), "batched dict": {name: np.concatenate(
                              [s[name] for s in listed])}}.items():
        assert _table_bytes(model, quant.iter_samples(model, source), tmp_path / "s.txt") == want, label
    # auto keeps its first tune_num samples from the stream itself
    assert _table_bytes(model, quant.iter_samples(model, images, **PRE), tmp_path / "a.txt", "auto") == \
        _table_bytes(model, listed, tmp_path / "b.txt", "auto")
    stream = quant.iter_samples(model, str(photos / "*.png"), input_num=4, **PRE)
    assert stream.total == 4 and [w for w, _ in stream.items()] == [str(p) for p in files[:4]]
    assert [w for w, _ in quant.iter_samples(model, images, input_num=2).items()] == \
        [f"{images}#0", f"{images}#1"]


def test_unreadable_files_are_named_or_skipped(model, photos, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    for p in sorted(photos.iterdir())[:3]:
        (d / p.name).write_bytes(p.read_bytes())
    (d / "01_broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(errors.ModelFileError, match="01_broken.png"):
        quant.calibrate(model, quant.iter_samples(model, d))
    stream = quant.iter_samples(model, d, skip_unreadable=True)
    table = quant.calibrate(model, stream)
    assert table.samples == 3 and stream.skipped == [str(d / "01_broken.png")]
    good = _write(tmp_path / "good.tfrecord", [_example({"image/encoded": (d / "00_astronaut.png").read_bytes()})])
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(good.read_bytes()[:-7])
    with pytest.raises(errors.ModelFileError, match=r"cut.tfrecord: record 0"):
        quant.load_samples(model, cut)
    with pytest.raises(errors.InputError, match="no samples.*1 unreadable"):
        quant.load_samples(model, cut, skip_unreadable=True)
    with pytest.raises(errors.ShapeError, match="features"):
        quant.load_samples(model, _write(tmp_path / "odd.tfrecord", [_example({"a": b"x", "b": b"y"})]))
    with pytest.raises(errors.InputError, match="glob matches no"):
        quant.iter_samples(model, str(tmp_path / "none*.png"))
    with pytest.raises(errors.InputError, match="directory"):
        quant.iter_samples(model, tmp_path / "missing")


def test_streams_keep_no_sample_and_read_once(model):
    rng = np.random.default_rng(3)
    made = []

    def gen(n):
        for _ in range(n):
            x = rng.normal(size=(1, 3, 16, 16)).astype(np.float32)
            made.append(weakref.ref(x))
            yield {"x": x}

    table = quant.calibrate(model, gen(40))
    gc.collect()
    assert table.samples == 40 and sum(r() is not None for r in made) == 0
    stream = quant.iter_samples(model, gen(12))
    head = stream.head(9)                      # kept (as tftpu.compile keeps its first); the pass goes on
    assert len(head) == 9 and len(list(stream)) == 12
    with pytest.raises(errors.UsageError, match="once"):
        list(stream)


def test_compile_streams_its_calibration_data(model):
    rng = np.random.default_rng(4)
    samples = [rng.normal(size=(1, 3, 16, 16)).astype(np.float32) for _ in range(12)]
    compiled = tftpu.compile(model, chip="npu1", calibration_data=iter(samples), mixed_precision="none",
                             bias_correction=False, space_to_depth=False)
    assert "over 12 samples" in str(compiled) and compiled.passed


def test_compile_fits_the_refit_on_more_photos_than_it_judges_on(model, monkeypatch):
    """tftpu.compile keeps the stream's first 17 samples: the search and the correction guard judge
    on 8 of them (and the test input), the weight refit fits on 16, plain bias correction on 8."""
    import tftpu.pipelines.deploy as deploy_module
    import tftpu.quant.bias_correction as bias_module
    from tftpu.quant.refit import MAX_SAMPLES

    judged, fitted = [], []
    real_deploy, real_correct = deploy_module.deploy, bias_module.correct_biases

    def spy_deploy(*args, **kwargs):
        judged.append(len(kwargs["samples"]))
        return real_deploy(*args, **kwargs)

    def spy_correct(*args, **kwargs):
        corrected = real_correct(*args, **kwargs)
        fitted.append((bool(kwargs.get("refit")), corrected[1].samples))
        return corrected

    monkeypatch.setattr(deploy_module, "deploy", spy_deploy)
    monkeypatch.setattr(bias_module, "correct_biases", spy_correct)
    rng = np.random.default_rng(5)
    samples = [rng.normal(size=(1, 3, 16, 16)).astype(np.float32) for _ in range(24)]
    compiled = tftpu.compile(model, chip="npu1", calibration_data=iter(samples), test_input=samples[0] * 0.5,
                             calibration_method="mse", mixed_precision="none", space_to_depth=False)
    assert "over 24 samples" in str(compiled) and compiled.passed
    assert MAX_SAMPLES == 16 and judged == [8]
    assert (True, 16) in fitted and (False, 8) in fitted and set(fitted) <= {(True, 16), (False, 8)}


@pytest.mark.parametrize("kw,needle", [({"scale": 0}, "none 0"), ({"scale": [1, 0, 1]}, "none 0"),
                                       ({"mean": float("nan")}, "finite"), ({"scale": "x"}, "expected numbers")])
def test_a_scale_of_zero_or_a_mean_that_is_not_a_number_is_refused(model, photos, kw, needle):
    """--scale 0 made every input 0 and calibrated on that; NaN means and text are refused too."""
    with pytest.raises(errors.UsageError, match=needle):
        quant.load_samples(model, photos, **kw)
