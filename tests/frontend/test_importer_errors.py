"""ONNX importer: bad files, unsupported ops (all listed at once), input shape handling."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.frontend.onnx_graphs import conv_bn_relu_net, model, rand, run_ort
from tftpu import errors, frontend
from tftpu.frontend.onnx_to_top import onnx_to_top
from tftpu.interp.top_interpreter import run


def test_missing_file(tmp_path):
    with pytest.raises(errors.ModelFileError, match="no such file"):
        onnx_to_top(tmp_path / "nope.onnx")


@pytest.mark.parametrize("cut", [10, 100, 1000])
def test_truncated_file(tmp_path, cut):
    data = conv_bn_relu_net().SerializeToString()
    p = tmp_path / "t.onnx"
    p.write_bytes(data[:cut])
    with pytest.raises(errors.ModelFileError, match="t.onnx"):
        onnx_to_top(p)


def test_not_onnx(tmp_path):
    p = tmp_path / "x.onnx"
    p.write_text("hello, I am text\n" * 20)
    with pytest.raises(errors.ModelFileError, match="not an ONNX model"):
        frontend.load(p)


def test_unknown_suffix(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"\0" * 10)
    with pytest.raises(errors.ModelFileError, match="unknown model type"):
        frontend.load(p)


def test_all_unsupported_ops_listed_at_once():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok_relu"),
        helper.make_node("TopK", ["a", "k"], ["v", "i"], name="my_topk"),
        helper.make_node("Celu", ["a"], ["b"], name="my_celu"),
        helper.make_node("Pow", ["a", "e"], ["p"], name="my_pow"),
        helper.make_node("Add", ["b", "v"], ["y"], name="downstream"),
    ]
    m = model(nodes, [("x", [2, 4])], [("y", [2, 4]), ("p", [2, 4])],
              {"k": np.array([4], np.int64), "e": np.array(2.5, np.float32)})
    with pytest.raises(errors.UnsupportedOpError) as info:
        onnx_to_top(m, "m")
    msg = str(info.value)
    assert "TopK (my_topk)" in msg and "Celu (my_celu)" in msg and "my_pow" in msg and "exponent 2.5" in msg
    assert "downstream" not in msg and "ok_relu" not in msg
    assert len(info.value.ops) == 3 and info.value.exit_code == 2


def test_unsupported_ops_name_the_file(tmp_path):
    """The unsupported-ops line of a model read from a file starts with the file."""
    m = model([helper.make_node("Hardmax", ["x"], ["y"], name="h")], [("x", [2, 4])], [("y", [2, 4])])
    p = tmp_path / "hard.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(errors.UnsupportedOpError, match=r"hard.onnx: unsupported op: Hardmax \(h\)"):
        frontend.load(p)


def test_custom_domain_op_unsupported():
    nodes = [helper.make_node("FusedConv", ["x"], ["y"], name="fc", domain="com.microsoft")]
    m = model(nodes, [("x", [1, 4])], [("y", [1, 4])])
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(errors.UnsupportedOpError, match=r"com.microsoft.FusedConv \(fc\)"):
        onnx_to_top(m, "m")


@pytest.mark.parametrize("batch", [1, 3])
def test_batch_from_input_shapes(batch):
    m = conv_bn_relu_net()
    top = onnx_to_top(m, "m", [[batch, 3, 32, 32]])
    x = rand(batch, 3, 32, 32)
    want = run_ort(m, {"x": x})["y"]
    np.testing.assert_allclose(run(top, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_dynamic_batch_defaults_to_one():
    top = onnx_to_top(conv_bn_relu_net(), "m")
    assert top.ops[0].output.type.get_shape() == (1, 3, 32, 32)


@pytest.mark.parametrize("shapes,msg", [
    ([[1, 3, 32, 32], [1, 3]], "2 shape"), ([[1, 3, 32]], "rank"), ([[1, 4, 32, 32]], "fixed dim 1")])
def test_bad_input_shapes(shapes, msg):
    with pytest.raises(errors.ShapeError, match=msg):
        onnx_to_top(conv_bn_relu_net(), "m", shapes)


@pytest.mark.parametrize("shapes", [[[1, -3, 32, 32]], [[1, 3, 0, 32]], [], [[1.5, 3]], "x"])
def test_input_shapes_given_as_lists_are_checked_too(shapes):
    """input_shapes from Python (not parsed from a flag) get the same check."""
    with pytest.raises(errors.UsageError, match="positive ints"):
        onnx_to_top(conv_bn_relu_net(), "m", shapes if shapes != "x" else [["a"]])
    with pytest.raises(errors.UsageError, match="positive ints"):
        frontend.load(conv_bn_relu_net(), input_shapes=shapes if shapes != "x" else [["a"]])


def test_a_tflite_models_fixed_shapes_are_checked_against_input_shapes():
    """A .tflite's inputs are fixed: input_shapes that agree pass, others are refused (not ignored)."""
    from tests import material

    path = material.get("face_detection_short_range.tflite")
    assert frontend.load(path, input_shapes=[[1, 128, 128, 3]]).ops[0].output.type.get_shape() == (1, 128, 128, 3)
    with pytest.raises(errors.ShapeError, match="fixed dim 1 = 128"):
        frontend.load(path, input_shapes=[[1, 64, 64, 3]])
    with pytest.raises(errors.ShapeError, match="rank 4"):
        frontend.load(path, input_shapes="[[1,128,128]]")


@pytest.mark.parametrize("text", ["[1,3", "[[1,-3]]", "abc", "[[1.5]]"])
def test_parse_shapes_rejects(text):
    with pytest.raises(errors.UsageError):
        frontend.parse_shapes(text)


def test_parse_shapes():
    assert frontend.parse_shapes("[[1,3,224,224],[1,10]]") == [[1, 3, 224, 224], [1, 10]]
    assert frontend.parse_shapes("[1,3,8,8]") == [[1, 3, 8, 8]]
    assert frontend.parse_shapes(None) is None


def test_output_alias_of_input_keeps_name():
    m = model([helper.make_node("Identity", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])])
    top = frontend.load(m)
    assert top.output_names == ["y"]
    x = rand(2, 3)
    np.testing.assert_array_equal(run(top, {"x": x})["y"], x)


def test_import_is_deterministic():
    a = frontend.load(conv_bn_relu_net(), input_shapes=[[2, 3, 32, 32]])
    b = frontend.load(conv_bn_relu_net().SerializeToString(), input_shapes="[[2,3,32,32]]")
    assert a.text() == b.text()
    from tftpu.ir import npz_bytes
    assert npz_bytes(a.weights) == npz_bytes(b.weights)


def test_int64_input_and_cast():
    g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    top = onnx_to_top(m, "m")
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(run(top, {"x": x})["y"], x.astype(np.float32))


def test_dead_unsupported_node_is_ignored():
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Celu", ["x"], ["unused"], name="dead")]
    top = onnx_to_top(model(nodes, [("x", [2, 3])], [("y", [2, 3])]), "m")
    assert [op.op_name for op in top.ops] == ["Input", "Relu"]


def test_load_unpacks_to_module_and_weights():
    from xdsl.dialects.builtin import ModuleOp
    module, weights = frontend.load(conv_bn_relu_net())
    assert isinstance(module, ModuleOp) and set(weights) == {"bn1_filter", "bn1_bias", "w2", "fc_w", "fc_b"}


def test_unknown_opset_is_refused():
    m = conv_bn_relu_net()
    m.opset_import[0].version = 99
    with pytest.raises(errors.ModelFileError, match="opset 99"):
        onnx_to_top(m)


@pytest.mark.parametrize("text,needle", [("[[1,true,4,4]]", "positive ints"),
                                         ("[[1,3,99999999999,2]]", "out of range"),
                                         ("[[1,3,100000,100000]]", "memory")])
def test_input_shapes_out_of_range_are_refused(text, needle):
    from tftpu.frontend.onnx_load import parse_shapes
    with pytest.raises(errors.UsageError, match=needle):
        parse_shapes(text)


def test_a_node_reading_a_missing_tensor_is_named():
    graph = helper.make_graph([helper.make_node("Relu", ["ghost"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with pytest.raises(errors.ModelFileError, match="Relu 'r' reads tensor 'ghost'"):
        onnx_to_top(m)


def test_dynamic_spatial_size_needs_input_shapes_and_batch_is_assumed_1():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with pytest.raises(errors.ShapeError, match="dimension 2 \\(H\\) is dynamic; give --input_shapes"):
        onnx_to_top(m)
    top = onnx_to_top(m, input_shapes=[[2, 3, 8, 8]])
    assert top.ops[0].results[0].type.get_shape() == (2, 3, 8, 8)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    assert onnx_to_top(m).ops[0].results[0].type.get_shape() == (1, 3, 8, 8)


def test_tflite_of_another_schema_version_is_refused(tmp_path):
    from tests import material
    from tftpu.tac import tflite_io

    model = tflite_io.read(material.get("face_detection_short_range.tflite"))
    model.version = 2
    p = tmp_path / "v2.tflite"
    p.write_bytes(tflite_io.write(model))
    with pytest.raises(errors.ModelFileError, match="schema version 2"):
        frontend.load(p)


def test_all_nan_test_input_is_refused_and_all_nan_tensors_do_not_pass(tmp_path):
    from tftpu.interp.similarity import compare_arrays
    from tftpu.pipelines.transform import transform

    nan = np.full((1, 3, 8, 8), np.nan, np.float32)
    assert not compare_arrays("t", nan, nan).passed
    onnx_path = tmp_path / "m.onnx"
    import onnx
    onnx.save(conv_bn_relu_net(), onnx_path)
    name = conv_bn_relu_net().graph.input[0].name
    shape = [d.dim_value or 1 for d in conv_bn_relu_net().graph.input[0].type.tensor_type.shape.dim]
    with pytest.raises(errors.UsageError, match="NaN"):
        transform(onnx_path, mlir=tmp_path / "m.top.mlir", test_input={name: np.full(shape, np.nan, np.float32)})
    assert not (tmp_path / "m.top.mlir").exists()


def test_a_corrupt_tflite_is_named_before_tensorflow_reads_it(tmp_path):
    """A .tflite with a few bytes of its flatbuffer's tables changed (TensorFlow's own reader, which
    tf2onnx calls, crashed the process on this one) is refused as a ModelFileError naming the file,
    in a subprocess so that a crash fails the test rather than ending the run."""
    import subprocess
    import sys

    from tests import material

    data = bytearray(material.get("face_detection_short_range.tflite").read_bytes())
    for at, byte in ((124, 249), (392, 107), (1052, 32), (1780, 199), (1942, 230), (2037, 60), (2858, 1),
                     (3238, 194)):
        data[at] = byte
    p = tmp_path / "corrupt.tflite"
    p.write_bytes(bytes(data))
    code = ("import sys\nfrom tftpu import errors, frontend\ntry:\n    frontend.load(sys.argv[1])\n"
            "except errors.ModelFileError as e:\n    print('REFUSED', e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("REFUSED") and "corrupt.tflite" in r.stdout and "corrupt or truncated" in r.stdout


def test_a_model_saved_at_an_ir_version_newer_than_onnxruntime_reads_is_checked_all_the_same(tmp_path):
    """onnx.helper stamps the IR version of the pinned onnx (newer than onnxruntime reads): compile
    and the onnxruntime checks read such a model at the newest version onnxruntime knows."""
    import onnx

    import tftpu
    from tftpu.frontend.check import onnx_tensors

    m = conv_bn_relu_net()
    m.ir_version = onnx.IR_VERSION
    p = tmp_path / "new.onnx"
    onnx.save(m, p)
    x = rand(1, 3, 32, 32)
    np.testing.assert_allclose(onnx_tensors(m, {"x": x}, all_tensors=False)["y"], run_ort(conv_bn_relu_net(), {"x": x})["y"],
                               rtol=1e-6, atol=1e-6)
    c = tftpu.compile(p, chip="npu1", quantize="F32")
    assert c.stages[0].passed and "onnxruntime" in c.stages[0].check


def test_a_model_onnxruntime_cannot_load_or_run_is_a_model_file_error():
    """onnxruntime's own failures (a node reading a channel count its weights do not have, an
    unknown custom op) are one-line ModelFileErrors, not onnxruntime's exception types."""
    from tftpu.frontend.check import onnx_tensors

    w = rand(4, 5, 3, 3)
    bad = model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", [1, 3, 8, 8])], [("y", [1, 4, 6, 6])], {"w": w})
    with pytest.raises(errors.ModelFileError, match="onnxruntime cannot (load|run) it: .*channels"):
        onnx_tensors(bad, {"x": rand(1, 3, 8, 8)})
    custom = model([helper.make_node("Mine", ["x"], ["y"], domain="com.acme")], [("x", [1, 4])], [("y", [1, 4])])
    custom.opset_import.append(helper.make_opsetid("com.acme", 1))
    with pytest.raises(errors.ModelFileError, match="onnxruntime cannot load it: .*Mine"):
        onnx_tensors(custom, {"x": rand(1, 4)})


@pytest.mark.parametrize("bad", [np.array([["ab"]]), np.ones((1, 1), np.complex64), np.zeros((1, 1), "datetime64[s]")])
def test_inputs_that_are_not_numbers_are_refused_by_name(bad):
    """Text, complex numbers or dates in an input of the right shape: an InputError naming the input
    (not numpy's ValueError from a cast), from TOP inference and from the onnxruntime checks."""
    from tftpu.frontend.check import bind_inputs
    from tftpu.interp.top_interpreter import TopInterpreter
    from tftpu.utils.inputs import numeric

    arr = np.broadcast_to(bad, (1, 3, 32, 32))
    with pytest.raises(errors.InputError, match="input 'x' holds .*; the model takes real numbers"):
        TopInterpreter(onnx_to_top(conv_bn_relu_net(), "m")).run({"x": arr})
    with pytest.raises(errors.InputError, match="input 'x' holds"):
        bind_inputs([("x", (1, 3, 32, 32), "tensor(float)")], {"x": arr})
    assert numeric("x", np.ones(3, bool)).dtype == bool and numeric("x", [1, 2]).dtype.kind == "i"
