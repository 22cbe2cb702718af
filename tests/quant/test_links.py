"""16-bit links (`tftpu.quant.links`): which tensors get a 16-bit grid, that INT8 inference over
them stays bit-exact against the independent integer reference, and that they lower the error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from xdsl.dialects.builtin import TensorType

from tests.interp import int8_reference as R
from tests.interp.test_tpu_int8_exact import ACTS, FEW, W, _f64, feeds, make_model, table_for
from tftpu.interp.top_interpreter import TopInterpreter
from tftpu.interp.tpu import TpuInterpreter
from tftpu.ir import quant, top
from tftpu.ir.base import value_name
from tftpu.quant import CalibrationTable
from tftpu.quant import links as links_module
from tftpu.quant.links import HEADROOM, I16_MAX, wide_grids
from tftpu.transforms.lowering import lower


def residual_stack(blocks: int = 3, c: int = 4, seed: int = 0, tail_conv: bool = False, depthwise: bool = True):
    """x -> [dw conv -> 1x1 conv -> + x -> PReLU] * blocks, the blocks of a BlazeFace-style
    detector; names: d{i} (the 3x3 conv, a dense one unless `depthwise`), c{i} (1x1 conv), a{i}
    (add), p{i} (PReLU)."""
    rng = np.random.default_rng(seed)

    def body(b, xs):
        x = xs[0]
        for i in range(blocks):
            if depthwise:
                w, attrs = W(rng, c, 1, 3, 3, scale=0.5), {"group": c}
            else:
                w, attrs = W(rng, c, c, 3, 3, scale=0.5 / c ** 0.5), {}
            d = b.op("Conv", [x, b.weight(f"dw{i}", w), b.none()],
                     {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], **attrs}, f"d{i}")
            y = b.op("Conv", [d, b.weight(f"w{i}", W(rng, c, c, 1, 1)), b.weight(f"b{i}", W(rng, c, scale=0.1))],
                     {"kernel_shape": [1, 1]}, f"c{i}")
            s = b.op("Add", [y, x], {}, f"a{i}")
            slope = rng.uniform(0.05, 0.5, (1, c, 1, 1)).astype(np.float32)
            x = b.op("PRelu", [s, b.weight(f"s{i}", slope)], {}, f"p{i}")
        if tail_conv:
            x = b.op("Conv", [x, b.weight("wt", W(rng, c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "tail")
        return x

    return make_model({"x": (1, c, 6, 6)}, body)


def _types(tpu_model) -> dict[str, str]:
    return {value_name(r): str(r.type.element_type) for op in tpu_model.ops for r in op.results
            if isinstance(r.type, TensorType)}


def test_links_are_the_tensors_only_elementwise_int8_ops_read():
    model = residual_stack()
    inputs = feeds({"x": (1, 4, 6, 6)}, 1)
    table = table_for(model, inputs)
    # each 1x1 conv feeds only its Add, each Add only its PReLU, each PReLU output (but the last,
    # the model output) the next Add and the next depthwise conv, which reads 16 bits in two
    # passes; the depthwise outputs feed 1x1 convs, which read 8 bits
    links = wide_grids(model, table, False, lambda name: True, split=False)
    assert sorted(links) == sorted([f"c{i}" for i in range(3)] + [f"a{i}" for i in range(3)] + ["p0", "p1"])
    assert wide_grids(model, table, False, lambda name: True) == links
    assert "p0" in wide_grids(model, table, False, lambda name: name != "a1", split=False)  # a float reader
    # with dense 3x3 convs in place of the depthwise ones, a PReLU output is read beside a conv
    # that reads 8 bits: a split link
    model = residual_stack(depthwise=False)
    table = table_for(model, inputs)
    whole = wide_grids(model, table, False, lambda name: True, split=False)
    assert sorted(whole) == sorted([f"c{i}" for i in range(3)] + [f"a{i}" for i in range(3)])
    # split links too: a PReLU output that the next Add reads beside the next 3x3 conv
    grids = wide_grids(model, table, False, lambda name: True)
    assert sorted(grids) == sorted(whole) + ["p0", "p1"]
    assert all(grids[n] == whole[n] for n in whole)
    assert all(g.storage == "i16" and g.zero_point == 0 for g in grids.values())
    for name, g in grids.items():               # the whole calibrated range fits the 16 bits
        t, lo, hi = table.entries[name][:3]
        assert max(abs(t), abs(lo), abs(hi)) <= g.scale * I16_MAX * (1 + 1e-12)
    # a conv read by an Add: its scale is the Add output's over a power of two
    for i in range(3):
        ratio = grids[f"c{i}"].scale / grids[f"a{i}"].scale
        assert ratio == 2.0 ** round(np.log2(ratio))
    # a reader kept in float takes 16 bits (its cast is as cheap, and finer), an INT8 reader that
    # needs 8 bits does not; a producer kept in float writes float, cast to 16 bits where only
    # INT8 element-wise ops read it (the float a1 feeds only the INT8 PReLU p1)
    floated = wide_grids(model, table, False, lambda name: name != "a1")
    assert "a1" in floated and "c1" in floated and "c0" in floated
    assert floated["a1"].scale == HEADROOM * max(abs(v) for v in table.entries["a1"][:3]) / I16_MAX
    assert "a1" not in wide_grids(model, table, False, lambda name: name not in ("a1", "p1"))  # no INT8 reader
    assert floated["c1"].scale == HEADROOM * max(abs(v) for v in table.entries["c1"][:3]) / I16_MAX
    floated = wide_grids(model, table, False, lambda name: name != "d1")
    assert "p0" in floated and "d1" not in floated       # p0 feeds the float d1 and the INT8 a1
    assert "p0" in wide_grids(model, table, False, lambda name: name != "d1", split=False)
    # a model output is never a link
    assert "p2" not in grids


@FEW
@given(st.data())
def test_int8_over_links_is_bit_exact(data):
    d = data.draw
    c = d(st.integers(1, 5), "channels")
    blocks = d(st.integers(1, 3), "blocks")
    asym = d(st.sampled_from([False, True, "auto"]), "asymmetric")
    seed = d(st.integers(0, 2 ** 16), "seed")
    depthwise = d(st.booleans(), "depthwise")
    model = residual_stack(blocks, c, seed, tail_conv=d(st.booleans(), "tail conv"), depthwise=depthwise)
    inputs = feeds({"x": (1, c, 6, 6)}, seed)
    table = table_for(model, inputs, seed)
    tm, _ = lower(model, "npu1", "INT8", table, asymmetric=asym)
    tm.verify()
    types = _types(tm)
    # each block's conv and Add write 16 bits, and so does each PReLU that the next block's Add
    # reads: its depthwise conv reads the 16 bits too (two passes), a dense conv through one cast
    # to 8 bits
    assert sum("i16" in t for t in types.values()) == 3 * blocks - 1
    casts = [op for op in tm.ops if op.name == "tpu.Cast" and "i16" in str(op.operands[0].type)]
    assert len(casts) == (0 if depthwise else blocks - 1) and all("i8" in str(op.results[0].type) for op in casts)
    wide_convs = [op for op in tm.ops if op.name == "tpu.Conv" and "i16" in str(op.operands[0].type)]
    assert len(wide_convs) == (blocks - 1 if depthwise else 0)
    dump = TpuInterpreter(tm).run(inputs, dump_all=True)
    seen = R.check_model(tm, dump)
    assert seen.get("tpu.Add", 0) == blocks and seen.get("tpu.PRelu", 0) == blocks
    assert seen.get("tpu.Conv", 0) == 2 * blocks + ("tail" in types)
    # the Add's multiplier for its 16-bit input is exact: m / 2**rshift is the ratio of the scales
    for op in tm.ops:
        if op.name == "tpu.Add":
            a = op.attrs()
            et0, eto = op.operands[0].type.element_type, op.results[0].type.element_type
            if quant.is_quant(et0) and "i16" in str(et0):
                assert a["multiplier"][0] / 2.0 ** a["rshift"][0] == et0.scale / eto.scale


def _sqnr(ref, got) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-30)))


@pytest.mark.parametrize("blocks,c,seed,depthwise", [(6, 8, 3, False), (6, 16, 1, False), (6, 8, 3, True)])
def test_links_lower_the_int8_error_of_a_residual_stack(blocks, c, seed, depthwise):
    model = residual_stack(blocks, c, seed, depthwise=depthwise)
    samples = [feeds({"x": (1, c, 6, 6)}, s) for s in range(4)]
    refs = [TopInterpreter(model).run(x, dump_all=True) for x in samples]
    entries = {}                                   # min / max calibration over the samples
    for name in refs[0]:
        v = np.concatenate([np.ravel(r[name]) for r in refs]).astype(np.float64)
        entries[name] = (float(np.abs(v).max()), float(min(v.min(), 0.0)), float(max(v.max(), 0.0)))
    table = CalibrationTable(entries)
    out = f"p{blocks - 1}"
    got = {}
    for wide, split in ((False, False), (True, False), (True, True)):
        tm, _ = lower(model, "npu1", "INT8", table, asymmetric="auto", wide_links=wide, split_links=split)
        assert any("i16" in t for t in _types(tm).values()) == wide
        run = TpuInterpreter(tm)
        got[wide, split] = np.mean([_sqnr(r[out], run.run(x, dequantize=True)[out]) for x, r in zip(samples, refs)])
    # half the rounding points of each block are gone: about 2-3 dB here; split links keep the
    # residual path off 8 bits altogether (where a depthwise conv reads it, it is a whole link)
    assert got[True, False] > got[False, False] + 1.5, got
    if depthwise:
        assert got[True, True] == got[True, False], got
    else:
        assert got[True, True] > got[True, False], got


@pytest.mark.parametrize("wide", [True, False])
def test_deploy_simulator_matches_tpu_inference_over_links(tmp_path, wide):
    from tftpu.pipelines.deploy import deploy
    model = residual_stack(blocks=2, c=4, seed=5)
    x = feeds({"x": (1, 4, 6, 6)}, 2)
    table = table_for(model, x, spread=(1.0, 1.0))
    result = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=x,
                    mixed_precision="none", wide_links=wide, model=str(tmp_path / "m.tpumodel"))
    assert result.simulator["passed"] and all(r["bit_exact"] for r in result.simulator["outputs"])
    assert ("i16" in result.model.text()) == wide


@pytest.mark.parametrize("seed", [3, 4])
def test_an_op_kept_in_float_reaches_its_int8_readers_on_16_bits(tmp_path, seed):
    """A mixed-precision island (the Add a1 in F16) is cast to a 16-bit grid for the INT8 PReLU
    that reads it, not rounded to 8 bits on its way back: INT8 inference stays bit-exact against
    the integer reference and the simulator, and the island costs the output no accuracy that the
    all-INT8 program (whose a1 writes a link) keeps."""
    from tftpu.pipelines.deploy import deploy
    c, blocks = 8, 3
    model = residual_stack(blocks, c, seed)
    samples = [feeds({"x": (1, c, 6, 6)}, s) for s in range(3)]
    table = table_for(model, samples[0], seed, spread=(1.0, 1.0))
    tm, _ = lower(model, "npu1", "INT8", table, qtable={"a1": "F16"}, asymmetric="auto")
    tm.verify()
    add = next(op for op in tm.ops if op.name == "tpu.Add" and "f16" in str(op.results[0].type))
    readers = [u.operation for u in add.results[0].uses]
    assert [r.name for r in readers] == ["tpu.Cast"]
    assert "i16" in str(readers[0].results[0].type)
    R.check_model(tm, TpuInterpreter(tm).run(samples[0], dump_all=True))
    out = f"p{blocks - 1}"
    refs = [TopInterpreter(model).run(x)[out] for x in samples]

    def sqnr_of(qtable, wide=True):
        # split links aside: the all-INT8 a1 reads p0 on 16 bits beside d1, the float a1 on 8
        m, _ = lower(model, "npu1", "INT8", table, qtable=qtable, asymmetric="auto", wide_links=wide,
                     split_links=False)
        run = TpuInterpreter(m)
        return np.mean([_sqnr(r, run.run(x, dequantize=True)[out]) for x, r in zip(samples, refs)])

    island, pure = sqnr_of({"a1": "F16"}), sqnr_of({})
    assert island >= pure - 0.1, (island, pure)
    result = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                    quantize_table={"a1": "F16"}, mixed_precision="none", model=str(tmp_path / "m.tpumodel"))
    assert result.simulator["passed"] and all(r["bit_exact"] for r in result.simulator["outputs"])


def test_isolated_errors_read_16_bit_links_on_their_grid():
    """The search's `isolated` ranking quantizes an op's inputs onto the grids it reads: a link
    is int16 (saturating it to uint8 once made every Add and PReLU look like 0 dB)."""
    from tftpu.transforms.lowering.search import isolated_errors
    model = residual_stack(3, 8, 2)
    samples = [feeds({"x": (1, 8, 6, 6)}, s) for s in range(2)]
    table = table_for(model, samples[0])
    tm, _ = lower(model, "npu1", "INT8", table, asymmetric="auto", wide_links=True)
    assert any("i16" in t for t in _types(tm).values())
    errs = isolated_errors(model, tm, samples, {op.loc for op in model.ops})
    # an Add of a 16-bit link and an 8-bit input, a PReLU of a 16-bit link: within their 8-bit
    # output grid's reach, like the convs (20-45 dB here)
    for name in ("a0", "a1", "a2", "p0", "p1"):
        assert errs[name] > 15.0, (name, errs)


def hardswish_stack(c: int = 4, seed: int = 0):
    """x -> 1x1 conv -> HardSwish h0 -> + x -> 1x1 conv -> HardSwish h1 -> 3x3 conv d1 ->
    1x1 conv: an activation table read by an Add (h0) and by a dense conv (h1), which reads 8 bits."""
    rng = np.random.default_rng(seed)

    def body(b, xs):
        x = xs[0]
        y = b.op("Conv", [x, b.weight("w0", W(rng, c, c, 1, 1)), b.weight("b0", W(rng, c, scale=0.1))],
                 {"kernel_shape": [1, 1]}, "c0")
        h = b.op("HardSwish", [y], {}, "h0")
        s = b.op("Add", [h, x], {}, "a0")
        y = b.op("Conv", [s, b.weight("w1", W(rng, c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "c1")
        h = b.op("HardSwish", [y], {}, "h1")
        d = b.op("Conv", [h, b.weight("dw", W(rng, c, c, 3, 3, scale=0.5 / c ** 0.5)), b.none()],
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "d1")
        return b.op("Conv", [d, b.weight("w2", W(rng, c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "c2")

    return make_model({"x": (1, c, 6, 6)}, body)


@pytest.mark.parametrize("seed", [0, 1])
def test_an_activation_table_writes_a_link(tmp_path, seed):
    """An activation's lookup table holds 16-bit entries: read only by an INT8 Add (h0), or by
    an op kept in float (h1 before the conv d1 in F16), it writes a 16-bit link; an INT8 dense
    conv reader (h1 before an INT8 d1) keeps it on 8 bits. Bit-exact against the integer
    reference and the simulator. With wide_links="tables", the convs before them (c0, c1) write
    16 bits too, which the tables interpolate."""
    from tftpu.pipelines.deploy import deploy
    model = hardswish_stack(4, seed)
    x = feeds({"x": (1, 4, 6, 6)}, seed)
    table = table_for(model, x, seed, spread=(1.0, 1.0))
    assert sorted(wide_grids(model, table, "auto", lambda name: True)) == ["h0"]   # a table reads 8 bits
    assert sorted(wide_grids(model, table, "auto", lambda name: True, tables=True)) == ["c0", "c1", "h0"]
    floated = wide_grids(model, table, "auto", lambda name: name != "d1")
    assert "h1" in floated and floated["h1"].storage == "i16"
    for qtable, tables in (({}, False), ({"d1": "F16"}, False), ({}, True), ({"d1": "F16"}, True)):
        wide = "tables" if tables else True
        tm, _ = lower(model, "npu1", "INT8", table, qtable=qtable, asymmetric="auto", wide_links=wide)
        tm.verify()
        types = _types(tm)
        assert "i16" in types["h0"] and ("i16" in types["h1"]) == bool(qtable)
        assert ("i16" in types["c0"]) == ("i16" in types["c1"]) == tables
        luts = [op for op in tm.ops if op.name == "tpu.Lut"]
        assert [op.operands[1].type.get_shape()[0] for op in luts] == [513 if tables else 256] * 2
        seen = R.check_model(tm, TpuInterpreter(tm).run(x, dump_all=True))
        assert seen.get("tpu.Lut", 0) == 2
        result = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=x,
                        quantize_table=qtable, mixed_precision="none", model=str(tmp_path / "m.tpumodel"),
                        wide_links=wide)
        assert result.simulator["passed"] and all(r["bit_exact"] for r in result.simulator["outputs"])


def test_bias_correction_reads_a_split_link_on_8_bits_where_the_lowering_does(monkeypatch):
    """A dense conv that reads a split link (the PReLU p0, which the Add a1 reads on 16 bits)
    reads it through a cast to 8 bits: bias correction simulates that reading, so its correction
    of d1 is (but for the cast's double rounding) the one it makes where p0 is not a link at all,
    and not the one it would make reading 16 bits."""
    import functools

    from tftpu.quant import bias_correction as bc
    model = residual_stack(3, 8, seed=7, depthwise=False)
    samples = [feeds({"x": (1, 8, 6, 6)}, s) for s in range(3)]
    table = table_for(model, samples[0], 7, spread=(1.0, 1.0))
    split, report = bc.correct_biases(model, table, samples, "auto")
    assert {r["name"] for r in report.ops} >= {"d1", "d2"}
    with monkeypatch.context() as m:
        m.setattr(bc, "wide_grids", functools.partial(wide_grids, split=False))
        whole, _ = bc.correct_biases(model, table, samples, "auto")
    with monkeypatch.context() as m:
        m.setattr(bc, "reads_link", lambda reader, v, wide, tables=False, convs=False: True)
        wide, _ = bc.correct_biases(model, table, samples, "auto")

    def bias(m, name):
        op = next(op for op in m.ops if op.loc == name)
        return np.asarray(m.weights[op.operands[2].owner.key], np.float64)

    for name in ("d1", "d2"):
        near, far = np.abs(bias(split, name) - bias(whole, name)).sum(), np.abs(bias(wide, name) - bias(whole, name)).sum()
        assert near < far / 2, (name, near, far)


def pyramid(c: int = 4, seed: int = 0, mode: str = "nearest", tap: bool = False):
    """Paths through pass-through ops into Adds, as detectors build them: an FPN's coarse conv
    `u` -> upsampling Resize `up` -> lateral Add `lat`; a block output `p` (which the Add `q`
    reads too) -> MaxPool `mp` -> channel Pad `pad` -> residual Add `res`; a stem conv `stem` ->
    MaxPool `sp` -> Add `sa`. `tap`: the Resize output feeds a conv `t` as well."""
    rng = np.random.default_rng(seed)

    def body(b, xs):
        x = xs[0]
        low = b.op("Conv", [x, b.weight("wd", W(rng, c, c, 3, 3)), b.weight("bd", W(rng, c, scale=0.1))],
                   {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "do_relu": True}, "down")
        u = b.op("Conv", [low, b.weight("wu", W(rng, c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "u")
        up = b.op("Resize", [u], {"mode": mode, "target_shape": [8, 8], "coord_mode": "half_pixel"}, "up")
        side = b.op("Conv", [x, b.weight("wl", W(rng, c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "l")
        lat = b.op("Add", [side, up], {}, "lat")
        p = b.op("PRelu", [lat, b.weight("s", rng.uniform(0.05, 0.5, (1, c, 1, 1)).astype(np.float32))], {}, "p")
        mp = b.op("MaxPool", [p, ], {"kernel_shape": [2, 2], "strides": [2, 2]}, "mp")
        pad = b.op("Pad", [mp], {"paddings": [0, 0, 0, 0, 0, c, 0, 0]}, "pad")
        wide = b.op("Conv", [low, b.weight("ww", W(rng, 2 * c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "w")
        res = b.op("Add", [wide, pad], {}, "res")
        # p is a block output the next Add reads too (so it is a link of its own)
        q = b.op("Add", [p, b.op("Conv", [x, b.weight("wq", W(rng, c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "cq")],
                 {}, "q")
        # a stem conv whose only reader is a strided pool: not widened just to be pooled down
        stem = b.op("Conv", [x, b.weight("ws", W(rng, c, c, 3, 3)), b.none()],
                    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "stem")
        pooled = b.op("MaxPool", [stem], {"kernel_shape": [2, 2], "strides": [2, 2]}, "sp")
        outs = [res, q, b.op("Add", [pooled, low], {}, "sa")]
        if tap:
            outs.append(b.op("Conv", [up, b.weight("wt", W(rng, c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "t"))
        return outs

    return make_model({"x": (1, c, 8, 8)}, body)


@pytest.mark.parametrize("tap", [False, True])
def test_a_link_passes_through_resize_pool_and_pad_on_its_16_bits(tap):
    model = pyramid(tap=tap)
    x = feeds({"x": (1, 4, 8, 8)}, 1)
    table = table_for(model, x, spread=(1.0, 1.0))
    grids = wide_grids(model, table, "auto", lambda name: True)
    # the conv before the Resize and the PReLU before the pool write 16 bits, and the moved
    # tensors keep their source's grid
    assert {"u", "up", "p", "mp", "pad"} <= set(grids)
    assert "stem" not in grids and "sp" not in grids
    assert grids["up"] == grids["u"] and grids["mp"] == grids["pad"] == grids["p"]
    # the lateral Add reads the Resize output on a scale its integer multiplier holds exactly
    ratio = grids["u"].scale / grids["lat"].scale                # (lat is a link too: PReLU reads it)
    assert ratio == 2.0 ** round(np.log2(ratio))
    # without splitting, a Resize that a conv reads too is no pass-through (the conv needs 8 bits)
    assert ("up" in wide_grids(model, table, "auto", lambda name: True, split=False)) == (not tap)
    # a pass-through kept in float reads its input as any float op does (cast from the 16 bits)
    assert "u" in wide_grids(model, table, "auto", lambda name: name != "up")


@FEW
@given(st.data())
def test_int8_through_pass_through_links_is_bit_exact(data):
    d = data.draw
    c = d(st.integers(1, 5), "channels")
    seed = d(st.integers(0, 2 ** 16), "seed")
    mode = d(st.sampled_from(["nearest", "linear"]), "resize mode")
    model = pyramid(c, seed, mode, tap=d(st.booleans(), "tap"))
    inputs = feeds({"x": (1, c, 8, 8)}, seed)
    table = table_for(model, inputs, seed)
    tm, _ = lower(model, "npu1", "INT8", table, asymmetric=d(st.sampled_from([False, True, "auto"]), "asymmetric"))
    tm.verify()
    types = _types(tm)
    assert all("i16" in types[n] for n in ("u", "up", "mp", "pad")), types
    dump = TpuInterpreter(tm).run(inputs, dump_all=True)
    seen = R.check_model(tm, dump)
    assert seen.get("tpu.Resize", 0) == 1 and seen.get("tpu.MaxPool", 0) == 2 and seen.get("tpu.Pad", 0) == 1
    assert "i16" not in types["stem"] and "i16" not in types["sp"]


def test_pass_through_links_lower_the_int8_error_and_the_simulator_agrees(tmp_path):
    from tftpu.pipelines.deploy import deploy
    model = pyramid(8, seed=2)
    samples = [feeds({"x": (1, 8, 8, 8)}, s) for s in range(4)]
    table = table_for(model, samples[0], spread=(1.0, 1.0))
    errors = {}
    for through in (False, True):
        with pytest.MonkeyPatch.context() as m:
            if not through:
                m.setattr(links_module, "PASS_THROUGH", ())
            tm, _ = lower(model, "npu1", "INT8", table, asymmetric="auto")
            ref, run = TopInterpreter(model), TpuInterpreter(tm)
            errors[through] = np.mean([_sqnr(ref.run(x)[o], run.run(x, dequantize=True)[o])
                                       for x in samples for o in ("res", "q")])
    assert errors[True] > errors[False] + 1.0, errors
    result = deploy(model, quantize="INT8", chip="npu1", calibration_table=table, test_input=samples[0],
                    mixed_precision="none", model=str(tmp_path / "m.tpumodel"))
    assert result.simulator["passed"] and all(r["bit_exact"] for r in result.simulator["outputs"])


def squeeze_excite(c: int = 4, seed: int = 0):
    """x -> conv `f` -> [GlobalAvgPool -> 1x1 conv -> HardSigmoid `gate`] -> Mul `se` (f times
    its gate) -> + x `out`: the SE block of a MobileNetV3 / PP-OCR backbone."""
    rng = np.random.default_rng(seed)

    def body(b, xs):
        x = xs[0]
        f = b.op("Conv", [x, b.weight("wf", W(rng, c, c, 3, 3)), b.weight("bf", W(rng, c, scale=0.1))],
                 {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "f")
        g = b.op("GlobalAvgPool", [f], {}, "gap")
        z = b.op("Conv", [g, b.weight("wz", W(rng, c, c, 1, 1)), b.weight("bz", W(rng, c, scale=0.5))],
                 {"kernel_shape": [1, 1]}, "z")
        gate = b.op("HardSigmoid", [z], {}, "gate")
        se = b.op("Mul", [f, gate], {}, "se")
        return b.op("Add", [se, x], {}, "out")

    return make_model({"x": (1, c, 6, 6)}, body)


@FEW
@given(st.data())
def test_a_mul_reads_and_writes_16_bit_links_bit_exactly(data):
    """An SE block's Mul reads its input and its gate on 16 bits (the pool reads the input
    through the cast to 8 bits) and writes 16 bits to the Add behind it: INT8 inference stays
    bit-exact against the integer reference."""
    d = data.draw
    c = d(st.integers(1, 5), "channels")
    seed = d(st.integers(0, 2 ** 16), "seed")
    model = squeeze_excite(c, seed)
    inputs = feeds({"x": (1, c, 6, 6)}, seed)
    table = table_for(model, inputs, seed)
    grids = wide_grids(model, table, "auto", lambda name: True)
    assert {"f", "gate", "se"} <= set(grids)
    tm, _ = lower(model, "npu1", "INT8", table, asymmetric=d(st.sampled_from([False, True, "auto"]), "asymmetric"))
    tm.verify()
    types = _types(tm)
    assert all("i16" in types[n] for n in ("f", "gate", "se")), types
    seen = R.check_model(tm, TpuInterpreter(tm).run(inputs, dump_all=True))
    assert seen.get("tpu.Mul", 0) == 1 and seen.get("tpu.GlobalAvgPool", 0) == 1


def test_mul_links_lower_the_int8_error_of_an_se_block():
    model = squeeze_excite(8, seed=4)
    samples = [feeds({"x": (1, 8, 6, 6)}, s) for s in range(4)]
    table = table_for(model, samples[0], spread=(1.0, 1.0))
    ref = TopInterpreter(model)
    errors = {}
    for wide in (False, True):
        tm, _ = lower(model, "npu1", "INT8", table, asymmetric="auto", wide_links=wide)
        run = TpuInterpreter(tm)
        errors[wide] = np.mean([_sqnr(ref.run(x)["out"], run.run(x, dequantize=True)["out"]) for x in samples])
    assert errors[True] > errors[False] + 1.0, errors


def test_a_link_passes_through_an_imported_tile():
    """Keras's UpSampling2D imports as Unsqueeze -> Concat of copies -> Reshape per axis: a Concat
    whose operands are all one tensor moves data as a Resize does, so an FPN's conv -> upsample ->
    Add keeps its 16 bits there too, bit-exactly."""
    rng = np.random.default_rng(5)

    def body(b, xs):
        x = xs[0]
        low = b.op("Conv", [x, b.weight("wd", W(rng, 4, 4, 3, 3)), b.none()],
                   {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "down")
        y = low
        for axis, n in ((2, 8), (3, 8)):           # repeat H, then W, twice each
            e = b.op("Unsqueeze", [y], {"axes": [axis + 1]}, f"e{axis}")
            t = b.op("Concat", [e, e], {"axis": axis + 1}, f"t{axis}")
            shape = [1, 4, 8, 4] if axis == 2 else [1, 4, 8, 8]
            y = b.op("Reshape", [t], {"shape": shape}, f"r{axis}")
        side = b.op("Conv", [x, b.weight("wl", W(rng, 4, 4, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "l")
        return b.op("Add", [side, y], {}, "lat")

    model = make_model({"x": (1, 4, 8, 8)}, body)
    x = feeds({"x": (1, 4, 8, 8)}, 5)
    table = table_for(model, x, spread=(1.0, 1.0))
    grids = wide_grids(model, table, "auto", lambda name: True)
    assert {"down", "e2", "t2", "r2", "e3", "t3", "r3"} <= set(grids)
    tm, _ = lower(model, "npu1", "INT8", table, asymmetric="auto")
    seen = R.check_model(tm, TpuInterpreter(tm).run(x, dump_all=True))
    assert seen.get("tpu.Concat", 0) == 2 and "i16" in _types(tm)["r3"]


def conv_activation_conv(name: str, attrs: dict, c: int = 3, seed: int = 7):
    """x -> 1x1 conv c0 -> activation a0 -> 1x1 conv c1: an activation that only a conv reads."""
    rng = np.random.default_rng(seed)

    def body(b, xs):
        y = b.op("Conv", [xs[0], b.weight("w0", W(rng, c, c, 1, 1, scale=1.0)), b.weight("b0", W(rng, c, scale=0.3))],
                 {"kernel_shape": [1, 1]}, "c0")
        a = b.op(name, [y], attrs, "a0")
        return b.op("Conv", [a, b.weight("w1", W(rng, c, c, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "c1")

    return make_model({"x": (1, c, 8, 8)}, body)


def _lut_outputs(lut, levels, table) -> np.ndarray:
    """What the integer reference makes of every input level in `levels` through `lut`."""
    want, problems = R.reference(lut, [levels, table])
    assert not problems, problems
    return np.asarray(want, np.float64)


SMOOTH = [a for a in ACTS if f"top.{a[0]}" in links_module.INTERPOLATED]


@pytest.mark.parametrize("asym", [False, "auto"], ids=["sym", "auto"])
@pytest.mark.parametrize("act", SMOOTH, ids=lambda a: a[0] + ("_" + "_".join(map(str, a[1].values())) if a[1] else ""))
def test_a_smooth_activation_interpolates_its_table_from_a_16_bit_conv_output(act, asym):
    """With wide_links="tables", a conv read only by a smooth activation writes 16 bits, and the
    activation's table is 513 knots interpolated: bit-exact against the integer reference, and over every input level of
    the conv's calibrated range nearer the float function than the 256-entry table that the
    8-bit conv output reads (the conv's 8-bit rounding is gone)."""
    name, attrs = act
    model = conv_activation_conv(name, attrs)
    x = feeds({"x": (1, 3, 8, 8)}, 3)
    table = table_for(model, x, 3, spread=(1.0, 1.0))
    assert sorted(wide_grids(model, table, asym, lambda n: True)) == []          # not by default
    assert sorted(wide_grids(model, table, asym, lambda n: True, tables=True)) == ["c0"]
    wide, _ = lower(model, "npu1", "INT8", table, asymmetric=asym, wide_links="tables")
    narrow, _ = lower(model, "npu1", "INT8", table, asymmetric=asym, wide_links=False)
    wide.verify()
    lut = next(op for op in wide.ops if op.name == "tpu.Lut")
    knots = wide.weights[lut.operands[1].owner.key]
    assert "i16" in _types(wide)["c0"] and knots.shape == (513,) and knots.dtype == np.int32
    seen = R.check_model(wide, TpuInterpreter(wide).run(x, dump_all=True))
    assert seen.get("tpu.Lut") == 1 and seen.get("tpu.Conv") == 2
    xi, yi = R.Info.of(lut.operands[0]), R.Info.of(lut.results[0])
    span = max(abs(v) for v in table.entries["c0"][:3])
    levels = np.arange(-int(span / xi.scale), int(span / xi.scale) + 1)
    real = levels * xi.scale
    exact = _f64(name, attrs, real)
    ideal = R.quantize(exact, yi.scale, yi.zp, yi.dtype).astype(np.int64)   # the best any table does
    got = _lut_outputs(lut, levels, knots)
    small = next(op for op in narrow.ops if op.name == "tpu.Lut")
    ni, no = R.Info.of(small.operands[0]), R.Info.of(small.results[0])
    assert (yi.scale, yi.zp) == (no.scale, no.zp)
    q8 = np.clip(np.floor(real / ni.scale + 0.5) + ni.zp, -128, 127).astype(np.int64)
    old = _lut_outputs(small, q8, narrow.weights[small.operands[1].owner.key])
    off, off8 = np.abs(got - ideal), np.abs(old - ideal)
    assert off.max() <= off8.max() + 1, (off.max(), off8.max())
    assert (off ** 2).mean() <= (off8 ** 2).mean() + 0.01, ((off ** 2).mean(), (off8 ** 2).mean())


@pytest.mark.parametrize("name", ["Floor", "Round", "Sign", "Log", "Sqrt"])
def test_a_step_function_or_a_steep_one_reads_8_bits(name):
    """Floor, Round, Sign (not continuous) and Log, Sqrt (unbounded slope at 0) keep the exact
    256-entry table: their conv writes 8 bits."""
    model = conv_activation_conv(name, {})
    x = feeds({"x": (1, 3, 8, 8)}, 3)
    table = table_for(model, x, 3, spread=(1.0, 1.0))
    assert "c0" not in wide_grids(model, table, "auto", lambda n: True, tables=True)
    tm, _ = lower(model, "npu1", "INT8", table, asymmetric="auto", wide_links="tables")
    lut = next(op for op in tm.ops if op.name == "tpu.Lut")
    assert "i16" not in _types(tm)["c0"] and tuple(lut.operands[1].type.get_shape()) == (256,)


def _conv_activation(b, x, rng, c: int, act: str | None, nhwc: bool):
    """A 1x1 conv `c0` of `c` channels, then `act` (`a`: a PReLU with its slopes, or any other op)."""
    layout = {"layout": "NHWC"} if nhwc else {}
    y = b.op("Conv", [x, b.weight("w0", W(rng, c, c, 1, 1)), b.weight("b0", W(rng, c, scale=0.1))],
             {"kernel_shape": [1, 1], **layout}, "c0")
    if act == "PRelu":
        slope = rng.uniform(0.05, 0.5, (1, 1, 1, c) if nhwc else (1, c, 1, 1)).astype(np.float32)
        return b.op("PRelu", [y, b.weight("s", slope)], {}, "a")
    return y if act is None else b.op(act, [y], {}, "a")


@FEW
@given(st.data())
def test_a_depthwise_conv_reads_a_16_bit_link_in_two_passes_bit_exactly(data):
    """conv -> activation -> depthwise conv -> 1x1 conv, over kernels, strides, dilations,
    channel multipliers, layouts and zero points: a depthwise conv up to 7x7 reads the tensor
    before it on a 16-bit link (no cast), a larger one on 8 bits; INT8 inference equals the
    integer reference, and the lowering report names the convs read so."""
    from tftpu.transforms.lowering.lower import TWO_PASSES
    d = data.draw
    c, mult = d(st.integers(1, 5), "channels"), d(st.sampled_from([1, 2]), "multiplier")
    k, stride, dil = d(st.sampled_from([1, 3, 5, 7, 9]), "kernel"), d(st.sampled_from([1, 2]), "stride"), \
        d(st.sampled_from([1, 2]), "dilation")
    nhwc = d(st.booleans(), "nhwc")
    act = d(st.sampled_from([None, "Relu", "HardSwish", "PRelu"]), "activation")
    asym = d(st.sampled_from([False, True, "auto"]), "asymmetric")
    seed = d(st.integers(0, 2 ** 16), "seed")
    rng = np.random.default_rng(seed)
    layout = {"layout": "NHWC"} if nhwc else {}
    side = 6 + k
    shape = (1, side, side, c) if nhwc else (1, c, side, side)

    def body(b, xs):
        y = _conv_activation(b, xs[0], rng, c, act, nhwc)
        pad = dil * (k // 2)
        z = b.op("Conv", [y, b.weight("wd", W(rng, c * mult, 1, k, k, scale=1.0 / k)), b.weight("bd", W(rng, c * mult))],
                 {"kernel_shape": [k, k], "pads": [pad] * 4, "strides": [stride] * 2, "dilations": [dil] * 2,
                  "group": c, **layout}, "dw")
        return b.op("Conv", [z, b.weight("w2", W(rng, 2, c * mult, 1, 1)), b.none()],
                    {"kernel_shape": [1, 1], **layout}, "out")

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, seed)
    table = table_for(model, inputs, seed)
    tm, report = lower(model, "npu1", "INT8", table, asymmetric=asym)
    tm.verify()
    conv = next(op for op in tm.ops if op.name == "tpu.Conv" and "dw" in op.loc)
    wide = k * k <= links_module.MAX_TAPS and c > 1
    assert ("i16" in str(conv.operands[0].type)) == wide
    assert not [op for op in tm.ops if op.name == "tpu.Cast" and "i16" in str(op.operands[0].type)]
    assert [x.name for x in report.decisions if x.reason == TWO_PASSES] == (["dw"] if wide else [])
    seen = R.check_model(tm, TpuInterpreter(tm).run(inputs, dump_all=True))
    assert seen.get("tpu.Conv", 0) == 3


@FEW
@given(st.data())
def test_every_conv_reads_a_16_bit_link_in_two_passes_bit_exactly(data):
    """wide_links="convs" (W8A16 in two INT8 passes): conv -> activation -> dense conv (kernels,
    strides, groups, layouts, zero points; channels enough that the 16-bit sums run past int32)
    -> 1x1 conv; every conv reads the tensor before it on 16 bits (the first the model input, cast
    to 16 bits where it enters), no other cast; INT8 inference equals the integer reference; the
    report names those convs."""
    from tftpu.transforms.lowering.lower import TWO_PASSES
    d = data.draw
    c, groups = d(st.sampled_from([2, 8, 48]), "channels"), d(st.sampled_from([1, 2]), "groups")
    k, stride = d(st.sampled_from([1, 3, 5]), "kernel"), d(st.sampled_from([1, 2]), "stride")
    nhwc = d(st.booleans(), "nhwc")
    act = d(st.sampled_from([None, "Relu", "HardSwish", "PRelu", "Sigmoid"]), "activation")
    asym = d(st.sampled_from([False, True, "auto"]), "asymmetric")
    seed = d(st.integers(0, 2 ** 16), "seed")
    rng = np.random.default_rng(seed)
    layout = {"layout": "NHWC"} if nhwc else {}
    side = 4 + k
    shape = (1, side, side, c) if nhwc else (1, c, side, side)

    def body(b, xs):
        y = _conv_activation(b, xs[0], rng, c, act, nhwc)
        z = b.op("Conv", [y, b.weight("wd", W(rng, 2 * c, c // groups, k, k, scale=1.0 / k)),
                          b.weight("bd", W(rng, 2 * c))],
                 {"kernel_shape": [k, k], "pads": [k // 2] * 4, "strides": [stride] * 2, "group": groups,
                  **layout}, "dense")
        return b.op("Conv", [z, b.weight("w2", W(rng, 2, 2 * c, 1, 1)), b.none()],
                    {"kernel_shape": [1, 1], **layout}, "out")

    model = make_model({"x": shape}, body)
    inputs = feeds({"x": shape}, seed)
    table = table_for(model, inputs, seed)
    tm, report = lower(model, "npu1", "INT8", table, asymmetric=asym, wide_links="convs")
    tm.verify()
    convs = {name: next(op for op in tm.ops if op.name == "tpu.Conv" and op.loc.startswith(name))
             for name in ("c0", "dense", "out")}
    assert {name: "i16" in str(op.operands[0].type) for name, op in convs.items()} == \
        {"c0": True, "dense": True, "out": True}
    assert not [op for op in tm.ops if op.name == "tpu.Cast" and "i16" in str(op.operands[0].type)]
    assert sorted(x.name for x in report.decisions if x.reason == TWO_PASSES) == ["c0", "dense", "out"]
    seen = R.check_model(tm, TpuInterpreter(tm).run(inputs, dump_all=True))
    assert seen.get("tpu.Conv", 0) == 3


def test_conv_links_lower_the_int8_error_of_a_conv_stack():
    """Dense convs reading 16 bits: the INT8 outputs of a conv stack get closer to float than with
    8-bit conv inputs, the same weights (whose 8-bit rounding is left: random weights lose about
    as much there as the activations do); an unknown value of wide_links is refused."""
    from tftpu.errors import UsageError
    rng = np.random.default_rng(3)

    def body(b, xs):
        y = xs[0]
        for i in range(4):
            y = b.op("Conv", [y, b.weight(f"w{i}", W(rng, 8, 8, 3, 3, scale=0.3)), b.weight(f"b{i}", W(rng, 8))],
                     {"kernel_shape": [3, 3], "pads": [1] * 4, "do_relu": i < 3}, f"c{i}")
        return y

    model = make_model({"x": (1, 8, 10, 10)}, body)
    inputs = feeds({"x": (1, 8, 10, 10)}, 3)
    table = table_for(model, inputs, 3, spread=(1.0, 1.0))
    ref = TopInterpreter(model).run(inputs)[model.output_names[0]]
    sqnr = {}
    for links in (False, True, "convs"):
        tm, _ = lower(model, "npu1", "INT8", table, wide_links=links)
        sqnr[links] = _sqnr(ref, TpuInterpreter(tm).run(inputs)[model.output_names[0]])
    assert sqnr[True] == sqnr[False] and sqnr["convs"] > sqnr[True] + 1.5, sqnr   # (no Add: no other link)
    with pytest.raises(UsageError, match="wide_links"):
        lower(model, "npu1", "INT8", table, wide_links="every")


@pytest.mark.parametrize("nhwc", [False, True])
def test_the_convs_reading_a_model_input_read_it_on_16_bits(nhwc):
    """`InputConvs`: the convs reading a model input (through an NHWC model's transpose too) read
    it on 16 bits in two INT8 passes, the input cast to 16 bits where it enters, every other conv
    on 8 bits and no table interpolated; INT8 inference equals the integer reference, and the
    outputs get closer to float where the input's 8-bit rounding is the noise that counts."""
    from tftpu.quant.links import InputConvs, input_convs, reach
    from tftpu.transforms.lowering.lower import TWO_PASSES
    rng = np.random.default_rng(5)
    shape = (1, 12, 12, 3) if nhwc else (1, 3, 12, 12)

    def body(b, xs):
        x = b.op("Permute", [xs[0]], {"order": [0, 3, 1, 2]}, "to_nchw") if nhwc else xs[0]
        y = b.op("Conv", [x, b.weight("w0", W(rng, 8, 3, 3, 3, scale=0.5)), b.weight("b0", W(rng, 8))],
                 {"kernel_shape": [3, 3], "pads": [1] * 4, "strides": [2, 2]}, "c0")
        y = b.op("Sigmoid", [y], {}, "s0")
        return b.op("Conv", [y, b.weight("w1", W(rng, 4, 8, 1, 1)), b.none()], {"kernel_shape": [1, 1]}, "c1")

    model = make_model({"x": shape}, body)
    assert input_convs(model) == {"c0"}
    assert reach(InputConvs({"c0"})) == (False, frozenset({"c0"}))
    inputs = feeds({"x": shape}, 5)
    table = table_for(model, inputs, 5)
    ref = TopInterpreter(model).run(inputs)[model.output_names[0]]
    got = {}
    for links in (True, InputConvs({"c0"})):
        tm, report = lower(model, "npu1", "INT8", table, wide_links=links)
        tm.verify()
        two = sorted(d.name for d in report.decisions if d.reason == TWO_PASSES)
        assert two == ([] if links is True else ["c0"])
        assert [op.name for op in tm.ops if op.name == "tpu.Lut"] == ["tpu.Lut"] * 1
        assert R.check_model(tm, TpuInterpreter(tm).run(inputs, dump_all=True)).get("tpu.Conv", 0) == 2
        got[links is True] = _sqnr(ref, TpuInterpreter(tm).run(inputs)[model.output_names[0]])
    assert got[False] > got[True], got
