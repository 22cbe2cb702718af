"""Every lowering, applied through a plug-in device that needs them, keeps the model's outputs."""

import functools

import numpy as np
import pytest

import tftpu.tac as tac
from tests.tac import models
from tests.tac.plugin_hw import LOWERED, LowerAll


def _w(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@functools.lru_cache(maxsize=None)
def ops_model(rank: int) -> bytes:
    """Pack (every axis), Split, SplitV, Sub (+ broadcast, + fused relu), SquaredDifference,
    Slice and Concat on rank-`rank` tensors; FC (with and without bias) and Mean on 4-D."""
    tf = models._tf()
    shape = [2, 4, 6, 4][-rank:] if rank < 4 else [1, 4, 6, 4]
    fw, fb = _w(1, 4, 5), _w(2, 5)

    def fn(x, y, img):
        outs = [tf.stack([x, y], axis=a) for a in range(-rank - 1, rank + 1, 2 if rank > 2 else 1)]
        outs += list(tf.split(x, 2, axis=rank - 1))
        outs += list(tf.split(y, [1, 3], axis=rank - 1))
        outs.append(x - y)
        outs.append(tf.nn.relu(x - y[..., :1]))
        outs.append(tf.math.squared_difference(x, y))
        outs.append(tf.slice(x, [0] * (rank - 1) + [1], [-1] * (rank - 1) + [2]))
        outs.append(tf.concat([x, y * 2.0], axis=0))
        outs.append(tf.matmul(tf.reshape(img, [-1, 4]), fw) + fb)
        outs.append(tf.matmul(tf.reshape(img, [-1, 4]), fw))
        outs.append(tf.reduce_mean(img, axis=[1, 2]))
        outs.append(tf.reduce_mean(img, axis=[1, 2], keepdims=True))
        return outs

    return models.convert(fn, [shape, shape, (1, 5, 3, 4)])


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_lowerings_keep_outputs(rank):
    data = ops_model(rank)
    result = tac.run(data, device_specs=[LowerAll])
    out = result.tflite()
    placed = result.op_devices()
    on_device = [op["type"] for op in placed if op["device"] == "LOWERALL"]
    assert not set(on_device) & set(LOWERED)
    remaining = {op["type"] for op in placed if op["device"] == "CPU"}
    if rank < 4:
        assert not remaining & set(LOWERED), remaining  # every lowering took
    lowered = {}
    for f in result.report["subgraphs"][0]["functions"]:
        for k, v in f["picked_lowerings"].items():
            lowered[k] = lowered.get(k, 0) + v
    expected = {"LowerPackIntoConcatReshape", "UnrollSplit", "UnrollSplitV", "SubToAdd", "SquaredDifference",
                "FullyConnectedToConv", "ReduceMeanToAvgPool"}
    if rank < 4:
        expected |= {"PadSlice", "PadConcat"}
        assert expected <= set(lowered), lowered
    else:  # packing 4-D tensors makes 5-D ones the device lacks: that view is dropped whole
        dropped = [d for f in result.report["subgraphs"][0]["functions"] for d in f["dropped"]]
        assert any(d["device"] == "LOWERALL" for d in dropped)
    for seed in range(3):
        ref, got = models.run_tflite(data, seed=seed), models.run_tflite(out, seed=seed)
        assert len(ref) == len(got)
        for k, (a, b) in enumerate(zip(ref, got)):
            assert a.shape == b.shape
            if k < len(ref) - 4:  # pack/split/sub/sqdiff/slice/concat: exactly equal
                assert np.array_equal(a, b), k
            else:  # FC -> conv, mean -> avg pool: summation order may differ
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_gpu_lowering_in_real_plan():
    data = models.chain(12, width=32, size=32)
    result = tac.run(data, device_specs=("GPU", "CPU"))
    placed = result.op_devices()
    assert {op["device"] for op in placed} == {"GPU"}  # Pack/Split/Sub lowered, all on GPU
    assert not {op["type"] for op in placed} & {"PACK", "SPLIT", "SUB"}
    for seed in range(2):
        for a, b in zip(models.run_tflite(data, seed=seed), models.run_tflite(result.tflite(), seed=seed)):
            assert np.array_equal(a, b)


def test_pattern_fixed_point_and_unknown_name():
    from tftpu import errors
    from tftpu.tac.passes import lowerings

    with pytest.raises(errors.ConfigError, match="unknown TAC transformation"):
        lowerings.resolve(["NoSuchPattern"])
    assert [n for n, _ in lowerings.resolve(["SubToAdd", len])] == ["SubToAdd", "len"]
