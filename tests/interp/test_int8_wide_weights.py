"""16-bit weights (`tftpu.quant.links.WideWeights`): a conv multiplies int16 weights in two INT8
passes over their byte planes (`256 hi + lo`, both signed), combined exactly; lowered, run and
simulated bit for bit against the exact integer reference, and priced at twice the passes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from tests.interp import int8_reference as R
from tests.interp.test_tpu_int8_exact import SWEEP, W, conv_model, feeds, make_model, table_for
from tftpu.interp.tpu import TpuInterpreter
from tftpu.interp.tpu import int8_kernels as K
from tftpu.quant import params as P
from tftpu.quant.links import WideWeights, reach, wide_weights
from tftpu.transforms.lowering import lower
from tftpu.transforms.lowering.lower import FOUR_PASSES, TWO_PASSES, WIDE_WEIGHTS


def test_weight_planes_split_every_level_into_two_signed_bytes():
    q = np.arange(-P.QMAX16, P.QMAX16 + 1, dtype=np.int16)
    hi, lo = K.weight_planes(q)
    assert hi.dtype == lo.dtype == np.int8
    assert np.array_equal(256 * hi.astype(np.int32) + lo, q)
    assert hi.min() == -127 and hi.max() == 127


def test_weights_per_channel_wide_keeps_the_largest_level():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3, 3, 3))
    w[2] = 0.0
    q, s = P.weights_per_channel(w, 0, wide=True)
    assert q.dtype == np.int16 and np.abs(q).max() == P.QMAX16 and s[2] == 1.0
    assert np.abs(q.astype(np.float64) * s[:, None, None, None] - w).max() <= s.max() / 2 + 1e-12
    q8, s8 = P.weights_per_channel(w, 0)
    assert q8.dtype == np.int8 and np.allclose(s8[s8 != 1] / s[s != 1], P.QMAX16 / P.QMAX)


def test_wide_weights_items_are_not_conv_links():
    links = frozenset({"a", WideWeights("b")})
    assert reach(links) == (True, frozenset({"a"}))
    assert wide_weights(links) == frozenset({"b"}) and wide_weights(True) == frozenset()


@settings(max_examples=40, deadline=None)
@given(cin=st.sampled_from([1, 3, 16, 300]), cout=st.integers(1, 5), kernel=st.sampled_from([1, 3, 5]),
       stride=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2]), pad=st.integers(0, 2),
       groups=st.sampled_from([1, 3]), zero_point=st.sampled_from([-128, 0, 5, 127]), nhwc=st.booleans(),
       hwio=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_weight_passes_equal_the_exact_conv(cin, cout, kernel, stride, dilation, pad, groups, zero_point, nhwc,
                                            hwio, seed):
    rng = np.random.default_rng(seed)
    cin, cout = cin * groups, cout * groups
    side = kernel * dilation + int(rng.integers(0, 5))
    x = rng.integers(-128, 128, (1, cin, side, side + 1)).astype(np.int8)
    x[0, :, 0, 0] = -128
    w = rng.integers(-P.QMAX16, P.QMAX16 + 1, (cout, cin // groups, kernel, kernel)).astype(np.int16)
    w[0] = P.QMAX16             # every term at its largest: past int32 for a long contraction
    attrs = {"strides": [stride, stride], "pads": [pad] * 4, "dilations": [dilation, dilation], "group": groups,
             "kernel_layout": "HWIO" if hwio else "OIHW", "layout": "NHWC" if nhwc else "NCHW"}
    want = np.rint(K.conv_accumulate(x.astype(np.float64) - zero_point, w, {**attrs, "kernel_layout": "OIHW",
                                                                              "layout": "NCHW"})).astype(np.int64)
    wk = np.ascontiguousarray(w.transpose(2, 3, 1, 0)) if hwio else w
    xk = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if nhwc else x
    got = K._weight_passes(xk, zero_point, wk, attrs, nhwc)
    assert got is not None and got.dtype == np.int64
    assert np.array_equal(got.transpose(0, 3, 1, 2) if nhwc else got, want)


@SWEEP
@given(st.data())
def test_conv_with_wide_weights_is_exact(data):
    """Lowered with 16-bit weights (and, drawn, a 16-bit input: four passes), every INT8 op
    equals the integer reference, and the conv's weights are int16 on their finer grid."""
    d = data.draw
    g = d(st.sampled_from([1, 1, 2]))
    cg, o = d(st.integers(1, 4)), g * d(st.integers(1, 3))
    k, s, dil = d(st.integers(1, 3)), d(st.integers(1, 2)), d(st.integers(1, 2))
    size, pad = d(st.integers(3, 9)), d(st.integers(0, 2))
    assume(size + 2 * pad >= dil * (k - 1) + 1)
    nhwc, hwio, has_bias, relu, asym, wide_in = (d(st.booleans()) for _ in range(6))
    seed = d(st.integers(0, 2 ** 16))
    c = g * cg
    xshape = (1, size, size, c) if nhwc else (1, c, size, size)
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "dilations": [dil, dil], "pads": [pad] * 4, "group": g,
             "do_relu": relu, "relu_limit": -1.0, "layout": "NHWC" if nhwc else "NCHW",
             "kernel_layout": "HWIO" if hwio else "OIHW"}
    model = conv_model(np.random.default_rng(seed), xshape, o, cg, attrs, has_bias)
    inputs = feeds({"x": xshape}, seed)
    links = frozenset({WideWeights("y")} | ({"y"} if wide_in else set()))
    tm, report = lower(model, "npu1", "INT8", table_for(model, inputs, seed), asymmetric=asym, wide_links=links)
    tm.verify()
    assert [x.reason for x in report.decisions if x.name == "y"] == [FOUR_PASSES if wide_in else WIDE_WEIGHTS]
    assert any(v.dtype == np.int16 for v in tm.weights.values())
    seen = R.check_model(tm, TpuInterpreter(tm).run(inputs, dump_all=True))
    assert seen.get("tpu.Conv") == 1


def _conv_model(rng):
    w = W(rng, 16, 8, 3, 3)

    def body(b, xs):
        y = b.op("Conv", [xs[0], b.weight("w1", w), b.weight("b1", W(rng, 16))],
                 {"kernel_shape": [3, 3], "pads": [1] * 4, "do_relu": True}, "c1")
        return b.op("Conv", [y, b.weight("w2", W(rng, 8, 16, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "c2")

    return make_model({"x": (1, 8, 12, 12)}, body)


def test_wide_weights_cost_twice_the_passes_and_simulate_bit_for_bit(tmp_path):
    from tftpu.backend import tpumodel
    from tftpu.backend.codegen import generate
    from tftpu.backend.cycles import estimate
    from tftpu.backend.simulator import Simulator

    rng = np.random.default_rng(1)
    model = _conv_model(rng)
    inputs = feeds({"x": (1, 8, 12, 12)}, 1)
    table = table_for(model, inputs, 1)
    plain, _ = lower(model, "npu1", "INT8", table)
    wide, report = lower(model, "npu1", "INT8", table, wide_links=frozenset({WideWeights("c1")}))
    assert [x.name for x in report.decisions if x.reason == WIDE_WEIGHTS] == ["c1"]
    assert not [x for x in report.decisions if x.reason == TWO_PASSES]
    assert "1 conv(s) multiply 16-bit weights in two INT8 passes: c1" in str(report)
    cycles = {m: {o.name: o.cycles for o in estimate(t, "npu1").ops} for m, t in (("plain", plain), ("wide", wide))}
    assert cycles["wide"]["c1"] > cycles["plain"]["c1"] and cycles["wide"]["c2"] == cycles["plain"]["c2"]
    want = TpuInterpreter(wide).run(inputs)
    program = generate(wide, "npu1")
    again = tpumodel.load(tpumodel.save(program, tmp_path / "wide.tpumodel"))     # the int16 weights kept
    for got in (Simulator(program).run(inputs), Simulator(again).run(inputs)):
        assert all(np.array_equal(np.asarray(got[name]), np.asarray(want[name])) for name in want)


def test_deploy_with_wide_weights_refits_them_on_their_grid(tmp_path):
    """`deploy` with 16-bit weights named in its links: the weight refit fits those convs
    against their 16-bit grid (no INT8 rounding of theirs), the program runs them in two passes
    and simulates bit for bit, the report lists them; all convs so come closer to float than
    with INT8 weights; an unknown conv is a UsageError naming it, and in tftpu-deploy one line
    and exit status 2."""
    import json


    from tests.tools.test_deploy import _tool, conv_net, samples_for
    from tftpu import errors, quant
    from tftpu.pipelines.deploy import deploy
    from tftpu.pipelines.judge import Judge

    model = conv_net([(16, 3), (16, 3), (4, 1)], 3, 16)
    samples = samples_for(model, n=5)
    table = quant.calibrate(model, samples, "mse")
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0], samples=samples[1:],
              mixed_precision="none")
    every = frozenset(WideWeights(n) for n in ("c0", "c1", "c2"))
    wide = deploy(model, wide_links=every, weight_refit=True, bias_correction=True, report=tmp_path / "r.json", **kw)
    assert sorted(d.name for d in wide.lowering.decisions if d.reason == WIDE_WEIGHTS) == ["c0", "c1", "c2"]
    assert wide.bias_correction.refit == 3 and all(r["bit_exact"] for r in wide.simulator["outputs"])
    assert json.loads((tmp_path / "r.json").read_text())["wide_weights"] == ["c0", "c1", "c2"]
    judge = Judge(model, samples)
    plain, narrow = deploy(model, wide_links="tables", **kw), deploy(model, wide_links=every, **kw)
    assert min(judge(narrow.model)) > min(judge(plain.model))
    # where the program misses the target, what its weights' rounding alone costs: far less with 16 bits
    assert plain.weights_alone is None                 # (the default target met: nothing said)
    aimed = [deploy(model, wide_links=links, **{**kw, "mixed_precision": "0.99,90", "mixed_precision_budget": 0.0})
             for links in ("tables", every)]
    assert all(r.weights_alone is not None and min(r.weights_alone) > min(r.judged) for r in aimed)
    assert min(aimed[1].weights_alone) > min(aimed[0].weights_alone) + 20
    assert "the weights' rounding to nearest alone (activations in float): worst part" in aimed[0].weights_line
    assert "the weights alone miss the 90 dB target" in aimed[0].weights_line    # (what to do about it)
    named = [n for n, _ in aimed[0].weights_worst]          # (and the convs to give 16-bit weights)
    assert named and set(named) <= {"c0", "c1", "c2"} and f"{named[0]} " in aimed[0].weights_line
    with pytest.raises(errors.UsageError, match="16-bit weights for 'nope'"):
        deploy(model, wide_links=frozenset({WideWeights("nope")}), **kw)
    top_path, _ = model.save(tmp_path / "convs.top.mlir")
    table.save(tmp_path / "cali")
    np.savez(tmp_path / "x.npz", **samples[0])
    args = ("deploy", f"--mlir={top_path}", "--quantize=INT8", "--chip=npu1", f"--calibration_table={tmp_path / 'cali'}",
            f"--test_input={tmp_path / 'x.npz'}", "--mixed_precision=none")
    done, bad = _tool(*args, "--wide_weights=c0"), _tool(*args, "--wide_weights=nope")
    assert done.returncode == 0, done.stderr
    assert "1 conv(s) multiply 16-bit weights in two INT8 passes: c0" in done.stdout
    aimed = _tool(*args[:-1], "--mixed_precision=0.99,90", "--mixed_precision_budget=0")
    assert aimed.returncode == 0 and "weights: the weights' rounding to nearest alone" in aimed.stdout
    assert bad.returncode == 2 and "16-bit weights for 'nope'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_wide_weights_give_way_where_the_bias_would_saturate():
    """A bias that int32 cannot hold at the 16-bit weights' finer scale keeps the conv's weights
    on 8 bits (the decision says nothing of two passes)."""
    rng = np.random.default_rng(2)

    def body(b, xs):
        return b.op("Conv", [xs[0], b.weight("w", W(rng, 4, 3, 1, 1) * 1e-3),
                             b.weight("b", np.full(4, 1e4, np.float32))], {"kernel_shape": [1, 1]}, "y")

    model = make_model({"x": (1, 3, 4, 4)}, body)
    inputs = feeds({"x": (1, 3, 4, 4)}, 2)
    tm, report = lower(model, "npu1", "INT8", table_for(model, inputs, 2), wide_links=frozenset({WideWeights("y")}))
    assert not any(v.dtype == np.int16 for v in tm.weights.values())
    assert [x.reason for x in report.decisions if x.name == "y"] == [""]
    assert R.check_model(tm, TpuInterpreter(tm).run(inputs, dump_all=True)).get("tpu.Conv") == 1


def test_refit_rounds_on_the_grid_the_lowering_keeps():
    """The refit simulates the weights the lowering gives: a conv whose bias int32 cannot hold at
    the 16-bit scale keeps 8 bits there, so its refit weights are GPTQ-rounded onto the 8-bit grid;
    with a bias that fits they stay on the 16-bit grid (no INT8 rounding of theirs)."""
    from tftpu.ir import top
    from tftpu.quant.bias_correction import correct_biases

    rng = np.random.default_rng(3)
    weights = W(rng, 4, 3, 3, 3) * 1e-3

    def fitted(bias: float) -> np.ndarray:
        def body(b, xs):
            return b.op("Conv", [xs[0], b.weight("w", weights), b.weight("b", np.full(4, bias, np.float32))],
                        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "y")

        model = make_model({"x": (1, 3, 8, 8)}, body)
        inputs = [feeds({"x": (1, 3, 8, 8)}, seed) for seed in range(3)]
        links = frozenset({WideWeights("y")})
        refit, report = correct_biases(model, table_for(model, inputs[0], 3, (1.0, 1.0)), inputs, wide_links=links,
                                       refit=True, rounding="gptq")
        assert report.refit == 1
        conv = next(op for op in refit.ops if isinstance(op, top.Conv))
        w = np.asarray(refit.weights[conv.operands[1].owner.key], np.float64)
        levels = w / (np.abs(w).reshape(4, -1).max(1) / P.QMAX).reshape(4, 1, 1, 1)
        return np.abs(levels - np.round(levels)).max()

    assert fitted(1e4) < 1e-3                 # 8-bit weights lowered: GPTQ put them on their grid
    assert fitted(1e-2) > 1e-2                # 16-bit weights: refit, not rounded to 8 bits


@pytest.mark.parametrize("weights, program, verdict", [
    ((18.0, 19.0), (17.0, 17.5), "the weights alone miss the 20 dB target"),
    ((30.0, 29.0), (19.0, 18.0), "the activations' rounding costs the most"),
    ((21.0, 20.5), (19.0, 18.0), None),
])
def test_weights_line_says_which_side_the_noise_is_on(weights, program, verdict):
    """Where the program misses: weights alone under the target (no calibration helps), far above
    the program (the activations' rounding), or neither (nothing more said)."""
    from tftpu.pipelines.deploy import DeployResult

    convs = {"c2": 31.0, "c0": 12.5, "c3": 40.0, "c1": 19.0}
    result = DeployResult(model=None, lowering=None, tolerance=(0.8, 0.5), judged=program, target_db=20.0,
                          weights_alone_of=lambda: weights, weights_each_of=lambda: convs)
    line = result.weights_line
    assert line.startswith("the weights' rounding to nearest alone")
    if verdict is None:
        assert "target" not in line and "costs the most" not in line
    else:
        assert line.count(verdict) == 1
    # the convs to give 16-bit weights are named where the weights alone miss, worst first
    missed = min(weights) < 20.0
    assert result.weights_worst == ([("c0", 12.5), ("c1", 19.0), ("c2", 31.0)] if missed else [])
    assert line.endswith("each conv's weights alone, on the test input: c0 12.5 dB, c1 19.0 dB, c2 31.0 dB") == missed
