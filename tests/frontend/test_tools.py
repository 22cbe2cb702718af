"""tftpu-transform and tftpu-run end to end: outputs, determinism, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.frontend.onnx_graphs import conv_bn_relu_net, rand
from tftpu import ir

REPO = Path(__file__).resolve().parents[2]


def tool(name, *args, cwd=None):
    return subprocess.run([sys.executable, str(REPO / "tools" / f"tftpu_{name}.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools")
    onnx.save(conv_bn_relu_net(), d / "net.onnx")
    np.savez(d / "in.npz", x=rand(2, 3, 32, 32, seed=5))
    return d


def test_transform_writes_checks_and_is_deterministic(files):
    args = ["--model_name=net", f"--model_def={files / 'net.onnx'}", "--input_shapes=[[2,3,32,32]]",
            f"--test_input={files / 'in.npz'}"]
    a = tool("transform", *args, f"--test_result={files / 'a_top.npz'}", f"--mlir={files / 'a' / 'net.top.mlir'}")
    assert a.returncode == 0, a.stderr
    assert "PASS" in a.stdout and "FAIL" not in a.stdout and "all 7 tensors within tolerance" in a.stdout
    b = tool("transform", *args, f"--mlir={files / 'b' / 'net.top.mlir'}")
    assert b.returncode == 0, b.stderr
    for f in ("net.top.mlir", "net_top_f32_weights.npz"):
        assert (files / "a" / f).read_bytes() == (files / "b" / f).read_bytes(), f
    model = ir.load(files / "a" / "net.top.mlir")
    assert model.name == "net" and model.weight_file == "net_top_f32_weights.npz"
    assert "BatchNorm" not in (files / "a" / "net.top.mlir").read_text()
    dumped = ir.load_npz(files / "a_top.npz")
    assert {"x", "r1", "p1", "y"} <= set(dumped)


def test_transform_below_tolerance_exits_1(files):
    done = tool("transform", f"--model_def={files / 'net.onnx'}", f"--test_input={files / 'in.npz'}",
                "--input_shapes=[[2,3,32,32]]", "--tolerance=1.0,1.0", f"--mlir={files / 'c' / 'net.top.mlir'}")
    assert done.returncode == 1, done.stderr
    assert "FAIL" in done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and "below tolerance" in done.stderr, done.stderr


def test_run_mlir_and_onnx_agree(files):
    mlir = files / "r" / "net.top.mlir"
    done = tool("transform", f"--model_def={files / 'net.onnx'}", "--input_shapes=[[2,3,32,32]]",
                "--layout=NHWC", f"--mlir={mlir}")
    assert done.returncode == 0 and "convert layout to NHWC" in done.stdout, done.stderr
    a = tool("run", f"--model={mlir}", f"--input={files / 'in.npz'}", f"--output={files / 'top.npz'}",
             "--dump_all_tensors")
    b = tool("run", f"--model={files / 'net.onnx'}", f"--input={files / 'in.npz'}", f"--output={files / 'ort.npz'}")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    top, ort = ir.load_npz(files / "top.npz"), ir.load_npz(files / "ort.npz")
    assert set(ort) == {"y"} and "y" in top and len(top) >= 8
    np.testing.assert_allclose(top["y"], ort["y"], rtol=1e-5, atol=1e-5)


def test_run_a_tflite_model_in_litert(tmp_path):
    """tftpu-run on a .tflite runs it in LiteRT: its outputs by tensor name, equal to the runtime's
    own; every tensor with --dump_all_tensors; an input array under another name by position."""
    from tests import material
    from tftpu.lite import runtime

    path = material.get("face_detection_short_range.tflite")
    x = rand(1, 128, 128, 3, seed=3)
    np.savez(tmp_path / "in.npz", image=x)
    a = tool("run", f"--model={path}", f"--input={tmp_path / 'in.npz'}", f"--output={tmp_path / 'out.npz'}")
    b = tool("run", f"--model={path}", f"--input={tmp_path / 'in.npz'}", f"--output={tmp_path / 'all.npz'}",
             "--dump_all_tensors")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    got, every = ir.load_npz(tmp_path / "out.npz"), ir.load_npz(tmp_path / "all.npz")
    interp = runtime.interpreter(path)
    want = dict(zip((d["name"] for d in runtime.output_details(interp)), runtime.run(interp, [x])))
    assert set(got) == set(want) and len(got) == 2 and len(every) > 50
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_array_equal(every[k], want[k])


def test_bad_inputs_exit_2_with_one_line(files, tmp_path):
    (tmp_path / "trunc.onnx").write_bytes((files / "net.onnx").read_bytes()[:200])
    (tmp_path / "text.onnx").write_text("not a model at all\n")
    (tmp_path / "bad.npz").write_bytes(b"garbage")
    cases = [
        ("transform", [f"--model_def={tmp_path / 'missing.onnx'}"], "no such file"),
        ("transform", [f"--model_def={tmp_path / 'trunc.onnx'}"], "not an ONNX model"),
        ("transform", [f"--model_def={tmp_path / 'text.onnx'}"], "not an ONNX model"),
        ("transform", [], "--model_def is required"),
        ("transform", [f"--model_def={files / 'net.onnx'}", "--input_shapes=[[1,3]]"], "rank"),
        ("run", [f"--model={tmp_path / 'trunc.onnx'}", f"--input={files / 'in.npz'}", "--output=o.npz"],
         "not an ONNX model"),
        ("run", [f"--model={files / 'net.onnx'}", f"--input={tmp_path / 'bad.npz'}", "--output=o.npz"], "bad.npz"),
        ("run", [f"--model={tmp_path / 'missing.mlir'}", f"--input={files / 'in.npz'}", "--output=o.npz"],
         "no such file"),
    ]
    for name, args, msg in cases:
        done = tool(name, *args, f"--mlir={tmp_path / 'x.mlir'}" if name == "transform" else "--dump_all_tensors",
                    cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and msg in lines[0], (name, args, done.stderr)
    assert not (tmp_path / "x.mlir").exists() and not (tmp_path / "o.npz").exists()
