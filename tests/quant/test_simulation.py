"""Simulated INT8: the fake-quantization grid, per-channel weights, and its effect on a real model."""

import numpy as np
import pytest

from tftpu import frontend, models, quant
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.quant import simulation as S
from tftpu.quant.table import CalibrationTable

RNG = np.random.default_rng(0)


def test_fake_quant_grid_and_clip():
    x = np.array([-3.0, -1.0, -0.004, 0.0, 0.006, 0.5, 1.0, 2.5], np.float32)
    q = S.fake_quant(x, 1.0)
    step = 1.0 / 127
    assert q.dtype == np.float32
    np.testing.assert_allclose(q, np.clip(np.rint(x / step), -127, 127) * step, rtol=1e-6)
    assert q[0] == pytest.approx(-1.0) and q[-1] == pytest.approx(1.0)          # clipped at the threshold
    assert len(np.unique(S.fake_quant(RNG.uniform(-1, 1, 100000), 1.0))) <= 255  # at most 255 levels
    np.testing.assert_array_equal(S.fake_quant(x, 0.0), x)                       # an all-zero tensor's table entry


def test_per_channel_weights_use_their_own_range():
    w = np.stack([RNG.uniform(-s, s, (3, 3, 3)) for s in (0.01, 1.0, 100.0)]).astype(np.float32)  # OIHW
    q = S.fake_quant(w, np.abs(w).max(axis=(1, 2, 3)), axis=0)
    for o in range(3):
        assert np.abs(q[o] - w[o]).max() <= np.abs(w[o]).max() / 127 / 2 * 1.0001


@pytest.fixture(scope="module")
def resnet_and_samples():
    model = frontend.load(models.resnet18_like((32, 32, 3)))
    samples = [{"image": RNG.uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)} for _ in range(3)]
    return model, samples


def test_simulation_tracks_float_and_coarser_grids_cost_more(resnet_and_samples):
    model, samples = resnet_and_samples
    table = quant.calibrate(model, samples, "minmax")
    good = quant.evaluate(model, table, samples)
    (name,) = model.output_names
    cos, snr = good.rows[name]
    assert cos > 0.99 and snr > 15, str(good)
    # thresholds far too small clip everything: the simulation must show it
    tiny = CalibrationTable({k: (v[0] / 50, v[1], v[2]) for k, v in table.entries.items()}, "minmax")
    bad = quant.evaluate(model, tiny, samples)
    assert bad.rows[name][1] < snr - 10


def test_observe_sees_every_tensor_and_weights_are_per_channel(resnet_and_samples):
    model, samples = resnet_and_samples
    seen = []
    TopInterpreter(model).run(samples[0], observe=lambda n, a: seen.append(n) or a)
    dump = TopInterpreter(model).run(samples[0], dump_all=True)
    assert seen == list(dump)
    qmodel = S.quantize_weights(model)
    changed = [k for k in model.weights if not np.array_equal(model.weights[k], qmodel.weights[k])]
    convs = [op for op in model.ops if op.op_name in ("Conv", "MatMul")]
    assert len(changed) == len(convs)
    for k in changed:
        w = model.weights[k]
        levels = len(np.unique(qmodel.weights[k][0] if w.ndim == 4 else qmodel.weights[k][..., 0]))
        assert levels <= 255
