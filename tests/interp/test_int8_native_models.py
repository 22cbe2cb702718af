"""Whole models through the native INT8 kernels (`tftpu.interp.tpu.native`) give every tensor
bit-equal to the numpy paths they replace (the paths `TFTPU_NATIVE=0` takes), on the layers
real networks have: depthwise convs (3x3 and 5x5, strided, padded), 1x1 and KxK convs (the
GEMM), squeeze-excite Muls, residual Adds, the input Cast; symmetric and asymmetric INT8, a
64-lane and a 16-lane chip. The build the loader chooses runs (`TFTPU_ISA=avx2` etc. forces
another)."""

from __future__ import annotations

import numpy as np
import pytest

from tftpu import frontend, quant
from tftpu.interp.tpu import TpuInterpreter, int8_kernels, native
from tftpu.transforms.lowering import lower

_MODELS = {}
APPS = {"MobileNetV2": dict(alpha=0.35), "EfficientNetB0": {}, "MobileNetV3Small": {}}


def app(name):
    """A keras application at 64x64 (random weights), its input and calibration samples."""
    if name not in _MODELS:
        import keras

        km = getattr(keras.applications, name)(weights=None, input_shape=(64, 64, 3), **APPS[name])
        model = frontend.load(frontend.to_onnx(km))
        rng = np.random.default_rng(0)
        feeds = [{model.input_names[0]: rng.uniform(-1, 1, (1, 64, 64, 3)).astype(np.float32)} for _ in range(2)]
        _MODELS[name] = model, feeds
    return _MODELS[name]


def numpy_only(monkeypatch):
    """The numpy paths: every native entry point reports itself unavailable."""
    monkeypatch.setattr(native, "library", lambda variant=None: None)
    monkeypatch.setattr(native, "has_gemm", lambda: False)


CASES = [("MobileNetV2", "npu1", False), ("MobileNetV2", "npu1", True), ("MobileNetV2", "edge16", False),
         ("EfficientNetB0", "npu1", False), ("MobileNetV3Small", "npu1", True)]


@pytest.mark.parametrize("name,chip,asymmetric", CASES,
                         ids=[f"{n}-{c}-{'asym' if a else 'sym'}" for n, c, a in CASES])
def test_native_kernels_equal_numpy_paths(monkeypatch, name, chip, asymmetric):
    assert native.library() is not None, "the native INT8 kernels must build where the tests run"
    model, feeds = app(name)
    table = quant.calibrate(model, feeds, "minmax", asymmetric=asymmetric)
    tpu_model, _ = lower(model, chip, "INT8", table, asymmetric=asymmetric)
    used = []
    call = native.Conv.__call__

    def spy(self, x):
        y = call(self, x)
        used.append(None if y is None else self.kind)
        return y

    with monkeypatch.context() as m:
        m.setattr(native.Conv, "__call__", spy)
        m.setattr(int8_kernels, "conv_f32", lambda *a: pytest.fail("a native conv ran its numpy path too"))
        fast = TpuInterpreter(tpu_model).run(feeds[1], dump_all=True)
    assert "depthwise" in used and "gemm" in used, used
    assert None not in used, used
    kinds = {op.name for op in tpu_model.ops}
    assert {"tpu.Conv", "tpu.Add", "tpu.Cast"} <= kinds
    with monkeypatch.context() as m:
        numpy_only(m)
        # a fresh model: the per-op plans are kept per op, and these ops have not been planned
        tpu_model, _ = lower(model, chip, "INT8", table, asymmetric=asymmetric)
        slow = TpuInterpreter(tpu_model).run(feeds[1], dump_all=True)
    assert fast.keys() == slow.keys()
    differ = [k for k in fast if not np.array_equal(np.asarray(fast[k]), np.asarray(slow[k]))]
    assert not differ, differ[:5]
