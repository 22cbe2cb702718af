"""Bad input found by hostile use (issue 11): each is one typed error, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tftpu import errors

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("kwargs,needle", [
    ({"dtype": "int4"}, "expected one of"),
    ({"dtype": "float32", "scale": "abc"}, "scale"),
    ({"dtype": "float32", "offset": float("nan")}, "finite"),
])
def test_data_space_to_depth_bad_arguments_are_usage_errors(kwargs, needle):
    import tensorflow as tf

    import tftpu

    ds = tf.data.Dataset.from_tensors(tf.zeros([1, 4, 4, 3], tf.uint8))
    with pytest.raises(errors.UsageError, match=needle):
        tftpu.data.space_to_depth(ds, 2, **kwargs)


@pytest.mark.parametrize("size", ["0", "-5", "100000"])
def test_demo_refuses_absurd_image_sizes(size, tmp_path):
    done = subprocess.run([str(BIN / "tftpu-demo"), f"--image_size={size}", f"--output_dir={tmp_path / 'o'}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--image_size" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_plugin_that_exits_or_is_not_python(tmp_path):
    from tftpu.tac.hardware import registry

    exits = tmp_path / "exits.py"
    exits.write_text("raise SystemExit(7)\n")
    with pytest.raises(errors.UsageError, match="SystemExit"):
        registry.load_plugin(f"{exits}:Foo")
    text = tmp_path / "plug.txt"
    text.write_text("x = 1\n")
    with pytest.raises(errors.UsageError, match="not a Python file"):
        registry.load_plugin(f"{text}:Foo")


@pytest.mark.parametrize("flag", ["--mean=nan", "--scale=1e400"])
def test_calibrate_refuses_non_finite_numbers(flag, tmp_path):
    done = subprocess.run([str(BIN / "tftpu-calibrate"), "--mlir=x.top.mlir", f"--dataset={tmp_path}", flag,
                           f"-o={tmp_path / 't'}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "finite" in done.stderr, done.stderr
