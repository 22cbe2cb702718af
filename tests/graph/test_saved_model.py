"""SavedModel in, SavedModel out: `optimize_saved_model` and the `tftpu-optimize` tool."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tftpu.errors import ModelFileError, UsageError
from tftpu.pipelines.saved_model import optimize_saved_model

ROOT = Path(__file__).resolve().parents[2]


def _export(path, size=33, kernel=7, padding="same", uint8=False):
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((size, size, 3), name="image", dtype="uint8" if uint8 else "float32")
    x = keras.ops.cast(inp, "float32") if uint8 else inp
    x = keras.layers.Rescaling(1 / 255.0, offset=-0.25)(x)
    x = keras.layers.Conv2D(8, kernel, strides=2, padding=padding)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inp, keras.layers.Dense(3)(x))
    model.export(str(path), verbose=False)
    return model


def _all_ops(saved_dir):
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((Path(saved_dir) / "saved_model.pb").read_bytes())
    graph = sm.meta_graphs[0].graph_def
    ops = [n.op for n in graph.node]
    for f in graph.library.function:
        ops += [n.op for n in f.node_def]
    return ops


@pytest.mark.parametrize("size,kernel,padding,uint8", [(33, 7, "same", False), (32, 3, "valid", True)])
def test_saved_model_same_outputs(tmp_path, size, kernel, padding, uint8):
    src, dst = tmp_path / "in", tmp_path / "out"
    _export(src, size, kernel, padding, uint8)
    reports = optimize_saved_model(src, dst, target="tpu")
    assert reports["serving_default"].applied("space_to_depth"), str(reports["serving_default"])
    assert "SpaceToDepth" in _all_ops(dst) and "SpaceToDepth" not in _all_ops(src)
    a = tf.saved_model.load(str(src)).signatures["serving_default"]
    b = tf.saved_model.load(str(dst)).signatures["serving_default"]
    assert a.structured_input_signature == b.structured_input_signature
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 255, (3, size, size, 3)).astype(np.uint8 if uint8 else np.float32)
    ra, rb = a(image=tf.constant(x)), b(image=tf.constant(x))
    assert ra.keys() == rb.keys()
    for k in ra:
        np.testing.assert_allclose(rb[k], ra[k], rtol=1e-5, atol=1e-5)
    shapes_a = sorted(tuple(v.shape) for v in tf.saved_model.load(str(src)).variables)
    shapes_b = sorted(tuple(v.shape) for v in tf.saved_model.load(str(dst)).original.variables)
    assert shapes_a == shapes_b and (kernel, kernel, 3, 8) in shapes_b


def test_saved_model_cpu_and_disable(tmp_path):
    src = tmp_path / "in"
    _export(src)
    cpu = optimize_saved_model(src, tmp_path / "cpu", target="cpu")["serving_default"]
    assert not cpu.applied("space_to_depth") and "estimated" in str(cpu)
    off = optimize_saved_model(src, tmp_path / "off", disable=["space_to_depth"])["serving_default"]
    assert str(off) == "space_to_depth: disabled"
    assert "SpaceToDepth" not in _all_ops(tmp_path / "off")


def test_saved_model_bad_inputs(tmp_path):
    with pytest.raises(ModelFileError, match="no such directory"):
        optimize_saved_model(tmp_path / "missing", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFileError, match="not a SavedModel"):
        optimize_saved_model(tmp_path / "empty", tmp_path / "o")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(UsageError, match="not empty"):
        optimize_saved_model(tmp_path / "empty", tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    (tmp_path / "file").write_text("keep me too")
    with pytest.raises(UsageError, match="the output directory is an existing file"):
        optimize_saved_model(tmp_path / "empty", tmp_path / "file")


def test_a_full_disk_while_saving_is_an_output_error_with_nothing_left(tmp_path, monkeypatch):
    """TensorFlow's ResourceExhaustedError from the save (a full disk) is one OutputError naming the
    output's directory; the temporary directory is removed."""
    import tensorflow as tf

    from tftpu.errors import OutputError

    src = tmp_path / "in"
    _export(src)

    def full(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", full)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(OutputError, match="cannot write the SavedModel: No space left on device"):
        optimize_saved_model(src, tmp_path / "out")
    assert sorted(tmp_path.iterdir()) == before


def _tool(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, str(ROOT / "tools" / "tftpu_optimize.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_tool(tmp_path):
    src = tmp_path / "in"
    _export(src)
    proc = _tool(f"--saved_model_dir={src}", f"--output_dir={tmp_path / 'out'}", "--target=tpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "space_to_depth: 1 rewrite(s)" in proc.stdout and "SpaceToDepth(b=2x2)" in proc.stdout
    assert "SpaceToDepth" in _all_ops(tmp_path / "out")
    bad = _tool(f"--saved_model_dir={tmp_path / 'nope'}", f"--output_dir={tmp_path / 'o2'}")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].endswith("nope: no such directory")
    assert len([line for line in bad.stderr.splitlines() if ": error:" in line]) == 1
    assert "Traceback" not in bad.stderr
    usage = _tool(f"--saved_model_dir={src}")
    assert usage.returncode == 2 and "--output_dir" in usage.stderr


@pytest.mark.parametrize("where", ["proc", "under_file"])
def test_tool_unwritable_output_dir(tmp_path, where):
    """A directory output that cannot be made (under /proc, under a file) is one line and exit 2,
    found before the model is loaded, and leaves no temporary directory behind."""
    src = tmp_path / "in"
    _export(src)
    (tmp_path / "file").write_text("x")
    out = "/proc/tftpu_out/model" if where == "proc" else str(tmp_path / "file" / "out")
    before = sorted(tmp_path.iterdir())
    proc = _tool(f"--saved_model_dir={src}", f"--output_dir={out}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if ": error:" in line]
    assert len(errors) == 1 and out in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert sorted(tmp_path.iterdir()) == before


def test_output_is_byte_identical_across_runs(tmp_path):
    """Every file the tool writes, fingerprint.pb included, is the same in two runs (issue 11,
    item 12): TF's random fingerprint uuid is replaced by one derived from the content hashes."""
    from tensorflow.core.protobuf import fingerprint_pb2

    src = tmp_path / "in"
    _export(src)
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        proc = _tool(f"--saved_model_dir={src}", f"--output_dir={out}")
        assert proc.returncode == 0, proc.stderr[-2000:]
    files = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    assert Path("fingerprint.pb") in files and Path("saved_model.pb") in files
    assert files == sorted(p.relative_to(outs[1]) for p in outs[1].rglob("*") if p.is_file())
    for name in files:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    fp = fingerprint_pb2.FingerprintDef.FromString((outs[0] / "fingerprint.pb").read_bytes())
    assert fp.uuid.isdigit() and int(fp.uuid) < 2 ** 128 and fp.checkpoint_hash
    read = tf.saved_model.experimental.read_fingerprint(str(outs[0]))
    assert read.singleprint() and read.saved_model_checksum == fp.saved_model_checksum
    assert tf.saved_model.load(str(outs[0])).signatures["serving_default"] is not None
