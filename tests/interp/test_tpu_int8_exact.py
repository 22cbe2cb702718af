"""INT8 TPU inference is bit-exact: every integer kernel against an independent integer
reference (`tests/interp/int8_reference.py`: Python ints / numpy int64, gemmlowp and TFLite
definitions, no tftpu rounding code), driven through the real lowering.

Each case builds a tiny TOP model, makes a calibration table directly (thresholds drawn around
the tensors' real ranges, so saturation is exercised too), lowers it to INT8 (symmetric and
asymmetric), runs `TpuInterpreter(dump_all=True)` and recomputes every INT8 op and every
`tpu.Cast` from the very int8 tensors the interpreter fed it. The requantization parameters
(multiplier / rshift) are also checked against QuantizeMultiplier of the ratio of the scales
the types carry. Sweeps use hypothesis with `derandomize=True` and bounded example counts.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tests.interp import int8_reference as R
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.interp.tpu.info import OpInfo, TensorInfo
from tftpu.ir import TopBuilder
from tftpu.quant import CalibrationTable
from tftpu.transforms.lowering import lower

SWEEP = settings(max_examples=30, derandomize=True, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
FEW = settings(SWEEP, max_examples=15)


# ---------------------------------------------------------------- helpers

def make_model(shapes: dict, body):
    """A TOP model: inputs `shapes` (name -> shape), `body(builder, inputs) -> output(s)`."""
    b = TopBuilder("exact")
    xs = [b.input(n, s) for n, s in shapes.items()]
    out = body(b, xs)
    model = b.finish(out if isinstance(out, list) else [out])
    model.verify()
    return model


def feeds(shapes: dict, seed: int, scale: float = 2.0) -> dict:
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) * scale).astype(np.float32) for n, s in shapes.items()}


def table_for(model, inputs, seed: int = 0, spread=(0.5, 1.3)) -> CalibrationTable:
    """A calibration table from the TOP tensors: each threshold / range a random factor of the
    real one (under 1: values saturate; over 1: coarser grid)."""
    rng = np.random.default_rng(seed)
    ref = TopInterpreter(model).run(inputs, dump_all=True)
    entries = {}
    for name, v in ref.items():
        v = np.asarray(v, np.float64)
        if v.dtype.kind != "f" or not v.size:
            continue
        f = float(rng.uniform(*spread))
        amax = float(np.abs(v).max())
        entries[name] = (amax * f + 0.05, min(float(v.min()) * f, -0.01), max(float(v.max()) * f, 0.01))
    return CalibrationTable(entries)


def run_exact(model, inputs, table, asymmetric=False, chip="npu1", mode="INT8"):
    """Lower, run, and check every INT8 op and cast bit for bit. Returns (tpu model, report,
    dump, {op name: count checked})."""
    tm, report = lower(model, chip, mode, table, asymmetric=asymmetric)
    tm.verify()
    dump = TpuInterpreter(tm).run(inputs, dump_all=True)
    seen = R.check_model(tm, dump)
    return tm, report, dump, seen


def W(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------- the reference itself

def test_reference_rules_on_known_values():
    # gemmlowp: the high multiply rounds ties up, the shift rounds ties away from zero
    assert R.srdhm(3 << 29, 1 << 30) == 3 << 28
    assert R.srdhm(7, 1 << 30) == 4 and R.srdhm(-7, 1 << 30) == -3        # 3.5 -> 4, -3.5 -> -3
    assert R.srdhm(R.INT32_MIN, R.INT32_MIN) == R.INT32_MAX
    assert [R.rdbpot(v, 1) for v in (3, -3, 5, -5, 4)] == [2, -2, 3, -3, 2]
    assert R.quantize_multiplier(0.5) == (1 << 30, 0)
    assert R.quantize_multiplier(1.0) == (1 << 30, 1)
    assert R.quantize_multiplier(0.75) == (3 << 29, 0)
    m, s = R.quantize_multiplier(1 - 2 ** -40)         # rounds up to 2**31: renormalised
    assert (m, s) == (1 << 30, 1)
    assert R.half_away(2.5) == 3 and R.half_away(-2.5) == -3 and R.half_away(-2.4) == -2


@FEW
@given(st.floats(1e-9, 1e4, allow_nan=False))
def test_quantize_multiplier_matches_tftpu(real):
    from tftpu.quant import params as P
    m, s = R.quantize_multiplier(real)
    assert P.requant([real]) == ([m], [-s])
    if m:
        assert abs(m * 2.0 ** (s - 31) - real) <= real * 2 ** -30


# ---------------------------------------------------------------- conv

@SWEEP
@given(st.data())
def test_conv_exact(data):
    d = data.draw
    nsp = d(st.sampled_from([1, 2]), "spatial dims")
    kind = d(st.sampled_from(["plain", "grouped", "depthwise"]))
    if kind == "depthwise":
        g, cg = d(st.integers(2, 4)), 1
    else:
        g = 1 if kind == "plain" else d(st.integers(2, 3))
        cg = d(st.integers(1, 3))
    c, o = g * cg, g * d(st.integers(1, 2))
    k = [d(st.integers(1, 3)) for _ in range(nsp)]
    s = [d(st.integers(1, 3)) for _ in range(nsp)]
    dil = [d(st.integers(1, 2)) for _ in range(nsp)]
    pads = [d(st.integers(0, 2)) for _ in range(2 * nsp)]
    size = [d(st.integers(1, 8)) for _ in range(nsp)]
    for i in range(nsp):
        assume(size[i] + pads[i] + pads[i + nsp] >= dil[i] * (k[i] - 1) + 1)
    nhwc, hwio = d(st.booleans(), "NHWC"), d(st.booleans(), "HWIO")
    has_bias, relu = d(st.booleans()), d(st.booleans())
    limit = d(st.sampled_from([-1.0, 0.3, 2.0]))
    asym = d(st.booleans(), "asymmetric")
    n = d(st.integers(1, 2))
    seed = d(st.integers(0, 2 ** 16))
    xshape = (n, *size, c) if nhwc else (n, c, *size)
    attrs = {"kernel_shape": k, "strides": s, "dilations": dil, "pads": pads, "group": g,
             "do_relu": relu, "relu_limit": limit, "layout": "NHWC" if nhwc else "NCHW",
             "kernel_layout": "HWIO" if hwio else "OIHW"}
    model = conv_model(np.random.default_rng(seed), xshape, o, cg, attrs, has_bias)
    inputs = feeds({"x": xshape}, seed)
    *_, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert seen.get("tpu.Conv") == 1


def conv_model(rng, xshape, o: int, cg: int, attrs: dict, has_bias: bool):
    """One conv "y" over input "x" (`xshape`): `o` output channels of `cg` input channels each,
    random weights scaled per channel (in `attrs`' kernel layout), a bias where `has_bias`."""
    k = list(attrs["kernel_shape"])
    w = W(rng, o, cg, *k) * rng.uniform(0.2, 3, (o,) + (1,) * (len(k) + 1)).astype(np.float32)
    if attrs["kernel_layout"] == "HWIO":
        w = np.moveaxis(np.moveaxis(w, 0, -1), 0, -2).copy()       # [O, I, *k] -> [*k, I, O]

    def body(b, xs):
        bias = b.weight("b", W(rng, o)) if has_bias else b.none()
        return b.op("Conv", [xs[0], b.weight("w", w), bias], attrs, "y")

    return make_model({"x": xshape}, body)


def test_conv_large_reduction_saturates_like_int32():
    """A 1x1 conv over 4096 channels of +127 * +127: sums far beyond int16, still exact."""
    rng = np.random.default_rng(3)
    w = np.abs(W(rng, 4, 4096, 1, 1)) + 0.1

    def body(b, xs):
        return b.op("Conv", [xs[0], b.weight("w", w), b.none()], {"kernel_shape": [1, 1]}, "y")

    model = make_model({"x": (1, 4096, 2, 2)}, body)
    inputs = {"x": np.abs(feeds({"x": (1, 4096, 2, 2)}, 3)["x"]) + 1.0}
    *_, seen = run_exact(model, inputs, table_for(model, inputs, 3, spread=(0.05, 0.1)))
    assert seen["tpu.Conv"] == 1


# ---------------------------------------------------------------- matmul

@SWEEP
@given(st.data())
def test_matmul_exact(data):
    d = data.draw
    const = d(st.booleans(), "constant right operand")
    transpose = d(st.booleans(), "right_transpose")
    m, k, n = d(st.integers(1, 4)), d(st.integers(1, 9)), d(st.integers(1, 5))
    batch = d(st.sampled_from([(), (2,), (2, 3)]))
    wbatch = d(st.sampled_from([(), batch[-1:]])) if batch else ()
    has_bias = const and d(st.booleans())
    relu, asym = d(st.booleans()), d(st.booleans())
    seed = d(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    wshape = (*wbatch, n, k) if transpose else (*wbatch, k, n)
    shapes = {"x": (*batch, m, k)} if const else {"x": (*batch, m, k), "w": wshape}
    attrs = {"right_transpose": transpose, "do_relu": relu}

    def body(b, xs):
        right = b.weight("w", W(rng, *wshape)) if const else xs[1]
        bias = b.weight("b", W(rng, n)) if has_bias else b.none()
        return b.op("MatMul", [xs[0], right, bias], attrs, "y")

    model = make_model(shapes, body)
    inputs = feeds(shapes, seed)
    *_, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert seen.get("tpu.MatMul") == 1


# ---------------------------------------------------------------- element-wise

@SWEEP
@given(st.data())
def test_add_sub_mul_exact(data):
    d = data.draw
    op = d(st.sampled_from(["Add", "Sub", "Mul"]))
    shapes = d(mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4)).input_shapes
    const = d(st.sampled_from([None, 0, 1]), "constant operand")
    assume(const is None or len(shapes[1 - const]) > 0)
    relu, asym = d(st.booleans()), d(st.booleans())
    ratio = d(st.sampled_from([1.0, 0.01, 30.0]), "range ratio of the inputs")
    seed = d(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    names = {"a": shapes[0], "b": shapes[1]}
    ins = {k: v for i, (k, v) in enumerate(names.items()) if i != const}

    def body(b, xs):
        it = iter(xs)
        operands = [b.weight("c", W(rng, *names[k], scale=ratio)) if i == const else next(it)
                    for i, k in enumerate(names)]
        return b.op(op, operands, {"do_relu": relu}, "y")

    model = make_model(ins, body)
    inputs = feeds(ins, seed)
    if "b" in inputs:
        inputs["b"] = inputs["b"] * np.float32(ratio)
    *_, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert seen.get(f"tpu.{op}") == 1


ACTS = [("Relu", {}), ("Relu", {"relu_limit": 1.5}), ("Clip", {"min": -0.5, "max": 1.0}),
        ("LeakyRelu", {"alpha": 0.1}), ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("HardSwish", {}), ("SiLU", {}), ("Tanh", {}), ("Exp", {}), ("Log", {}), ("Sqrt", {}), ("Erf", {}),
        ("Abs", {}), ("Neg", {}), ("GELU", {}), ("GELU", {"approximate": "tanh"}), ("Floor", {}), ("Ceil", {}),
        ("Round", {}), ("Sign", {}), ("Sin", {}), ("Cos", {}), ("Softsign", {})]


def _f64(name, attrs, x):
    """The activations in float64, written from their definitions."""
    erf = np.vectorize(math.erf)

    with np.errstate(all="ignore"):
        return {
            "Relu": lambda: np.minimum(np.maximum(x, 0), attrs["relu_limit"]) if attrs.get("relu_limit", -1) >= 0
            else np.maximum(x, 0),
            "Clip": lambda: np.clip(x, attrs["min"], attrs["max"]),
            "LeakyRelu": lambda: np.where(x >= 0, x, attrs["alpha"] * x),
            "Sigmoid": lambda: 1 / (1 + np.exp(-x)),
            "HardSigmoid": lambda: np.clip(attrs["alpha"] * x + attrs["beta"], 0, 1),
            "HardSwish": lambda: x * np.clip(x / 6 + 0.5, 0, 1),
            "SiLU": lambda: x / (1 + np.exp(-x)),
            "Tanh": lambda: np.tanh(x),
            "Exp": lambda: np.exp(x),
            "Log": lambda: np.log(x),
            "Sqrt": lambda: np.sqrt(x),
            "Erf": lambda: erf(x),
            "Abs": lambda: np.abs(x),
            "Neg": lambda: -x,
            "Floor": lambda: np.floor(x),
            "Ceil": lambda: np.ceil(x),
            "Round": lambda: np.round(x),
            "Sign": lambda: np.sign(x),
            "Sin": lambda: np.sin(x),
            "Cos": lambda: np.cos(x),
            "Softsign": lambda: x / (1 + np.abs(x)),
            "GELU": lambda: (0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))
            if attrs.get("approximate") == "tanh" else 0.5 * x * (1 + erf(x / np.sqrt(2))),
        }[name]()


@pytest.mark.parametrize("asym", [False, True], ids=["sym", "asym"])
@pytest.mark.parametrize("act", ACTS, ids=lambda a: a[0] + ("_" + "_".join(map(str, a[1].values())) if a[1] else ""))
def test_lut_exact_and_its_table(act, asym):
    name, attrs = act
    shape = (2, 3, 5)
    model = make_model({"x": shape}, lambda b, xs: b.op(name, [xs[0]], attrs, "y"))
    inputs = feeds({"x": shape}, 5)
    if name in ("Log", "Sqrt"):
        inputs["x"] = np.abs(inputs["x"]) + 0.05
    table = table_for(model, inputs, 5)
    tm, report, dump, seen = run_exact(model, inputs, table, asymmetric=asym)
    assert seen.get("tpu.Lut") == 1, str(report)
    # the table: the function of every input level, quantized on the output grid (+-1 level:
    # the lowering evaluates it in float32)
    lut = next(op for op in tm.ops if op.name == "tpu.Lut")
    xi, yi = R.Info.of(lut.operands[0]), R.Info.of(lut.results[0])
    grid = np.arange(-128, 128)
    real = R.dequantize(grid, xi.scale, xi.zp).astype(np.float64)
    want = _f64(name, attrs, real)
    ok = np.isfinite(want)
    # (a sigmoid that is the model's output writes its scores on the fixed 16-bit grid)
    storage = "i16" if name in ("Sigmoid", "HardSigmoid") else "i8"
    assert yi.dtype == storage and (storage == "i8" or (yi.scale, yi.zp) == (1 / 65536, -32768))
    want = R.quantize(np.where(ok, want, 0.0), yi.scale, yi.zp, storage).astype(np.int64)
    got = tm.weights[lut.operands[1].owner.key].astype(np.int64)
    assert np.abs(got - want)[ok].max() <= 1
    assert (got != want)[ok].sum() <= 4


# ---------------------------------------------------------------- pools

@SWEEP
@given(st.data())
def test_pools_exact(data):
    d = data.draw
    kind = d(st.sampled_from(["MaxPool", "AvgPool", "GlobalAvgPool", "GlobalMaxPool"]))
    nhwc, asym, relu = d(st.booleans()), d(st.booleans()), d(st.booleans())
    size = [d(st.integers(1, 7)), d(st.integers(1, 7))]
    c, n = d(st.integers(1, 3)), d(st.integers(1, 2))
    seed = d(st.integers(0, 2 ** 16))
    if kind.startswith("Global"):
        attrs = {"keepdims": d(st.booleans()), "layout": "NHWC" if nhwc else "NCHW"}
    else:
        k = [d(st.integers(1, 3)), d(st.integers(1, 3))]
        s = [d(st.integers(1, 3)), d(st.integers(1, 3))]
        pads = [d(st.integers(0, min(k[i % 2] - 1, 1))) for i in range(4)]
        for i in range(2):
            assume(size[i] + pads[i] + pads[i + 2] >= k[i])
        attrs = {"kernel_shape": k, "strides": s, "pads": pads, "do_relu": relu,
                 "layout": "NHWC" if nhwc else "NCHW"}
        if kind == "AvgPool":
            attrs["count_include_pad"] = True          # every window counts k*k: INT8 takes it
    xshape = (n, *size, c) if nhwc else (n, c, *size)

    def body(b, xs):
        x = b.op("Neg", [xs[0]], {}, "neg") if "Max" in kind else xs[0]   # max pools follow an INT8 input
        return b.op(kind, [x], attrs, "y")

    model = make_model({"x": xshape}, body)
    inputs = feeds({"x": xshape}, seed)
    *_, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert seen.get(f"tpu.{kind}") == 1


def test_avgpool_with_excluded_pads_falls_back_with_reason():
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    model = make_model({"x": (1, 2, 5, 5)}, lambda b, xs: b.op("AvgPool", [xs[0]], attrs, "y"))
    inputs = feeds({"x": (1, 2, 5, 5)}, 1)
    _, report, _, seen = run_exact(model, inputs, table_for(model, inputs))
    assert "tpu.AvgPool" not in seen
    (d,) = report.fallbacks
    assert d.name == "y" and d.mode == "F32" and "count different numbers" in d.reason


# ---------------------------------------------------------------- data movement

@FEW
@given(st.data())
def test_concat_exact(data):
    d = data.draw
    count = d(st.integers(2, 3))
    ratios = [d(st.sampled_from([1.0, 0.5, 2.0])) for _ in range(count)]
    axis = d(st.integers(-3, 2))
    relu, asym = d(st.booleans()), d(st.booleans())
    seed = d(st.integers(0, 2 ** 16))
    shapes = {}
    for i in range(count):
        s = [2, 3, 4]
        s[axis % 3] = d(st.integers(2, 3))
        shapes[f"x{i}"] = tuple(s)

    def body(b, xs):
        return b.op("Concat", [b.op("Neg", [x], {}, f"n{i}") for i, x in enumerate(xs)],
                    {"axis": axis, "do_relu": relu}, "y")

    model = make_model(shapes, body)
    inputs = {k: v * np.float32(r) for (k, v), r in zip(feeds(shapes, seed).items(), ratios)}
    _, report, _, seen = run_exact(model, inputs, table_for(model, inputs, seed, spread=(0.9, 1.1)),
                                   asymmetric=asym)
    if report.fallbacks:     # the inputs' ranges still came out > 16x apart: float, and why
        assert "one INT8 grid would erase the smaller input" in report.fallbacks[0].reason
    else:
        assert seen.get("tpu.Concat") == 1, str(report)


def test_concat_of_very_different_ranges_stays_float_and_keeps_both_parts():
    """Boxes up to ~300 beside scores in 0..3 (a YOLO head's logits): one INT8 grid would erase
    the scores, so the Concat stays float, says why, and each part keeps its precision. (A
    sigmoid's scores there are on their 16-bit grid: tests/tools/test_deploy.py.)"""
    shapes = {"boxes": (1, 4, 8), "scores": (1, 2, 8)}

    def body(b, xs):
        return b.op("Concat", [b.op("Relu", [xs[0]], {}, "bx"), b.op("Relu", [xs[1]], {}, "sc")],
                    {"axis": 1}, "y")

    model = make_model(shapes, body)
    inputs = feeds(shapes, 2)
    inputs["boxes"] = inputs["boxes"] * np.float32(150)
    tm, report, _, seen = run_exact(model, inputs, table_for(model, inputs, 2, spread=(1.0, 1.0)))
    assert "tpu.Concat" not in seen
    (d,) = report.fallbacks
    assert d.name == "y" and "erase the smaller input" in d.reason
    got = TpuInterpreter(tm).run(inputs)["y"]
    want = TopInterpreter(model).run(inputs)["y"]
    from tftpu.interp.similarity import cosine_similarity
    assert cosine_similarity(want[:, 4:], got[:, 4:]) > 0.999        # the scores survive
    assert cosine_similarity(want[:, :4], got[:, :4]) > 0.999


@FEW
@given(st.data())
def test_pad_exact(data):
    d = data.draw
    mode = d(st.sampled_from(["constant", "reflect", "edge"]))
    val = d(st.sampled_from([0.0, 0.5, -1.0])) if mode == "constant" else 0.0
    asym = d(st.booleans())
    seed = d(st.integers(0, 2 ** 16))
    shape = (1, 3, 4)
    pads = [d(st.integers(0, 2)) for _ in range(6)]
    attrs = {"paddings": pads, "mode": mode, "val": val}
    model = make_model({"x": shape}, lambda b, xs: b.op("Pad", [b.op("Neg", [xs[0]], {}, "n")], attrs, "y"))
    inputs = feeds({"x": shape}, seed)
    _, report, _, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    if report.fallbacks:      # a constant the input's grid cannot hold: float, with a reason
        assert mode == "constant" and "outside the INT8 range" in report.fallbacks[0].reason
    else:
        assert seen.get("tpu.Pad") == 1


def test_movement_ops_keep_grid_and_bytes():
    """Reshape/Permute/Slice/Split/... move int8 bytes: their outputs equal the same move of
    their int8 inputs and keep the input's grid."""
    shape = (1, 4, 4, 6)

    def body(b, xs):
        x = b.op("Neg", [xs[0]], {}, "n")
        p = b.op("Permute", [x], {"order": [0, 2, 3, 1]}, "p")
        s = b.op("Slice", [p], {"starts": [0, 1, 0, 0], "ends": [1, 4, 6, 4], "steps": [1, 2, 2, 1],
                                "axes": [0, 1, 2, 3]}, "s")
        r = b.op("Reshape", [s], {"shape": [1, 12, 2]}, "r")
        f = b.op("Flatten", [r], {}, "f")
        d2s = b.op("SpaceToDepth", [x], {"block_size": 2}, "s2d")
        return [f, d2s]

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, 4)
    tm, report, dump, seen = run_exact(model, inputs, table_for(model, inputs, 4))
    assert not report.fallbacks, str(report)
    n = dump["n"]
    assert np.array_equal(dump["p"], n.transpose(0, 2, 3, 1))
    assert np.array_equal(dump["s"], dump["p"][:, 1:4:2, 0:6:2, 0:4])
    assert np.array_equal(dump["r"], dump["s"].reshape(1, 12, 2))
    for op in tm.ops:
        if op.name in R.MOVES:
            assert R.Info.of(op.results[0]).scales == R.Info.of(op.operands[0]).scales


# ---------------------------------------------------------------- casts

def test_quantize_rounds_ties_away_from_zero_and_saturates():
    """scale 0.25 exactly: +-0.125 and +-0.375 are ties; +-100 saturates."""
    x = np.array([[0.125, -0.125, 0.375, -0.375, 0.124, 100.0, -100.0, 0.0]], np.float32)
    model = make_model({"x": x.shape}, lambda b, xs: b.op("Abs", [xs[0]], {}, "y"))
    table = CalibrationTable({"x": (31.75, -31.75, 31.75), "y": (31.75, 0.0, 31.75)})
    tm, _, dump, seen = run_exact(model, {"x": x}, table)
    q = next(v for k, v in dump.items() if v.dtype == np.int8 and k.startswith("x"))
    assert q.tolist() == [[1, -1, 2, -2, 0, 127, -128, 0]]
    assert seen["tpu.Cast"] == 2


@pytest.mark.parametrize("chip,mode", [("npu1", "BF16"), ("npu1", "F16"), ("edge16", "F16"),
                                       ("edge16", "INT8"), ("npu1", "INT8")])
def test_casts_of_every_kind_are_exact(chip, mode):
    """float -> bf16/f16 and back, f32/f16 -> int8 (quantize), int8 -> f32/f16 (dequantize) and
    int8 -> int8 (requantize: a Concat of inputs on other grids), all bit-exact."""
    shapes = {"a": (1, 3, 4), "b": (1, 2, 4)}

    def body(b, xs):
        c = b.op("Concat", [b.op("Neg", [xs[0]], {}, "na"), b.op("Tanh", [xs[1]], {}, "tb")], {"axis": 1}, "c")
        return b.op("Softmax", [c], {"axis": -1, "log": True}, "sm")    # log-softmax: a float island

    model = make_model(shapes, body)
    inputs = feeds(shapes, 6)
    tm, report, dump, seen = run_exact(model, inputs, table_for(model, inputs, 6), chip=chip, mode=mode)
    assert seen["tpu.Cast"] >= 2
    kinds = set()
    for op in tm.ops:
        if op.name == "tpu.Cast":
            src, dst = R.Info.of(op.operands[0]), R.Info.of(op.results[0])
            kinds.add(("q" if src.quant else src.dtype, "q" if dst.quant else dst.dtype))
    if mode == "INT8":
        fb = "f16" if chip == "edge16" else "f32"
        assert {("f32", "q"), ("q", "q"), ("q", fb)} <= kinds, kinds
        assert all(d.mode == ("F16" if chip == "edge16" else "F32") for d in report.fallbacks)
    else:
        assert {("f32", mode.lower()), (mode.lower(), "f32")} <= kinds, kinds


# ---------------------------------------------------------------- kernels on arbitrary parameters

@SWEEP
@given(st.data())
def test_requantization_with_any_multiplier_and_shift(data):
    """The integer kernels on parameters no lowering of ours would choose (a `.tpu.mlir` from
    elsewhere may): multipliers anywhere in [0, 2**31), right shifts -4..31 (negative: a left
    shift, saturating), accumulators that overflow int32, zero points, fused relu."""
    from tftpu.interp.tpu import int8_kernels as K

    d = data.draw
    k = d(st.sampled_from([1, 7, 4096]))
    per_channel = d(st.booleans())
    n = 3
    rng = np.random.default_rng(d(st.integers(0, 2 ** 16)))
    ms = [d(st.integers(0, (1 << 31) - 1)) for _ in range(n if per_channel else 1)]
    rs = [d(st.integers(-4, 31)) for _ in range(len(ms))]
    zx, zo = d(st.integers(-128, 127)), d(st.integers(-128, 127))
    relu = d(st.booleans())
    x = rng.integers(-128, 128, (2, k)).astype(np.int8)
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    b = rng.integers(-(1 << 31), 1 << 31, (n,), dtype=np.int64).astype(np.int32) if d(st.booleans()) else None
    xi = TensorInfo("i8", (0.1,), (zx,))
    wi = TensorInfo("i8", (0.1,) * n, (0,) * n, 1)
    oi = TensorInfo("i8", (0.5,), (zo,))
    attrs = {"right_transpose": False, "do_relu": relu, "relu_limit": -1.0, "multiplier": ms, "rshift": rs}
    got = K.matmul([x, w, b], attrs, OpInfo((xi, wi, None), (oi,)))[0]
    ins = [R.Info("i8", (0.1,), (zx,)), R.Info("i8", (0.1,) * n, (0,) * n, 1), None]
    want, _ = R.reference_of("tpu.MatMul", attrs, ins, R.Info("i8", (0.5,), (zo,)), [x, w, b],
                             check_params=False)
    assert np.array_equal(got, want)
    # the same accumulators through Mul (one multiplier) and a requantizing Cast
    y = rng.integers(-128, 128, (2, k)).astype(np.int8)
    one = {"do_relu": relu, "relu_limit": -1.0, "multiplier": ms[:1], "rshift": rs[:1]}
    got = K.mul([x, y], one, OpInfo((xi, xi), (oi,)))[0]
    want, _ = R.reference_of("tpu.Mul", one, [ins[0], ins[0]], R.Info("i8", (0.5,), (zo,)), [x, y],
                             check_params=False)
    assert np.array_equal(got, want)
    one = {"multiplier": ms[:1], "rshift": rs[:1]}
    got = K.cast([x], one, OpInfo((xi,), (oi,)))[0]
    want, _ = R.reference_of("tpu.Cast", one, [ins[0]], R.Info("i8", (0.5,), (zo,)), [x], check_params=False)
    assert np.array_equal(got, want)


# ---------------------------------------------------------------- a whole model

def test_small_network_every_int8_op_exact():
    """conv (relu6) -> depthwise -> sigmoid -> add -> maxpool -> avgpool -> GAP -> matmul,
    symmetric and asymmetric, with the table from the real calibration."""
    from tftpu import quant

    rng = np.random.default_rng(0)

    def body(b, xs):
        c1 = b.op("Conv", [xs[0], b.weight("w1", W(rng, 8, 3, 3, 3)), b.weight("b1", W(rng, 8, scale=0.1))],
                  {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "do_relu": True,
                   "relu_limit": 6.0}, "c1")
        c2 = b.op("Conv", [c1, b.weight("w2", W(rng, 8, 1, 3, 3)), b.none()],
                  {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 8}, "c2")
        a = b.op("Add", [c1, b.op("Sigmoid", [c2], {}, "s")], {}, "a")
        m = b.op("MaxPool", [a], {"kernel_shape": [2, 2], "strides": [2, 2]}, "m")
        p = b.op("AvgPool", [m], {"kernel_shape": [2, 2], "strides": [1, 1]}, "p")
        g = b.op("Flatten", [b.op("GlobalAvgPool", [p], {}, "g")], {}, "f")
        return b.op("MatMul", [g, b.weight("wf", W(rng, 8, 5)), b.weight("bf", W(rng, 5))], {}, "o")

    model = make_model({"x": (1, 3, 16, 16)}, body)
    samples = [feeds({"x": (1, 3, 16, 16)}, i, 1.0) for i in range(4)]
    table = quant.calibrate(model, samples, "minmax")
    for asym in (False, True):
        _, report, _, seen = run_exact(model, samples[0], table, asymmetric=asym)
        assert not report.fallbacks, str(report)
        assert {"tpu.Conv": 2, "tpu.Lut": 1, "tpu.Add": 1, "tpu.MaxPool": 1, "tpu.AvgPool": 1,
                "tpu.GlobalAvgPool": 1, "tpu.MatMul": 1}.items() <= seen.items(), seen


# ---------------------------------------------------------------- rounding ties, on purpose

def _pow2_table(model, inputs, exps: dict) -> CalibrationTable:
    """Thresholds 127 * 2**e: every scale a power of two, so every requantization ratio is one
    too and half the results are exact ties (the rounding rules decide them)."""
    ref = TopInterpreter(model).run(inputs, dump_all=True)
    return CalibrationTable({k: (127.0 * 2.0 ** exps.get(k, 0), -1.0, 1.0) for k in ref})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "AvgPool", "GlobalAvgPool", "Conv", "Concat"])
def test_power_of_two_scales_make_ties_and_they_round_exactly(op):
    shape = (1, 2, 4, 4)
    rng = np.random.default_rng(7)
    # inputs on the 1/8 grid, within +-16 (levels -128..127)
    inputs = {"a": (rng.integers(-128, 128, shape) / 8).astype(np.float32),
              "b": (rng.integers(-128, 128, shape) / 8).astype(np.float32)}

    def body(b, xs):
        if op in ("Add", "Sub", "Mul"):
            return b.op(op, xs, {}, "y")
        if op == "AvgPool":
            return b.op(op, [xs[0]], {"kernel_shape": [2, 2], "strides": [1, 1]}, "y")
        if op == "GlobalAvgPool":
            return b.op(op, [xs[0]], {}, "y")
        if op == "Conv":
            w = np.array([1, -1, 1, 1], np.float32).reshape(2, 2, 1, 1)      # scale 1/127: exact
            return b.op(op, [xs[0], b.weight("w", w), b.none()], {"kernel_shape": [1, 1]}, "y")
        return b.op(op, [b.op("Neg", [x], {}, f"n{i}") for i, x in enumerate(xs)], {"axis": 1}, "y")

    shapes = {"a": shape} if op in ("AvgPool", "GlobalAvgPool", "Conv") else {"a": shape, "b": shape}
    model = make_model(shapes, body)
    inputs = {k: inputs[k] for k in shapes}
    # ratios of 1/2 (a multiplier of 2**30, no shift: the high multiply's ties) or a shift's
    exps = {"a": -3, "b": -3, "n0": -3, "n1": -3,
            "y": {"Mul": -5, "Conv": 1, "AvgPool": -4, "GlobalAvgPool": -6, "Concat": -2}.get(op, -2)}
    tm, report, dump, seen = run_exact(model, inputs, _pow2_table(model, inputs, exps))
    assert not report.fallbacks, str(report)
    assert seen.get(f"tpu.{op}") == 1
    # ties did occur: some exact results lie half-way between two output levels
    a = dump[next(k for k in dump if k.startswith("a") and dump[k].dtype == np.int8)].astype(np.int64)
    assert (a % 2 == 1).any() and (a < 0).any()


def test_add_ties_round_away_from_zero():
    """x / 2 with x odd: TPU-MLIR's Add rounds the shared shift half away from zero."""
    x = np.arange(-9, 10, dtype=np.float32).reshape(1, -1) / 8
    model = make_model({"a": x.shape, "b": x.shape}, lambda b, xs: b.op("Add", xs, {}, "y"))
    table = CalibrationTable({"a": (127 / 8, -1, 1), "b": (127 / 8, -1, 1), "y": (127 / 4, -1, 1)})
    zero = np.zeros_like(x)
    _, _, dump, _ = run_exact(model, {"a": x, "b": zero}, table)
    y = dump["y_i8"] if "y_i8" in dump else next(v for k, v in dump.items() if v.dtype == np.int8 and k.startswith("y"))
    want = [R.half_away(v / 2) for v in range(-9, 10)]
    assert y.ravel().tolist() == want


@pytest.mark.parametrize("multiplier,rshift", [(1 << 30, 0), (3 << 29, 0), (1 << 30, 1), (3 << 29, 2),
                                               (1 << 30, -1), (5 << 28, 3)])
def test_requantize_ties_of_every_int8_value(multiplier, rshift):
    """Every int8 value through a requantizing tpu.Cast whose ratio makes ties: the high
    multiply rounds them up, the shift away from zero (gemmlowp), as the reference says."""
    from tftpu.interp.tpu import int8_kernels as K

    x = np.arange(-128, 128, dtype=np.int8)
    for zx, zo in ((0, 0), (5, -3)):
        attrs = {"multiplier": [multiplier], "rshift": [rshift]}
        src, dst = TensorInfo("i8", (1.0,), (zx,)), TensorInfo("i8", (1.0,), (zo,))
        got = K.cast([x], attrs, OpInfo((src,), (dst,)))[0]
        want, _ = R.reference_of("tpu.Cast", attrs, [R.Info("i8", (1.0,), (zx,))], R.Info("i8", (1.0,), (zo,)),
                                 [x], check_params=False)
        assert np.array_equal(got, want)
        if (multiplier, rshift, zx, zo) == (1 << 30, 0, 0, 0):      # x / 2: ties up
            assert got[[128 - 3, 128 - 1, 128 + 1, 128 + 3]].tolist() == [-1, 0, 1, 2]


@pytest.mark.parametrize("asym", [False, True])
def test_concat_with_a_constant_input_runs_in_int8(asym):
    """A constant beside activations is quantized onto the output grid (it used to fall back
    saying a calibration entry was missing)."""
    rng = np.random.default_rng(8)
    shapes = {"x": (1, 3, 4)}
    model = make_model(shapes, lambda b, xs: b.op(
        "Concat", [b.op("Neg", [xs[0]], {}, "n"), b.weight("c", W(rng, 1, 2, 4, scale=2.0))], {"axis": 1}, "y"))
    inputs = feeds(shapes, 8)
    _, report, dump, seen = run_exact(model, inputs, table_for(model, inputs, 8, spread=(1.0, 1.0)), asymmetric=asym)
    assert not report.fallbacks, str(report)
    assert seen["tpu.Concat"] == 1


@SWEEP
@given(st.data())
def test_prelu_exact(data):
    """PReLU: per-channel (or one, or a 1-D channel vector) slopes, negative and zero ones too."""
    d = data.draw
    c = d(st.integers(1, 6))
    layout = d(st.sampled_from(["NCHW", "NHWC"]))
    form = d(st.sampled_from(["broadcast", "vector", "scalar"]))
    asym, seed = d(st.booleans()), d(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    shape = (2, c, 3, 4) if layout == "NCHW" else (2, 3, 4, c)
    slopes = rng.uniform(-1.5, 1.5, c).astype(np.float32)
    slopes[rng.random(c) < 0.2] = 0.0
    if form == "scalar":
        slope = slopes[:1]
    elif form == "vector":
        slope = slopes
    else:
        slope = slopes.reshape((1, c, 1, 1) if layout == "NCHW" else (1, 1, 1, c))

    def body(b, xs):
        return b.op("PRelu", [xs[0], b.weight("slope", slope)], {}, "y")

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, seed)
    tm, report, dump, seen = run_exact(model, inputs, table_for(model, inputs, seed), asymmetric=asym)
    assert seen.get("tpu.PRelu") == 1, report
    tm, *_ = run_exact(model, inputs, table_for(model, inputs, seed, spread=(1.0, 1.05)), asymmetric=asym)
    ref = TopInterpreter(model).run(inputs)["y"]
    got = TpuInterpreter(tm).run(inputs)["y"]
    assert np.corrcoef(ref.ravel(), got.ravel())[0, 1] > 0.99


@pytest.mark.parametrize("c,k,group,stride,dil", [(512, 3, 1, 1, 1), (64, 7, 1, 2, 1), (32, 3, 32, 2, 1),
                                                  (16, 3, 4, 1, 2), (3, 5, 1, 2, 1)])
def test_conv_integer_path_equals_float64_path_at_extremes(c, k, group, stride, dil):
    """onnxruntime's ConvInteger (uint8 offset by 128) gives the same integers as the float64
    path, with saturated inputs, extreme zero points and long reductions."""
    from tftpu.interp.tpu.int8_kernels import conv_accumulate, conv_integer

    rng = np.random.default_rng(c * k + group)
    o = 2 * group if group > 1 else 24
    x = rng.choice(np.array([-128, 127, 0, -1, 1], np.int8), size=(1, c, 11, 13)).astype(np.int8)
    w = rng.choice(np.array([-127, 127, 0, 5], np.int8), size=(o, c // group, k, k)).astype(np.int8)
    attrs = {"strides": [stride] * 2, "pads": [1, 2, 0, 1], "dilations": [dil] * 2, "group": group,
             "layout": "NCHW", "kernel_layout": "OIHW"}
    for zp in (-128, 0, 127):
        got = conv_integer(x, zp, w, attrs)
        want = conv_accumulate(x.astype(np.float64) - zp, w, attrs)
        assert got is not None and got.dtype == np.int32
        np.testing.assert_array_equal(got.astype(np.int64), np.rint(want).astype(np.int64))


@pytest.mark.parametrize("mode", ["F16", "BF16"])
def test_whole_tensor_float_ops_differ_from_rows_by_round_off_only(mode):
    """`exact_rows=False` (accuracy figures: the mixed-precision search, evaluation) runs float
    window ops on whole tensors: INT8 ops bit-equal, float ops within round-off of the by-rows
    results the simulator is checked against."""
    rng = np.random.default_rng(7)
    b = TopBuilder("rows")
    x = b.input("x", (2, 3, 13, 11))
    c1 = b.op("Conv", [x, b.weight("w1", W(rng, 8, 3, 3, 3)), b.weight("b1", W(rng, 8))],
              {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "do_relu": True}, "c1")
    p = b.op("MaxPool", [c1], {"kernel_shape": [2, 2], "strides": [1, 1]}, "p")
    c2 = b.op("Conv", [p, b.weight("w2", W(rng, 4, 8, 3, 3)), b.none()], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
              "c2")
    model = b.finish([c2])
    feed = feeds({"x": (2, 3, 13, 11)}, 3)
    table = table_for(model, feed)
    tpu, _ = lower(model, "npu1", "INT8", table, qtable={"c2": mode, "p": mode})
    exact = TpuInterpreter(tpu).run(feed, dump_all=True)
    fast = TpuInterpreter(tpu, exact_rows=False).run(feed, dump_all=True)
    assert exact.keys() == fast.keys()
    for name, want in exact.items():
        got = fast[name]
        if want.dtype.kind != "f":
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            tol = 2.0 ** -7 if mode == "BF16" else 2.0 ** -10
            np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol,
                                       atol=tol * float(np.max(np.abs(want.astype(np.float32)))), err_msg=name)


def quant_calibrate(model, samples):
    from tftpu import quant
    return quant.calibrate(model, samples, "minmax")


def _score_head(rng, through_moves: bool, more_users: bool = False):
    """conv logits (mostly very negative, a few objects) -> sigmoid -> [reshape, transpose] -> output."""
    b = TopBuilder("scores")
    x = b.input("x", (1, 4, 6, 8))
    w = W(rng, 3, 4, 1, 1)
    c = b.op("Conv", [x, b.weight("w", w), b.weight("b", np.full(3, -7.0, np.float32))], {"kernel_shape": [1, 1]}, "logits")
    s = b.op("Sigmoid", [c], {}, "scores")
    outs = [s]
    if through_moves:
        r = b.op("Reshape", [s], {"shape": [1, 3, 48]}, "flat")
        outs = [b.op("Permute", [r], {"order": [0, 2, 1]}, "per_anchor")]
    if more_users:
        outs.append(b.op("Conv", [s, b.weight("w2", W(rng, 3, 3, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "mixed"))
    return b.finish(outs)


@pytest.mark.parametrize("through_moves", [False, True])
def test_score_maps_leave_on_a_fixed_16_bit_grid(through_moves):
    """A sigmoid whose values only leave the model is written on the fixed grid 1/65536 (i16):
    exact to the table, whatever range the calibration photos gave it; the simulator agrees."""
    from tftpu.interp.similarity import sqnr
    from tftpu.ir.quant import UniformQuantType
    from tftpu.pipelines.deploy import deploy

    rng = np.random.default_rng(11)
    model = _score_head(rng, through_moves)
    calib = [{"x": rng.normal(size=(1, 4, 6, 8)).astype(np.float32)} for _ in range(4)]
    held = {"x": rng.normal(size=(1, 4, 6, 8)).astype(np.float32)}
    table = quant_calibrate(model, calib)
    tpu, _ = lower(model, "npu1", "INT8", table)
    lut = next(op for op in tpu.ops if op.name == "tpu.Lut")
    t = lut.results[0].type.element_type
    assert isinstance(t, UniformQuantType) and t.storage == "i16" and t.scales == (1.0 / 65536,)
    got = TpuInterpreter(tpu).run(held, dequantize=True)
    ref = TopInterpreter(model).run(held)
    out = model.output_names[0]
    # the sigmoid of the INT8 logits, exactly as the table holds it (16-bit rounding only)
    logits = TpuInterpreter(tpu).run(held, dump_all=True, dequantize=True)["logits"]
    want = np.clip(np.floor(1.0 / (1.0 + np.exp(-logits.astype(np.float64))) * 65536 + 0.5), 0, 65535) / 65536
    want = want.reshape(1, 3, 48).transpose(0, 2, 1) if through_moves else want
    np.testing.assert_allclose(got[out].ravel(), np.minimum(want.ravel(), 32767 / 65536 + 0.5), atol=1.0 / 65536)
    # what an 8-bit grid over the calibrated score range would have made of them
    lo, hi = table.entries["scores"][1:]
    step = (hi - lo) / 255
    eight = np.clip(np.round(got[out] / step), 0, 255) * step
    assert sqnr(ref[out], got[out]) > sqnr(ref[out], eight) + 3.0
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=held, mixed_precision="none")
    assert res.simulator["passed"] and all(r["bit_exact"] for r in res.simulator["outputs"])


def test_a_sigmoid_other_ops_read_keeps_its_8_bit_grid():
    from tftpu.ir.quant import UniformQuantType

    rng = np.random.default_rng(12)
    model = _score_head(rng, True, more_users=True)
    calib = [{"x": rng.normal(size=(1, 4, 6, 8)).astype(np.float32)} for _ in range(4)]
    tpu, _ = lower(model, "npu1", "INT8", quant_calibrate(model, calib))
    t = next(op for op in tpu.ops if op.name == "tpu.Lut").results[0].type.element_type
    assert isinstance(t, UniformQuantType) and t.storage == "i8"
