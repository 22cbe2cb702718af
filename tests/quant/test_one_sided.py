"""asymmetric="auto": a zero point for the activations whose range is one-sided, none elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from tftpu import errors, quant
from tftpu.interp.similarity import sqnr
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.interp.tpu.info import info_of
from tftpu.ir.base import value_name
from tftpu.quant.params import activation, one_sided
from tftpu.transforms.lowering import lower
from tests.tools.test_deploy import detector, samples_for


@pytest.mark.parametrize("entry, want", [
    ((4.0, 0.0, 4.0), True),              # ReLU
    ((1.0, 0.0, 1.0), True),              # sigmoid
    ((6.0, -0.28, 6.0), True),            # SiLU / HardSwish
    ((4.0, -4.0, 4.0), False),            # two-sided
    ((4.0, -2.5, 4.0), False),            # a zero point would not make the step 3/4 of symmetric's
    ((0.0, 0.0, 0.0), False),             # always zero
])
def test_one_sided(entry, want):
    assert one_sided(*entry) is want
    p = activation(*entry, asymmetric="auto")
    assert (p.zero_point != 0) is want or entry[2] == 0
    if want:
        assert p.scale < 0.75 * entry[0] / 127 + 1e-12 and p == activation(*entry, asymmetric=True)
    else:
        assert p == activation(*entry, asymmetric=False)


def test_auto_lowering_gives_zero_points_to_one_sided_tensors_only():
    model = detector()
    samples = samples_for(model)
    table = quant.calibrate(model, samples, "mse", asymmetric=True)
    tpu, _ = lower(model, "npu1", "INT8", table, asymmetric="auto")
    zps = {value_name(r): info_of(r.type).zp for op in tpu.ops for r in op.results
           if info_of(r.type) is not None and info_of(r.type).quantized}
    assert zps["feat"] != 0 and zps["scores"] != 0          # ReLU and sigmoid outputs
    assert zps["raw_box"] == 0 and zps["logits"] == 0          # two-sided conv outputs
    assert tpu.asymmetric
    # at least as close to float as symmetric INT8 on the one-sided outputs
    ref = TopInterpreter(model).run(samples[0], dump_all=True)
    sym, _ = lower(model, "npu1", "INT8", table, asymmetric=False)
    got_auto = TpuInterpreter(tpu).run(samples[0], dump_all=True, dequantize=True)
    got_sym = TpuInterpreter(sym).run(samples[0], dump_all=True, dequantize=True)
    assert sqnr(ref["feat"], got_auto["feat"]) > sqnr(ref["feat"], got_sym["feat"]) + 1.5
    # float modes ignore it; anything else is a usage error
    f16, _ = lower(model, "npu1", "F16", asymmetric="auto")
    assert not f16.asymmetric
    with pytest.raises(errors.UsageError, match="auto"):
        lower(model, "npu1", "INT8", table, asymmetric="yes")
    assert np.isfinite(got_auto["detections"]).all()
