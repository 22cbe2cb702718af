"""Empirical bias correction (`tftpu.quant.bias_correction`): the mean per-channel INT8 error of
a conv whose weights all round one way is taken back by its bias; the corrected copy differs
from the model only in biases; deploy / compile still judge against the model as given; the
same inputs give the same bytes; with the flag off nothing changes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tftpu
from tftpu import quant
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import TopBuilder, top
from tftpu.pipelines.deploy import deploy, verify
from tftpu.quant.bias_correction import correct_biases
from tftpu.transforms.lowering import lower

STEP = 0.01


def biased_net():
    """Positive inputs (as after a ReLU) -> a 3x3 conv without bias whose weights all lie 0.4 of
    an INT8 step above a level (INT8 rounds every one down) -> ReLU conv with a bias, same trick."""
    rng = np.random.default_rng(3)

    def weights(o, i):
        k = rng.integers(-100, 100, size=(o, i, 3, 3)).astype(np.float64)
        w = (k + 0.4) * STEP
        w[:, 0, 0, 0] = 127 * STEP                     # max |w| = 127 steps: the scale is STEP exactly
        return w.astype(np.float32)

    b = TopBuilder("biased")
    x = b.input("x", (1, 4, 10, 10))
    c1 = b.op("Conv", [x, b.weight("w1", weights(6, 4)), b.none()],
              {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "c1")
    c2 = b.op("Conv", [c1, b.weight("w2", weights(5, 6) * 0.1), b.weight("b2", np.full(5, 0.5, np.float32))],
              {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "do_relu": True}, "c2")
    model = b.finish([c2])
    samples = [{"x": rng.uniform(0, 1, (1, 4, 10, 10)).astype(np.float32)} for _ in range(6)]
    held = [{"x": rng.uniform(0, 1, (1, 4, 10, 10)).astype(np.float32)} for _ in range(4)]
    return model, samples, held


@pytest.fixture(scope="module")
def case():
    model, samples, held = biased_net()
    return model, quant.calibrate(model, samples, "mse"), samples, held


def _channel_error(model, tpu, name, held) -> np.ndarray:
    """Per channel, the mean of (INT8 - float) of tensor `name` over `held`."""
    top_run, tpu_run = TopInterpreter(model), TpuInterpreter(tpu)
    diffs = [tpu_run.run(s, dump_all=True, dequantize=True)[name].astype(np.float64)
             - top_run.run(s, dump_all=True)[name] for s in held]
    return np.mean(diffs, axis=(0, 1, 3, 4))


def test_biased_rounding_is_taken_back_by_the_bias(case):
    model, table, samples, held = case
    corrected, report = correct_biases(model, table, samples)
    assert [o["name"] for o in report.ops] == ["c1", "c2"] and report.samples == 6
    base, _ = lower(model, "npu1", "INT8", table)
    fixed, _ = lower(corrected, "npu1", "INT8", table)
    before, after = _channel_error(model, base, "c1", held), _channel_error(model, fixed, "c1", held)
    # every weight rounded down by 0.4 step on inputs of mean 0.5: about -0.4 * 0.5 * 36 steps
    assert np.all(before < -3 * STEP)
    assert np.max(np.abs(after)) < 0.2 * np.max(np.abs(before))
    ref = [TopInterpreter(model).run(s)["c2"] for s in held]
    err = [np.mean((TpuInterpreter(t).run(s, dequantize=True)["c2"] - r) ** 2)
           for t in (base, fixed) for s, r in zip(held, ref)]
    assert np.mean(err[len(held):]) < np.mean(err[:len(held)])       # the output closer to float too
    assert "2 conv/matmul/deconv biases corrected over 6 samples" in str(report)


def test_the_corrected_copy_differs_only_in_biases(case):
    model, table, samples, _ = case
    text, weights = model.text(), {k: v.copy() for k, v in model.weights.items()}
    corrected, report = correct_biases(model, table, samples)
    assert model.text() == text and all(np.array_equal(model.weights[k], v) for k, v in weights.items())
    ops = lambda m: [(op.name, op.loc, op.attrs()) for op in m.ops if not isinstance(op, (top.Weight, top.NoneOp))]
    assert ops(corrected) == ops(model)
    corrected.verify()
    changed = {k for k in corrected.used_weights() if k not in model.weights
               or not np.array_equal(corrected.weights[k], model.weights[k])}
    assert changed == {"b2", "c1_bias_corrected"}       # c1 had no bias: it has one now
    c1 = next(op for op in corrected.ops if op.loc == "c1")
    assert c1.operands[2].owner.loc == "c1_bias_corrected"
    # c1 is linear: its float output moves by its new bias, channel by channel, and nothing else
    x = samples[0]
    a = TopInterpreter(model).run(x, dump_all=True)["c1"]
    b = TopInterpreter(corrected).run(x, dump_all=True)["c1"]
    np.testing.assert_allclose(b - a, np.broadcast_to(corrected.weights["c1_bias_corrected"].reshape(1, -1, 1, 1), a.shape),
                               atol=1e-5)


def test_deploy_lowers_the_corrected_copy_and_judges_against_the_model(case):
    model, table, samples, held = case
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=held[0],
                 samples=samples, mixed_precision="none", bias_correction=True)
    assert res.bias_correction is not None and len(res.bias_correction.ops) == 2
    plain, _ = lower(model, "npu1", "INT8", table)
    assert not np.array_equal(res.model.weights[_bias_key(res.model, "c2")], plain.weights[_bias_key(plain, "c2")])
    pool = [held[0]] + samples
    _, rows, _ = verify(model, res.model, pool, res.tolerance)            # against the original model
    assert (res.outputs[0].cosine, res.outputs[0].sqnr) == (rows[0].cosine, rows[0].sqnr)
    corrected, _ = correct_biases(model, table, samples)
    _, rows, _ = verify(corrected, res.model, pool, res.tolerance)        # not the corrected copy
    assert res.outputs[0].sqnr != rows[0].sqnr
    assert res.simulator["passed"]
    # the same inputs give the same bytes
    again = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=held[0],
                   samples=samples, mixed_precision="none", bias_correction=True)
    assert again.model.text() == res.model.text()
    assert all(np.array_equal(again.model.weights[k], v) for k, v in res.model.weights.items())


def test_flag_off_is_the_plain_lowering(case):
    model, table, samples, held = case
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=held[0],
                 samples=samples, mixed_precision="none", bias_correction=False)
    before = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=held[0],
                    samples=samples, mixed_precision="none")                  # as deploy was
    plain, _ = lower(model, "npu1", "INT8", table)
    assert res.bias_correction is None and res.model.text() == before.model.text()
    assert res.model.weights.keys() == plain.weights.keys()
    assert all(np.array_equal(plain.weights[k], v) for k, v in res.model.weights.items())


def test_compile_corrects_by_default_and_reports_it(case):
    model, _, samples, held = case
    on = tftpu.compile(model, chip="npu1", calibration_data=samples, test_input=held[0], mixed_precision="none",
                       space_to_depth=False, weight_rounding=False, weight_refit=False)
    stage = next(s for s in on.stages if s.name == "bias correction")
    assert "biases corrected" in stage.check and on.report["bias_correction"]["ops"] == 2
    assert on.top_model is not None and "c1_bias_corrected" not in on.top_model.weights     # the model as given
    off = tftpu.compile(model, chip="npu1", calibration_data=samples, test_input=held[0], mixed_precision="none",
                        space_to_depth=False, bias_correction=False, weight_rounding=False, weight_refit=False)
    assert "bias_correction" not in off.report and all(s.name != "bias correction" for s in off.stages)
    sq = lambda c: min(r.sqnr for r in c.deployed.outputs)
    assert sq(on) > sq(off)


def _bias_key(tpu, loc):
    op = next(o for o in tpu.ops if o.name == "tpu.Conv" and o.loc.split("_i8")[0] == loc)
    return op.operands[2].owner.key


def test_a_relu_after_the_conv_counts_like_a_fused_one():
    """Only the positions a ReLU passes on count, fused (do_relu) or as the conv's only reader;
    a PReLU weights the cut side by its slope."""
    rng = np.random.default_rng(5)
    w = (rng.integers(-100, 100, size=(4, 3, 3, 3)) + 0.4) * STEP
    w[:, 0, 0, 0] = 127 * STEP
    w = w.astype(np.float32)
    samples = [{"x": rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]

    def build(kind):
        b = TopBuilder(kind)
        x = b.input("x", (1, 3, 8, 8))
        attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "do_relu": kind == "fused"}
        c = b.op("Conv", [x, b.weight("w", w), b.weight("b", np.zeros(4, np.float32))], attrs, "c")
        if kind == "relu":
            c = b.op("Relu", [c], {}, "r")
        elif kind == "prelu":
            c = b.op("PRelu", [c, b.weight("s", np.full((4, 1, 1), 0.25, np.float32))], {}, "r")
        m = b.finish([c])
        return m, quant.calibrate(m, samples, "mse")

    deltas = {}
    for kind in ("fused", "relu", "prelu", "none"):
        m, table = build(kind)
        if kind == "relu":
            table.entries["c"] = build("fused")[1].entries["c"]      # the same grids as the fused conv
        corrected, _ = correct_biases(m, table, samples)
        deltas[kind] = corrected.weights["b"]
    np.testing.assert_array_equal(deltas["relu"], deltas["fused"])
    assert not np.array_equal(deltas["prelu"], deltas["fused"]) and not np.array_equal(deltas["none"], deltas["fused"])


def test_deploy_keeps_the_model_as_given_where_the_test_input_loses(case, monkeypatch):
    import tftpu.pipelines.deploy as D

    model, table, samples, held = case
    kept = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=held[0],
                  samples=samples, mixed_precision="none", bias_correction=True)
    assert kept.bias_correction.kept
    assert "kept: worst output SQNR on the test input and 6 samples" in str(kept.bias_correction)
    assert ", on the test input alone " in str(kept.bias_correction)
    real = D._keep_correction

    def refuse(*args):
        real(*args)
        for report in args[3]:
            report.kept = False
        return False

    monkeypatch.setattr(D, "_keep_correction", refuse)
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=held[0],
                 samples=samples, mixed_precision="none", bias_correction=True)
    plain, _ = lower(model, "npu1", "INT8", table)
    assert not res.bias_correction.kept and res.model.weights.keys() == plain.weights.keys()
    assert all(np.array_equal(plain.weights[k], v) for k, v in res.model.weights.items())


def test_the_guard_judges_pooled_and_the_test_input_alone():
    """An image whose output is zero says nothing on its own (judged alone, any error there is
    -inf dB, and a tie kept the correction whatever else it did), so the samples are pooled, as
    verify pools them; and the test input is judged alone too: a constant offset, small beside
    the other images' outputs, is not kept where the test input's output is small as well."""
    from tftpu.ir.module import TopModel
    from tftpu.pipelines.deploy import _Judge, _keep_correction
    from tftpu.quant.bias_correction import BiasCorrection

    b = TopBuilder("identity")
    x = b.input("x", (1, 4, 6, 6))
    y = b.op("Conv", [x, b.weight("w", np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1)),
                      b.weight("b", np.zeros(4, np.float32))], {"kernel_shape": [1, 1]}, "y")
    model = b.finish([y])
    offset, _ = lower(TopModel(model.module, {**model.weights, "b": np.array([0.05, -0.05, 0.05, -0.05], np.float32)}),
                      "npu1", "F32")                            # the "correction": +-0.05 everywhere
    gain, _ = lower(TopModel(model.module, {**model.weights, "w": 1.3 * model.weights["w"]}),
                    "npu1", "F32")                              # the model "as given": 30% off, 10.5 dB
    pattern = np.random.default_rng(0).uniform(-1, 1, (1, 4, 6, 6)).astype(np.float32)
    small, large, empty = ({"x": np.float32(v) * pattern} for v in (0.02, 1, 0))
    report = BiasCorrection([], 1, 0.0)
    assert _keep_correction(_Judge(model, [large, empty, small]), offset, gain, [report]) and report.kept
    assert report.check.startswith("kept: worst output SQNR on the test input and 2 samples 10.")
    report = BiasCorrection([], 1, 0.0)
    assert not _keep_correction(_Judge(model, [small, empty, large]), offset, gain, [report]) and not report.kept
    assert ", on the test input alone 10." in report.check and report.check.endswith(" -> -12.42 dB")


def test_tftpu_deploy_flag(case, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    model, table, _, held = case
    top_path, _ = model.save(tmp_path / "biased.top.mlir")
    table.save(tmp_path / "cali")
    np.savez(tmp_path / "in.npz", **held[0])
    args = [str(Path(sys.executable).parent / "tftpu-deploy"), f"--mlir={top_path}", "--quantize=INT8", "--chip=npu1",
            f"--calibration_table={tmp_path / 'cali'}", f"--test_input={tmp_path / 'in.npz'}",
            "--mixed_precision=none"]
    on = subprocess.run(args + ["--bias_correction"], capture_output=True, text=True, timeout=300)
    assert on.returncode == 0, on.stderr
    assert "bias correction: 2 conv/matmul/deconv biases corrected over 1 samples" in on.stdout
    assert "worst output SQNR on the test input" in on.stdout
    off = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert off.returncode == 0 and "bias correction" not in off.stdout


def test_the_guard_judges_concatenated_parts():
    from tests.tools.test_deploy import detector, samples_for

    model = detector()
    samples = samples_for(model)
    table = quant.calibrate(model, samples, "mse")
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                 samples=samples[1:], mixed_precision="none", bias_correction=True)
    assert res.parts and "worst output SQNR on the test input and 5 samples" in res.bias_correction.check



def relu_pair():
    """x -> c1 (3x3 conv + ReLU, INT8) -> c2 (1x1 conv with a bias): c1's output grid, cut to 0.6
    of its range, clips only large positive values, so the INT8 c1 hands c2 a lower mean (on 8
    bits: the checks below lower without 16-bit links, which would give c2 c1's accumulator)."""
    rng = np.random.default_rng(5)
    b = TopBuilder("pair")
    x = b.input("x", (1, 3, 8, 8))
    c1 = b.op("Conv", [x, b.weight("w1", rng.normal(0, 0.5, (6, 3, 3, 3)).astype(np.float32)), b.none()],
              {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "do_relu": True}, "c1")
    c2 = b.op("Conv", [c1, b.weight("w2", np.abs(rng.normal(0, 0.5, (4, 6, 1, 1))).astype(np.float32)),
                       b.weight("b2", np.zeros(4, np.float32))], {"kernel_shape": [1, 1]}, "c2")
    model = b.finish([c2])
    samples = [{"x": rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(6)]
    held = [{"x": rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    table = quant.calibrate(model, samples, "minmax")
    t, lo, hi, *rest = table.entries["c1"]
    table = dataclasses.replace(table, entries={**table.entries, "c1": (0.6 * t, lo, 0.6 * hi, *rest)})
    return model, table, samples, held


def _mixed_error(model, lowered_from, table, qtable, held) -> tuple[float, np.ndarray]:
    """(mean squared error, mean error per channel) of c2 of `lowered_from` lowered with `qtable`
    against `model` in float, over `held`."""
    tpu, _ = lower(lowered_from, "npu1", "INT8", table, qtable=qtable, wide_links=False)
    diffs = np.array([TpuInterpreter(tpu).run(s, dequantize=True)["c2"].astype(np.float64)
                      - TopInterpreter(model).run(s)["c2"] for s in held])
    return float(np.mean(diffs ** 2)), diffs.mean(axis=(0, 1, 3, 4))


def test_a_float_op_absorbs_the_mean_error_of_its_int8_inputs():
    """c2 kept in float reads c1's INT8 output, clipped by its grid (a mean shift no correction
    of c1 can take back): c2's bias takes it back, its weights stay the float ones."""
    model, table, samples, held = relu_pair()
    qtable = {"c2": "F16"}
    corrected, report = correct_biases(model, table, samples, float_ops={"c2"}, wide_links=False)
    assert [(o["name"], o["float"]) for o in report.ops] == [("c1", False), ("c2", True)]
    assert np.array_equal(corrected.weights["w2"], model.weights["w2"])
    only_c1, _ = correct_biases(model, table, samples, float_ops={"c2"}, fixed={"c2"}, wide_links=False)
    assert np.array_equal(only_c1.weights["b2"], model.weights["b2"])
    before, after = (_mixed_error(model, m, table, qtable, held + samples) for m in (only_c1, corrected))
    assert np.max(np.abs(after[1])) < 0.3 * np.max(np.abs(before[1])) and after[0] < before[0]


def test_an_op_left_as_given_is_simulated_in_float_and_unchanged(case):
    model, table, samples, _ = case
    corrected, report = correct_biases(model, table, samples, float_ops={"c1"}, fixed={"c1"}, refit=True)
    assert report.skipped == {"c1": "left as given"} and report.refit == 1          # c2 refit
    assert np.array_equal(corrected.weights["w1"], model.weights["w1"]) and "c1_bias_corrected" not in corrected.weights


def test_a_float_conv_is_refit_to_its_int8_inputs_in_float():
    model, table, samples, held = relu_pair()
    qtable = {"c2": "F16"}
    corrected, report = correct_biases(model, table, samples, float_ops={"c2"}, refit=True, wide_links=False)
    assert report.refit == 2
    w = corrected.weights["w2"]
    assert w.dtype == np.float32 and not np.array_equal(w, model.weights["w2"])
    scale = np.abs(w).reshape(w.shape[0], -1).max(axis=1) / 127
    off_grid = np.abs(w / scale.reshape(-1, 1, 1, 1) - np.rint(w / scale.reshape(-1, 1, 1, 1)))
    assert off_grid.max() > 0.1                              # float weights, not put on an INT8 grid
    only_c1, _ = correct_biases(model, table, samples, float_ops={"c2"}, fixed={"c2"}, refit=True,
                                wide_links=False)
    assert _mixed_error(model, corrected, table, qtable, held)[0] < _mixed_error(model, only_c1, table, qtable, held)[0]
