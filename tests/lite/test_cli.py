"""tftpu-convert: tflite_convert's flags plus tftpu's; bad input is one line and exit 2 with
nothing written; the one-command SavedModel pipeline (S2D + TAC + INT8 from photos)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tftpu.lite import runtime
from tftpu.tac import export, tflite_io


def _script():
    path = Path(sys.executable).parent / "tftpu-convert"
    return str(path) if path.exists() else shutil.which("tftpu-convert")


def _cli(*args):
    return subprocess.run([_script(), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    import keras

    keras.utils.set_random_seed(1)
    inp = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 7, strides=2, padding="same", activation="relu")(inp)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inp, keras.layers.Dense(4)(x))
    path = tmp_path_factory.mktemp("sm") / "model"
    model.export(str(path), verbose=False)
    keras_file = path.parent / "model.keras"
    model.save(keras_file)
    return path, keras_file, model


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from tests import material

    d = tmp_path_factory.mktemp("photos")
    for name in material.COLOUR_PHOTOS[:6]:
        shutil.copy(material.get(name), d / name)
    return d


def test_bad_input_is_one_line_exit_2(tmp_path, saved_model):
    (tmp_path / "text.keras").write_text("not a model\n")
    cases = [
        ([f"--output_file={tmp_path}/a.tflite"], "exactly one of"),
        ([f"--saved_model_dir={tmp_path}/missing", f"--output_file={tmp_path}/a.tflite"], "no such directory"),
        ([f"--keras_model_file={tmp_path}/none.keras", f"--output_file={tmp_path}/a.tflite"], "no such"),
        ([f"--keras_model_file={tmp_path}/text.keras", f"--output_file={tmp_path}/a.tflite"], "not a .keras model"),
        ([f"--saved_model_dir={tmp_path}/text.keras", f"--output_file={tmp_path}/a.tflite"],
         "a file, not a SavedModel directory"),
        ([f"--saved_model_dir={saved_model[0]}", f"--output_file={tmp_path}/a.tflite", "--quantize=int8"],
         "--representative_data"),
        ([f"--saved_model_dir={saved_model[0]}", f"--output_file={tmp_path}/a.tflite", "--signature_key=nope"],
         "signature"),
        ([f"--saved_model_dir={saved_model[0]}", f"--output_file={tmp_path}", "--device_specs=GPU"],
         "is a directory"),
        ([f"--saved_model_dir={saved_model[0]}", f"--output_file={tmp_path}/a.tflite", "--quantize=int8",
          f"--representative_data={tmp_path}/none"], "directory"),
    ]
    for args, needle in cases:
        done = _cli(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, done.stderr)
    assert not (tmp_path / "a.tflite").exists()


def test_plain_conversion_is_tensorflows(tmp_path, saved_model):
    import tensorflow as tf

    done = _cli(f"--saved_model_dir={saved_model[0]}", f"--output_file={tmp_path}/a.tflite")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.tflite").read_bytes() == tf.lite.TFLiteConverter.from_saved_model(
        str(saved_model[0])).convert()


def test_one_command_saved_model_pipeline(tmp_path, saved_model, photos):
    out, report = tmp_path / "m.tflite", tmp_path / "m.json"
    done = _cli(f"--saved_model_dir={saved_model[0]}", "--device_specs=GPU,CPU", "--space_to_depth",
                "--quantize=int8", f"--representative_data={photos}", f"--output_file={out}",
                "--mean=127.5", "--scale=0.0078125", f"--report={report}")
    assert done.returncode == 0, done.stderr
    rep = json.loads(report.read_text())
    assert rep["space_to_depth"]["applies"] and rep["int8"]["method"] == "mse" and rep["tac"]["ops_per_device"]
    model = tflite_io.read(out)
    assert export.get_metadata(model)["device_specs"] == ["GPU", "CPU"]
    interp = runtime.interpreter(out)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
    [y] = runtime.run(interp, [x])
    ref = saved_model[2](x).numpy()
    assert np.abs(y - ref).max() < 0.1 * np.abs(ref).max() + 0.05   # INT8 of a random-weight net

    keras_out = tmp_path / "k.tflite"
    done = _cli(f"--keras_model_file={saved_model[1]}", "--space_to_depth", "--s2d_block_size=2", "--s2d_input",
                f"--output_file={keras_out}")
    assert done.returncode == 0, done.stderr
    assert export.get_metadata(tflite_io.read(keras_out), "tftpu.s2d")["block_size"] == 2
