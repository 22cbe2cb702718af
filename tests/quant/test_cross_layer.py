"""Cross-layer equalization (`tftpu.quant.cross_layer`): the equalized model computes what the
model computes, only the pairs it may rescale are rescaled, and in INT8 a conv output with quiet
channels does better."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tftpu
from tftpu import errors, quant
from tftpu.interp.similarity import max_relative_difference, sqnr
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import TopBuilder
from tftpu.quant.cross_layer import MAX_FACTOR, equalize_cross_layer, pairs
from tftpu.transforms.lowering import lower


def quiet_net(seed: int, kernel: int = 3, depthwise: bool = False, relu: bool = True, limit: float = -1.0,
              readers: int = 1, stride: int = 1, reader: str = "Conv", exposed: bool = False, quiet: float = 0.02):
    """conv A (fused ReLU where `relu`, ReLU6 where `limit` 6) with half its output channels
    quiet (`quiet` times the others, their reader weights as much larger), read by `readers` dense convs (or an Add, `reader`); A's
    output a model output too where `exposed`."""
    rng = np.random.default_rng(seed)
    c = 8
    b = TopBuilder("quiet")
    x = b.input("x", (1, c if depthwise else 4, 10, 10))
    scale = np.where(np.arange(c) % 2 == 0, quiet, 1.0)
    w_in = 1 if depthwise else 4
    wa = rng.normal(size=(c, w_in, kernel, kernel)) * 0.4 * scale[:, None, None, None]
    attrs = {"kernel_shape": [kernel, kernel], "pads": [kernel // 2] * 4, "group": c if depthwise else 1}
    if relu:
        attrs["do_relu"] = True
        attrs["relu_limit"] = limit
    y = b.op("Conv", [x, b.weight("wa", wa.astype(np.float32)),
                      b.weight("ba", (rng.normal(size=c) * 0.1 * scale).astype(np.float32))], attrs, "a")
    outs = []
    for i in range(readers):
        if reader == "Add":
            outs.append(b.op("Add", [y, y], {}, f"r{i}"))
            continue
        k = 3 if i == 0 else 1
        wb = rng.normal(size=(3, c, k, k)) * 0.3 / scale[None, :, None, None]     # (the quiet channels count)
        outs.append(b.op("Conv", [y, b.weight(f"wb{i}", wb.astype(np.float32)),
                                  b.weight(f"bb{i}", rng.normal(size=3).astype(np.float32) * 0.1)],
                         {"kernel_shape": [k, k], "pads": [k // 2] * 4, "strides": [stride, stride]}, f"r{i}"))
    return b.finish(outs + ([y] if exposed else []))


def samples_for(model, n=6, seed=3):
    rng = np.random.default_rng(seed)
    shape = model.func.function_type.inputs.data[0].get_shape()
    return [{model.input_names[0]: rng.normal(size=shape).astype(np.float32)} for _ in range(n)]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 16), kernel=st.sampled_from([1, 3]), depthwise=st.booleans(), relu=st.booleans(),
       readers=st.sampled_from([1, 2]), stride=st.sampled_from([1, 2]))
def test_the_equalized_model_computes_the_same(seed, kernel, depthwise, relu, readers, stride):
    """Over kernels, depthwise or dense producers, with or without a fused ReLU, one or two
    readers and their strides: the quiet channels are scaled up (within MAX_FACTOR), the readers
    take the factors back, and the outputs equal the model's up to float rounding."""
    model = quiet_net(seed, kernel, depthwise, relu, readers=readers, stride=stride)
    samples = samples_for(model)
    eq = equalize_cross_layer(model, samples)
    assert list(eq.factors) == ["a"] and sorted(eq.readers["a"]) == [f"r{i}" for i in range(readers)]
    k = eq.factors["a"]
    dumps = [TopInterpreter(model).run(x, dump_all=True)["a"] for x in samples]
    r = np.max([np.abs(a).max(axis=(0, 2, 3)) for a in dumps], axis=0)
    np.testing.assert_allclose(k, np.minimum((r.max() / np.maximum(r, r.max() / MAX_FACTOR ** 2)) ** 0.5, MAX_FACTOR))
    for sample, a in list(zip(samples, dumps))[:2]:
        got = TopInterpreter(eq.model).run(sample, dump_all=True)
        np.testing.assert_allclose(got["a"], a * k[None, :, None, None], rtol=1e-5, atol=1e-6 * np.abs(a).max())
        assert max_relative_difference(TopInterpreter(model).run(sample), got, model.output_names) < 1e-5
    assert eq.model.weights is not model.weights and np.array_equal(model.weights["wa"], quiet_net(
        seed, kernel, depthwise, relu, readers=readers, stride=stride).weights["wa"])      # the model untouched


@pytest.mark.parametrize("case", [dict(limit=6.0), dict(reader="Add"), dict(exposed=True)])
def test_what_cannot_take_the_factors_back_is_left(case):
    """ReLU6 (not positively homogeneous at its limit), a reader that is not a conv, and a model
    output: no pair, the model itself returned."""
    model = quiet_net(1, **case)
    assert pairs(model) == []
    eq = equalize_cross_layer(model, samples_for(model))
    assert eq.model is model and not eq.factors and "no conv output" in str(eq)


def test_even_channels_need_no_factors():
    """Channels of one range: no factor reaches MIN_FACTOR, nothing changes."""
    model = quiet_net(2, quiet=1.0)
    assert equalize_cross_layer(model, samples_for(model)).model is model


def test_bad_parameters_are_usage_errors():
    model = quiet_net(0)
    with pytest.raises(errors.UsageError, match="power"):
        equalize_cross_layer(model, samples_for(model), power=0)
    with pytest.raises(errors.UsageError, match="max_factor"):
        equalize_cross_layer(model, samples_for(model), max_factor=0.5)


def test_quiet_channels_do_better_in_int8():
    """All INT8 on one per-tensor grid for A's output: the equalized program's outputs are nearer
    the float model's."""
    model = quiet_net(5, quiet=0.01, readers=2)
    samples = samples_for(model, 8)
    eq = equalize_cross_layer(model, samples)
    chip = tftpu.chip.load("npu1")
    figures = []
    for m in (model, eq.model):
        table = quant.calibrate(m, samples, "mse")
        tpu_model, _ = lower(m, chip, "INT8", table, wide_links=False)
        got = TpuInterpreter(tpu_model).run(samples[0], dequantize=True)
        ref = TopInterpreter(model).run(samples[0])
        figures.append(min(sqnr(ref[n], got[n]) for n in model.output_names))
    assert figures[1] > figures[0] + 3, figures


def test_compile_runs_it_on_request():
    """tftpu.compile(cross_layer=True): a stage says what was equalized and that the float program
    is unchanged; the simulator stays bit-exact; off by default."""
    model = quiet_net(4, readers=2)
    samples = samples_for(model, 6)
    compiled = tftpu.compile(model, chip="npu1", calibration_data=samples, test_input=samples[0],
                             cross_layer=True, mixed_precision="none", log=lambda line: None)
    stage = next(s for s in compiled.stages if s.name == "cross-layer equalization")
    assert stage.passed and "1 conv output(s) equalized across layers" in stage.check and stage.check.endswith(", kept")
    assert compiled.report["cross_layer"] == stage.check
    assert all("bit-exact" in s.check for s in compiled.stages if s.name == "simulate")
    plain = tftpu.compile(model, chip="npu1", calibration_data=samples, test_input=samples[0],
                          mixed_precision="none", log=lambda line: None)
    assert not any(s.name.startswith("cross-layer equalization") for s in plain.stages)
    with pytest.raises(errors.UsageError, match="cross_layer"):
        tftpu.compile(model, chip="npu1", calibration_data=samples, cross_layer="yes")


def test_the_deploy_tool_runs_it_on_request(tmp_path):
    """tftpu-deploy --cross_layer with --samples: its line printed, the float check kept."""
    model = quiet_net(6, readers=2)
    samples = samples_for(model, 5)
    top_path, _ = model.save(tmp_path / "quiet.top.mlir")
    quant.calibrate(model, samples, "mse").save(tmp_path / "cali")
    np.savez(tmp_path / "in.npz", **samples[0])
    (tmp_path / "more").mkdir()
    for i, s in enumerate(samples[1:]):
        np.savez(tmp_path / "more" / f"{i}.npz", **s)
    script = Path(sys.executable).parent / "tftpu-deploy"
    done = subprocess.run([str(script), f"--mlir={top_path}", "--quantize=INT8", "--chip=npu1",
                           f"--calibration_table={tmp_path / 'cali'}", f"--test_input={tmp_path / 'in.npz'}",
                           f"--samples={tmp_path / 'more'}", "--mixed_precision=none", "--cross_layer"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("cross-layer equalization: "))
    assert "1 conv output(s) equalized across layers" in line and line.endswith(", kept")
