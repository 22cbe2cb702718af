"""Every tool that writes files checks all its outputs before any work (`tftpu.utils.output_paths`,
run by `cli.run(paths=...)` before TensorFlow is imported): an output that is an input, another
output, a side file (the weights .npz beside an .mlir), not a regular file, or not writable is one
line on stderr, exit 2, nothing written and nothing replaced."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tftpu import errors
from tftpu.utils.output_paths import check, mlir_name, mlir_weights

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A real TOP .mlir with its weights, an .onnx, an input .npz and a real .tflite."""
    from tests import material
    from tests.frontend.onnx_graphs import conv_bn_relu_net, rand
    from tftpu.frontend.onnx_to_top import onnx_to_top

    d = tmp_path_factory.mktemp("made")
    m = conv_bn_relu_net()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    (d / "m.onnx").write_bytes(m.SerializeToString())
    onnx_to_top(d / "m.onnx", "m").save(d / "m.top.mlir")
    np.savez(d / "in.npz", x=rand(1, 3, 32, 32))
    shutil.copy(material.get("face_detection_short_range.tflite"), d / "m.tflite")
    return d


@pytest.fixture()
def work(made, tmp_path):
    for p in made.iterdir():
        shutil.copy(p, tmp_path / p.name)
    return tmp_path


# ---------------------------------------------------------------- the helper


def test_same_file_as_an_input_or_another_output(tmp_path):
    (tmp_path / "a").write_text("a")
    os.link(tmp_path / "a", tmp_path / "hard")
    os.symlink(tmp_path / "a", tmp_path / "soft")
    for alias in ("a", "hard", "soft", "./sub/../a"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(errors.UsageError, match=r"--out and --in name the same file: .*an output would replace"):
            check([("--out", tmp_path / alias)], [("--in", tmp_path / "a")])
    with pytest.raises(errors.UsageError, match=r"^--x and --y name the same file: .*new$"):
        check([("--x", tmp_path / "new"), ("--y", tmp_path / "d" / ".." / "new")])   # not there yet
    check([("--x", tmp_path / "x"), ("--y", None), ("--z", "")], [("--in", tmp_path / "a"), ("--none", None)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "hard", "soft", "sub"]    # the probe left nothing


def test_outputs_that_are_not_regular_files(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        for path, what in [("/dev/full", "a character device"), ("/dev/null", "a character device"),
                           (tmp_path / "fifo", "a fifo"), (tmp_path / "sock", "a socket"),
                           (tmp_path, "is a directory")]:
            with pytest.raises(errors.OutputError, match=f"cannot write: .*{what}.*\\(--out\\)"):
                check([("--out", path)])
    finally:
        sock.close()


def test_outputs_that_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("")
    for path, reason in [("/proc/r.json", "/proc is not a writable directory"),
                         (tmp_path / "file" / "x.json", "is not a directory"),
                         (tmp_path / ("n" * 300), "file name too long")]:
        with pytest.raises(errors.OutputError, match=re.escape(reason)):
            check([("--ok", tmp_path / "fine.json"), ("--report", path)])
    check([("--deep", tmp_path / "new" / "dir" / "x.json")])         # missing parents are made when written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_directory_outputs(tmp_path):
    (tmp_path / "sm").mkdir()
    with pytest.raises(errors.UsageError, match="--output_dir=.* would replace --saved_model_dir"):
        check([], [("--saved_model_dir", tmp_path / "sm")], directories=[("--output_dir", tmp_path / "sm")])
    with pytest.raises(errors.UsageError, match="would replace"):     # it holds the input
        check([], [("--saved_model_dir", tmp_path / "sm")], directories=[("--output_dir", tmp_path)])
    with pytest.raises(errors.OutputError, match="/proc is not a writable directory"):
        check([], directories=[("--output_dir", "/proc/out")])
    check([], [("--saved_model_dir", tmp_path / "sm")], directories=[("--output_dir", tmp_path / "out")])


def test_the_weights_an_mlir_names(made, tmp_path):
    assert mlir_weights(made / "m.top.mlir") == made / "m_top_f32_weights.npz"
    assert mlir_name(made / "m.top.mlir") == "m"
    os.mkfifo(tmp_path / "f.mlir")                                     # read without blocking: not at all
    for path in (None, made / "m.onnx", tmp_path / "none.mlir", tmp_path / "f.mlir", tmp_path):
        assert mlir_weights(path) is None and mlir_name(path) is None


def test_every_tool_that_writes_files_checks_its_paths():
    for tool in sorted((ROOT / "tools").glob("tftpu_*.py")):
        text = tool.read_text()
        writes = re.search(r'DEFINE_string\("(o|output\w*|mlir|tpu_mlir|model|report|trace|json|html|'
                           r'test_result)"', text) and tool.stem != "tftpu_compare"
        if writes or tool.stem == "tftpu_demo":
            assert "paths=_paths" in text and "output_paths.check(" in text, tool.name


# ---------------------------------------------------------------- through the tools


def _tool(name, *args, cwd):
    t0 = time.perf_counter()
    done = subprocess.run([str(BIN / name), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)
    done.seconds = time.perf_counter() - t0
    return done


DEPLOY = ("tftpu-deploy", "--mlir=m.top.mlir", "--chip=npu1")
TAC = ("tftpu-tac", "m.tflite")

CASES = [
    # one output replacing an input, or two outputs one file
    (("tftpu-transform", "--model_def=m.onnx", "--mlir=m.onnx"), ["--mlir", "--model_def", "m.onnx"]),
    (("tftpu-transform", "--model_def=m.onnx", "--test_input=in.npz", "--test_result=in.npz", "--mlir=t.top.mlir"),
     ["--test_result", "--test_input", "in.npz"]),
    (("tftpu-transform", "--model_def=m.onnx", "--model_name=q", "--test_input=in.npz",
      "--test_result=q_top_f32_weights.npz", "--mlir=q.top.mlir"),
     ["--mlir's weights", "--test_result", "q_top_f32_weights.npz"]),
    ((*DEPLOY, "--tpu_mlir=m.top.mlir"), ["--tpu_mlir", "--mlir", "m.top.mlir"]),
    ((*DEPLOY, "--model=x.out", "--report=x.out"), ["--model", "--report", "x.out"]),
    ((*DEPLOY, "--tpu_mlir=t.tpu.mlir", "--report=m_tpu_f32_weights.npz"),
     ["--tpu_mlir's weights", "--report", "m_tpu_f32_weights.npz"]),
    ((*DEPLOY, "--report=m_top_f32_weights.npz"), ["--report", "--mlir's weights", "m_top_f32_weights.npz"]),
    ((*TAC, "-o", "m.tflite", "--report=m.tflite"), ["-o", "the input", "m.tflite"]),
    ((*TAC, "-o", "o.tflite", "--report=o.tflite"), ["-o", "--report", "o.tflite"]),
    (("tftpu-run", "--model=m.top.mlir", "--input=in.npz", "--output=in.npz"), ["--output", "--input", "in.npz"]),
    (("tftpu-run", "--model=m.top.mlir", "--input=in.npz", "--output=m_top_f32_weights.npz"),
     ["--output", "--model's weights"]),
    (("tftpu-calibrate", "--mlir=m.top.mlir", "--dataset=.", "-o", "m.top.mlir"), ["-o", "--mlir", "m.top.mlir"]),
    (("tftpu-evaluate", "--model=m.top.mlir", "--reference=m.onnx", "--dataset=.", "--json=m.onnx"),
     ["--json", "--reference", "m.onnx"]),
    # not a regular file
    (("tftpu-transform", "--model_def=m.onnx", "--mlir=/dev/full"), ["/dev/full", "character device", "--mlir"]),
    (("tftpu-run", "--model=m.top.mlir", "--input=in.npz", "--output=fifo"), ["fifo", "a fifo", "--output"]),
    # one output that cannot be written: refused before the others are written
    ((*DEPLOY, "--model=m.tpumodel", "--tpu_mlir=t.tpu.mlir", "--report=/proc/r.json"), ["/proc/r.json", "--report"]),
    ((*DEPLOY, "--model=m.tpumodel", "--tpu_mlir=t.tpu.mlir", "--trace=/proc/t.json"), ["/proc/t.json", "--trace"]),
    ((*TAC, "-o", "o.tflite", "--output_mlir=o.mlir", "--report=/proc/r.json"), ["/proc/r.json", "--report"]),
    (("tftpu-evaluate", "--model=m.top.mlir", "--reference=m.onnx", "--dataset=.", "--json=e.json",
      "--html=/proc/e.html"), ["/proc/e.html", "--html"]),
    (("tftpu-convert", "--saved_model_dir=.", "--output_file=o.tflite", "--report=/proc/r.json"),
     ["/proc/r.json", "--report"]),
    (("tftpu-transform", "--model_def=m.onnx", "--mlir=t.top.mlir", "--test_input=in.npz", "--test_result=adir"),
     ["adir", "is a directory", "--test_result"]),
    (("tftpu-calibrate", "--mlir=m.top.mlir", "--dataset=.", "-o", "file/t"), ["file", "not a directory", "-o"]),
    (("tftpu-optimize", "--saved_model_dir=adir", "--output_dir=adir"), ["--output_dir", "--saved_model_dir"]),
    (("tftpu-demo", "--output_dir=/proc/demo"), ["/proc/demo", "--output_dir"]),
]


@pytest.mark.parametrize("args,needles", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_tool_refuses_before_any_work(work, args, needles):
    os.mkfifo(work / "fifo")
    (work / "adir").mkdir()
    (work / "file").write_text("")
    before = _files(work)
    done = _tool(*args, cwd=work)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{args[0]}: error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert _files(work) == before                         # nothing written, nothing replaced
    assert {p.name for p in work.iterdir()} == {*before, "adir", "fifo"}
    assert "tensorflow" not in done.stderr.lower() and done.seconds < 30    # refused before TensorFlow


def test_refusal_precedes_tensorflow(made):
    """The check runs in `cli.run` before TensorFlow is imported (so a refusal costs no start-up)."""
    code = ("import sys\n"
            "from tftpu import cli\n"
            "def paths(args):\n"
            "    from tftpu.utils import output_paths\n"
            "    assert 'tensorflow' not in sys.modules\n"
            f"    output_paths.check([('--out', {str(made / 'in.npz')!r})], [('--in', {str(made / 'in.npz')!r})])\n"
            "cli.run(lambda args: 0, 'doc', argv=['t'], tensorflow=True, paths=paths)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"t: error: --out and --in name the same file: {made / 'in.npz'} (an output would replace an input)")
