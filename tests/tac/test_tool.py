"""The tftpu-tac command line on a real model: outputs, MLIR, report, plug-ins, exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.tac import models

ROOT = Path(__file__).resolve().parents[2]


def tool(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "tools" / "tftpu_tac.py"), *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def selfie_path():
    from tests import material

    return material.get("selfie_segmentation.tflite")


def test_tool_full_run(tmp_path, selfie_path):
    out, mlir, rep = tmp_path / "s.tflite", tmp_path / "s.mlir", tmp_path / "s.json"
    r = tool(selfie_path, "-o", out, "--device_specs=GPU,CPU", "--output_mlir", mlir,
             "--inline_subgraphs=false", "--report", rep)
    assert r.returncode == 0, r.stderr
    assert "func_0_GPU_FLOAT" in r.stdout and "all_CPU" in r.stdout
    report = json.loads(rep.read_text())
    assert report["ops_per_device"] == {"GPU": 246} and report["device_specs"] == ["GPU", "CPU"]
    text = mlir.read_text()
    assert "func.func private @func_0_GPU_FLOAT" in text and "func.func private @func_0_CPU_FLOAT" in text
    assert '"func.call"' in text
    x = np.random.default_rng(0).random((1, 256, 256, 3), dtype=np.float32)
    data = Path(selfie_path).read_bytes()
    assert np.array_equal(models.run_tflite(data, [x])[0], models.run_tflite(out.read_bytes(), [x])[0])
    # same input, same bytes
    out2 = tmp_path / "s2.tflite"
    assert tool(selfie_path, "-o", out2, "--output_mlir", tmp_path / "s2.mlir", "--inline_subgraphs=false").returncode == 0
    assert out2.read_bytes() == out.read_bytes()
    assert (tmp_path / "s2.mlir").read_text() == text


def test_tool_inline_mlir_and_plugin(tmp_path, selfie_path):
    mlir = tmp_path / "i.mlir"
    r = tool(selfie_path, "--device_specs=tests/tac/plugin_hw.py:ConvOnly,CPU", "--output_mlir", mlir)
    assert r.returncode == 0, r.stderr
    text = mlir.read_text()
    assert 'tac.device = "CONVONLY"' in text and "func.call" not in text
    r = tool(selfie_path, "--device_specs=tests.tac.plugin_hw:LowerAll", "-o", tmp_path / "l.tflite")
    assert r.returncode == 0, r.stderr
    assert "LOWERALL" in r.stdout


@pytest.mark.parametrize("args,word", [
    ((), "exactly one INPUT"),
    (("a.tflite", "b.tflite"), "exactly one INPUT"),
    (("{selfie}", "--device_specs=TPU9"), "unknown hardware 'TPU9'"),
    (("{selfie}", "--device_specs=nomodule.x:Y"), "cannot be imported"),
    (("{selfie}", "--no_such_flag"), "no_such_flag"),
])
def test_tool_usage_errors(selfie_path, args, word):
    r = tool(*[a.format(selfie=selfie_path) for a in args])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0]


def test_tool_help():
    r = tool("--help")
    assert r.returncode == 0 and "--device_specs" in r.stdout and "--inline_subgraphs" in r.stdout
