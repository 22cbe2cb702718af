"""Issue 11, item by item, as a hostile user meets it: through the tools, each case asserts the
exit status, the single line on stderr (naming what and where) and what is left on disk.

Items covered elsewhere at this level: 4 (SIGTERM, test_output_files), 5's --scale=nan and
--image_size (test_bad_input_more), 5's external data and malformed nodes (test_onnx_validation),
7 and 8 (test_quiet), 12 (tests/graph/test_saved_model). Item 9 is about the Python API
(test_bad_input_more).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from tests.frontend.onnx_graphs import conv_bn_relu_net, model, rand

BIN = Path(sys.executable).parent


def _tool(name: str, *args, cwd=None, umask: int | None = None, timeout: int = 120):
    pre = (lambda: os.umask(umask)) if umask is not None else None
    t0 = time.perf_counter()
    done = subprocess.run([str(BIN / name), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, preexec_fn=pre)
    done.seconds = time.perf_counter() - t0
    return done


def _one_line(done, code: int, *needles: str) -> str:
    lines = done.stderr.splitlines()
    assert done.returncode == code, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.fixture()
def onnx_file(tmp_path):
    path = tmp_path / "m.onnx"
    m = conv_bn_relu_net()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    path.write_bytes(m.SerializeToString())
    np.savez(tmp_path / "in.npz", x=rand(1, 3, 32, 32))
    return path


# ---------------------------------------------------------------- 1. truncated .mlir

def test_1_truncated_mlir_fails_fast_in_run_and_calibrate(onnx_file, tmp_path):
    from tftpu.frontend.onnx_to_top import onnx_to_top

    onnx_to_top(onnx_file, "m").save(tmp_path / "m.top.mlir")
    long_name = "a_rather_long_tensor_name_of_forty_five_chars"
    text = (tmp_path / "m.top.mlir").read_text().replace('loc("c1")', f'loc("{long_name}")')
    cut = tmp_path / "cut.top.mlir"
    cut.write_text(text[:text.index(long_name) + 40])   # inside the string: 40 open characters
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "a.npz", x=rand(1, 3, 32, 32))
    before = _files(tmp_path)
    run = _tool("tftpu-run", f"--model={cut}", f"--input={tmp_path / 'in.npz'}", f"--output={tmp_path / 'o.npz'}")
    _one_line(run, 2, str(cut), "unterminated")
    cal = _tool("tftpu-calibrate", f"--mlir={cut}", f"--dataset={tmp_path / 'data'}", "-o", tmp_path / "t")
    _one_line(cal, 2, str(cut), "unterminated")
    assert run.seconds < 60 and cal.seconds < 60   # the lexer used to take exponential time here
    assert _files(tmp_path) == before


# ---------------------------------------------------------------- 2. names in any script

@pytest.mark.parametrize("name", ["modèle", "模型", "a/b"])
def test_2_any_name_round_trips_from_another_directory(onnx_file, tmp_path, name):
    out = tmp_path / "out"
    done = _tool("tftpu-transform", f"--model_def={onnx_file}", f"--model_name={name}",
                 f"--mlir={out / 'm.top.mlir'}", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _tool("tftpu-run", f"--model={out / 'm.top.mlir'}", f"--input={tmp_path / 'in.npz'}",
                f"--output={tmp_path / 'o.npz'}", cwd=elsewhere)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert set(np.load(tmp_path / "o.npz")) == {"y"} and _files(elsewhere) == []


# ---------------------------------------------------------------- 3. output paths

def test_3_output_that_is_a_directory_leaves_no_weights(onnx_file, tmp_path):
    (tmp_path / "m.top.mlir").mkdir()
    before = _files(tmp_path)
    done = _tool("tftpu-transform", f"--model_def={onnx_file}", f"--mlir={tmp_path / 'm.top.mlir'}", cwd=tmp_path)
    _one_line(done, 2, "m.top.mlir", "is a directory")
    assert _files(tmp_path) == before


@pytest.mark.parametrize("where,needle", [("file/x.npz", "not a directory"), ("n" * 300 + ".npz", "too long"),
                                          ("adir", "is a directory")])
def test_3_bad_output_paths_of_run(onnx_file, tmp_path, where, needle):
    (tmp_path / "file").write_text("")
    (tmp_path / "adir").mkdir()
    before = _files(tmp_path)
    done = _tool("tftpu-run", f"--model={onnx_file}", f"--input={tmp_path / 'in.npz'}",
                 f"--output={tmp_path / where}")
    _one_line(done, 2, "cannot write", needle)
    assert _files(tmp_path) == before


def test_3_disk_full_is_one_line(onnx_file, tmp_path):
    """ENOSPC when the finished file is put in place (simulated: a real full disk is not at hand)."""
    code = ("import sys; from tftpu import cli; from tftpu.utils import files\n"
            "def main(args):\n"
            "    files.os.replace = lambda a, b: (_ for _ in ()).throw(OSError(28, 'No space left on device'))\n"
            f"    files.write_bytes({str(tmp_path / 'big.bin')!r}, b'x' * 100)\n"
            "cli.run(main, 'full', argv=['full'])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    _one_line(done, 2, "big.bin", "no space left")
    assert _files(tmp_path) == ["in.npz", "m.onnx"]


# ---------------------------------------------------------------- 5. other tracebacks

def test_5_onnx_node_reading_a_missing_tensor(tmp_path):
    path = tmp_path / "g.onnx"
    path.write_bytes(model([helper.make_node("Relu", ["ghost"], ["y"], name="r")], [("x", [1, 4])],
                           [("y", [1, 4])]).SerializeToString())
    done = _tool("tftpu-transform", f"--model_def={path}", f"--mlir={tmp_path / 'g.top.mlir'}", cwd=tmp_path)
    _one_line(done, 2, str(path), "Relu 'r' reads tensor 'ghost'")
    assert _files(tmp_path) == ["g.onnx"]


@pytest.mark.parametrize("shapes,needle", [("[[1,true,32,32]]", "positive ints"),
                                           ("[[1,3,99999999999,32]]", "out of range"),
                                           ("[[1,3,100000,100000]]", "memory")])
def test_5_6_input_shapes_out_of_range(onnx_file, tmp_path, shapes, needle):
    done = _tool("tftpu-transform", f"--model_def={onnx_file}", f"--input_shapes={shapes}",
                 f"--mlir={tmp_path / 'm.top.mlir'}", cwd=tmp_path)
    _one_line(done, 2, "--input_shapes", needle)
    assert _files(tmp_path) == ["in.npz", "m.onnx"]


def test_5_npz_header_bomb_is_refused_before_allocating(onnx_file, tmp_path):
    import io
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)})
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w") as zf:
        zf.writestr("x.npy", buf.getvalue() + b"\0" * 40)
    done = _tool("tftpu-run", f"--model={onnx_file}", f"--input={tmp_path / 'bomb.npz'}",
                 f"--output={tmp_path / 'o.npz'}")
    _one_line(done, 2, "bomb.npz", "memory")
    assert not (tmp_path / "o.npz").exists() and done.seconds < 60


def test_5_plugin_path_that_is_not_python_and_10_plugin_that_exits(tmp_path):
    from tests.tac.models import mixed

    tflite = tmp_path / "m.tflite"
    tflite.write_bytes(mixed())
    (tmp_path / "plug.txt").write_text("x = 1\n")
    (tmp_path / "exits.py").write_text("raise SystemExit(7)\n")
    for spec, needle in ((f"{tmp_path / 'plug.txt'}:Foo", "not a Python file"),
                         (f"{tmp_path / 'exits.py'}:Foo", "SystemExit")):
        done = _tool("tftpu-tac", tflite, "-o", tmp_path / "out.tflite", f"--device_specs={spec},CPU")
        _one_line(done, 2, needle)
        assert not (tmp_path / "out.tflite").exists()


# ---------------------------------------------------------------- 6. bad input accepted

def test_6_dynamic_spatial_size_is_refused_and_batch_assumed_with_a_warning(tmp_path):
    for dims, code in ((["N", 3, "H", "W"], 2), (["N", 3, 8, 8], 0)):
        path = tmp_path / "d.onnx"
        path.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], [("x", dims)], [("y", None)]).SerializeToString())
        mlir = tmp_path / "d.top.mlir"
        done = _tool("tftpu-transform", f"--model_def={path}", f"--mlir={mlir}", cwd=tmp_path)
        if code == 2:
            _one_line(done, 2, "dimension 2 (H) is dynamic", "--input_shapes")
            assert not mlir.exists()
        else:
            _one_line(done, 0, "warning", "dynamic batch dimension", "assuming 1")
            assert mlir.exists()


def test_6_all_nan_test_input_is_refused_before_writing(onnx_file, tmp_path):
    np.savez(tmp_path / "nan.npz", x=np.full((1, 3, 32, 32), np.nan, np.float32))
    done = _tool("tftpu-transform", f"--model_def={onnx_file}", f"--test_input={tmp_path / 'nan.npz'}",
                 f"--mlir={tmp_path / 'm.top.mlir'}", cwd=tmp_path)
    _one_line(done, 2, "NaN")
    assert _files(tmp_path) == ["in.npz", "m.onnx", "nan.npz"]


def test_6_unknown_opset_is_refused(tmp_path):
    m = conv_bn_relu_net()
    m.opset_import[0].version = 99
    path = tmp_path / "o.onnx"
    path.write_bytes(m.SerializeToString())
    done = _tool("tftpu-transform", f"--model_def={path}", f"--mlir={tmp_path / 'o.top.mlir'}", cwd=tmp_path)
    _one_line(done, 2, str(path), "opset 99")
    assert _files(tmp_path) == ["o.onnx"]


def test_6_tflite_of_another_schema_version_is_refused_by_transform_and_tac(tmp_path):
    from tests.tac.models import mixed
    from tftpu.tac import tflite_io

    tfl = tflite_io.read(mixed())
    tfl.version = 2
    path = tmp_path / "v2.tflite"
    path.write_bytes(tflite_io.write(tfl))
    for done in (_tool("tftpu-transform", f"--model_def={path}", f"--mlir={tmp_path / 'v.top.mlir'}", cwd=tmp_path),
                 _tool("tftpu-tac", path, "-o", tmp_path / "out.tflite")):
        _one_line(done, 2, "v2.tflite", "schema version 2")
    assert _files(tmp_path) == ["v2.tflite"]


# ---------------------------------------------------------------- 11. permissions

def test_11_outputs_get_the_permissions_of_a_plain_write(onnx_file, tmp_path):
    done = _tool("tftpu-transform", f"--model_def={onnx_file}", f"--mlir={tmp_path / 'm.top.mlir'}", cwd=tmp_path,
                 umask=0o027)
    assert done.returncode == 0, done.stderr
    written = [p for p in tmp_path.iterdir() if p.name not in ("m.onnx", "in.npz")]
    assert len(written) == 2
    assert {oct(p.stat().st_mode & 0o777) for p in written} == {"0o640"}


def test_modes_are_taken_in_any_case(onnx_file, tmp_path):
    """--quantize=int8 / Bf16 (Python spells INT8, TFLite's CLI int8): taken in any case, held as
    the tool spells it; an unknown mode is still one line and exit 2."""
    mlir = tmp_path / "m.top.mlir"
    assert _tool("tftpu-transform", f"--model_def={onnx_file}", f"--mlir={mlir}").returncode == 0
    done = _tool("tftpu-deploy", f"--mlir={mlir}", "--chip=npu1", "--quantize=bf16", f"--model={tmp_path / 'b.tpumodel'}")
    assert done.returncode == 0 and (tmp_path / "b.tpumodel").is_file(), done.stderr
    _one_line(_tool("tftpu-deploy", f"--mlir={mlir}", "--chip=npu1", "--quantize=int4"), 2, "--quantize")
