"""Layer groups on chips whose local memory is tiny, so that groups are sliced along H (and N)
with halos: the groups cover the TPU ops in order; every group's slices partition its output's
rows; each slice holds exactly the rows (and pad rows) its window ops read, as worked out here
from the conv/pool arithmetic; every tensor of a slice fits a lane, EU-aligned, apart from the
tensors alive with it; no tensor made inside a group is read outside it; the DDR plan gives no
two tensors alive together the same bytes when a group's DDR inputs and outputs live over the
group's whole span; and the plan is deterministic and never costs more than one op per group.
A wrong halo or pad gives wrong numbers only at slice edges, and a placement clash only when
two tensors happen to meet, so these are checked directly rather than through outputs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.backend.chips_tiny import tiny_chip, zoo, zoo_feed
from tftpu import chip as chips
from tftpu import quant
from tftpu.backend.codegen import generate
from tftpu.backend.layer_group import lane_bytes, plan_groups, weight_lane_axis
from tftpu.backend.memory import plan_memory
from tftpu.backend.simulator import Simulator
from tftpu.ir import TopBuilder
from tftpu.ir import attrs as A
from tftpu.ir import top, tpu
from tftpu.ir.base import numel, value_name
from tftpu.transforms.lowering import lower

CONFIGS = [("tiny512", "INT8"), ("tiny512", "F16"), ("tiny1024", "INT8"), ("tiny1024", "F16"),
           ("tiny2048", "INT8"), ("npu1_tiny1024", "F32"), ("npu1_tiny1024", "BF16"), ("npu1_tiny1024", "INT8"),
           ("edge16", "INT8"), ("npu1", "INT8")]


@pytest.fixture(scope="module")
def chip_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("chips")
    return {"tiny512": tiny_chip(d, 512), "tiny1024": tiny_chip(d, 1024), "tiny2048": tiny_chip(d, 2048),
            "npu1_tiny1024": tiny_chip(d, 1024, "npu1"), "edge16": "edge16", "npu1": "npu1"}


@pytest.fixture(scope="module")
def zoo_model():
    model = zoo(batch=2)
    return model, quant.calibrate(model, [zoo_feed(batch=2)], "minmax")


def lowered(zoo_model, chip_paths, which, mode):
    model, table = zoo_model
    chip = chips.load(chip_paths[which])
    tpu_model, _ = lower(model, chip, mode, table if mode == "INT8" else None)
    return tpu_model, chip


# ---------------------------------------------------------------- independent arithmetic


def _itemsize(t) -> int:
    return A.numpy_dtype(A.dtype_name(t.element_type)).itemsize


def window_rows(op, h0: int, h1: int, size: int) -> tuple[int, int, int, int]:
    """(first, stop, pad_before, pad_after) of the input rows a conv/pool reads for output rows
    [h0, h1) of an input `size` rows high."""
    a = op.attrs()
    k, s = a["kernel_shape"][0], a["strides"][0]
    d = (a.get("dilations") or [1])[0]
    top_pad = a["pads"][0]
    first = h0 * s - top_pad
    stop = (h1 - 1) * s - top_pad + (k - 1) * d + 1
    return max(first, 0), min(stop, size), max(0, -first), max(0, stop - size)


def needed_rows(group, types, n, h) -> tuple[dict, dict]:
    """Rows (n0, n1, h0, h1) each tensor of a slice must hold so that the group's last op makes
    rows `h` of images `n`, and the (first, stop, pads) each window op reads: back from the end."""
    held = {group.ops[-1].outs[0]: (n[0], n[1], h[0], h[1])}
    reads = {}
    for f in reversed(group.ops):
        if f.outs[0] not in held:
            continue
        oshape = types[f.outs[0]]
        if f.kind == "batch":                   # a global or ceil-mode pool makes all its rows
            held[f.outs[0]] = held[f.outs[0]][:2] + (0, oshape[2])
        n0, n1, h0, h1 = held[f.outs[0]]
        for name in f.ins:
            if name is None:
                continue
            shape = types[name]
            nn = (0, 1) if shape[0] == 1 and oshape[0] != 1 else (n0, n1)
            if f.kind == "window":
                first, stop, pb, pa = window_rows(f.op, h0, h1, shape[2])
                reads[f.name] = (first, stop, pb, pa)
                hh = (first, stop)
            elif f.kind == "batch":
                hh = (0, shape[2])
            else:
                hh = (0, 1) if shape[2] == 1 and oshape[2] != 1 else (h0, h1)
            if name in held:
                o = held[name]
                nn, hh = (min(nn[0], o[0]), max(nn[1], o[1])), (min(hh[0], o[2]), max(hh[1], o[3]))
            held[name] = (nn[0], nn[1], hh[0], hh[1])
    return held, reads


def consumers(model) -> dict:
    """Tensor name -> indices (in model.ops) of the ops that read it."""
    out: dict = {}
    for i, op in enumerate(model.ops):
        for v in op.operands:
            if hasattr(v.type, "get_shape"):
                out.setdefault(value_name(v), []).append(i)
    return out


# ---------------------------------------------------------------- checks


def check_cover(model, plan):
    """The groups hold every TPU op once, in program order; a global group holds one op."""
    positions = [g.ops[k].index for g in plan.groups for k in range(len(g.ops))]
    assert positions == [i for i, op in enumerate(model.ops) if isinstance(op, tpu.TpuOp)]
    assert [g.start for g in plan.groups] == [0] + [g.stop for g in plan.groups[:-1]]
    for g in plan.groups:
        assert g.stop - g.start == len(g.ops) >= 1
        assert not g.is_global or len(g.ops) == 1
        assert g.is_global or all(f.kind is not None for f in g.ops), str(g)


def check_slices(plan):
    """The slices partition the last op's output: every (image, row) in exactly one slice; each
    slice holds exactly the rows its ops read, with the pad rows they need."""
    types = plan.types
    for g in plan.local_groups:
        out = types[g.ops[-1].outs[0]]
        seen = [[0] * out[2] for _ in range(out[0])]
        slices = g.slices(types)
        assert len(slices) == g.n_slices * g.h_slices, str(g)
        for rng in slices:
            n0, n1 = rng.n
            h0, h1 = rng.h
            assert 0 <= n0 < n1 <= out[0] and 0 <= h0 < h1 <= out[2], (str(g), rng.n, rng.h)
            for b in range(n0, n1):
                for r in range(h0, h1):
                    seen[b][r] += 1
            want, reads = needed_rows(g, types, rng.n, rng.h)
            assert {k: tuple(v) for k, v in rng.tensors.items()} == want, str(g)
            assert {k: tuple(v) for k, v in rng.reads.items()} == reads, str(g)
            for f in g.ops:
                if f.kind == "window":
                    # the op's own formula on the slice, with its pads, gives the slice's rows
                    first, stop, pb, pa = reads[f.name]
                    a = f.op.attrs()
                    span = (a["kernel_shape"][0] - 1) * (a.get("dilations") or [1])[0] + 1
                    r = rng.tensors[f.outs[0]]
                    assert (stop - first + pb + pa - span) // a["strides"][0] + 1 == r[3] - r[2], f.name
                if f.kind == "batch":
                    # a global pool or ceil-mode pool makes its whole output from its whole input
                    r = rng.tensors[f.outs[0]]
                    assert (r[2], r[3]) == (0, types[f.outs[0]][2]), f"{g}: {f.name} makes rows {r[2]}..{r[3]}"
        assert all(c == 1 for row in seen for c in row), f"{g}: slices do not cover the output exactly once"


def check_local(plan, chip, generated: bool):
    """The planner's figure for each group fits a lane; after codegen, every tensor of every slice
    has EU-aligned per-lane offsets inside the lane (sized for the largest slice), and no two
    tensors alive at the same op of the group share bytes."""
    types = plan.types
    bank = chip.local_mem_per_lane
    for g in plan.local_groups:
        assert 0 < g.local_peak <= bank, str(g)
        assert g.copies in (1, 2)
        if not generated:
            continue
        slices = g.slices(types)
        itemsize = {}
        for f in g.ops:
            for v in list(f.op.operands) + list(f.op.results):
                if hasattr(v.type, "get_shape"):
                    itemsize[value_name(v)] = _itemsize(v.type)
        sizes = {}
        for rng in slices:
            for name, (n0, n1, h0, h1) in rng.tensors.items():
                shape = types[name]
                b = lane_bytes((n1 - n0, shape[1], h1 - h0, *shape[3:]), itemsize[name], chip)
                sizes[name] = max(sizes.get(name, 0), b)
        assert set(g.inputs) <= set(sizes) and set(g.outputs) <= set(sizes), str(g)
        end = len(g.ops)
        span = {}
        for p, f in enumerate(g.ops):
            for o in f.outs:
                span.setdefault(o, [p, p])
            for name in f.ins:
                if name is not None and name in span:
                    span[name][1] = p
        items = [((w, 0), lane_bytes(types[w], itemsize[w], chip, weight_lane_axis(types[w])), -1, end)
                 for w in g.weights]
        copies = g.copies if len(slices) > 1 else 1
        for name, size in sizes.items():
            if name in g.inputs or name in g.outputs:
                items.extend(((name, c), size, -1, end) for c in range(copies))
            else:
                lo, hi = span[name]
                items.append(((name, 0), size, lo, hi))
        peak = 0
        for k, (key, size, lo, hi) in enumerate(items):
            off = g.local[key]
            assert off % chip.eu_bytes == 0, f"{g}: {key} at {off} is not EU-aligned"
            assert off + size <= bank, f"{g}: {key} passes the end of a lane"
            peak = max(peak, off + size)
            for key2, size2, lo2, hi2 in items[:k]:
                if hi < lo2 or hi2 < lo:
                    continue
                off2 = g.local[key2]
                assert off + size <= off2 or off2 + size2 <= off, f"{g}: {key} and {key2} share local bytes"
        assert peak <= g.local_peak <= bank


def check_inner(model, plan):
    """A result made inside a group and read after it (or returned) must be the group's last."""
    readers = consumers(model)
    outputs = {value_name(v) for v in model.return_op.operands}
    for g in plan.local_groups:
        inside = {f.index for f in g.ops}
        for f in g.ops[:-1]:
            for o in f.outs:
                assert o not in outputs, f"{g}: {o} is a model output"
                outside = [i for i in readers.get(o, []) if i not in inside]
                assert not outside, f"{g}: {o} is read by {[model.ops[i].name for i in outside]}"
        made = {o for f in g.ops for o in f.outs}
        reads = [n for f in g.ops for n in f.ins if n is not None and n not in made]
        assert set(g.inputs) == set(reads), str(g)
        assert g.outputs == g.ops[-1].outs


def check_ddr(model, plan, memory):
    """Group-aware liveness: a tensor lives from the first op of the group that makes it to the
    last op of the last group that reads it (model inputs from the start, outputs to the end);
    tensors that stay inside a group have no DDR address, all others have one; no two tensors
    alive together share bytes; weights sit apart below the activations."""
    span = {}
    for g in plan.groups:
        for f in g.ops:
            span[f.index] = (g.ops[0].index, g.ops[-1].index)
    inner = {o for g in plan.local_groups for f in g.ops[:-1] for o in f.outs}
    first, last, sizes = {}, {}, {}
    for i, op in enumerate(model.ops):
        if isinstance(op, (top.Weight, top.NoneOp)):
            continue
        for r in op.results:
            name = value_name(r)
            if name in inner:
                assert name not in memory.addresses, f"{name} stays in local memory but has an address"
                continue
            first[name] = 0 if isinstance(op, top.Input) else span[i][0]
            last[name] = first[name]
            sizes[name] = numel(r.type.get_shape()) * _itemsize(r.type)
        for v in op.operands:
            name = value_name(v)
            if name in first:
                last[name] = max(last[name], span.get(i, (i, i))[1])
    for v in model.return_op.operands:
        last[value_name(v)] = len(model.ops)
    assert set(first) <= set(memory.addresses)
    acts = sorted((memory.addresses[n][0], sizes[n], n) for n in first)
    for a, s, n in acts:
        assert a % memory.alignment == 0 and a >= memory.activation_base >= memory.weight_bytes
        assert memory.addresses[n][1] >= s
    for k, (a, s, n) in enumerate(acts):
        for b, t, m in acts[k + 1:]:
            if b >= a + s:
                break
            assert last[n] < first[m] or last[m] < first[n], f"{n} and {m} are alive together and share DDR bytes"
    weights = sorted(memory.addresses[n] for n in memory.addresses if n not in first and n not in inner)
    assert all(a + s <= b for (a, s), (b, _) in zip(weights, weights[1:]))
    assert not weights or weights[-1][0] + weights[-1][1] <= memory.activation_base


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("which,mode", CONFIGS)
def test_plan_slices_fit_and_cover(zoo_model, chip_paths, which, mode):
    tpu_model, chip = lowered(zoo_model, chip_paths, which, mode)
    plan = plan_groups(tpu_model, chip)
    again = plan_groups(tpu_model, chip)
    assert plan.as_dict() == again.as_dict() and str(plan) == str(again)
    assert [g.local for g in plan.groups] == [g.local for g in again.groups]
    assert plan.cycles <= plan.single_cycles
    assert all(g.cycles > 0 for g in plan.groups)
    check_cover(tpu_model, plan)
    check_inner(tpu_model, plan)
    check_slices(plan)
    check_local(plan, chip, generated=False)
    check_ddr(tpu_model, plan, plan_memory(tpu_model, chip, plan))
    program = generate(tpu_model, chip, again)             # codegen re-places each group over its slices
    check_local(again, chip, generated=True)
    check_ddr(tpu_model, again, program.memory)
    if which.startswith("tiny") or which.startswith("npu1_tiny"):
        # halo slicing happens: an H-sliced group whose window ops read rows of a neighbour
        halo = [g for g in plan.local_groups if g.h_slices > 1 and any(
            f.kind == "window" and f.op.attrs()["kernel_shape"][0] > 1 for f in g.ops)]
        assert halo, str(plan)
        assert sum(len(g.ops) > 1 for g in plan.local_groups) >= 2, str(plan)


def test_tiny_memory_slices_batch_too(chip_paths):
    # three images on 512 bytes a lane: some group runs one image per slice
    model = zoo(batch=3)
    table = quant.calibrate(model, [zoo_feed(batch=3)], "minmax")
    chip = chips.load(chip_paths["tiny512"])
    tpu_model, _ = lower(model, chip, "INT8", table)
    plan = plan_groups(tpu_model, chip)
    assert any(g.n_slices > 1 for g in plan.local_groups), str(plan)
    check_cover(tpu_model, plan)
    check_slices(plan)
    program = generate(tpu_model, chip, plan)
    check_local(plan, chip, generated=True)
    check_ddr(tpu_model, plan, program.memory)


def ceil_pool_model(skip_rows: bool):
    """The smallest models found where a ceil-mode pool (a "batch" op: whole images in, whole
    images out) is given fewer result rows than its kernel makes: H-sliced behind a 3x3 conv,
    or unsliced behind a 1x1/s2 conv that reads rows 0..H-2 of it."""
    c, h, k = (1, 3, 1) if skip_rows else (8, 16, 3)
    b = TopBuilder("ceil_pool")
    x = b.input("x", (1, c, h, h))
    p = b.op("MaxPool", [x], {"kernel_shape": [k, k], "strides": [2, 2], "ceil_mode": True}, "p")
    w = b.weight("w", np.random.default_rng(0).normal(size=(c, c, 3 - 2 * skip_rows, 3 - 2 * skip_rows)))
    attrs = {"kernel_shape": [1, 1], "strides": [2, 2]} if skip_rows else {"kernel_shape": [3, 3], "pads": [1] * 4}
    return b.finish([b.op("Conv", [p, w, b.none()], attrs, "c")])


@pytest.mark.parametrize("skip_rows", [False, True], ids=["h_sliced", "rows_skipped"])
def test_ceil_mode_pool_makes_all_its_rows(skip_rows):
    tpu_model, _ = lower(ceil_pool_model(skip_rows), "npu1", "F32")
    plan = plan_groups(tpu_model, "npu1")
    check_cover(tpu_model, plan)
    shape = tpu_model.func.function_type.inputs.data[0].get_shape()
    Simulator(generate(tpu_model, "npu1", plan)).run({"x": np.ones(shape, np.float32)})
    check_slices(plan)


def edge_slice_pool():
    """The smallest model found where the planner's representative slice underestimates."""
    b = TopBuilder("edge_slice")
    x = b.input("x", (1, 1, 5, 16))
    return b.finish([b.op("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [2, 0, 0, 0]}, "p")])


def test_every_slice_fits_not_just_the_representative_one(chip_paths):
    chip = chips.load(chip_paths["tiny512"])
    tpu_model, _ = lower(edge_slice_pool(), chip, "F16")
    plan = plan_groups(tpu_model, chip)
    generate(tpu_model, chip, plan)
    check_local(plan, chip, generated=True)


def token_scale_model():
    """A transformer's per-feature scale and shift on [N, T, C] tokens (LayerNorm's gamma and
    beta): by numpy broadcasting a 1-D weight runs along the last axis, which a 3-D op slices."""
    rng = np.random.default_rng(0)
    b = TopBuilder("token_scale")
    x = b.input("x", (1, 40, 120))
    m = b.op("Mul", [x, b.weight("gamma", rng.uniform(0.5, 2.0, 120))], {}, "m")
    return b.finish([b.op("Add", [m, b.weight("beta", rng.normal(size=120))], {}, "a")])


@pytest.mark.parametrize("which,mode", [("tiny512", "INT8"), ("tiny512", "F16"), ("npu1", "INT8"), ("npu1", "F32")])
def test_a_1d_weight_along_the_sliced_axis_is_never_cut(chip_paths, which, mode):
    """A PP-OCRv4 recognizer's LayerNorm crashed the simulator: its (C,) gamma met an H slice of
    [N, T, C]. Such an op runs whole; the simulator's results equal the interpreter's."""
    from tftpu.interp.tpu import TpuInterpreter
    model = token_scale_model()
    feed = {"x": np.random.default_rng(1).normal(size=(1, 40, 120)).astype(np.float32)}
    chip = chips.load(chip_paths[which])
    table = quant.calibrate(model, [feed], "minmax") if mode == "INT8" else None
    tpu_model, _ = lower(model, chip, mode, table)
    plan = plan_groups(tpu_model, chip)
    check_cover(tpu_model, plan)
    got = Simulator(generate(tpu_model, chip, plan)).run(feed)
    want = TpuInterpreter(tpu_model).run(feed)
    assert np.array_equal(np.asarray(got["a"]), np.asarray(want["a"]))


@pytest.mark.parametrize("which", ["tiny1024", "npu1"])
def test_plans_remembered_across_programs_equal_fresh_ones(zoo_model, chip_paths, which):
    # the precision search plans program after program that differ in a few ops: a candidate
    # group remembered from an earlier program must give the plan a fresh planner gives
    from tftpu.backend import layer_group
    model, table = zoo_model
    chip = chips.load(chip_paths[which])
    convs = [op.loc for op in model.ops if isinstance(op, top.Conv)]
    programs = [lower(model, chip, "INT8", table, qtable=q)[0] for q in ({}, {convs[1]: "F16"}, {convs[-1]: "F16"})]
    warm = [plan_groups(p, chip) for p in programs]
    for program, plan in zip(programs, warm):
        layer_group._EVALUATED.clear()
        fresh = plan_groups(program, chip)
        assert plan.as_dict() == fresh.as_dict()
        assert [g.local for g in plan.groups] == [g.local for g in fresh.groups]
        assert [g.inputs for g in plan.groups] == [g.inputs for g in fresh.groups]
        assert [[f.op for f in g.ops] for g in plan.groups] == [[f.op for f in g.ops] for g in fresh.groups]
        check_cover(program, plan)
        check_local(plan, chip, generated=False)


class _NoHints(dict):
    def get(self, key, default=None):
        return default


@pytest.mark.parametrize("which", ["tiny512", "tiny1024", "npu1"])
def test_the_fewest_slices_hint_changes_no_plan(zoo_model, chip_paths, which, monkeypatch):
    # the bisection for a group's fewest H slices starts from the group one op shorter: the plan
    # must be the one a plain bisection from 2 finds
    from tftpu.backend import layer_group
    tpu_model, chip = lowered(zoo_model, chip_paths, which, "INT8")
    layer_group._EVALUATED.clear()
    hinted = plan_groups(tpu_model, chip)
    init = layer_group._Planner.__init__

    def without_hints(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._fewest = _NoHints()

    monkeypatch.setattr(layer_group._Planner, "__init__", without_hints)
    layer_group._EVALUATED.clear()
    plain = plan_groups(tpu_model, chip)
    assert hinted.as_dict() == plain.as_dict()
    assert [g.local for g in hinted.groups] == [g.local for g in plain.groups]
    assert any(g.h_slices > 1 for g in hinted.groups) or which == "npu1"


@pytest.mark.parametrize("which", ["tiny512", "tiny1024", "npu1"])
def test_slice_ranges_carried_to_longer_groups_change_no_plan(zoo_model, chip_paths, which, monkeypatch):
    # a group's slice ranges are carried on from the group one op shorter: the plan must be the
    # one that propagates every candidate group's ranges afresh
    from tftpu.backend import layer_group
    tpu_model, chip = lowered(zoo_model, chip_paths, which, "INT8")
    layer_group._EVALUATED.clear()
    carried = plan_groups(tpu_model, chip)

    def afresh(self, start, stop, n, h):
        return layer_group.slice_ranges(self.facts[start:stop], self.types, n, h)

    monkeypatch.setattr(layer_group._Planner, "_slice", afresh)
    layer_group._EVALUATED.clear()
    plain = plan_groups(tpu_model, chip)
    assert carried.as_dict() == plain.as_dict()
    assert [g.local for g in carried.groups] == [g.local for g in plain.groups]
    assert [g.inputs for g in carried.groups] == [g.inputs for g in plain.groups]
    assert any(g.h_slices > 1 for g in carried.groups) or which == "npu1"


@pytest.mark.parametrize("which", ["tiny512", "tiny1024"])
def test_local_floor_never_exceeds_a_placements_peak_nor_changes_a_plan(zoo_model, chip_paths, which, monkeypatch):
    # a candidate whose floor (all it holds at its busiest step) is over the bank is turned down
    # unplaced: every placement the planner makes must need at least its floor
    from tftpu.backend import layer_group
    tpu_model, chip = lowered(zoo_model, chip_paths, which, "INT8")
    seen = []
    place = layer_group.place_local

    def placed(ops, sizes, ins, outs, ws, copies, wsizes):
        local, peak = place(ops, sizes, ins, outs, ws, copies, wsizes)
        seen.append((layer_group.local_floor(ops, sizes, ins, outs, ws, copies, wsizes), peak))
        return local, peak

    monkeypatch.setattr(layer_group, "place_local", placed)
    layer_group._EVALUATED.clear()
    every = plan_groups(tpu_model, chip)
    assert seen and all(floor <= peak for floor, peak in seen)
    assert any(floor == peak for floor, peak in seen)
    # and the plan is the one placing every candidate finds
    monkeypatch.setattr(layer_group, "local_floor", lambda *args: 0)
    layer_group._EVALUATED.clear()
    placing = plan_groups(tpu_model, chip)
    assert every.as_dict() == placing.as_dict()
    assert [g.local for g in every.groups] == [g.local for g in placing.groups]
