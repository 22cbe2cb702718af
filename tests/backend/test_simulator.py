"""The simulator runs codegen's command list on lane-split local memory and byte-addressed DDR;
its outputs must equal TPU-dialect inference (`TpuInterpreter`) bit for bit in INT8, BF16 and
F16, by construction: a slice runs the same integer kernel on the same values, and a float
window op runs one call per output row (`tftpu.interp.tpu.float_rows`) whatever slice holds the
row, so no library's shape-dependent summation order can tell a slice from the whole tensor
(a kernel made to round by the shape of its call proves it). F32 modules run TOP's kernels on
whole tensors (bit-equal to TOP), so there the simulator is held to FLOAT_TOLERANCE. Small
random models (convs of every kernel, stride, pad, dilation and group, pools, activations,
residual adds, concats, squeeze-excite multiplies) run on the real chips and on chips with a
tiny local memory, where groups are sliced along H (and N) with halos, so a wrong halo, pad
row, slice boundary or buffer shows up as a wrong number. The command list must also be safe to
run in parallel: the timeline starts every command after its deps, and every two commands that
touch the same local or DDR bytes (one of them writing) are ordered by deps and engine order,
so the result does not depend on the engines' timing. Corrupt offsets are `SimulatorError`s
naming the command. Real models (selfie segmentation, mtcnn O-Net, MobileNetV2, ResNet50) are
checked bit for bit in INT8, BF16 and F16, marked slow. Each bug these tests found has a test
of its own.

`TFTPU_SIM_EXAMPLES=200` runs the random sweeps longer, with fresh examples."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.backend.chips_tiny import accesses, tiny_chip, types_of, zoo, zoo_feed
from tftpu import chip as chips
from tftpu import quant
from tftpu.backend.codegen import generate
from tftpu.backend.layer_group import plan_groups
from tftpu.backend.simulator import Simulator, SimulatorError
from tftpu.backend.timeline import schedule
from tftpu.errors import InternalError
from tftpu.interp.kernels import KERNELS
from tftpu.interp.tpu import TpuInterpreter, float_kernels
from tftpu.interp.tpu.float_rows import IMAGE_OPS, ROW_OPS
from tftpu.ir import attrs as A
from tftpu.ir import TopBuilder
from tftpu.ir.base import numel, value_name
from tftpu.transforms.lowering import lower

EXAMPLES = int(os.environ.get("TFTPU_SIM_EXAMPLES", "25"))
SWEEP = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("TFTPU_SIM_EXAMPLES"),
                 database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                       HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def chip_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("chips")


# ---------------------------------------------------------------- random models


class Case:
    """A random model and its input; shown (when hypothesis reports it) as its layers."""

    def __init__(self, model, feed: dict, layers: list):
        self.model, self.feed, self.layers = model, feed, layers

    def __repr__(self) -> str:
        return f"Case(input {list(self.feed['x'].shape)}: " + "; ".join(self.layers) + ")"


@st.composite
def random_models(draw):
    """A random chain of 1-8 layers over an N x C x H x W input."""
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 20))
    h, w = draw(st.integers(5, 20)), draw(st.integers(5, 20))
    seed = draw(st.integers(0, 2 ** 16))
    layers = []
    rng = np.random.default_rng(seed)
    b = TopBuilder("rand")
    names = iter(f"t{i}" for i in range(1000))

    def weight(shape):
        fan_in = max(1, numel(shape[1:]))
        return b.weight(next(names), rng.normal(0, 1.5 / np.sqrt(fan_in), size=shape).astype(np.float32))

    def conv(x, cin, cout, k=1, s=1, d=1, pads=(0, 0, 0, 0), group=1, bias=True, relu=False):
        layers.append(f"conv {cin}->{cout} k{k} s{s} d{d} pads {list(pads)} group {group}"
                      f"{' bias' if bias else ''}{' relu' if relu else ''}")
        return b.op("Conv", [x, weight((cout, cin // group, k, k)), weight((cout,)) if bias else b.none()],
                    {"kernel_shape": [k, k], "strides": [s, s], "pads": list(pads), "dilations": [d, d],
                     "group": group, "do_relu": relu}, next(names))

    x = b.input("x", (n, c, h, w))
    cur = (x, c, h, w)
    seen = [cur]
    outputs = []
    for _ in range(draw(st.integers(1, 8))):
        v, c, h, w = cur
        kind = draw(st.sampled_from(["conv", "conv", "conv", "maxpool", "avgpool", "relu", "sigmoid",
                                     "add", "concat", "se"]))
        if kind == "conv":
            k = draw(st.integers(1, 5))
            d = draw(st.integers(1, 2)) if k > 1 else 1
            s = draw(st.integers(1, 2))
            span = (k - 1) * d + 1
            pads = [draw(st.integers(0, k - 1)) for _ in range(4)]
            if h + pads[0] + pads[2] < span or w + pads[1] + pads[3] < span:
                k, d, pads = 1, 1, [0, 0, 0, 0]
                span = 1
            depthwise = c > 1 and draw(st.booleans())
            cout = c if depthwise else draw(st.integers(1, 20))
            v = conv(v, c, cout, k, s, d, pads, c if depthwise else 1, draw(st.booleans()), draw(st.booleans()))
            c, h, w = cout, (h + pads[0] + pads[2] - span) // s + 1, (w + pads[1] + pads[3] - span) // s + 1
        elif kind in ("maxpool", "avgpool"):
            k = draw(st.integers(1, 3))
            s = draw(st.integers(1, 2))
            pads = [draw(st.integers(0, k - 1)) for _ in range(4)]
            if h + pads[0] + pads[2] < k or w + pads[1] + pads[3] < k:
                k, pads = 1, [0, 0, 0, 0]
            ceil = draw(st.integers(0, 3)) == 0
            attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": pads, "ceil_mode": ceil}
            if kind == "avgpool":
                attrs["count_include_pad"] = draw(st.booleans())
            v = b.op("MaxPool" if kind == "maxpool" else "AvgPool", [v], attrs, next(names))
            layers.append(f"{kind} {attrs}")
            h, w = (v.type.get_shape()[2], v.type.get_shape()[3])
        elif kind in ("relu", "sigmoid"):
            v = b.op("Relu" if kind == "relu" else "Sigmoid", [v], {}, next(names))
            layers.append(kind)
        elif kind == "add":
            same = [t for t in seen if t[1:] == (c, h, w) and t[0] is not v]
            other = draw(st.sampled_from(same))[0] if same else conv(v, c, c, 3, 1, 1, (1, 1, 1, 1), relu=True)
            v = b.op("Add", [v, other], {"do_relu": draw(st.booleans())}, next(names))
            layers.append(f"add {value_name(other)}")
        elif kind == "concat":
            same = [t for t in seen if t[2:] == (h, w) and t[0] is not v]
            if same:
                other, c2 = draw(st.sampled_from(same))[:2]
            else:
                c2 = draw(st.integers(1, 8))
                other = conv(v, c, c2, 3, 1, 1, (1, 1, 1, 1))
            pair = [v, other] if draw(st.booleans()) else [other, v]
            v = b.op("Concat", pair, {"axis": 1}, next(names))
            layers.append(f"concat {[value_name(t) for t in pair]}")
            c = c + c2
        else:                                   # squeeze-excite: x * sigmoid(conv(mean(x)))
            gate = b.op("Sigmoid", [conv(b.op("GlobalAvgPool", [v], {}, next(names)), c, c)], {}, next(names))
            v = b.op("Mul", [v, gate], {}, next(names))
            layers.append("squeeze-excite")
        cur = (v, c, h, w)
        seen.append(cur)
        layers[-1] += f" -> {value_name(v)} {[c, h, w]}"
        if len(seen) > 2 and draw(st.integers(0, 5)) == 0:
            outputs.append(seen[-2][0])           # an inner tensor is an output too
    outputs.append(cur[0])
    if draw(st.booleans()):
        outputs.append(b.op("GlobalAvgPool", [cur[0]], {}, next(names)))
    outputs = list(dict.fromkeys(outputs))
    layers.append(f"outputs {[value_name(t) for t in outputs]}")
    feed = {"x": rng.normal(0, 1, size=x.type.get_shape()).astype(np.float32)}
    return Case(b.finish(outputs), feed, layers)


# ---------------------------------------------------------------- checks


def lowered(model, feed, chip, mode, asymmetric=False, table=None):
    if mode == "INT8" and table is None:
        table = quant.calibrate(model, [feed], "minmax", asymmetric=asymmetric)
    tpu_model, _ = lower(model, chip, mode, table if mode == "INT8" else None, asymmetric=asymmetric)
    return tpu_model


def duplicate_names(tpu_model) -> list:
    """Tensor names two results share (the backend keys tensors by name)."""
    names = Counter(value_name(r) for op in tpu_model.ops for r in op.results if hasattr(r.type, "get_shape"))
    return sorted(n for n, k in names.items() if k > 1)


# F32 modules only: their window ops are TOP's kernels on whole tensors, and a library orders a
# float32 sum by the shape of its call (oneDNN's and Eigen's blocking, and Eigen's split of a sum
# among threads, differ between a slice of rows and the whole tensor), so a sliced sum may round
# differently, by up to about twice its length times 2^-24 of the sum of its terms' magnitudes,
# and the difference travels through the layers after it. Held within 1e-5 of the output's
# largest magnitude: about 2^7 F32 units in the last place of that value.
# BF16, F16 and INT8 have no tolerance: they are compared bit for bit.
FLOAT_TOLERANCE = {"F32": 1e-5}


def compare(tpu_model, chip, feed, tolerance=None, program=None):
    """Compile (unless given the program) and simulate; compare with TPU inference, bit for bit
    unless given a `tolerance`. Returns the program."""
    program = program or generate(tpu_model, chip)
    want = TpuInterpreter(tpu_model).run(feed)
    got = Simulator(program).run(feed)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        if tolerance is None:
            diff = np.flatnonzero(got[name] != want[name])
            assert diff.size == 0, (f"{name}: {diff.size} of {want[name].size} values differ, first at "
                                    f"{np.unravel_index(diff[0], want[name].shape)}\n{program.groups}")
        else:
            scale = float(np.abs(want[name]).max(initial=0))
            np.testing.assert_allclose(got[name], want[name], rtol=tolerance, atol=tolerance * scale, err_msg=name)
    return program


def compile_and_compare(model, feed, chip, mode, asymmetric=False, exact=True, table=None):
    return compare(lowered(model, feed, chip, mode, asymmetric, table), chip, feed,
                   None if exact else FLOAT_TOLERANCE.get(mode))


def check_schedule(program):
    """Every command starts after its deps end, and engines run one command at a time in order."""
    slots = schedule(program.commands)
    free = {}
    for cmd, slot in zip(program.commands, slots):
        assert all(d < slot.index and slots[d].end <= slot.start for d in cmd["deps"]), slot
        assert free.get(slot.engine, 0) <= slot.start
        free[slot.engine] = slot.end


def check_races(program):
    """Every two commands that touch the same bytes of local memory or DDR, one of them writing,
    are ordered by the program's sync (deps, and each engine running its commands in order), and
    nothing reads local bytes no command wrote: the engines may run at any speed."""
    types = types_of(program.model)
    chip = program.chip
    engines = sorted({c["engine"] for c in program.commands})
    ddr_size = max([a + s for a, s in program.memory.addresses.values()] + [1])
    # bytes in blocks of the EU width: local offsets, DDR addresses and sizes are multiples of it
    g = chip.eu_bytes
    mem = {"local": -(-chip.local_mem_per_lane // g), "ddr": -(-ddr_size // g)}
    # per engine and block: the last command of that engine that wrote / read it (-1: none; the
    # host writes the inputs and the weights into DDR before everything)
    wrote = {(m, e): np.full(size, -1, np.int32) for m, size in mem.items() for e in engines}
    read = {(m, e): np.full(size, -1, np.int32) for m, size in mem.items() for e in engines}
    initialised = np.zeros(mem["local"], bool)
    clock: list = []                 # per command: engine -> its last command that happened before
    last_of = {}
    for i, cmd in enumerate(program.commands):
        e = cmd["engine"]
        vc = {}
        for j in [last_of.get(e)] + list(cmd["deps"]):
            if j is None:
                continue
            for k, v in clock[j].items():
                vc[k] = max(vc.get(k, -1), v)
            vc[program.commands[j]["engine"]] = max(vc.get(program.commands[j]["engine"], -1), j)
        clock.append(vc)
        last_of[e] = i

        def before(j, engine):
            return j < 0 or engine == e or vc.get(engine, -1) >= j

        lr, lw, dr, dw = accesses(program, types, i)
        touched = [("local", lr, False), ("local", lw, True), ("ddr", dr, False), ("ddr", dw, True)]
        for m, ranges, writes in touched:
            for a, z in ranges:
                assert 0 <= a <= z <= mem[m] * g, f"command {i} ({cmd['kind']}): {m} bytes {a}..{z} out of range"
                a, z = a // g, -(-z // g)
                if not writes and m == "local":
                    assert initialised[a:z].all(), f"command {i} ({cmd['kind']}) reads local bytes never written"
                for f in engines:
                    j = int(wrote[m, f][a:z].max(initial=-1))
                    assert before(j, f), f"command {i} ({cmd['kind']} on {e}) races command {j} writing {m} bytes"
                    if writes:
                        j = int(read[m, f][a:z].max(initial=-1))
                        assert before(j, f), (f"command {i} ({cmd['kind']} on {e}) overwrites {m} bytes that "
                                              f"command {j} reads")
        for m, ranges, writes in touched:
            for a, z in ranges:
                a, z = a // g, -(-z // g)
                (wrote if writes else read)[m, e][a:z] = i
                if writes and m == "local":
                    initialised[a:z] = True


def check_program(program):
    check_schedule(program)
    check_races(program)


# ---------------------------------------------------------------- the sweeps

RANDOM_CONFIGS = [("npu1", "INT8", False), ("npu1", "INT8", True), ("edge16", "INT8", False),
                  ("tiny512", "INT8", False), ("tiny1024", "INT8", True), ("tiny2048", "INT8", False),
                  ("tiny512", "F16", False), ("tiny1024", "F16", False), ("npu1_tiny1024", "BF16", False),
                  ("npu1_tiny1024", "F32", False)]


def chip_for(chip_dir, which):
    if which.startswith("npu1_tiny"):
        return chips.load(tiny_chip(chip_dir, int(which[len("npu1_tiny"):]), "npu1"))
    if which.startswith("tiny"):
        return chips.load(tiny_chip(chip_dir, int(which[len("tiny"):])))
    return chips.load(which)


def run_case(case, chip, mode, asymmetric):
    """One example of the sweep: compile, simulate, compare, check the program's sync."""
    tpu_model = lowered(case.model, case.feed, chip, mode, asymmetric)
    assert not duplicate_names(tpu_model)
    plan = plan_groups(tpu_model, chip)
    program = generate(tpu_model, chip, plan)
    check_program(compare(tpu_model, chip, case.feed, FLOAT_TOLERANCE.get(mode), program=program))


@pytest.mark.parametrize("which,mode,asymmetric", RANDOM_CONFIGS,
                         ids=[f"{c}-{m}{'-asym' if a else ''}" for c, m, a in RANDOM_CONFIGS])
def test_random_models_match_tpu_inference(chip_dir, which, mode, asymmetric):
    chip = chip_for(chip_dir, which)

    @SWEEP
    @given(random_models())
    def sweep(case):
        run_case(case, chip, mode, asymmetric)

    sweep()


@pytest.mark.parametrize("which,mode,asymmetric", RANDOM_CONFIGS,
                         ids=[f"{c}-{m}{'-asym' if a else ''}" for c, m, a in RANDOM_CONFIGS])
def test_zoo_matches_tpu_inference(chip_dir, which, mode, asymmetric):
    program = compile_and_compare(zoo(batch=2), zoo_feed(batch=2), chip_for(chip_dir, which), mode, asymmetric,
                                  exact=mode not in FLOAT_TOLERANCE)
    check_program(program)
    if "tiny" in which:
        assert any(g.h_slices > 1 for g in program.groups.local_groups)


# ---------------------------------------------------------------- float: equal by construction

_SLICED_FLOAT_OPS = ROW_OPS + IMAGE_OPS


def _rounding_by_shape(kernel):
    """`kernel` with its float32 results scaled by 1 + k * 2^-12, k from its input's shape: a
    stand-in for a library whose summation order follows the shape of the call (as oneDNN's
    blocking does on AVX2), coarse enough to move F16/BF16 results."""

    def run(operands, attrs):
        k = sum(operands[0].shape) % 7
        return [r * np.float32(1 + k * 2.0 ** -12) if r.dtype == np.float32 else r for r in kernel(operands, attrs)]

    return run


@pytest.mark.parametrize("which,mode", [("tiny512", "F16"), ("npu1_tiny1024", "BF16"), ("tiny1024", "INT8")])
def test_float_slices_are_bit_equal_whatever_order_the_library_sums_in(chip_dir, monkeypatch, which, mode):
    """With every sliced float kernel rounding by the shape of its call, the simulator still
    equals TPU inference bit for bit: each output row is the same call on both sides. Run on
    whole tensors instead (as before float_rows), the same kernels make the slices differ."""
    for name in _SLICED_FLOAT_OPS:
        monkeypatch.setitem(KERNELS, name, _rounding_by_shape(KERNELS[name]))
    chip = chip_for(chip_dir, which)
    tpu_model = lowered(zoo(batch=2), zoo_feed(batch=2), chip, mode)
    program = compare(tpu_model, chip, zoo_feed(batch=2))
    assert any(g.h_slices > 1 for g in program.groups.local_groups)
    if mode != "INT8":
        monkeypatch.setattr(float_kernels, "canonical", lambda name, kernel: kernel)
        with pytest.raises(AssertionError, match="values differ"):
            compare(tpu_model, chip, zoo_feed(batch=2), program=program)


def _elementwise_case(name: str, x: np.ndarray, rng) -> tuple[list, dict]:
    """Operands and attrs for the TOP kernel of one element-wise op on `x` (N, C, H, W)."""
    c = x.shape[1]

    def vec():
        return rng.uniform(0.5, 2, c).astype(np.float32)

    if name in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        return [x, rng.standard_normal(x.shape).astype(x.dtype)], {}
    if name == "PRelu":
        return [x, vec().reshape(1, c, 1, 1)], {}
    if name == "Scale":
        return [x, vec(), vec()], {}
    if name == "BatchNorm":
        return [x, vec(), vec(), vec(), vec()], {"epsilon": 1e-5}
    if name == "Concat":
        return [x, -x], {"axis": 1}
    if name in ("Log", "Sqrt"):
        return [np.abs(x)], {}
    if name == "Clip":
        return [x], {"min": -0.5, "max": 1.5}
    return [x], {}


@pytest.mark.parametrize("mode", ["F16", "BF16", "F32"])
def test_elementwise_float_kernels_give_an_element_the_same_value_in_any_slice(mode):
    """Element-wise ops run on slices of a tensor in the simulator (rows of H, images of N) and on
    the whole of it in TPU inference, by the same kernel: numpy's SIMD loops and TF's Erf must give
    each element the value it has in the whole tensor, wherever a vector's tail falls. Checked on
    the CPU at hand for every float element-wise op that layer groups take."""
    from tftpu.backend.layer_group import SLICING
    from tftpu.interp.tpu.info import OpInfo, TensorInfo
    from tftpu.interp.tpu.registry import OWN

    rng = np.random.default_rng(0)
    dtype = {"F16": "f16", "BF16": "bf16", "F32": "f32"}[mode]
    store = A.numpy_dtype(dtype)
    x = (rng.standard_normal((2, 5, 13, 7)) * 3).astype(np.float32).astype(store)
    names = [n.split(".")[1] for n, kind in SLICING.items()           # tpu.Cast / tpu.Lut: own kernels
             if kind == "elementwise" and n not in OWN and f"top.{n.split('.')[1]}" in KERNELS]
    assert {"Add", "Sigmoid", "Erf", "GELU", "Tanh", "Exp"} <= set(names)
    for name in names:
        operands, attrs = _elementwise_case(name, x, rng)
        operands = [o if o.ndim < 4 else o.astype(store) for o in operands]
        info = OpInfo(tuple(TensorInfo(dtype) for _ in operands), (TensorInfo(dtype),))
        kernel = float_kernels.float_kernel(f"top.{name}")
        whole = kernel(operands, attrs, info)[0]
        for n0, n1, h0, h1 in [(0, 2, 0, 13), (0, 1, 0, 13), (1, 2, 3, 4), (0, 2, 1, 12), (1, 2, 5, 13)] + \
                [(0, 2, h, h + k) for k in (1, 2, 5) for h in range(13 - k + 1)]:
            part = [o[n0:n1, :, h0:h1] if o.ndim == 4 and o.shape[0] > 1 else o for o in operands]
            got = kernel([np.ascontiguousarray(p) for p in part], attrs, info)[0]
            want = whole[n0:n1, :, h0:h1]
            assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (name, (n0, n1, h0, h1))


def test_duplicate_names_an_output_that_a_concat_requantizes():
    b = TopBuilder("dup")
    x = b.input("x", (1, 4, 8, 8))
    s = b.op("Sigmoid", [x], {}, "s")
    model = b.finish([s, b.op("Concat", [s, x], {"axis": 1}, "cat")])
    feed = {"x": np.random.default_rng(0).normal(size=(1, 4, 8, 8)).astype(np.float32)}
    tpu_model = lowered(model, feed, chips.load("npu1"), "INT8")
    assert not duplicate_names(tpu_model)
    check_program(compare(tpu_model, chips.load("npu1"), feed))


# ---------------------------------------------------------------- the checker checks


def _program(chip_dir, which="tiny512", mode="INT8"):
    model, feed = zoo(batch=2), zoo_feed(batch=2)
    table = quant.calibrate(model, [feed], "minmax")
    tpu_model, _ = lower(model, chip_for(chip_dir, which), mode, table if mode == "INT8" else None)
    return generate(tpu_model, chip_for(chip_dir, which)), feed


def _with(program, i, edit):
    commands = copy.deepcopy(program.commands)
    edit(commands[i])
    return dataclasses.replace(program, commands=commands)


@pytest.mark.parametrize("kind", ["compute", "store"])
def test_race_check_sees_a_missing_dep(chip_dir, kind):
    program, _ = _program(chip_dir)
    check_program(program)
    # a later slice's first compute (it waits for the slice's loads) or a store (it waits for the
    # compute that makes what it stores), with its deps dropped
    i = next(i for i, c in enumerate(program.commands) if c["kind"] == kind and c.get("slice", 0) > 0
             and any(program.commands[d]["engine"] != c["engine"] for d in c["deps"]))
    with pytest.raises(AssertionError, match="races"):
        check_races(_with(program, i, lambda c: c.update(deps=[])))


# ---------------------------------------------------------------- corrupt programs


def _first(program, kind):
    return next(i for i, c in enumerate(program.commands) if c["kind"] == kind)


@pytest.mark.parametrize("kind", ["load", "store", "compute"])
def test_misaligned_local_offset_is_an_error(chip_dir, kind):
    program, feed = _program(chip_dir)
    i = _first(program, kind)

    def bump(c):
        (c["result"] if kind == "compute" else c)["local"] += 1

    with pytest.raises(SimulatorError, match=rf"command {i} \(.*not aligned"):
        Simulator(_with(program, i, bump)).run(feed)


@pytest.mark.parametrize("kind", ["load", "store", "compute", "operand"])
def test_local_offset_past_the_lane_is_an_error(chip_dir, kind):
    program, feed = _program(chip_dir)
    bank = program.chip.local_mem_per_lane
    i = _first(program, "compute" if kind == "operand" else kind)

    def past(c):
        where = c["operands"][0] if kind == "operand" else c["result"] if kind == "compute" else c
        where["local"] = bank                          # aligned, but the data runs past the lane

    with pytest.raises(SimulatorError, match=rf"command {i} \(.*pass the end of a lane"):
        Simulator(_with(program, i, past)).run(feed)


def test_ddr_address_outside_ddr_is_an_error(chip_dir):
    program, feed = _program(chip_dir)
    i = _first(program, "load")
    with pytest.raises(SimulatorError, match=rf"command {i} \(.*outside DDR"):
        Simulator(_with(program, i, lambda c: c.update(ddr=program.ddr_bytes))).run(feed)


# ---------------------------------------------------------------- real models

REAL_MODELS = ["selfie", "onet", "MobileNetV2", "ResNet50"]
REAL_CONFIGS = [("npu1", "INT8"), ("npu1", "BF16"), ("edge16", "INT8"), ("edge16", "F16"), ("tiny2048", "INT8"),
                ("tiny4096", "F16")]
_REAL: dict = {}


def real_model(which):
    """(TOP model, feed, INT8 table), built once per session."""
    if which not in _REAL:
        from tftpu import frontend
        if which == "selfie":
            from tests import material
            model = frontend.load(material.get("selfie_segmentation.tflite"))
        elif which == "onet":
            from tests.models import mtcnn
            model = frontend.load(mtcnn.onet(weights=True))
        else:
            import keras
            net = {"MobileNetV2": lambda: keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3)),
                   "ResNet50": lambda: keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3))}[which]()
            model = frontend.load(frontend.to_onnx(net))
        shape = model.func.function_type.inputs.data[0].get_shape()
        feed = {model.input_names[0]: np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)}
        _REAL[which] = model, feed, quant.calibrate(model, [feed], "minmax")
    return _REAL[which]


@pytest.mark.slow
@pytest.mark.parametrize("which", REAL_MODELS)
@pytest.mark.parametrize("chip_name,mode", REAL_CONFIGS, ids=[f"{c}-{m}" for c, m in REAL_CONFIGS])
def test_real_models_match_tpu_inference_bit_for_bit(chip_dir, which, chip_name, mode):
    model, feed, table = real_model(which)
    chip = chip_for(chip_dir, chip_name)
    program = compile_and_compare(model, feed, chip, mode, table=table)
    check_program(program)
    mem = program.memory                 # the group-aware DDR plan against its lower bound
    assert mem.lower_bound <= mem.peak <= 1.10 * mem.lower_bound, str(mem)
    if chip_name.startswith("tiny"):
        assert any(g.h_slices > 1 for g in program.groups.local_groups)
