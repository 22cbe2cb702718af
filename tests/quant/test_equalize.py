"""Depthwise input equalization (`tftpu.quant.equalize`): the rewritten model computes what the
model computes, its factors are exact INT8 constants, and in INT8 it does better where a
channel's range is a small part of its tensor's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tftpu
from tftpu import errors
from tftpu.interp.similarity import sqnr
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import TopBuilder
from tftpu.quant import params as P
from tftpu.quant.equalize import MAX_FACTOR, equalize_depthwise, factors_for


def quiet_channels_net(seed: int, producer: str = "HardSwish", multiplier: int = 1, kernel: int = 9,
                       stride: int = 1, quiet: float = 0.02, layout: str = "NCHW", residual: bool = False,
                       side: bool = True):
    """conv -> `producer` -> depthwise conv (and a second depthwise conv and a 1x1 conv reading
    the same tensor, a model output where `side`) -> 1x1 conv: half the depthwise input's
    channels quiet (`quiet` times the others), their depthwise kernels as much larger (a folded
    batch norm of quiet channels). Kernels larger than 7x7 read 8 bits, the ones equalized; up to
    7x7 they read the tensor on its 16-bit link."""
    rng = np.random.default_rng(seed)
    c = 8
    b = TopBuilder("quiet")
    nhwc = layout == "NHWC"
    x = b.input("x", (1, 12, 12, 4) if nhwc else (1, 4, 12, 12))
    scale = np.where(np.arange(c) % 2 == 0, quiet, 1.0)
    conv = dict(layout=layout) if nhwc else {}
    w0 = rng.normal(size=(c, 4, 3, 3)) * 0.3 * scale[:, None, None, None]
    y = b.op("Conv", [x, b.weight("w0", w0.astype(np.float32)), b.weight("b0", (rng.normal(size=c) * 0.1 * scale)
                                                                         .astype(np.float32))],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], **conv}, "c0")
    if producer == "PRelu":
        shape = (1, 1, 1, c) if nhwc else (1, c, 1, 1)
        y = b.op("PRelu", [y, b.weight("slope", np.full(shape, 0.1, np.float32))], {}, "act")
    elif producer == "Add":
        y = b.op("Add", [y, y], {}, "act")
    elif producer != "Conv":
        y = b.op(producer, [y], {}, "act")
    outs = []
    for i in range(2):
        wd = rng.normal(size=(c * multiplier, 1, kernel, kernel)) / np.repeat(scale, multiplier)[:, None, None, None]
        pad = kernel // 2
        outs.append(b.op("Conv", [y, b.weight(f"wd{i}", (wd * 0.2).astype(np.float32)), b.none()],
                         {"kernel_shape": [kernel, kernel], "pads": [pad] * 4, "strides": [stride, stride],
                          "group": c, **conv}, f"dw{i}"))
    z = b.op("Add", [outs[0], outs[1]], {}, "sum")
    z = b.op("Relu", [z], {}, "relu")
    aside = b.op("Conv", [y, b.weight("wp", rng.normal(size=(2, c, 1, 1)).astype(np.float32)), b.none()],
                {"kernel_shape": [1, 1], **conv}, "side")
    head = b.op("Conv", [z, b.weight("wo", (rng.normal(size=(3, c * multiplier, 1, 1)) * 0.3).astype(np.float32)),
                         b.none()], {"kernel_shape": [1, 1], **conv}, "out")
    return b.finish([head] + ([aside] if side else []) + ([y] if residual else []))


def samples_for(model, n=6, seed=3):
    rng = np.random.default_rng(seed)
    shape = model.func.function_type.inputs.data[0].get_shape()
    return [{model.input_names[0]: rng.normal(size=shape).astype(np.float32)} for _ in range(n)]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 16), producer=st.sampled_from(["HardSwish", "SiLU", "PRelu", "Add", "Conv", "Tanh"]),
       multiplier=st.sampled_from([1, 2]), kernel=st.sampled_from([9, 11]), stride=st.sampled_from([1, 2]),
       layout=st.sampled_from(["NCHW", "NHWC"]), residual=st.booleans())
def test_the_equalized_model_computes_the_same(seed, producer, multiplier, kernel, stride, layout, residual):
    """Over producers, channel multipliers, kernels, strides and layouts, with the tensor read by
    two depthwise convs and a 1x1 conv (and a model output where `residual`): the equalized model's
    outputs equal the model's up to float rounding, one Mul per tensor, and its factors are
    exact on an INT8 grid."""
    model = quiet_channels_net(seed, producer, multiplier, kernel, stride, layout=layout, residual=residual)
    samples = samples_for(model)
    eq = equalize_depthwise(model, samples)
    if residual:                 # a model output keeps its 8-bit grid: nothing to gain
        assert not eq.factors and eq.model is model
        return
    assert list(eq.factors) == ["act" if producer != "Conv" else "c0"]
    muls = [op for op in eq.model.ops if op.name == "top.Mul"]
    assert len(muls) == 1 and [op for op in eq.model.ops if op.name == "top.Conv" and
                                op.operands[0] is muls[0].results[0]].__len__() == 2
    for k in eq.factors.values():
        q, s = P.weights_per_tensor(k.astype(np.float32))
        assert np.array_equal(q.astype(np.float64) * s, k.astype(np.float32).astype(np.float64)) or \
            np.allclose(q * s, k, rtol=1e-6, atol=0)
        assert k.max() <= MAX_FACTOR * (1 + 1e-9) and k.min() > 0
        assert k.max() / k.min() >= 2              # the quiet channels are raised
    for sample in samples[:2]:
        ref, got = TopInterpreter(model).run(sample), TopInterpreter(eq.model).run(sample)
        for name, r in ref.items():
            np.testing.assert_allclose(got[name], r, rtol=1e-4, atol=1e-5 * float(np.abs(r).max()))
    assert TopInterpreter(model).run(samples[0])["out"].shape == TopInterpreter(eq.model).run(samples[0])["out"].shape


def test_factors_rule():
    """k = (R / r) ** 0.5, at most MAX_FACTOR, whole multiples of the largest over 127; None where
    no channel reaches a factor of 2 (or the tensor is all zeros)."""
    k = factors_for(np.array([1.0, 0.25, 1e-9, 0.0]))
    step = k.max() / 127
    np.testing.assert_allclose(k / step, np.rint(k / step), atol=1e-9)
    assert k[2] == k[3] == pytest.approx(MAX_FACTOR) and k[1] == pytest.approx(2.0, rel=0.02)
    assert factors_for(np.array([1.0, 0.5, 0.3])) is None
    assert factors_for(np.zeros(4)) is None
    with pytest.raises(errors.UsageError, match="power"):
        equalize_depthwise(quiet_channels_net(0), [], power=2.0)


def test_int8_does_better_equalized_and_compile_keeps_it():
    """Pure INT8 of a conv with quiet channels read by depthwise convs: compile's all-INT8
    program with their input equalized beats the one without on a held-out input, auto keeps it
    (its judge lowers with plain links, where the conv writes its 16 bits into the Mul), saying
    so, and the simulator stays bit-equal; a net with no depthwise conv gets no equalize stage."""
    model = quiet_channels_net(1, producer="Conv")
    samples = samples_for(model, 8)
    held = samples_for(model, 1, seed=99)[0]
    kw = dict(chip="npu1", calibration_data=samples, test_input=samples[0], mixed_precision="none",
              weight_refit=False, bias_correction=False, weight_rounding=False, space_to_depth=False)
    ref = TopInterpreter(model).run(held)
    figures = {}
    for eq in (False, True, "auto"):
        c = tftpu.compile(model, equalize=eq, **kw)
        assert c.passed
        got = TpuInterpreter(c.deployed.model).run(held, dequantize=True)
        figures[eq] = min(sqnr(np.asarray(ref[n], np.float64), np.asarray(got[n], np.float64)) for n in ref)
        stage = [s for s in c.stages if s.name == "equalize"]
        assert bool(stage) == (eq is not False)
        if eq == "auto":
            assert stage[0].check.endswith(", kept") and "equalized TOP vs TOP" in stage[0].check
            assert c.report["equalize"] == stage[0].check
    assert figures[True] > figures[False] + 6 and figures["auto"] == figures[True]
    with pytest.raises(errors.UsageError, match="equalize"):
        tftpu.compile(model, equalize="yes", **kw)
    b = TopBuilder("plain")
    x = b.input("x", (1, 4, 8, 8))
    plain = b.finish([b.op("Conv", [x, b.weight("w", np.ones((2, 4, 1, 1), np.float32)), b.none()],
                           {"kernel_shape": [1, 1]}, "c")])
    c = tftpu.compile(plain, chip="npu1", calibration_data=samples_for(plain, 4), mixed_precision="none")
    assert not [s for s in c.stages if s.name == "equalize"]


def test_deploy_equalizes_on_its_samples():
    """deploy (tftpu-deploy --samples) runs the same step on its samples: the model lowered is the
    equalized one, checked against the TOP model given, the line in its result and JSON report;
    without samples, or with equalize=False, nothing changes."""
    from tftpu import quant
    from tftpu.pipelines.deploy import deploy
    from tftpu.pipelines.deploy_report import report_data

    model = quiet_channels_net(1, producer="Conv")
    samples = samples_for(model, 8)
    table = quant.calibrate(model, samples, "mse", asymmetric=True)
    kw = dict(quantize="INT8", chip="npu1", calibration_table=table, mixed_precision="none",
              test_input=samples_for(model, 1, seed=99)[0])
    done = deploy(model, samples=samples, equalize="auto", **kw)
    assert done.passed and done.equalize.endswith(", kept") and "equalized TOP vs TOP" in done.equalize
    assert any("equalized" in op.loc for op in done.model.ops) and done.seconds["equalize"] > 0
    assert report_data(done)["equalize"] == done.equalize
    for plain in (deploy(model, samples=samples, equalize=False, **kw), deploy(model, equalize=True, **kw)):
        assert plain.equalize is None and not any("equalized" in op.loc for op in plain.model.ops)
    with pytest.raises(errors.UsageError, match="equalize"):
        deploy(model, samples=samples, equalize="yes", **kw)


def test_a_depthwise_conv_up_to_7x7_reads_its_link_and_is_not_equalized():
    """A 3x3 depthwise conv reads its quiet-channel input on the 16-bit link itself (two INT8
    passes): nothing to equalize, no stage, and pure INT8 does better than on 8-bit activations
    by more than equalization gains; the lowering report names the convs so read."""
    from tftpu.transforms.lowering.lower import TWO_PASSES
    model = quiet_channels_net(1, producer="Conv", kernel=3)
    samples = samples_for(model, 8)
    held = samples_for(model, 1, seed=99)[0]
    assert not equalize_depthwise(model, samples).factors
    kw = dict(chip="npu1", calibration_data=samples, test_input=samples[0], mixed_precision="none",
              weight_refit=False, bias_correction=False, weight_rounding=False, space_to_depth=False)
    ref = TopInterpreter(model).run(held)
    figures = {}
    for links in (True, False):
        c = tftpu.compile(model, wide_links=links, **kw)
        assert c.passed and not [s for s in c.stages if s.name == "equalize"]
        got = TpuInterpreter(c.deployed.model).run(held, dequantize=True)
        figures[links] = min(sqnr(np.asarray(ref[n], np.float64), np.asarray(got[n], np.float64)) for n in ref)
        two = sorted(d.name for d in c.deployed.lowering.decisions if d.reason == TWO_PASSES)
        assert two == (["dw0", "dw1"] if links else [])
        assert ("2 conv(s) read a 16-bit link in two INT8 passes: dw0, dw1" in str(c.deployed.lowering)) \
            == links
    assert figures[True] > figures[False] + 6, figures
