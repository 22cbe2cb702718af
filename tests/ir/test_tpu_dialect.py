"""The TPU dialect's types and verifier: quantized types reject bad scales and zero points (in
Python and in a file, where the error is a tftpu ModelFileError naming file and line and
reason), print -> parse round-trips exactly, and a `.tpu.mlir` whose requantization parameters
or per-axis types its kernels cannot run is refused by the verifier (a ShapeError naming the
op), never left to fail inside a kernel as an internal error."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tftpu import errors
from tftpu.ir import TopBuilder, quant
from tftpu.ir.module import TpuModel, parse_module, print_module
from tftpu.quant import CalibrationTable
from tftpu.transforms.lowering import lower
from xdsl.dialects.builtin import FloatData, StringAttr
from xdsl.utils.exceptions import VerifyException


# ---------------------------------------------------------------- the quant types

@pytest.mark.parametrize("scale", [0.0, -0.5, math.inf, -math.inf, math.nan])
def test_uniform_rejects_bad_scales(scale):
    with pytest.raises(VerifyException, match="finite and positive"):
        quant.uniform("i8", scale, 0)
    with pytest.raises(VerifyException, match="finite and positive"):
        quant.per_axis("i8", 0, [0.5, scale])


@pytest.mark.parametrize("storage,zp", [("i8", 128), ("i8", -129), ("u8", -1), ("u8", 256),
                                        ("i16", 1 << 15), ("i32", 1 << 31)])
def test_uniform_rejects_zero_points_outside_storage(storage, zp):
    with pytest.raises(VerifyException, match="zero points must lie in"):
        quant.uniform(storage, 0.5, zp)


def test_uniform_rejects_bad_storage_expressed_and_counts():
    with pytest.raises(VerifyException, match="storage type"):
        quant.uniform("i4", 0.5)
    with pytest.raises(VerifyException, match="expressed type"):
        quant.uniform("i8", 0.5, expressed="f64")
    with pytest.raises(VerifyException, match="one zero point per scale"):
        quant.per_axis("i8", 0, [0.5, 0.25], [0])
    with pytest.raises(VerifyException, match="one zero point per scale"):
        quant.per_axis("i8", 0, [])


def _module_with(type_text: str) -> str:
    return ('"builtin.module"() ({\n'
            f'  "func.func"() <{{sym_name = "main", function_type = (tensor<2x{type_text}>) -> ()}}> ({{\n'
            f'  ^bb0(%0: tensor<2x{type_text}> loc(unknown)):\n'
            '    "func.return"() : () -> () loc(unknown)\n'
            '  }) : () -> () loc(unknown)\n'
            '}) : () -> () loc(unknown)\n')


@pytest.mark.parametrize("bad,reason", [
    ("!quant.uniform<i8:f32, -0.5:0>", "finite and positive"),
    ("!quant.uniform<i8:f32, 0.0:0>", "finite and positive"),
    ("!quant.uniform<i8:f32, 0.5:128>", "zero points must lie in"),
    ("!quant.uniform<u8:f32, 0.5:-1>", "zero points must lie in"),
    ("!quant.uniform<i9:f32, 0.5:0>", "storage type"),
    ("!quant.uniform<i8:f64, 0.5:0>", "expressed type"),
    ("!quant.uniform<i8:f32:0, {}>", ""),
    ("!quant.uniform<i8:f32, inf:0>", ""),
    ("!quant.uniform<i8:f32, 0.5:true>", ""),
    ("!quant.calibrated<f32<2.0:1.0>>", "min <= max"),
])
def test_bad_types_in_a_file_are_model_file_errors_with_the_reason(bad, reason):
    with pytest.raises(errors.ModelFileError) as e:
        parse_module(_module_with(bad), "bad.tpu.mlir")
    msg = str(e.value)
    assert msg.startswith("bad.tpu.mlir") and ":2:" in msg       # file and line
    assert reason in msg


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.floats(min_value=1e-30, max_value=1e30, allow_nan=False, allow_infinity=False),
       st.integers(-128, 127), st.sampled_from(["f32", "f16", "bf16"]))
def test_uniform_prints_and_parses_back_to_the_same_bits(scale, zp, expressed):
    t = quant.uniform("i8", scale, zp, expressed)
    text = _module_with(f"!quant.uniform<{t.storage}:{t.expressed}, {quant._fmt(scale)}:{zp}>")
    module = parse_module(text)
    back = module.body.block.first_op.function_type.inputs.data[0].element_type
    assert back == t and back.scale == scale and back.zero_point == zp
    assert print_module(module) == print_module(parse_module(print_module(module)))


def test_per_axis_and_calibrated_round_trip():
    t = quant.per_axis("i8", 1, [0.1, 1e-7, 3.0], [0, -1, 5])
    c = quant.CalibratedQuantType(StringAttr("f32"), FloatData(-3.5), FloatData(4.25))
    for et, text in ((t, "!quant.uniform<i8:f32:1, {0.1:0,1.0e-07:-1,3.0:5}>"), (c, "!quant.calibrated<f32<-3.5:4.25>>")):
        module = parse_module(_module_with(text))
        back = module.body.block.first_op.function_type.inputs.data[0].element_type
        assert back == et
        assert text in print_module(module)


# ---------------------------------------------------------------- the verifier on INT8 ops

def _int8_conv_text():
    rng = np.random.default_rng(0)
    b = TopBuilder("m")
    x = b.input("x", (1, 3, 6, 6))
    y = b.op("Conv", [x, b.weight("w", rng.normal(size=(4, 3, 3, 3)).astype(np.float32)),
                      b.weight("b", rng.normal(size=(4,)).astype(np.float32))], {"kernel_shape": [3, 3]}, "y")
    z = b.op("Add", [y, b.op("Sigmoid", [y], {}, "s")], {}, "z")
    model = b.finish([z])
    table = CalibrationTable({"x": (3.0, -3, 3), "y": (8.0, -8, 8), "s": (1.0, 0, 1), "z": (9.0, -8, 9)})
    tm, _ = lower(model, "npu1", "INT8", table)
    return tm


TM = None


def _load(text):
    global TM
    m = TpuModel(parse_module(text, "t.tpu.mlir"), dict(TM.weights))
    m.verify()
    return m


@pytest.mark.parametrize("edit,reason", [
    (lambda t: re.sub(r"multiplier = \[\d+ : i64, ", "multiplier = [", t, count=1), "as many multipliers as rshifts"),
    (lambda t: re.sub(r", multiplier = \[[^\]]*\], rshift = \[[^\]]*\]", "", t, count=1), "at least one"),
    (lambda t: re.sub(r"rshift = \[\d+ :", "rshift = [40 :", t, count=1), "rshifts in [-31, 31]"),
    (lambda t: re.sub(r"rshift = \[\d+ :", "rshift = [-32 :", t, count=1), "rshifts in [-31, 31]"),
    (lambda t: re.sub(r"multiplier = \[\d+ :", "multiplier = [-5 :", t, count=1), "[0, 2**31)"),
    (lambda t: re.sub(r"multiplier = \[\d+ :", "multiplier = [2147483648 :", t, count=1), "[0, 2**31)"),
    (lambda t: re.sub(r"(4x3x3x3x!quant.uniform<i8:f32:0, \{)[^,]+,", r"\1", t), "one scale per channel"),
    (lambda t: t.replace("4x3x3x3x!quant.uniform<i8:f32:0,", "4x3x3x3x!quant.uniform<i8:f32:7,"),
     "one scale per channel"),
    (lambda t: re.sub(r'("tpu.Add".*?)rshift = \[\d+ : i64\]', r"\1rshift = [40 : i64]", t), "Add needs"),
    (lambda t: re.sub(r'("tpu.Add".*?)multiplier = \[\d+ : i64, ', r"\1multiplier = [", t), "Add needs"),
    (lambda t: re.sub(r'("tpu.Add".*?)multiplier = \[\d+ :', r"\1multiplier = [40000 :", t), "Add needs"),
])
def test_verifier_refuses_requantization_its_kernels_cannot_run(edit, reason):
    global TM
    TM = TM or _int8_conv_text()
    text = TM.text()
    _load(text)                                  # the original is fine
    bad = edit(text)
    assert bad != text
    with pytest.raises(errors.ShapeError) as e:
        _load(bad)
    assert reason in str(e.value) and "tpu." in str(e.value)


def test_a_requantizing_cast_needs_its_multiplier():
    b = TopBuilder("m")
    x = b.input("x", (1, 4))
    y = b.op("Concat", [b.op("Neg", [x], {}, "n"), b.op("Abs", [x], {}, "a")], {"axis": 1}, "y")
    model = b.finish([y])
    table = CalibrationTable({"x": (3.0, -3, 3), "n": (3.0, -3, 3), "a": (2.0, 0, 2), "y": (4.0, -3, 3)})
    tm, _ = lower(model, "npu1", "INT8", table)
    text = tm.text()
    assert re.search(r'"tpu.Cast"\([^)]*\) \{multiplier', text)
    bad = re.sub(r'("tpu.Cast"\([^)]*\)) \{multiplier = \[[^\]]*\], rshift = \[[^\]]*\]\}', r"\1", text, count=1)
    assert bad != text
    with pytest.raises(errors.ShapeError, match="Cast needs as many multipliers"):
        TpuModel(parse_module(bad), dict(tm.weights)).verify()
