"""top.BatchNorm and top.Scale share one per-channel operand check."""

import pytest

from tftpu.ir import top


@pytest.mark.parametrize("cls", [top.BatchNorm, top.Scale])
@pytest.mark.parametrize("layout,data", [("NCHW", (1, 5, 4, 3)), ("NHWC", (1, 4, 3, 5))])
@pytest.mark.parametrize("param", [(5,), (1, 5, 1, 1), (5, 1), (4,), (1, 4, 1, 1)])
def test_per_channel_operands(cls, layout, data, param):
    op = cls.__new__(cls)
    n = 4 if cls is top.BatchNorm else 2
    shapes = [data] + [param] * n
    if param in ((4,), (1, 4, 1, 1)):
        with pytest.raises(ValueError, match=rf"per-channel operand \({param[0]},.*must have 5 values"):
            op.check(shapes, {"layout": layout})
    else:
        op.check(shapes, {"layout": layout})
