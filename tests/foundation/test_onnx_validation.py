"""ONNX nodes are checked against their op's schema and rank before conversion (issue 11, item 5),
and external data is read only from the model's own folder.

Every malformed node is a ModelFileError naming the file and the node; a converter that still
fails is an InternalError naming the node (a bug), never a bare IndexError/TypeError.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.frontend.onnx_graphs import conv_bn_relu_net, model, rand
from tftpu import errors
from tftpu.frontend.onnx_to_top import onnx_to_top

BIN = Path(sys.executable).parent
X = [("x", [1, 3, 8, 8])]


def _conv(**attrs):
    return model([helper.make_node("Conv", ["x", "w"], ["y"], name="bad", **attrs)], X, [("y", None)],
                 {"w": rand(4, 3, 3, 3)})


MALFORMED = {
    "kernel_shape of rank 3 on a 2-D conv": (_conv(kernel_shape=[3, 3, 3]), "kernel_shape"),
    "pads of the wrong length": (_conv(pads=[1, 1]), "pads"),
    "strides of the wrong type": (_conv(strides=1.5), "strides"),
    "dilations of the wrong length": (_conv(dilations=[1, 1, 1]), "dilations"),
    "an attribute the op does not have": (_conv(colour=3), "colour"),
    "a pool window of rank 1 on 2-D input": (
        model([helper.make_node("MaxPool", ["x"], ["y"], name="bad", kernel_shape=[3])], X, [("y", None)]),
        "kernel_shape"),
    "a perm that is not a permutation": (
        model([helper.make_node("Transpose", ["x"], ["y"], name="bad", perm=[0, 0, 1, 2])], X, [("y", None)]),
        "perm"),
    "a perm of the wrong length": (
        model([helper.make_node("Transpose", ["x"], ["y"], name="bad", perm=[0, 1])], X, [("y", None)]),
        "perm"),
    "an axis out of range": (
        model([helper.make_node("Concat", ["x", "x"], ["y"], name="bad", axis=7)], X, [("y", None)]), "axis"),
    "a softmax axis out of range": (
        model([helper.make_node("Softmax", ["x"], ["y"], name="bad", axis=-9)], X, [("y", None)]), "axis"),
    "a missing required input": (
        model([helper.make_node("BatchNormalization", ["x", "s", "b", "m"], ["y"], name="bad")], X, [("y", None)],
              {k: np.ones(3, np.float32) for k in "sbm"}), "input size"),
    "operands that do not fit": (
        model([helper.make_node("Gemm", ["f", "w"], ["y"], name="bad")], [("f", [1, 8])], [("y", None)],
              {"w": rand(5, 10)}), "bad"),
    "a declared output shape the node cannot compute": (
        model([helper.make_node("Relu", ["x"], ["y"], name="bad")], X, [("y", [1, 3, 8, 9])]), "declared"),
    "a split that does not add up": (
        model([helper.make_node("Split", ["x", "s"], ["a", "b"], name="bad", axis=1)], X, [("a", None), ("b", None)],
              {"s": np.array([1, 1], np.int64)}), "bad"),
    "a squeeze of an axis that is not 1": (
        model([helper.make_node("Squeeze", ["x", "a"], ["y"], name="bad")], X, [("y", None)],
              {"a": np.array([2], np.int64)}), "bad"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_node_is_a_model_file_error_naming_file_and_node(case, tmp_path):
    m, needle = MALFORMED[case]
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(errors.ModelFileError) as info:
        onnx_to_top(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "'bad'" in msg and needle in msg, msg
    assert "\n" not in msg


def test_every_attribute_length_flip_of_a_real_graph_is_refused_or_imported():
    """Each window attribute of each node of a small net, made one longer and one shorter: a
    ModelFileError naming the node, never an IndexError from a converter."""
    base = conv_bn_relu_net()
    seen = 0
    for k, node in enumerate(base.graph.node):
        for j, a in enumerate(node.attribute):
            if a.type != onnx.AttributeProto.INTS:
                continue
            for ints in (list(a.ints) + [1], list(a.ints)[:-1]):
                m = onnx.ModelProto.FromString(base.SerializeToString())
                del m.graph.node[k].attribute[j].ints[:]
                m.graph.node[k].attribute[j].ints.extend(ints)
                with pytest.raises(errors.ModelFileError, match=f"'{node.name}'"):
                    onnx_to_top(m)
                seen += 1
    assert seen >= 8


def test_a_converter_that_still_fails_is_an_internal_error_naming_the_node(monkeypatch):
    from tftpu.frontend import onnx_to_top as mod

    def broken(imp, node, a):
        return [][1]

    monkeypatch.setitem(mod.CONVERTERS, "onnx.Relu", broken)
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r1")], X, [("y", None)])
    with pytest.raises(errors.InternalError, match="ONNX Relu 'r1': converter failed: IndexError") as info:
        onnx_to_top(m)
    assert not isinstance(info.value, errors.TftpuError) and info.value.exit_code == 70


def test_a_constant_node_onnx_cannot_evaluate_is_named(monkeypatch):
    from onnx.reference import ReferenceEvaluator

    def fails(self, *args, **kwargs):
        raise ValueError("shapes not aligned")

    monkeypatch.setattr(ReferenceEvaluator, "run", fails)
    nodes = [helper.make_node("Add", ["c", "c"], ["d"], name="fold_me"), helper.make_node("Add", ["x", "d"], ["y"])]
    m = model(nodes, [("x", [3])], [("y", None)], {"c": np.ones(3, np.float32)})
    with pytest.raises(errors.ModelFileError, match="Add 'fold_me': cannot be computed from its constant inputs"):
        onnx_to_top(m)


def test_unknown_element_type_is_named(tmp_path):
    m = model([helper.make_node("Relu", ["x"], ["y"])], X, [("y", None)])
    m.graph.input[0].type.tensor_type.elem_type = 108
    with pytest.raises(errors.ModelFileError, match="unknown element type 108"):
        onnx_to_top(m)


def test_tool_on_a_malformed_node_is_one_line_exit_2_and_writes_nothing(tmp_path):
    m, _ = MALFORMED["pads of the wrong length"]
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    out = tmp_path / "out"
    done = subprocess.run([str(BIN / "tftpu-transform"), f"--model_def={path}", f"--mlir={out / 'm.top.mlir'}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert str(path) in done.stderr and "'bad'" in done.stderr and "pads" in done.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


# ---------------------------------------------------------------- external data

def _external(tmp_path, location="w.bin") -> Path:
    """A model whose weight `w` lives in an external file named `location` (written by onnx)."""
    m = _conv(kernel_shape=[3, 3])
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0)
    if location != "w.bin":
        m = onnx.load_model(str(path), load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        path.write_bytes(m.SerializeToString())
    return path


def test_external_data_in_the_model_folder_is_read(tmp_path, monkeypatch):
    path = _external(tmp_path)
    monkeypatch.chdir(tmp_path)  # not the model's folder: the data is found beside the model
    top = onnx_to_top(path)
    np.testing.assert_array_equal(top.weights["w"], rand(4, 3, 3, 3))


@pytest.mark.parametrize("where,needle", [
    ("missing.bin", "no such file"),
    ("../outside.bin", "outside the model's folder"),
    ("sub/../../outside.bin", "outside the model's folder"),
    ("ABS", "not a file name relative"),
    ("link.bin", "outside the model's folder"),
    ("short.bin", "past the end"),
    ("adir", "not a regular file"),
])
def test_external_data_missing_or_outside_the_folder_is_refused(tmp_path, where, needle):
    secret = tmp_path / "outside.bin"
    secret.write_bytes(rand(4, 3, 3, 3).tobytes())
    location = str(secret) if where == "ABS" else where
    path = _external(tmp_path, location)
    if where == "link.bin":
        (path.parent / "link.bin").symlink_to(secret)
    if where == "short.bin":
        (path.parent / "short.bin").write_bytes(b"\0" * 10)
    if where == "adir":
        (path.parent / "adir").mkdir()
    with pytest.raises(errors.ModelFileError, match=needle) as info:
        onnx_to_top(path)
    assert str(path) in str(info.value) and "'w'" in str(info.value)


def test_external_data_without_a_path_is_refused(tmp_path):
    path = _external(tmp_path)
    m = onnx.load_model(str(path), load_external_data=False)
    with pytest.raises(errors.ModelFileError, match="give the model's path"):
        onnx_to_top(m)
    with pytest.raises(errors.ModelFileError, match="give the model's path"):
        onnx_to_top(m.SerializeToString())


def test_tool_refuses_external_data_outside_the_folder_in_one_line(tmp_path):
    (tmp_path / "outside.bin").write_bytes(rand(4, 3, 3, 3).tobytes())
    path = _external(tmp_path, "../outside.bin")
    np.savez(tmp_path / "in.npz", x=rand(1, 3, 8, 8))
    before = sorted(os.listdir(path.parent))
    for tool, args in (("tftpu-transform", [f"--model_def={path}", f"--mlir={path.parent / 'm.top.mlir'}"]),
                       ("tftpu-run", [f"--model={path}", f"--input={tmp_path / 'in.npz'}",
                                      f"--output={path.parent / 'o.npz'}"])):
        done = subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (tool, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "outside the model's folder" in done.stderr, done.stderr
        assert sorted(os.listdir(path.parent)) == before
