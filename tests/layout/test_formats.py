"""Memory formats (NCHW, NHWC, lane-blocked), the chip config, and explicit, costed reorders."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tftpu.errors import ConfigError
from tftpu.interp.top_interpreter import run
from tftpu.ir import layout as L
from tftpu.ir.module import TopBuilder, parse_module
from tests.layout.helpers import clone, inputs_for, randn


@pytest.mark.parametrize("text", ["NCHW", "NHWC", "lane_blocked:64", "lane_blocked:4:16"])
def test_format_parse_round_trip(text):
    assert str(L.MemoryFormat.parse(text)) == text
    assert L.FormatAttr.of(text).format == L.MemoryFormat.parse(text)


@pytest.mark.parametrize("bad", ["NWHC", "NCHW:4", "lane_blocked", "lane_blocked:x", "lane_blocked:0",
                                 "lane_blocked:4:4:4"])
def test_format_parse_rejects(bad):
    with pytest.raises(ConfigError):
        L.MemoryFormat.parse(bad)


SHAPES = [(1, 3, 4, 5), (2, 7, 3, 3), (1, 70, 2, 3), (2, 5, 1, 1)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("itemsize", [1, 2, 4])
def test_plain_formats_match_numpy_strides(shape, itemsize):
    flat = np.arange(np.prod(shape)).reshape(shape)
    nhwc = flat.transpose(0, 2, 3, 1).copy().reshape(-1)
    pos_nhwc = np.empty_like(nhwc)
    pos_nhwc[nhwc] = np.arange(nhwc.size)
    for idx in itertools.product(*map(range, shape)):
        assert L.NCHW.address(idx, shape, itemsize) == (0, flat[idx] * itemsize)
        assert L.NHWC.address(idx, shape, itemsize) == (0, pos_nhwc[flat[idx]] * itemsize)
    assert L.NCHW.nbytes(shape, itemsize) == L.NHWC.nbytes(shape, itemsize) == flat.size * itemsize


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("lanes,align", [(4, 0), (4, 16), (64, 64), (3, 8)])
@pytest.mark.parametrize("itemsize", [1, 4])
def test_lane_blocked_addresses(shape, lanes, align, itemsize):
    fmt = L.MemoryFormat("lane_blocked", lanes, align)
    seen = set()
    per_lane = fmt.per_lane_bytes(shape, itemsize)
    for idx in itertools.product(*map(range, shape)):
        lane, off = fmt.address(idx, shape, itemsize)
        assert lane == idx[1] % lanes and 0 <= off <= per_lane - itemsize
        if idx[2:] == (0, 0) and align > 1:
            assert off % align == 0          # every plane starts EU-aligned
        seen.add((lane, off))
    assert len(seen) == np.prod(shape)       # no two elements share a byte
    plane = shape[2] * shape[3] * itemsize
    padded = -(-plane // align) * align if align > 1 else plane
    assert per_lane == shape[0] * -(-shape[1] // lanes) * padded
    assert fmt.nbytes(shape, itemsize) == lanes * per_lane


def test_tensor_encoding_round_trip():
    from xdsl.dialects.builtin import TensorType, f32
    t = L.with_format(TensorType(f32, [1, 64, 8, 8]), "lane_blocked:64:64")
    assert L.format_of(t) == L.MemoryFormat("lane_blocked", 64, 64)
    assert L.format_of(TensorType(f32, [1, 2])) == L.NCHW
    assert "#layout.format<\"lane_blocked\"" in str(t)


def test_chip_config_npu1():
    chip = L.load_chip("npu1")
    assert chip.lanes == 64 and chip.eu_bytes == 64 and chip.local_mem_bytes == 16 * 2 ** 20
    assert chip.format_for("top.Conv") == L.MemoryFormat("lane_blocked", 64, 64)
    assert chip.format_for("top.MatMul") == L.NCHW and chip.io_format == L.NCHW
    assert chip.format_for("top.Sigmoid") == chip.format_for("default")
    assert "i8" in chip.dtypes


@pytest.mark.parametrize("text,msg", [
    ("name: x\n", "missing"),
    ("[1, 2]\n", "mapping"),
    ({"formats": {"io": "NCHW", "default": "NCHW", "top.Conv": "NCWH"}}, "is not NCHW, NHWC or lane_blocked"),
    ({"npu_lanes": 0}, "positive"),
    ("name: [\n", "YAML"),
])
def test_chip_config_errors(tmp_path, text, msg):
    from tests.chips import chip_file
    p = tmp_path / "bad.yaml"
    if isinstance(text, dict):
        chip_file(p, **text)
    else:
        p.write_text(text)
    with pytest.raises(ConfigError, match=msg) as e:
        L.load_chip(p)
    assert "bad.yaml" in str(e.value)
    with pytest.raises(ConfigError, match="known chips"):
        L.load_chip("no_such_chip")


def _net():
    b = TopBuilder("net")
    x = b.input("x", (1, 3, 8, 8))
    y = b.op("Conv", [x, b.weight("w", randn((70, 3, 3, 3), 1)), b.none()],
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "conv")
    y = b.op("Relu", [y], {}, "relu")
    s = b.op("Softmax", [y], {"axis": 1}, "soft")
    z = b.op("Add", [y, s], {}, "add")
    f = b.op("Reshape", [z], {"shape": [1, 70 * 64]}, "flat")
    m = b.op("MatMul", [f, b.weight("fc", randn((70 * 64, 5), 2)), b.none()], {}, "fc")
    return b.finish([m, y])


def test_plan_counts_and_costs_reorders():
    chip = L.load_chip("npu1")
    plan = L.plan_formats(_net(), chip)
    got = sorted((name, str(a), str(b)) for name, a, b, _ in plan.reorders)
    lb = "lane_blocked:64:64"
    assert got == [("add", lb, "NCHW"), ("relu", lb, "NCHW"), ("soft", "NCHW", lb), ("x", "NCHW", lb)]
    # relu is read by Softmax (NCHW) and returned (NCHW): one reorder serves both
    name, src, dst, cost = next(r for r in plan.reorders if r[0] == "x")
    assert cost.bytes_read == 3 * 64 * 4 and cost.bytes_written == 64 * 1 * 256
    assert cost.seconds == pytest.approx((cost.bytes_read + cost.bytes_written) / chip.reorder_bandwidth)
    assert plan.count == 4 and plan.bytes_moved == sum(c.bytes_read + c.bytes_written for *_, c in plan.reorders)
    assert "4 reorders" in plan.summary()


def test_insert_reorders_explicit_ops_run_and_round_trip():
    chip = L.load_chip("npu1")
    model = _net()
    ref = run(model, inputs_for(model))
    new = clone(model)
    plan = L.insert_reorders(new, chip)
    assert L.count_reorders(new) == plan.count == 4
    new.verify()
    got = run(new, inputs_for(model))
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])
    again = parse_module(new.text())
    assert new.text() == __import__("tftpu.ir.module", fromlist=["print_module"]).print_module(again)
    assert L.plan_formats(new, chip).count >= plan.count  # reorders are now ops in the graph


def test_plain_orders_are_not_reorders(tmp_path):
    """NCHW vs NHWC in TOP is ConvertLayout's job (explicit Permutes): a chip with plain formats
    only plans no reorder, whichever layout the model was converted to; lane-blocked ones count
    the same after either conversion."""
    from tftpu.transforms.convert_layout import convert_layout
    from tests.chips import chip_file
    p = chip_file(tmp_path / "plain.yaml", name="plain", npu_lanes=8, eu_bytes=16, local_mem_bytes=1024,
                  formats={"io": "NCHW", "default": "NCHW", "top.Conv": "NHWC"})
    plain, npu1 = L.load_chip(p), L.load_chip("npu1")
    counts = []
    for target in ("NCHW", "NHWC"):
        m = clone(_net())
        convert_layout(m, layout=target)
        assert L.plan_formats(m, plain).count == 0
        plan = L.plan_formats(m, npu1)
        counts.append(plan.count)
        conv_out = [k for k in plan.formats if k.startswith("conv")][0]
        assert plan.formats[conv_out].kind == "lane_blocked"
    assert counts[0] == counts[1]
