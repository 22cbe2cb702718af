"""The README's main job runs end to end on the bundled default."""

import subprocess
import sys
from pathlib import Path

import numpy as np


def test_demo_tool_runs(tmp_path):
    script = Path(sys.executable).parent / "tftpu-demo"
    done = subprocess.run([str(script), f"--output_dir={tmp_path}", "--image_size=64"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "demo passed" in done.stdout and "[6/6] TAC" in done.stdout and "simulated INT8" in done.stdout
    assert "1 conv rewritten for tpu, 0 for cpu" in done.stdout
    assert (tmp_path / "resnet18_like.onnx").stat().st_size > 1_000_000
    for name in ("resnet18_like.top.mlir", "resnet18_like_nhwc.top.mlir", "resnet18_like_tac.tflite",
                 "space_to_depth_report.txt", "tac_report.txt", "resnet18_like_cali_table"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert '"top.Permute"' not in (tmp_path / "resnet18_like_nhwc.top.mlir").read_text()


def test_reference_model_is_deterministic():
    from tftpu import models

    a = models.resnet18_like((32, 32, 3), classes=10, seed=3)
    b = models.resnet18_like((32, 32, 3), classes=10, seed=3)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    assert models.sample_image(32).shape == (32, 32, 3)
