"""TOP dialect: every op builds, verifies, round-trips byte-identically; verifiers reject bad ops."""

from __future__ import annotations

import numpy as np
import pytest

from tftpu import errors
from tftpu import ir
from tftpu.ir import TopBuilder, top
from tftpu.ir.attrs import tensor_type


def rand(*shape):
    return np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)


def zoo() -> ir.TopModel:
    """One module holding every TOP op (at least once), NCHW and NHWC variants."""
    b = TopBuilder("zoo")
    x = b.input("x", (1, 4, 8, 8))
    v = b.input("v", (2, 6), "f32")
    n = b.none()
    c = b.op("Conv", [x, b.weight("w", rand(8, 2, 3, 3)), b.weight("b", rand(8))],
             {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2], "group": 2,
              "do_relu": True, "relu_limit": 6.0}, "conv")
    hw = b.op("Permute", [x], {"order": [0, 2, 3, 1]}, "nhwc")
    b.op("Conv", [hw, b.weight("w_hwio", rand(3, 3, 4, 5)), n],
         {"kernel_shape": [3, 3], "layout": "NHWC", "kernel_layout": "HWIO"}, "conv_nhwc")
    b.op("Conv", [b.op("Reshape", [x], {"shape": [1, 4, 64]}, "x1d"), b.weight("w1", rand(2, 4, 5)), n],
         {"kernel_shape": [5], "pads": [2, 2]}, "conv1d")
    d = b.op("Deconv", [c, b.weight("wd", rand(8, 3, 2, 2)), n],
             {"kernel_shape": [2, 2], "strides": [2, 2], "output_padding": [1, 0]}, "deconv")
    mm = b.op("MatMul", [v, b.weight("m", rand(4, 6)), b.weight("mb", rand(4))], {"right_transpose": True}, "mm")
    for name in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        b.op(name, [mm, b.weight(f"k_{name}", rand(1, 4))], {}, name.lower())
    b.op("PRelu", [d, b.weight("slope", rand(1, 3, 1, 1))], {}, "prelu")
    for name in ("Sigmoid", "HardSwish", "SiLU", "Tanh", "Exp", "Log", "Sqrt", "Erf", "Abs", "Neg", "GELU",
                 "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Softsign"):
        b.op(name, [mm], {}, name.lower())
    b.op("Relu", [mm], {"relu_limit": 6.0}, "relu")
    b.op("Clip", [mm], {"min": -1.0, "max": 1.0}, "clip")
    b.op("LeakyRelu", [mm], {"alpha": 0.1}, "leaky")
    b.op("HardSigmoid", [mm], {"alpha": 0.2, "beta": 0.5}, "hsig")
    b.op("Softmax", [mm], {"axis": 1, "log": True}, "softmax")
    b.op("MaxPool", [c], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": True}, "maxpool")
    b.op("AvgPool", [c], {"kernel_shape": [2, 2], "strides": [2, 2], "count_include_pad": True}, "avgpool")
    b.op("GlobalAvgPool", [c], {}, "gap")
    b.op("GlobalMaxPool", [hw], {"keepdims": False, "layout": "NHWC"}, "gmp")
    bn = b.op("BatchNorm", [c, *[b.weight(f"bn{i}", np.abs(rand(8)) + 0.1) for i in range(4)]], {"epsilon": 1e-3},
              "bn")
    b.op("Scale", [bn, b.weight("sc", rand(8)), b.weight("sb", rand(8))], {}, "scale")
    b.op("LayerNorm", [c, b.weight("ln_g", rand(1, 8, 1, 1)), b.none()], {"axes": [1], "eps": 1e-5}, "layernorm")
    b.op("Concat", [c, bn], {"axis": 1}, "concat")
    b.op("Flatten", [c], {"start_dim": 1, "end_dim": 2}, "flatten")
    b.op("Pad", [x], {"paddings": [0, 0, 1, 2, 0, 0, 3, 0], "mode": "reflect"}, "pad")
    b.op("Slice", [x], {"starts": [1, -1], "ends": [3, -9], "steps": [1, -2], "axes": [1, 3]}, "slice")
    b.op("Split", [c], {"axis": 1, "split_size": [3, 5]}, ["split0", "split1"])
    b.op("Squeeze", [b.op("Unsqueeze", [mm], {"axes": [0, 3]}, "unsq")], {"axes": [0]}, "sq")
    b.op("Resize", [x], {"mode": "linear", "coord_mode": "align_corners", "target_shape": [13, 5]}, "resize")
    for name in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum"):
        b.op(name, [x], {"axes": [2, 3], "keepdims": name != "ReduceSum"}, name.lower())
    b.op("SpaceToDepth", [x], {"block_size": 2}, "s2d")
    b.op("DepthToSpace", [x], {"block_size": 2, "mode": "CRD"}, "d2s")
    b.op("Cast", [x], {"to": "f16"}, "cast")
    b.op("Gather", [x, b.weight("idx", np.array([3, 0], np.int64))], {"axis": 1}, "gather")
    return b.finish([c, d])


def test_zoo_covers_every_op():
    model = zoo()
    used = {op.name for op in model.ops}
    assert used == set(ir.OPS_BY_NAME)


def test_zoo_verifies_and_round_trips_byte_identical():
    model = zoo()
    model.verify()
    text = model.text()
    again = ir.TopModel(ir.parse_module(text), model.weights)
    again.verify()
    assert again.text() == text
    assert 'loc("conv")' in text and 'loc(fused["split0", "split1"])' in text
    assert "dense<" not in text, "weights must live in the .npz, not the .mlir"


def test_every_op_has_kernel_and_flops():
    from tftpu.interp.kernels import KERNELS
    from tftpu.ir.top import FLOPS
    model = zoo()
    for name in ir.OPS_BY_NAME:
        if name in ("top.Input", "top.Weight", "top.None"):
            continue
        assert name in KERNELS and name in FLOPS, name
    conv = next(op for op in model.ops if op.loc == "conv")
    # 1x8x4x6 outputs, each 2 in-channels x 3x3 taps, multiply + add
    assert conv.flops() >= 2 * 8 * 4 * 6 * 2 * 9
    assert model.flops() > conv.flops()


def test_save_and_load_are_deterministic(tmp_path):
    model = zoo()
    m1, w1 = model.save(tmp_path / "a" / "zoo.top.mlir")
    m2, w2 = zoo().save(tmp_path / "b" / "zoo.top.mlir")
    assert m1.read_bytes() == m2.read_bytes() and w1.read_bytes() == w2.read_bytes()
    loaded = ir.load(m1)
    assert loaded.text() == model.text()
    assert sorted(loaded.weights) == sorted(model.weights)
    for k, v in model.weights.items():
        np.testing.assert_array_equal(loaded.weights[k], v)
        assert loaded.weights[k].dtype == v.dtype


def test_npz_writer_matches_numpy_reader_and_is_stable():
    arrays = {"b": np.arange(6, dtype=np.int64).reshape(2, 3), "a/x:0": np.float32(1.5) * np.ones(3, np.float32),
              "s": np.array(2.0, np.float32)}
    data = ir.npz_bytes(arrays)
    assert data == ir.npz_bytes(dict(reversed(list(arrays.items()))))
    import io
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        assert sorted(z.files) == sorted(arrays)
        for k in arrays:
            np.testing.assert_array_equal(z[k], arrays[k])
            assert z[k].shape == arrays[k].shape


# ------------------------------------------------------------------ verifiers

BAD_OPS = {
    "conv_group_mismatch": ("Conv", lambda b, x: [x, b.weight("w", rand(8, 3, 3, 3)), b.none()],
                            {"kernel_shape": [3, 3], "group": 2}, None),
    "conv_kernel_shape": ("Conv", lambda b, x: [x, b.weight("w", rand(8, 4, 3, 3)), b.none()],
                          {"kernel_shape": [5, 5]}, None),
    "conv_bias_size": ("Conv", lambda b, x: [x, b.weight("w", rand(8, 4, 1, 1)), b.weight("b", rand(7))],
                       {"kernel_shape": [1, 1]}, None),
    "conv_pads_len": ("Conv", lambda b, x: [x, b.weight("w", rand(8, 4, 1, 1)), b.none()],
                      {"kernel_shape": [1, 1], "pads": [1, 1]}, None),
    "conv_wrong_result": ("Conv", lambda b, x: [x, b.weight("w", rand(8, 4, 3, 3)), b.none()],
                          {"kernel_shape": [3, 3]}, [(1, 8, 8, 8)]),
    "conv_bad_layout": ("Conv", lambda b, x: [x, b.weight("w", rand(8, 4, 1, 1)), b.none()],
                        {"kernel_shape": [1, 1], "layout": "NCWH"}, [(1, 8, 8, 8)]),
    "none_input": ("Relu", lambda b, x: [b.none()], {}, [(1,)]),
    "add_no_broadcast": ("Add", lambda b, x: [x, b.weight("c", rand(3))], {}, [(1, 4, 8, 8)]),
    "reshape_count": ("Reshape", lambda b, x: [x], {"shape": [1, 100]}, None),
    "permute_not_perm": ("Permute", lambda b, x: [x], {"order": [0, 1, 1, 2]}, None),
    "split_sum": ("Split", lambda b, x: [x], {"axis": 1, "split_size": [1, 2]}, [(1, 1, 8, 8), (1, 2, 8, 8)]),
    "squeeze_non_one": ("Squeeze", lambda b, x: [x], {"axes": [1]}, [(1, 8, 8)]),
    "softmax_axis": ("Softmax", lambda b, x: [x], {"axis": 4}, [(1, 4, 8, 8)]),
    "cast_target": ("Cast", lambda b, x: [x], {"to": "f8"}, [(1, 4, 8, 8)]),
    "resize_mode": ("Resize", lambda b, x: [x], {"mode": "cubic", "target_shape": [4, 4]}, [(1, 4, 4, 4)]),
    "s2d_indivisible": ("SpaceToDepth", lambda b, x: [x], {"block_size": 3}, [(1, 36, 2, 2)]),
    "pool_kernel_rank": ("MaxPool", lambda b, x: [x], {"kernel_shape": [2]}, [(1, 4, 4, 4)]),
    "pad_len": ("Pad", lambda b, x: [x], {"paddings": [1, 1]}, [(1, 4, 8, 8)]),
    "matmul_k": ("MatMul", lambda b, x: [x, b.weight("w", rand(7, 3)), b.none()], {}, [(1, 4, 8, 3)]),
}


@pytest.mark.parametrize("case", sorted(BAD_OPS))
def test_verifier_rejects(case):
    op_name, operands, attrs, results = BAD_OPS[case]
    b = TopBuilder("bad")
    x = b.input("x", (1, 4, 8, 8))
    ops = operands(b, x)
    types = None if results is None else [tensor_type(s) for s in results]
    with pytest.raises(errors.ShapeError, match="bad_op"):
        y = b.op(op_name, ops, attrs, "bad_op", result_types=types)
        b.finish([y if not isinstance(y, list) else y[0]]).verify()


def test_verifier_message_names_op_and_location():
    b = TopBuilder("bad")
    x = b.input("x", (1, 4, 8, 8))
    y = b.op("Relu", [x], {}, "my_relu", result_types=[tensor_type((1, 4, 8, 9))])
    with pytest.raises(errors.ShapeError, match=r"top\.Relu at 'my_relu'.*\(1, 4, 8, 9\)"):
        b.finish([y]).verify()


@pytest.mark.parametrize("old,new,msg", [
    ("{order = [0 : i64, 2 : i64, 3 : i64, 1 : i64]}", "{ordr = [0 : i64]}", "'order' expected"),
    ("{order = [0 : i64, 2 : i64, 3 : i64, 1 : i64]}", "{order = [0 : i64, 2 : i64, 3 : i64, 1 : i64], x = 1}",
     "unknown attribute"),
    ("{axis = 1 : i64, log = true}", '{axis = 1 : i64, log = "yes"}', "top.Softmax at 'softmax'"),
])
def test_bad_attributes_rejected_when_parsed(old, new, msg):
    model = zoo()
    text = model.text()
    assert old in text
    with pytest.raises(errors.ShapeError, match=msg):
        ir.TopModel(ir.parse_module(text.replace(old, new, 1)), model.weights).verify()


def test_parse_error_is_model_file_error():
    with pytest.raises(errors.ModelFileError, match="not valid MLIR"):
        ir.parse_module('"builtin.module"() ({ %0 = "top.Relu"(', "broken.mlir")


def test_load_checks_weights(tmp_path):
    model = zoo()
    mlir, weights = model.save(tmp_path / "zoo.top.mlir")
    arrays = ir.load_npz(weights)
    arrays["w"] = arrays["w"][:4]
    ir.save_npz(weights, arrays)
    with pytest.raises(errors.ShapeError, match="weight 'w'"):
        ir.load(mlir)
    del arrays["w"]
    ir.save_npz(weights, arrays)
    with pytest.raises(errors.ShapeError, match="'w' is missing"):
        ir.load(mlir)
    weights.unlink()
    with pytest.raises(errors.ModelFileError, match="no such file"):
        ir.load(mlir)
    with pytest.raises(errors.ModelFileError, match="no such file"):
        ir.load(tmp_path / "nothing.mlir")


def test_load_npz_rejects_garbage(tmp_path):
    p = tmp_path / "x.npz"
    p.write_bytes(b"not a zip")
    with pytest.raises(errors.ModelFileError):
        ir.load_npz(p)


def test_top_op_attrs_defaults():
    b = TopBuilder("m")
    x = b.input("x", (1, 2, 5))
    y = b.op("Conv", [x, b.weight("w", rand(3, 2, 3)), b.none()], {"kernel_shape": [3]}, "c")
    op = y.owner
    a = op.attrs()
    assert a["strides"] == [1] and a["pads"] == [0, 0] and a["dilations"] == [1] and a["group"] == 1
    assert a["do_relu"] is False and a["relu_limit"] == -1.0 and a["layout"] == "NCHW"
    assert isinstance(op, top.Conv)


def test_weight_key_is_its_own():
    """A weight's file key may differ from its tensor name, so one tensor can own several arrays."""
    b = TopBuilder("k")
    x = b.input("x", (1, 4))
    w8 = b.weight("scale", np.arange(4, dtype=np.int8), key="scale_int8")
    w32 = b.weight("scale_bias", np.arange(4, dtype=np.int32), key="scale_bias_int32")
    y = b.op("Add", [b.op("Cast", [w8], {"to": "f32"}, "c8"), x], {}, "y")
    m = b.finish([b.op("Add", [b.op("Cast", [w32], {"to": "f32"}, "c32"), y], {}, "z")])
    m.verify()
    assert sorted(m.weights) == ["scale_bias_int32", "scale_int8"]
    keys = {op.loc: op.key for op in m.ops if isinstance(op, ir.top.Weight)}
    assert keys == {"scale": "scale_int8", "scale_bias": "scale_bias_int32"}
    again = ir.TopModel(ir.parse_module(m.text()), dict(m.weights))
    again.verify()
    assert again.text() == m.text() and '"scale_int8"' in m.text()
    plain = TopBuilder("p")
    plain.weight("w", np.ones(2, np.float32))
    assert "key" not in plain.finish([plain.input("x", (2,))]).text()


@pytest.mark.parametrize("name", ["modèle", "模型", "мод\\ель", 'q"uote', "a/b", "../up", "tab\tnl", "x" * 300])
def test_names_round_trip_in_any_script(tmp_path, name):
    """Model, tensor and weight names round-trip for any Unicode; files stay beside the .mlir."""
    import os
    from tftpu.interp.top_interpreter import run

    b = TopBuilder(name)
    x = b.input(f"entrée {name}", (1, 4))
    y = b.op("Add", [x, b.weight(f"poids {name}", np.ones(4, np.float32))], {}, f"sortie/{name}")
    model = b.finish([b.op("Relu", [y], {}, f"é{name}")])
    (tmp_path / "sub").mkdir()
    mlir, weights = model.save(tmp_path / "sub" / "m.top.mlir")
    assert weights.parent == mlir.parent and len(weights.name.encode()) < 200
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)                       # found relative to the .mlir, not the cwd
        again = ir.load("sub/m.top.mlir")
    finally:
        os.chdir(cwd)
    assert again.name == name and again.input_names == [f"entrée {name}"]
    assert again.text() == model.text()
    out = run(again, {f"entrée {name}": np.full((1, 4), -3, np.float32)})
    np.testing.assert_array_equal(out[f"é{name}"], np.zeros((1, 4), np.float32))


def test_weights_elsewhere_are_named_relative_to_the_mlir(tmp_path):
    b = TopBuilder("m")
    x = b.input("x", (1, 2))
    model = b.finish([b.op("Add", [x, b.weight("w", np.ones(2, np.float32))], {}, "y")])
    (tmp_path / "a").mkdir()
    (tmp_path / "w").mkdir()
    model.save(tmp_path / "a" / "m.top.mlir", tmp_path / "w" / "weights.npz")
    assert model.weight_file == "../w/weights.npz"
    assert ir.load(tmp_path / "a" / "m.top.mlir").weights["w"].shape == (2,)
