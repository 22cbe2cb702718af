"""tftpu.pipelines.transform: the library form of tftpu-transform."""

import numpy as np
import onnx
import pytest

from tests.frontend.onnx_graphs import conv_bn_relu_net, rand
from tftpu import errors, ir
from tftpu.pipelines.transform import transform


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "net.onnx"
    onnx.save(conv_bn_relu_net(), path)
    return path


def test_transform_saves_and_checks(net, tmp_path):
    x = {"x": rand(2, 3, 32, 32, seed=5)}
    r = transform(net, name="net", input_shapes=[[2, 3, 32, 32]], mlir=tmp_path / "net.top.mlir",
                  test_input=x, test_result=tmp_path / "top.npz")
    assert r.passed and r.worst.cosine > 0.99999 and len(r.rows) == 7
    assert [name for name, _ in r.checks] == ["onnxruntime"]
    assert r.ops_before > len(r.model.ops)          # BatchNorm folded, Relu fused
    assert ir.load(r.mlir).name == "net" and r.weights.exists()
    assert "y" in ir.load_npz(tmp_path / "top.npz")


def test_transform_tolerance_and_layout(net, tmp_path):
    x = {"x": rand(2, 3, 32, 32, seed=5)}
    r = transform(net, input_shapes=[[2, 3, 32, 32]], layout="NHWC", mlir=tmp_path / "n.top.mlir",
                  test_input=x, tolerance=(1.0, 1.0))
    assert r.layout_report is not None and r.failed and not r.passed
    np.testing.assert_array_equal(sorted(r.model.output_names), ["y"])


def test_transform_rejects_bad_layout_and_mlir(net, tmp_path):
    with pytest.raises(errors.UsageError, match="layout"):
        transform(net, layout="NCWH", mlir=tmp_path / "x.top.mlir")
    r = transform(net, input_shapes=[[2, 3, 32, 32]], mlir=tmp_path / "m.top.mlir")
    with pytest.raises(errors.UsageError, match="an .mlir .*is not a source to import"):
        transform(r.mlir)
