"""The pass as a whole: API forms, determinism, idempotence, 1-D/3-D data, several inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tftpu.ir import top
from tftpu.ir.module import TopBuilder
from tftpu.transforms.convert_layout import ConvertLayout, convert_layout, desired_for
from tests.layout.helpers import clone, convert_and_compare, inputs_for, permutes, randn


def _net(nsp: int = 2):
    b = TopBuilder(f"net{nsp}d")
    sp = (7, 6, 5)[:nsp]
    x = b.input("x", (1, 3, *sp))
    k = [3] * nsp
    y = b.op("Conv", [x, b.weight("w1", randn((8, 3, *k), 1)), b.weight("b1", randn((8,), 2))],
             {"kernel_shape": k, "pads": [1] * (2 * nsp), "do_relu": True}, "c1")
    y = b.op("MaxPool", [y], {"kernel_shape": [2] * nsp, "strides": [2] * nsp}, "pool")
    z = b.op("Conv", [y, b.weight("w2", randn((8, 1, *k), 3)), b.none()],
             {"kernel_shape": k, "pads": [1] * (2 * nsp), "group": 8}, "dw")
    y = b.op("Add", [y, z], {}, "res")
    y = b.op("GlobalAvgPool", [y], {"keepdims": True}, "gap")
    y = b.op("Reshape", [y], {"shape": [1, 8]}, "flat")
    y = b.op("MatMul", [y, b.weight("fc", randn((8, 4), 4)), b.weight("fcb", randn((4,), 5))], {}, "fc")
    return b.finish([y, z])


@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("target", ["NHWC", "NCHW"])
def test_1d_2d_3d(nsp, target):
    new, rep = convert_and_compare(_net(nsp), layout=target)
    if target == "NHWC":
        assert rep.at_inputs == 1 and rep.at_outputs == 1 and rep.inside == 0   # x in; dw (NCHW) out
        assert all(op.attrs()["layout"] == "NHWC" for op in new.ops if isinstance(op, top.Conv))
    else:
        assert not permutes(new) and rep.weights_transformed == 0


def test_bare_module_and_weights_api():
    model = _net()
    feeds = inputs_for(model)
    from tftpu.interp.top_interpreter import run
    ref = run(model, feeds)
    c = clone(model)
    module, weights = c.module, c.weights
    ConvertLayout({"top.Conv": ["NHWC", "default"]}).apply(module, weights)
    assert any(k.endswith("_2310") for k in weights)          # HWIO weights in the caller's dict
    from tftpu.ir.module import TopModel
    got = run(TopModel(module, weights), feeds)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5)
    from tftpu.errors import UsageError
    with pytest.raises(UsageError):
        ConvertLayout({}).apply(module)
    rep = convert_layout(clone(model), "NCHW")   # layout as the second positional argument
    assert rep.permutes_after == 0


def test_deterministic_and_idempotent():
    a, b = clone(_net()), clone(_net())
    ra, rb = convert_layout(a, layout="NHWC"), convert_layout(b, layout="NHWC")
    assert a.text() == b.text() and str(ra) == str(rb)
    assert sorted(a.weights) == sorted(b.weights)
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)
    text = a.text()
    again = convert_layout(a, layout="NHWC")
    assert again.inserted == again.absorbed and again.weights_transformed == 0
    assert again.permutes_after == ra.permutes_after
    assert len(a.text().splitlines()) == len(text.splitlines())


def test_only_conv_desired_pools_follow():
    new, rep = convert_and_compare(_net(), desired={"top.Conv": ["NHWC", "OIHW"]})
    pool = [op for op in new.ops if isinstance(op, top.MaxPool)][0]
    assert pool.attrs()["layout"] == "NHWC"         # adapts to its NHWC input (light behaviour)
    assert {op.attrs()["kernel_layout"] for op in new.ops if isinstance(op, top.Conv)} == {"OIHW"}


def test_two_inputs_shared_outputs():
    b = TopBuilder("two")
    x = b.input("x", (1, 6, 6, 4))
    z = b.input("z", (1, 4, 6, 6))
    xt = b.op("Permute", [x], {"order": [0, 3, 1, 2]}, "xt")
    s = b.op("Add", [xt, z], {}, "s")
    c = b.op("Conv", [s, b.weight("w", randn((4, 4, 1, 1), 1)), b.none()], {"kernel_shape": [1, 1]}, "c")
    new, rep = convert_and_compare(b.finish([c, s, c]), layout="NHWC")
    assert rep.inside == 0 and len(permutes(new)) <= 3
    assert new.output_names == ["c", "s", "c"]


def test_desired_for():
    d = desired_for("NHWC")
    assert d["top.Conv"] == ["NHWC", "default"] and d["top.MaxPool"] == ["NHWC"]
    from tftpu.errors import UsageError
    with pytest.raises(UsageError):
        desired_for("NWHC")


def test_desired_from_chip(tmp_path):
    from tftpu.ir.layout import load_chip
    from tftpu.transforms.convert_layout import desired_for_chip
    d = desired_for_chip("npu1")        # lane-blocked convs: channels split over lanes, NCHW order
    assert d["top.Conv"] == ["NCHW", "default"] and d["top.SpaceToDepth"] == ["NCHW"]
    from tests.chips import chip_file
    p = chip_file(tmp_path / "nhwc_chip.yaml", name="c", npu_lanes=8, eu_bytes=16, local_mem_bytes=1024,
                  formats={"io": "NCHW", "default": "NHWC", "top.Deconv": "lane_blocked"})
    d = desired_for_chip(load_chip(p))
    assert d["top.Conv"] == ["NHWC", "default"] and d["top.Deconv"] == ["NCHW"]
    new, rep = convert_and_compare(_net(), desired=d)
    assert rep.permute_bytes == sum(int(np.prod(op.results[0].type.get_shape())) * 4 for op in permutes(new)) > 0
    assert "bytes moved" in str(rep)
