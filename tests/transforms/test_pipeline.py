"""Module passes: registry, pipeline strings, verification after each pass, decisions."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from tftpu.errors import InternalError, UsageError
from tftpu.ir import TopBuilder
from tftpu.transforms.pipeline import ModulePass, parse_pipeline, register, registered, run_pipeline
from tftpu.utils.decisions import PassResult


def _net():
    b = TopBuilder("m")
    x = b.input("x", (1, 3, 8, 8))
    y = b.op("Conv", [x, b.weight("w", np.ones((4, 3, 3, 3), np.float32)), b.none()],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "conv")
    y = b.op("Clip", [y], {"min": 0.0, "max": 6.0}, "clip")
    return b.finish([b.op("Permute", [y], {"order": [0, 1, 2, 3]}, "out")])


def test_registry_holds_the_builtin_passes():
    assert {"canonicalize", "convert-layout"} <= set(registered())
    for name, cls in registered().items():
        assert cls.name == name and dataclasses.is_dataclass(cls)


def test_pipeline_strings_parse_with_options():
    passes = parse_pipeline("canonicalize,convert-layout{layout=NCHW kernel_layout=HWIO},canonicalize")
    assert [p.name for p in passes] == ["canonicalize", "convert-layout", "canonicalize"]
    assert passes[1].layout == "NCHW" and passes[1].kernel_layout == "HWIO"
    assert passes[1].spec() == "convert-layout{layout=NCHW kernel_layout=HWIO}"


@pytest.mark.parametrize("spec,needle", [
    ("canonicalise", "unknown TOP pass 'canonicalise'"),
    ("convert-layout{layout=NCWH}", "layout must be NCHW or NHWC"),
    ("convert-layout{colour=blue}", "unknown option 'colour'"),
    ("convert-layout{layout=", "--passes"),
    ("", "no pass"),
])
def test_bad_pipelines_are_usage_errors(spec, needle):
    with pytest.raises(UsageError, match=needle):
        parse_pipeline(spec)


def test_passes_report_their_decisions_and_keep_the_module_valid():
    m = _net()
    results = run_pipeline(m, "canonicalize,convert-layout{layout=NHWC},canonicalize")
    canon, layout, _ = results
    assert {d.where for d in canon.changed} >= {"clip-to-relu", "fuse-relu", "drop-noop"}
    assert layout.detail.layout == "NHWC" and any(d.where == "Conv:NHWC" for d in layout.changed)
    assert all(r.seconds >= 0 for r in results)
    assert "rewrite(s)" in str(canon)


@register
@dataclasses.dataclass
class _Breaks(ModulePass):
    """A deliberately buggy pass: renames a result type so the module no longer verifies."""

    name: ClassVar[str] = "test-breaks-module"

    def apply(self, model) -> PassResult:
        op = next(op for op in model.ops if op.name == "top.Conv")
        op.group = 5                         # 3 input channels cannot split into 5 groups
        return PassResult(self.name)


def test_a_pass_that_breaks_the_module_is_an_internal_error_naming_it():
    with pytest.raises(InternalError, match="pass test-breaks-module: left an invalid module"):
        run_pipeline(_net(), "test-breaks-module")


def test_tool_runs_a_pipeline(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.ones(108, np.float32))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    tool = Path(sys.executable).with_name("tftpu-transform")
    done = subprocess.run([str(tool), f"--model_def={tmp_path / 'm.onnx'}", f"--mlir={tmp_path / 'm.top.mlir'}",
                           "--passes=canonicalize,convert-layout{layout=NHWC},canonicalize"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "convert layout to NHWC" in done.stdout and 'layout = "NHWC"' in (tmp_path / "m.top.mlir").read_text()
    bad = subprocess.run([str(tool), f"--model_def={tmp_path / 'm.onnx'}", f"--mlir={tmp_path / 'n.top.mlir'}",
                          "--passes=canonicalize,fold-everything"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown TOP pass 'fold-everything'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "n.top.mlir").exists()
