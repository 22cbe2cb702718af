"""tftpu-convert --representative_data streams its files (tftpu.quant.iter_samples): the .tflite
is byte-identical to the one from the same samples read into memory first; an unreadable file is
one line naming it and exit 2, or with --skip_unreadable is skipped (logged once)."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tftpu import errors
from tftpu.lite import command, samples


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import keras

    keras.utils.set_random_seed(3)
    inp = keras.Input((24, 24, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inp)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    m = keras.Model(inp, keras.layers.Dense(3)(x))
    path = tmp_path_factory.mktemp("keras") / "m.keras"
    m.save(path)
    return path


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from tests import material

    d = tmp_path_factory.mktemp("photos")
    for name in material.COLOUR_PHOTOS[:5]:
        shutil.copy(material.get(name), d / name)
    return d


def _in_memory(keras_file, data, method="mse", **kw) -> bytes:
    """The pre-streaming path: every sample read into a list first, then converted."""
    import tensorflow as tf

    from tftpu.quant import load_samples

    converter = command.converter_for(keras_model_file=keras_file)
    shapes = samples.input_shapes(converter)
    loaded = load_samples(shapes, data, **kw)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([s[n] for n in shapes] for s in loaded)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.calibration_method = method
    return bytes(converter.convert())


@pytest.mark.parametrize("method", ["mse", "auto"])
def test_streamed_is_byte_identical_to_in_memory(tmp_path, model, photos, method):
    out = tmp_path / "s.tflite"
    report = command.convert(out, keras_model_file=model, quantize="int8", representative_data=str(photos),
                             input_num=4, mean=[127.5], scale=[1 / 127.5], calibration_method=method)
    assert report["representative_data"] == {"samples": 4, "skipped": []}
    assert out.read_bytes() == _in_memory(model, photos, method, input_num=4, mean=[127.5], scale=[1 / 127.5])


def test_one_sample_in_memory_at_a_time(model, photos):
    """The callable reads lazily: the first sample comes before a later file is even opened."""
    converter = command.converter_for(keras_model_file=model)
    files = sorted(str(p) for p in photos.iterdir())[:2] + [str(photos / "gone.jpg")]
    gen = samples.dataset(converter, files)()
    first = next(gen)
    assert len(first) == 1 and first[0].shape == (1, 24, 24, 3)
    next(gen)
    with pytest.raises(errors.ModelFileError, match="gone.jpg"):
        next(gen)


def _script():
    path = Path(sys.executable).parent / "tftpu-convert"
    return str(path) if path.exists() else shutil.which("tftpu-convert")


def test_cli_unreadable_file_is_named_or_skipped(tmp_path, model, photos):
    data = tmp_path / "data"
    shutil.copytree(photos, data)
    (data / "0_broken.png").write_bytes(b"\x89PNG not a png")
    out = tmp_path / "m.tflite"
    args = [_script(), f"--keras_model_file={model}", "--quantize=int8", f"--representative_data={data}/*.png",
            "--input_num=0", "--mean=127.5", "--scale=0.0078125", "--noprogress", f"--output_file={out}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "0_broken.png" in lines[0], r.stderr
    assert not out.exists()
    r = subprocess.run(args + ["--skip_unreadable"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "representative data: 4 inputs (1 unreadable skipped:" in r.stdout
    assert r.stderr.count("skipping") == 1 and "0_broken.png" in r.stderr     # two passes, one warning
    pngs = sorted(str(p) for p in photos.glob("*.png"))      # the good files alone, read into memory
    assert out.read_bytes() == _in_memory(model, pngs, mean=[127.5], scale=[0.0078125])
