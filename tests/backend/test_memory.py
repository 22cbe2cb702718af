"""DDR memory assignment: no two tensors alive at once share bytes, the peak stays within 10% of
the lower bound (the most bytes live at once) on real models, addresses land in the types, and
the module still runs and round-trips through its text."""

from __future__ import annotations

import numpy as np
import pytest

from tests import material
from tftpu import frontend, quant
from tftpu.backend import assign_memory, plan_memory
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import load, top
from tftpu.ir.base import value_name
from tftpu.transforms.lowering import lower


def _lifetimes(model):
    first, last = {}, {}
    for i, op in enumerate(model.ops):
        if isinstance(op, (top.Weight, top.NoneOp)):
            continue
        for r in op.results:
            first[value_name(r)] = 0 if isinstance(op, top.Input) else i
            last[value_name(r)] = first[value_name(r)]
        for v in op.operands:
            if value_name(v) in first:
                last[value_name(v)] = i
    for v in model.return_op.operands:
        last[value_name(v)] = len(model.ops)
    return first, last


def check_plan(model, plan):
    first, last = _lifetimes(model)
    acts = sorted((a, s, n) for n, (a, s) in plan.addresses.items() if n in first)
    for i, (a, s, n) in enumerate(acts):
        assert a % plan.alignment == 0 and a >= plan.activation_base >= plan.weight_bytes
        for b, t, m in acts[i + 1:]:
            if b >= a + s:
                break
            overlap_in_time = not (last[n] < first[m] or last[m] < first[n])
            assert not overlap_in_time, f"{n} and {m} are alive together and share bytes"
    weights = sorted((a, s) for n, (a, s) in plan.addresses.items() if n not in first)
    assert all(a + s <= b for (a, s), (b, _) in zip(weights, weights[1:]))
    assert plan.lower_bound <= plan.peak <= 1.10 * plan.lower_bound, str(plan)


def _deployed(model, samples, mode="INT8", chip="npu1"):
    table = quant.calibrate(model, samples, "mse") if mode == "INT8" else None
    tpu, _ = lower(model, chip, mode, table)
    return tpu


def tiny():
    from tftpu.ir import TopBuilder
    rng = np.random.default_rng(0)
    b = TopBuilder("tiny")
    x = b.input("x", (1, 3, 8, 8))
    c = b.op("Conv", [x, b.weight("w", rng.normal(size=(4, 3, 3, 3)).astype(np.float32)), b.none()],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "do_relu": True}, "c")
    d = b.op("Conv", [c, b.weight("w2", rng.normal(size=(4, 4, 1, 1)).astype(np.float32)), b.none()],
             {"kernel_shape": [1, 1]}, "d")
    a = b.op("Add", [c, d], {}, "a")
    return b.finish([b.op("Sigmoid", [a], {}, "out"), d])


def test_tiny_model_plan_runs_and_round_trips(tmp_path):
    model = tiny()
    x = {"x": np.random.default_rng(1).normal(size=(1, 3, 8, 8)).astype(np.float32)}
    tpu = _deployed(model, [x])
    before = TpuInterpreter(tpu).run(x)
    plan = assign_memory(tpu, "npu1")
    check_plan(tpu, plan)
    tpu.verify()
    text = tpu.text()
    assert ", " + str(plan.addresses["c"][0]) + " : i64>" in text         # the address is in the type
    after = TpuInterpreter(tpu).run(x)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    path, _ = tpu.save(tmp_path / "tiny.tpu.mlir")
    again = load(path)
    assert again.text() == tpu.text()
    assert plan_memory(again, "npu1").addresses == plan.addresses        # deterministic


@pytest.mark.slow
@pytest.mark.parametrize("which", ["selfie", "rnet", "onet", "MobileNetV2"])
def test_real_models_peak_within_ten_percent_of_the_lower_bound(which):
    if which == "selfie":
        model = frontend.load(material.get("selfie_segmentation.tflite"))
    elif which in ("rnet", "onet"):
        from tests.models import mtcnn
        model = frontend.load(getattr(mtcnn, which)(weights=True))
    else:
        import keras
        model = frontend.load(frontend.to_onnx(keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3))))
    shape = model.func.function_type.inputs.data[0].get_shape()
    samples = [{model.input_names[0]: np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)}]
    for mode, chip in (("INT8", "npu1"), ("F16", "edge16")):
        tpu = _deployed(model, samples, mode, chip)
        plan = plan_memory(tpu, chip)
        check_plan(tpu, plan)
