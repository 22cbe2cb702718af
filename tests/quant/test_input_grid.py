"""Exact 8-bit inputs (`tftpu.quant.input_grid`): each channel's pixel levels found in the data,
the stem conv rewritten to read them (the same function in float, over kernels, strides, pads,
groups, layouts, normalizations and the space-to-depth form), and in INT8 the input's rounding
gone; declined, with the reason, where the data is not on a grid of 256 levels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.ir import TopBuilder
from tftpu.quant import calibrate
from tftpu.quant.input_grid import exact_input_grid, pixel_grid
from tftpu.transforms.pipeline import run_pipeline

NORMS = {   # name -> (offset, scale) per channel: x = (p / 255 - offset) / scale
    "imagenet": (np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])),
    "unit": (np.zeros(3), np.ones(3)),
    "pm1": (np.full(3, 0.5), np.full(3, 0.5)),
    "raw": (np.zeros(3), np.full(3, 1 / 255)),
}


def stem_model(size, k, stride, pads, cin=3, cout=8, nhwc=False, permute=False, group=1, seed=0):
    rng = np.random.default_rng(seed)
    b = TopBuilder("stem")
    if permute:
        x = b.op("Permute", [b.input("image", (1, size[0], size[1], cin))], {"order": [0, 3, 1, 2]}, "to_nchw")
    else:
        x = b.input("image", (1, size[0], size[1], cin) if nhwc else (1, cin, size[0], size[1]))
    w = b.weight("w", rng.normal(size=(cout, cin // group, k, k)).astype(np.float32))
    bv = b.weight("b", rng.normal(size=(cout,)).astype(np.float32))
    c = b.op("Conv", [x, w, bv], {"kernel_shape": [k, k], "strides": [stride, stride], "pads": pads,
                                  "group": group, "layout": "NHWC" if nhwc else "NCHW"}, "stem")
    out = b.op("Relu", [c], {}, "after")
    return b.finish([out])


def pixels(model, norm: str, seed: int, cin=3, channels_last=False, smooth=False) -> dict:
    """A photo-like input: integer levels 0..255 normalized per channel (`smooth`: a ramp with a
    level or two of texture, as neighbouring pixels of a photo differ)."""
    shape = model.func.function_type.inputs.data[0].get_shape()
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 256, size=shape).astype(np.float64)
    if smooth:
        ramp = np.linspace(0, 255, shape[-1] * shape[-2]).reshape(shape[-2:])
        p = np.clip(np.rint(ramp + rng.integers(-2, 3, size=shape)), 0, 255)
    p.flat[0], p.flat[1] = 0, 255                     # the full range, as photos have
    off, sc = (np.resize(v, cin) for v in NORMS[norm])
    axis = 3 if channels_last else 1
    view = [1] * 4
    view[axis] = cin
    return {"image": ((p / 255 - off.reshape(view)) / sc.reshape(view)).astype(np.float32)}


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(6, 15), st.integers(6, 15), st.integers(1, 5), st.sampled_from([1, 2]),
       st.lists(st.integers(0, 2), min_size=4, max_size=4), st.sampled_from(["nchw", "nhwc", "permute"]),
       st.sampled_from(sorted(NORMS)), st.sampled_from([1, 3]), st.booleans())
def test_rewrite_is_exact(h, w, k, stride, pads, layout, norm, group, s2d):
    k = min(k, h, w)
    model = stem_model((h, w), k, stride, pads, cout=6, nhwc=layout == "nhwc", permute=layout == "permute",
                       group=group)
    last = layout != "nchw"
    if s2d and stride == 2 and group == 1:
        run_pipeline(model, "space-to-depth")
    samples = [pixels(model, norm, s, channels_last=last) for s in range(3)]
    x = pixels(model, norm, 99, channels_last=last)
    want = TopInterpreter(model).run(x)["after"]
    table = calibrate(model, samples)
    new, new_table, grid = exact_input_grid(model, table, samples)
    if norm in ("unit", "raw"):                  # a zero point puts 0..1 or 0..255 on the input's own grid
        assert not grid.applied and "holds its levels already" in grid.line and new is model
        return
    assert grid.applied, grid.line
    off, sc = NORMS[norm]
    for step in grid.step:                       # each channel's step is its pixel step
        assert np.min(np.abs(step / (1 / 255 / sc) - 1)) < 1e-4, (step, 1 / 255 / sc)
    assert grid.scaled in new_table.entries
    got = TopInterpreter(new).run(x)["after"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max() + 1))


def test_int8_input_is_the_pixel_levels():
    """Lowered to INT8, the stem on ImageNet-normalized pixels reads each pixel's own level (its
    INT8 input, inside the padding, is the pixel level - 128: no input rounding), and its
    outputs are no further from the float ones than through one per-tensor grid."""
    from tftpu.interp.tpu import TpuInterpreter
    from tftpu.pipelines.deploy import deploy

    model = stem_model((24, 24), 3, 1, [1, 1, 1, 1], cout=16, seed=3)
    samples = [pixels(model, "imagenet", s) for s in range(4)]
    x = pixels(model, "imagenet", 50)
    off, sc = NORMS["imagenet"]
    levels = np.rint((x["image"][0] * sc[:, None, None] + off[:, None, None]) * 255)
    want = TopInterpreter(model).run(x)["after"].astype(np.float64)
    table = calibrate(model, samples, asymmetric=True)

    def run(**kw):
        r = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, samples=samples,
                   mixed_precision=None, **kw)
        got = TpuInterpreter(r.model).run(x, dump_all=True)
        return r, got, 10 * np.log10(np.sum(want ** 2) / np.sum((got["after"] - want) ** 2))

    _, _, plain = run()
    r, got, exact = run(input_grid=True)
    assert r.input_grid.startswith("stem reads its input's 3 channels"), r.input_grid
    assert any(d.name == "stem_grid" and d.mode != "INT8" for d in r.lowering.decisions)
    read = got["stem_grid_i8"]
    assert read.dtype == np.int8
    np.testing.assert_array_equal(read[0, :, 1:-1, 1:-1], levels - 128)
    assert exact > plain - 0.5, (exact, plain)


def test_pixel_grid_levels():
    step = 1 / 255 / 0.229
    levels = (np.arange(3, 250) * step - 2.1).astype(np.float32)
    got = pixel_grid(levels)
    assert not isinstance(got, str)
    assert got[0] == pytest.approx(step, rel=1e-5)
    # a pad's zeros are left out; where zero is a level it counts (unit data without black pixels)
    unit = np.concatenate([np.arange(1, 256) / 255.0, np.zeros(10)]).astype(np.float32)
    assert pixel_grid(unit)[1] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("values, why", [
    (np.random.default_rng(0).normal(size=1000), "more than 256 levels"),
    (np.full(10, 0.5), "a constant channel"),
    (np.array([0.1, 0.2, 0.2 + 0.1 * np.sqrt(2)]), "not evenly spaced"),
    (np.array([1.0, 2.0, 301.0]), "span 302 levels"),
    (np.zeros(5), "no finite non-zero values"),
])
def test_pixel_grid_declines(values, why):
    got = pixel_grid(values)
    assert isinstance(got, str) and why in got


def test_declines_where_it_does_not_apply():
    model = stem_model((8, 8), 3, 1, [1, 1, 1, 1])
    off_grid = [{"image": np.random.default_rng(s).normal(size=(1, 3, 8, 8)).astype(np.float32)} for s in range(2)]
    table = calibrate(model, off_grid)
    same, same_table, grid = exact_input_grid(model, table, off_grid)
    assert same is model and same_table is table and not grid.applied
    assert "input channel 0: its values are not evenly spaced levels" in grid.line
    b = TopBuilder("after_relu")                      # the conv reads a computed tensor
    r = b.op("Relu", [b.input("image", (1, 3, 8, 8))], {}, "r")
    c = b.op("Conv", [r, b.weight("w", np.ones((2, 3, 1, 1), np.float32)), b.none()],
             {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0]}, "c")
    m = b.finish([c])
    samples = [pixels(m, "unit", 0)]
    _, _, grid = exact_input_grid(m, calibrate(m, samples), samples)
    assert "no conv reads a model input" in grid.line
