"""TOP -> TPU lowering properties, over every op the ONNX importer produces (the one-node
models of tests/frontend/test_onnx_ops.py) on both chips in every mode they run:

- each lowers, verifies and runs; an op INT8 declines runs in the chip's float mode (edge16 has
  no F32: F16) and the report says why; no compute op of edge16 touches f32;
- every INT8 op and cast is bit-exact against the independent integer reference;
- F32 is bit-equal to the TOP interpreter;
- the `.tpu.mlir` prints, parses back and re-prints byte-identically; saved and loaded (weights
  npz with int8, int32, f16 and bf16 arrays) it gives identical results; lowering the same
  inputs twice gives byte-identical files; a truncated file fails fast with a tftpu error.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.frontend.test_onnx_ops import CASES, case_model
from tests.interp import int8_reference as R
from tftpu import chip as chips
from tftpu import errors
from tftpu.frontend.onnx_to_top import onnx_to_top
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import attrs as A
from tftpu.ir import load, tpu
from tftpu.ir.module import parse_module
from tftpu.quant import CalibrationTable
from tftpu.transforms.lowering import lower

RUNS = [("npu1", "F32", False), ("npu1", "BF16", False), ("npu1", "F16", False), ("npu1", "INT8", False),
        ("npu1", "INT8", True), ("edge16", "F16", False), ("edge16", "INT8", False), ("edge16", "INT8", True)]


def _table(model, feeds) -> CalibrationTable:
    ref = TopInterpreter(model).run(feeds, dump_all=True)
    entries = {}
    for k, v in ref.items():
        v = np.asarray(v)
        if v.dtype.kind == "f" and v.size:
            amax = float(np.abs(v).max())
            entries[k] = (amax + 1e-3, float(v.min()), float(v.max()))
    return CalibrationTable(entries)


_MODELS: dict = {}


def _case(case):
    name = case[0]
    if name not in _MODELS:
        onnx_model, feeds, _, _ = case_model(case)
        model = onnx_to_top(onnx_model, "m")
        _MODELS[name] = (model, feeds, _table(model, feeds))
    return _MODELS[name]


def _bits(x):
    x = np.ascontiguousarray(x)
    return x.dtype.str, x.shape, x.view(np.uint8).tobytes() if x.dtype.itemsize else b""


def test_every_chip_runs_its_modes_and_edge16_has_no_f32():
    assert set(chips.load("npu1").modes) >= {"F32", "BF16", "F16", "INT8"}
    assert "F32" not in chips.load("edge16").modes
    with pytest.raises(errors.UsageError, match="does not run F32"):
        model, feeds, table = _case(CASES[0])
        lower(model, "edge16", "F32", table)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_imported_op_lowers_in_every_mode_of_both_chips(case):
    model, feeds, table = _case(case)
    top_out = TopInterpreter(model).run(feeds, dump_all=True)
    for chip_name, mode, asym in RUNS:
        what = f"{case[0]} {chip_name} {mode}{' asym' if asym else ''}"
        chip = chips.load(chip_name)
        tm, report = lower(model, chip_name, mode, table, asymmetric=asym)
        tm.verify()
        fallback = "F32" if "F32" in chip.modes else "F16"
        for d in report.fallbacks:
            assert d.mode == fallback and d.reason, (what, d)
        assert len(report.decisions) == sum(1 for op in model.ops if op.name not in
                                            ("top.Input", "top.Weight", "top.None")), what
        if chip_name == "edge16":          # no F32 arithmetic: only host-side I/O casts see f32
            for op in tm.ops:
                if isinstance(op, tpu.TpuOp) and op.name != "tpu.Cast":
                    types = [v.type for v in (*op.operands, *op.results) if hasattr(v.type, "element_type")]
                    assert not any(A.is_float(t) and A.dtype_name(t.element_type) == "f32" for t in types), \
                        (what, op.name)
        dump = TpuInterpreter(tm).run(feeds, dump_all=True)
        R.check_model(tm, dump)
        out = TpuInterpreter(tm).run(feeds)
        assert sorted(out) == sorted(model.output_names), what
        for k in model.output_names:
            assert out[k].shape == top_out[k].shape and out[k].dtype == top_out[k].dtype, (what, k)
        if mode == "F32":                  # bit-equal to TOP, every tensor
            for k, v in top_out.items():
                assert _bits(dump[k]) == _bits(v), (what, k)


def _tiny_net():
    from tftpu.ir import TopBuilder

    rng = np.random.default_rng(0)
    b = TopBuilder("tiny")
    x = b.input("x", (1, 3, 8, 8))
    c = b.op("Conv", [x, b.weight("w", rng.normal(size=(4, 3, 3, 3)).astype(np.float32) * 0.3),
                      b.weight("b", rng.normal(size=(4,)).astype(np.float32))],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "do_relu": True}, "c")
    s = b.op("Sigmoid", [c], {}, "s")
    a = b.op("Add", [c, s], {}, "a")
    g = b.op("Flatten", [b.op("GlobalAvgPool", [a], {}, "g")], {}, "f")
    o = b.op("MatMul", [g, b.weight("wf", rng.normal(size=(4, 3)).astype(np.float32)), b.none()], {}, "o")
    sm = b.op("Softmax", [o], {}, "sm")
    model = b.finish([sm, o])
    feeds = {"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)}
    return model, feeds, _table(model, feeds)


@pytest.mark.parametrize("chip_name,mode,asym", RUNS, ids=[f"{c}-{m}{'-asym' if a else ''}" for c, m, a in RUNS])
def test_text_round_trip_save_load_and_determinism(tmp_path, chip_name, mode, asym):
    model, feeds, table = _tiny_net()
    tm, _ = lower(model, chip_name, mode, table, asymmetric=asym)
    text = tm.text()
    assert parse_module(text, "x.tpu.mlir") is not None
    again = type(tm)(parse_module(text), dict(tm.weights))
    assert again.text() == text
    want = TpuInterpreter(tm).run(feeds, dump_all=True)
    (tmp_path / "a").mkdir()
    mlir, npz = tm.save(tmp_path / "a" / "m.tpu.mlir")
    loaded = load(mlir)
    assert type(loaded).__name__ == "TpuModel" and loaded.mode == mode and loaded.chip == chip_name
    assert loaded.text() == mlir.read_text()
    for k, v in tm.weights.items():
        assert _bits(loaded.weights[k]) == _bits(v), k
    got = TpuInterpreter(loaded).run(feeds, dump_all=True)
    assert sorted(got) == sorted(want)
    for k in want:
        assert _bits(got[k]) == _bits(want[k]), k
    # the same inputs give byte-identical files
    tm2, _ = lower(model, chip_name, mode, table, asymmetric=asym)
    (tmp_path / "b").mkdir()
    mlir2, npz2 = tm2.save(tmp_path / "b" / "m.tpu.mlir")
    assert mlir2.read_bytes() == mlir.read_bytes() and npz2.read_bytes() == npz.read_bytes()
    kinds = {np.asarray(v).dtype.name for v in loaded.weights.values()}
    expect = {"INT8": {"int8", "int32"}, "F16": {"float16"}, "BF16": {"bfloat16"}, "F32": {"float32"}}[mode]
    assert expect <= kinds, kinds


def test_truncated_tpu_mlir_fails_fast_with_a_tftpu_error(tmp_path):
    model, feeds, table = _tiny_net()
    tm, _ = lower(model, "npu1", "INT8", table)
    mlir, npz = tm.save(tmp_path / "m.tpu.mlir")
    text = mlir.read_text()
    cuts = sorted(set(np.linspace(0, len(text) - 1, 60).astype(int)) | {text.index("!quant") + 10})
    for cut in cuts:
        if text[:cut].strip() == text.strip():
            continue                    # only the final newline cut: still the whole module
        mlir.write_text(text[:cut])
        t0 = time.perf_counter()
        with pytest.raises((errors.ModelFileError, errors.ShapeError)):
            load(mlir)
        assert time.perf_counter() - t0 < 2.0, cut
    mlir.write_text(text)
    npz.write_bytes(npz.read_bytes()[:100])
    with pytest.raises(errors.ModelFileError):
        load(mlir)


@pytest.mark.parametrize("mode", ["F32", "F16", "INT8"])
def test_scalar_constants_keep_their_shape(mode):
    """A 0-d constant (a scalar Gather index, a scalar multiplier) stays 0-d in the TPU module:
    it used to become shape [1], and a scalar Gather then failed the TPU verifier."""
    for name in ("gather_scalar", "mul_scalar"):
        model, feeds, table = _case(next(c for c in CASES if c[0] == name))
        tm, _ = lower(model, "npu1", mode, table)
        tm.verify()
        shapes = {k: np.asarray(v).shape for k, v in tm.weights.items()}
        assert () in shapes.values(), (name, shapes)
