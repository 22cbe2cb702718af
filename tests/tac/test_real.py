"""TAC on real mediapipe models: outputs unchanged in tf.lite.Interpreter, sensible placement."""

import numpy as np
import pytest

import tftpu.tac as tac
from tftpu.tac.passes.pick import brute_force
from tests.tac import models


def _photo(size):
    from tests import material

    img = material.image("astronaut.png")
    tf = models._tf()
    x = tf.image.resize(img[None].astype(np.float32) / 255.0, (size, size)).numpy()
    return x.astype(np.float32)


@pytest.mark.parametrize("specs", [("GPU", "CPU"), ("NNAPI", "GPU", "CPU"), ("NNAPI", "CPU")])
@pytest.mark.parametrize("name,size", [("selfie", 256), ("face", 128)])
def test_real_model_outputs_unchanged(model_bytes, name, size, specs):
    data = model_bytes(name)
    result = tac.run(data, device_specs=specs)
    out = result.tflite()
    for x in (_photo(size), np.random.default_rng(1).random((1, size, size, 3), dtype=np.float32)):
        ref, got = models.run_tflite(data, [x]), models.run_tflite(out, [x])
        assert len(ref) == len(got)
        for a, b in zip(ref, got):
            assert a.shape == b.shape and np.array_equal(a, b)
    for part in result.partitions.values():
        assert part.picked.exact
        if len(part.subgraphs) <= 12 and np.prod([len(v) for v in part.views]) <= 50_000:
            assert part.picked.cost == pytest.approx(brute_force(part.problem).cost)
        assert part.picked.cost <= part.greedy.cost + 1e-9


def test_selfie_on_gpu(model_bytes):
    result = tac.run(model_bytes("selfie"), device_specs=("GPU", "CPU"))
    placed = result.op_devices()
    assert len(placed) == 246
    assert {o["device"] for o in placed} == {"GPU"}  # the custom transpose conv included
    rep = result.report
    assert rep["cost_us"]["picked"] < rep["cost_us"]["all_CPU"] / 2
    assert rep["ops_per_device"] == {"GPU": 246}


def test_selfie_nnapi_splits_around_custom_op(model_bytes):
    result = tac.run(model_bytes("selfie"), device_specs=("NNAPI", "CPU"))
    part = result.partitions[0]
    custom = [i for i, n in enumerate(part.graph.nodes) if n.name == "CUSTOM"]
    assert all(part.annotation[i].device == "CPU" for i in custom)
    assert len(part.subgraphs) >= 3
    names = [s.name for s in part.subgraphs]
    assert any(n.endswith("_NNAPI_FLOAT") for n in names) and any(n.endswith("_CPU_FLOAT") for n in names)


def test_face_detection_report(model_bytes):
    result = tac.run(model_bytes("face"), device_specs=("GPU", "CPU"))
    rep = result.report
    sub = rep["subgraphs"][0]
    assert sub["ops_in"] == 164
    assert sum(sub["ops_per_device"].values()) == sub["ops_out"]
    cpu_funcs = [f for f in sub["functions"] if f["name"].endswith("_CPU_FLOAT")]
    assert cpu_funcs and all(f["op_types"] == {"CONCATENATION": 2} for f in cpu_funcs)  # 3-D concats
    assert cpu_funcs[0]["views"][1]["device"] == "GPU" and cpu_funcs[0]["views"][1]["lowerings"]["PadConcat"] == 2
    text = result.table()
    assert "func_0_GPU_FLOAT" in text and "all_CPU" in text and "greedy" in text
