"""Quiet by default, verbose with TFTPU_VERBOSE=1 (issue 11 item 8, issue 15 "Noise").

A tool's stderr holds its own lines only: no TensorFlow start-up lines, no TFLite delegate line,
no `tf.lite.Interpreter is deprecated` warning, no absl warnings of TF or Keras, before the one
error line. tftpu's own warnings still show. TFTPU_VERBOSE=1 brings the rest back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests import material

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def _env(verbose: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TFTPU_VERBOSE")}
    if verbose:
        env["TFTPU_VERBOSE"] = "1"
    return env


def _transform_wrong_input(tmp_path, verbose: bool):
    tflite = material.get("face_detection_short_range.tflite")
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((1, 5), np.float32))
    out = tmp_path / "out"
    done = subprocess.run([str(BIN / "tftpu-transform"), f"--model_def={tflite}", f"--mlir={out / 'm.top.mlir'}",
                           f"--test_input={bad}"], capture_output=True, text=True, timeout=300, env=_env(verbose),
                          cwd=tmp_path)
    return done, out


def test_a_failing_tool_prints_exactly_one_line(tmp_path):
    done, out = _transform_wrong_input(tmp_path, verbose=False)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "tftpu-transform: error: input 'input' has shape [1, 5], the model wants [1, 128, 128, 3]"], done.stderr
    assert not out.exists()


def test_verbose_brings_tensorflow_lines_back(tmp_path):
    done, _ = _transform_wrong_input(tmp_path, verbose=True)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("tftpu-transform: error: input 'input'")
    assert len(lines) > 1 and any("deprecated" in x or "oneDNN" in x or "XNNPACK" in x for x in lines), lines


def test_tftpu_own_warnings_still_show(tmp_path):
    from tests.frontend.onnx_graphs import conv_bn_relu_net

    path = tmp_path / "m.onnx"
    path.write_bytes(conv_bn_relu_net().SerializeToString())
    done = subprocess.run([str(BIN / "tftpu-transform"), f"--model_def={path}", f"--mlir={tmp_path / 'm.top.mlir'}"],
                          capture_output=True, text=True, timeout=300, env=_env(False), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "dynamic batch dimension" in lines[0] and "assuming 1" in lines[0], lines


def test_model_export_is_quiet_unless_verbose(tmp_path):
    code = ("from tftpu import models; "
            "models.resnet18_like(input_shape=(32, 32, 3), classes=10).export(r'{}')")
    quiet = subprocess.run([sys.executable, "-c", code.format(tmp_path / "a")], capture_output=True, text=True,
                           timeout=300, env=_env(False), cwd=ROOT)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "" and quiet.stderr == ""
    assert (tmp_path / "a" / "saved_model.pb").is_file()
    loud = subprocess.run([sys.executable, "-c", code.format(tmp_path / "b")], capture_output=True, text=True,
                          timeout=300, env=_env(True), cwd=ROOT)
    assert loud.returncode == 0 and "Captures:" in loud.stdout and "TensorSpec" in loud.stdout


def test_tflite_import_is_quiet_unless_verbose():
    """tf2onnx's TFLite reader builds a tf.lite.Interpreter: its deprecation warning and the
    native XNNPACK line stay off a library user's stderr too (frontend.load, tftpu.compile)."""
    tflite = material.get("face_detection_short_range.tflite")
    code = ("import warnings; warnings.simplefilter('default'); "
            f"from tftpu import frontend; frontend.load(r'{tflite}')")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**_env(False), "TF_CPP_MIN_LOG_LEVEL": "2"}, cwd=ROOT)
    assert quiet.returncode == 0, quiet.stderr
    assert "deprecated" not in quiet.stderr and "XNNPACK" not in quiet.stderr, quiet.stderr
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=_env(True), cwd=ROOT)
    assert loud.returncode == 0 and "XNNPACK" in loud.stderr, loud.stderr


def test_tool_output_restores_stderr_and_keeps_own_records(capsys):
    """In-process (stderr captured by the test runner): nothing is redirected, other packages'
    log records and warnings are dropped, tftpu's kept, and everything is put back after."""
    import logging
    import warnings

    from absl import logging as absl_logging

    from tftpu.utils import quiet

    before = sys.stderr
    foreign = logging.LogRecord("absl", logging.WARNING, "/site-packages/keras/x.py", 1, "foreign", None, None)
    own = logging.LogRecord("absl", logging.WARNING, str(ROOT / "tftpu" / "x.py"), 1, "own", None, None)
    handler = absl_logging.get_absl_handler()
    with quiet.tool_output():
        assert handler.filter(own) and not handler.filter(foreign)
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn("deprecated", DeprecationWarning)
        assert sys.stderr is before
    assert handler.filter(foreign) and sys.stderr is before
