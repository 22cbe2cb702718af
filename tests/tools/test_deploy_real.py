"""Deployed INT8 on real models: mtcnn R-Net / O-Net with their real weights on lfw_subset
(integer inference, against TFLite's own INT8 figures in PEERS.md), and mediapipe's selfie
segmentation, whose pure INT8 mask falls apart and which the mixed-precision search repairs (the
rankings each on a synthetic model: tests/tools/test_deploy.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests import material
from tftpu import frontend, quant
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.pipelines.deploy import deploy

# TFLite 2.21 full-INT8, same protocol (PEERS.md / TEST-MATERIAL.md): largest face-score move
TFLITE_MOVE = {"rnet": 0.024, "onet": 0.069}


@pytest.mark.slow
@pytest.mark.parametrize("net,size", [("rnet", 24), ("onet", 48)])
def test_mtcnn_int8_integer_inference_beats_tflite(net, size):
    from tests.models import mtcnn

    km = getattr(mtcnn, net)(weights=True)
    images, labels = mtcnn.lfw_inputs(size)
    images = images.astype(np.float32)
    model = frontend.load(km)
    name = model.input_names[0]
    calib_idx = np.concatenate([np.where(labels == 1)[0][:50], np.where(labels == 0)[0][:50]])
    table = quant.calibrate(model, [{name: images[i:i + 1]} for i in calib_idx], "mse", asymmetric=True)
    res = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, asymmetric=True,
                 test_input={name: images[:1]}, mixed_precision="none")
    assert res.passed
    ref, run = TopInterpreter(model), TpuInterpreter(res.model)
    prob = next(n for n in model.output_names if ref.run({name: images[:1]})[n].shape[-1] == 2)
    pf = np.array([ref.run({name: images[i:i + 1]})[prob][0, 1] for i in range(len(images))])
    pi = np.array([run.run({name: images[i:i + 1]})[prob][0, 1] for i in range(len(images))])
    assert np.mean((pi > 0.5) == labels) == 1.0 and np.mean((pf > 0.5) == labels) == 1.0
    assert float(np.abs(pi - pf).max()) < TFLITE_MOVE[net]
    convs = [d for d in res.lowering.decisions if d.op in ("top.Conv", "top.MatMul", "top.PRelu")]
    assert convs and all(d.mode == "INT8" for d in convs)


def _selfie_samples(model):
    out = []
    for photo in ("astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png"):
        img = material.image(photo, (256, 256)).astype(np.float32) / 255.0
        out.append({model.input_names[0]: img[None]})
    return out


def _pooled_iou(model, tpu_model, samples) -> float:
    out = model.output_names[0]
    ref, run = TopInterpreter(model), TpuInterpreter(tpu_model)
    inter = union = 0
    for s in samples:
        a, b = ref.run(s)[out] > 0.5, run.run(s)[out] > 0.5
        inter += int((a & b).sum())
        union += int((a | b).sum())
    return inter / union


@pytest.mark.slow
def test_selfie_segmentation_mixed_precision():
    model = frontend.load(material.get("selfie_segmentation.tflite"))
    samples = _selfie_samples(model)
    table = quant.calibrate(model, samples, "mse")
    pure = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                  samples=samples[1:], mixed_precision="none")
    # default flags: the search (cosine 0.99, 20 dB, auto ranking) keeps at most 5% of the
    # FLOPs in float and the program within 1.15x the all-INT8 latency, and says the target was missed
    within = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                    samples=samples[1:])
    assert within.search.budget_limited and not within.search.met and within.search.kept
    assert within.lowering.flop_shares()["INT8"] >= 0.95 and within.search.latency_ratio <= 1.15 + 1e-9
    assert "a larger mixed_precision_budget" in within.search.summary
    # without the budgets, the search keeps the mask
    default = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                     samples=samples[1:], mixed_precision_budget=None, mixed_precision_latency=None)
    assert default.search is not None and default.search.met
    # with 16-bit links most of the FLOPs stay INT8 (measured 76%; 36% with 8-bit links)
    assert default.lowering.flop_shares()["INT8"] >= 0.6
    assert _pooled_iou(model, default.model, samples) >= 0.98
    assert _pooled_iou(model, pure.model, samples) < 0.98     # pure INT8 needed the search


KERAS_APPS = [("ResNet50", 64), ("MobileNetV2", 96), ("EfficientNetB0", 64), ("MobileNetV3Small", 64),
              ("ConvNeXtTiny", 64)]


@pytest.mark.slow
@pytest.mark.parametrize("name,size", KERAS_APPS, ids=[n for n, _ in KERAS_APPS])
def test_keras_applications_every_mode_on_both_chips(name, size):
    """F32 is bit-equal to TOP; BF16, F16 and INT8 pass TPU-MLIR's default tolerances on every
    chip that runs the mode (random weights; the logits before any softmax are judged too). The
    simulator equals TPU inference bit for bit in BF16, F16 and INT8 by construction (the same
    kernel calls on the same values, float window ops one output row per call), on any CPU; in
    F32 (TOP's kernels on whole tensors) it is held to deploy's round-off check."""
    import keras

    km = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classifier_activation=None)
    model = frontend.load(frontend.to_onnx(km), name=name)
    rng = np.random.default_rng(0)
    shape = model.func.function_type.inputs.data[0].get_shape()
    samples = [{model.input_names[0]: rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(3)]
    table = quant.calibrate(model, samples, "mse")
    for chip, modes in (("npu1", ("F32", "BF16", "F16", "INT8")), ("edge16", ("F16", "INT8"))):
        for mode in modes:
            res = deploy(model, quantize=mode, chip=chip, calibration_table=table, test_input=samples[0],
                         samples=samples[1:], mixed_precision="none")
            assert res.passed, (chip, mode, res.outputs, res.simulator)
            if mode == "F32":
                assert all(r.note.startswith("equal") for r in res.tensors.rows), (chip, res.worst_tensors(3))
            else:
                assert all(r["bit_exact"] for r in res.simulator["outputs"]), (chip, mode, res.simulator)
                # a wide margin on every output that is not zero up to rounding (random weights
                # leave some nets' logits there)
                cos_tol = {"BF16": 0.99, "F16": 0.999, "INT8": 0.98}[mode]
                judged = [r for r in res.outputs if "rounding noise" not in r.note]
                assert all(r.cosine > cos_tol for r in judged), (chip, mode, res.outputs)
