"""The native fused INT8 kernels (`tftpu.interp.tpu.native`, ctypes bindings of `int8_native.cc`)
are bit-exact against an independent integer reference written here with numpy int64 (Python
object ints where a sum may leave int64), following TFLite / gemmlowp's definitions:

- the accumulator `t` is the exact sum plus bias, saturated to int32;
- SaturatingRoundingDoublingHighMul(t, m): `ab = t * m`, nudge `2**30` (`1 - 2**30` where
  `ab < 0`), then C++'s truncating division by `2**31`;
- RoundingDivideByPOT(y, r): gemmlowp's mask-and-threshold form;
- `out = clip(result + zp, lo, hi)` in the output type.

Conv sums are recomputed from the padded input (padding holds `zx`, so it contributes zero).
Covers `Requantizer.requant` (int32 / int64 accumulators, per channel or one, NCHW or channels
last, bias, `exact32`), `Conv` (depthwise and the GEMM of ungrouped convs), `add`, the cases the
kernels decline, and `TFTPU_NATIVE=0`. Each kernel also runs split among the library's worker
threads (`native.PARALLEL_MIN` lowered) so that the split edges are checked on small tensors too.

The sweeps run the build the loader chooses (`TFTPU_ISA` forces one); `test_every_variant_*`
run the kernels under every instruction-set build this CPU can execute (`tftpu.utils.isa`:
VNNI on zmm or ymm, vpmaddwd on zmm or ymm, portable C++), each against the reference and
against each other, on the edges of each build's tiles and exactness arguments.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tftpu.interp.tpu import native, requant
from tftpu.utils import isa

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
EDGE_MULTS = [0, 1, 3, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, 3 << 29, INT32_MAX - 1, INT32_MAX]
EDGE_I32 = [INT32_MIN, INT32_MIN + 1, -(1 << 30) - 1, -(1 << 30), -3, -2, -1, 0, 1, 2, 3, 1 << 30,
            INT32_MAX - 1, INT32_MAX]
BEYOND = [INT32_MIN - 1, INT32_MAX + 1, -(1 << 40), 1 << 40, -(1 << 62), 1 << 62]
OUT_TYPES = [np.int8, np.uint8, np.int16]

SWEEP = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
VARIANTS = isa.supported()           # the instruction-set builds this CPU runs, best first


@pytest.fixture(params=VARIANTS)
def build(request):
    """Each build this CPU runs in turn, the one every entry point uses within the test."""
    with native.using(request.param) as lib:
        assert lib is not None and lib.tftpu_isa().decode() == request.param
        yield request.param


def need_library():
    assert native.library() is not None, \
        "the native INT8 kernels must build where the tests run (a C++ compiler; TFTPU_NATIVE not 0)"


def ungrouped_kind(c: int, o: int):
    """What `native.Conv` makes of an ungrouped conv: 1 -> 1 channel is also depthwise; else the
    GEMM, which every build has."""
    assert native.has_gemm()
    return "depthwise" if c == o == 1 else "gemm"


# ---------------------------------------------------------------- the integer reference

def srdhm(t, m):
    """gemmlowp's SaturatingRoundingDoublingHighMul for int32 `t` and 0 <= m < 2**31 (int64;
    no saturation case: m != INT32_MIN)."""
    ab = np.asarray(t, np.int64) * np.asarray(m, np.int64)
    total = ab + np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    return np.where(total >= 0, total // (1 << 31), -((-total) // (1 << 31)))     # C++ truncation


def rdbp(y, r):
    """gemmlowp's RoundingDivideByPOT, mask-and-threshold form (r in 0..31)."""
    y = np.asarray(y, np.int64)
    r = np.asarray(r, np.int64)
    mask = (np.int64(1) << r) - 1
    remainder = y & mask
    threshold = (mask >> 1) + (y < 0).astype(np.int64)
    return (y >> r) + (remainder > threshold).astype(np.int64)


def along(v, ndim: int, axis: int):
    """Per-channel values shaped to broadcast along `axis` (one value: a 0-d array)."""
    v = np.asarray(v, np.int64).reshape(-1)
    if v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def ref_requant(s, mult, rshift, axis, lo, hi, zp, dtype):
    """The exact sums `s` (any integers) saturated to int32, scaled, zero point, clamp."""
    s = np.asarray(s, object) if np.asarray(s).dtype == object else np.asarray(s, np.int64)
    t = np.clip(s, INT32_MIN, INT32_MAX).astype(np.int64)
    m = along(mult, t.ndim, axis)
    r = along(rshift, t.ndim, axis)
    m, r = np.broadcast_arrays(m, r)
    y = rdbp(srdhm(t, m), r)
    return np.clip(y + zp, lo, hi).astype(dtype)


def ref_conv_sums(x, w, bias, zx, strides, pads, dilations, group):
    """The exact int64 sums of a grouped conv of NCHW `x` (zero point `zx`, padded with `zx`)
    and OIHW `w`, plus `bias`."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dilations
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=zx) - zx
    xg = xp.reshape(n, group, cg, h + pt + pb, wd + pl + pr)
    wg = w.astype(np.int64).reshape(group, o // group, cg, kh, kw)
    acc = np.zeros((n, group, o // group, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xg[:, :, :, ky * dh: ky * dh + (oh - 1) * sh + 1: sh, kx * dw: kx * dw + (ow - 1) * sw + 1: sw]
            acc += np.einsum("ngchw,goc->ngohw", patch, wg[:, :, :, ky, kx])
    acc = acc.reshape(n, o, oh, ow)
    if bias is not None:
        acc += np.asarray(bias, np.int64).reshape(1, o, 1, 1)
    return acc


def ref_add(a, b, za, zb, ma, mb, r, lo, hi, zp, dtype):
    s = (a.astype(np.int64) - za) * ma + (b.astype(np.int64) - zb) * mb
    return np.clip(rdbp(s, r) + zp, lo, hi).astype(dtype)


def test_reference_matches_gemmlowp_by_hand():
    """The reference's rounding, on hand-worked values (ties up in the high multiply, ties away
    from zero in the shift)."""
    half = 1 << 30                                       # m = 2**30: t / 2
    assert srdhm([7, -7, 5, -5, 1, -1], half).tolist() == [4, -3, 3, -2, 1, 0]
    assert srdhm([INT32_MAX, INT32_MIN], INT32_MAX).tolist() == [INT32_MAX - 1, INT32_MIN + 1]
    assert rdbp([5, -5, 6, -6, 7, -7, 4, -4], 1).tolist() == [3, -3, 3, -3, 4, -4, 2, -2]
    assert rdbp([6, -6, 5, -5, 10, -10], 2).tolist() == [2, -2, 1, -1, 3, -3]
    assert rdbp([INT32_MAX, INT32_MIN, 1 << 30, -(1 << 30)], 31).tolist() == [1, -1, 1, -1]
    assert rdbp([(1 << 30) - 1, -(1 << 30) + 1], 31).tolist() == [0, 0]


# ---------------------------------------------------------------- helpers

@contextlib.contextmanager
def threaded():
    """Every kernel call shared among the library's worker threads, however small it is
    (`native.PARALLEL_MIN` lowered; as many parts as the pool has threads)."""
    old = native.PARALLEL_MIN
    native.PARALLEL_MIN = 1
    try:
        yield
    finally:
        native.PARALLEL_MIN = old


def both(call):
    """`call()` on one thread and split among threads; both results, asserted equal."""
    whole = call()
    with threaded():
        split = call()
    assert whole is not None and split is not None
    np.testing.assert_array_equal(whole, split)
    return whole


def check_equal(got, want, what):
    assert got.dtype == want.dtype, what
    assert got.shape == want.shape, what
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)
        i = tuple(bad[0])
        raise AssertionError(f"{what}: {len(bad)} of {got.size} differ; first at {i}: got {got[i]}, want {want[i]}")


def rand_mults(rng, size, low=0):
    """Multipliers: a fifth the edge values, the rest in [2**30, 2**31) (QuantizeMultiplier's
    range) or anywhere in [low, 2**31)."""
    u = rng.random(size)
    edge = rng.choice(np.array(EDGE_MULTS, np.int64), size)
    usual = rng.integers(1 << 30, 1 << 31, size)
    anywhere = rng.integers(low, 1 << 31, size)
    return np.where(u < 0.2, edge, np.where(u < 0.7, usual, anywhere)).tolist()


def rand_rshifts(rng, size, top=31):
    """Right shifts: 0 and `top` a fifth of the time each, else uniform in 0..top."""
    u = rng.random(size)
    return np.where(u < 0.2, 0, np.where(u < 0.4, top, rng.integers(0, top + 1, size))).tolist()


def draw_clamp(draw, rng, dtype):
    """(lo, hi, zp) in the range of `dtype`: the full range, a fused ReLU (lo = zp), a ReLU6-like
    upper bound, or any sub-range."""
    info = np.iinfo(dtype)
    zp = draw(st.sampled_from([0, int(info.min), int(info.max), "random", "random"]))
    zp = int(rng.integers(int(info.min), int(info.max) + 1)) if zp == "random" else zp
    mode = draw(st.sampled_from(["full", "relu", "relu6", "range"]))
    if mode == "full":
        return int(info.min), int(info.max), zp
    if mode == "relu":
        return zp, int(info.max), zp
    if mode == "relu6":
        return zp, min(int(info.max), zp + int(rng.integers(0, 256))), zp
    lo, hi = sorted(rng.integers(int(info.min), int(info.max) + 1, 2).tolist())
    return lo, hi, zp


# ---------------------------------------------------------------- Requantizer.requant

def target_sums(rng, shape, axis, mult, rshift, span: int, wide: bool, extremes: bool):
    """Exact sums (Python ints) per element: near an output of its channel within +-`span`, of a
    random magnitude, or an extreme (beyond int32 where `wide`, the int64 extremes where also
    `extremes`)."""
    ch = np.indices(shape)[axis].reshape(-1) if len(shape) else np.zeros(1, int)
    ms = np.broadcast_to(np.asarray(mult, np.int64).reshape(-1), (shape[axis],)).tolist()
    rs = np.broadcast_to(np.asarray(rshift, np.int64).reshape(-1), (shape[axis],)).tolist()
    pool = EDGE_I32 + (BEYOND if wide else []) + ([INT64_MIN, INT64_MIN + 1, INT64_MAX] if extremes else [])
    out = []
    for c in ch.tolist():
        kind = rng.integers(0, 10)
        m, r = ms[c], rs[c]
        if kind < 5 and m > 0:
            v = int(rng.integers(-span, span + 1))
            t = (v << (31 + r)) // m + int(rng.integers(-4, 5))
            out.append(min(max(t, -(1 << 62)), 1 << 62))
        elif kind < 7:
            e = int(rng.integers(0, 62 if wide else 32))
            out.append(int(rng.integers(-(1 << e), (1 << e) + 1)))
        else:
            out.append(int(pool[rng.integers(0, len(pool))]))
    return out


@settings(SWEEP, max_examples=250)
@given(st.data())
def test_requant(data):
    need_library()
    check_requant_drawn(data.draw)


def check_requant_drawn(draw):
    """One drawn requantization (layout, accumulator type, scheme, clamp, bias, exact32) against
    the reference."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layout = draw(st.sampled_from(["nchw", "last"]))
    c = draw(st.integers(1, 9))
    if layout == "nchw":
        shape = (draw(st.integers(1, 2)), c, draw(st.integers(1, 6)), draw(st.integers(1, 8)))
        axis = draw(st.sampled_from([1, -3]))
    else:
        lead = draw(st.lists(st.integers(1, 6), min_size=0, max_size=3))
        shape = (*lead, c)
        axis = draw(st.sampled_from([len(shape) - 1, -1]))
    ax = axis % len(shape)
    acc_type = draw(st.sampled_from([np.int32, np.int64]))
    dtype = draw(st.sampled_from(OUT_TYPES))
    lo, hi, zp = draw_clamp(draw, rng, dtype)
    scheme = draw(st.sampled_from(["per_channel", "per_tensor", "mult_per_channel"]))
    if scheme == "per_channel":
        mult, rshift = rand_mults(rng, c), rand_rshifts(rng, c)
    elif scheme == "mult_per_channel":               # one rshift for every channel
        mult, rshift = rand_mults(rng, c), rand_rshifts(rng, 1)[0]
    else:
        mult, rshift = rand_mults(rng, 1)[0], rand_rshifts(rng, 1)[0]
    bias_kind = draw(st.sampled_from([None, "small", "large"]))
    exact32 = acc_type == np.int32 and draw(st.booleans())

    if bias_kind is None:
        bias = None
    elif bias_kind == "small":
        bias = rng.integers(-1000, 1001, c).astype(np.int32)
    else:
        bias = rng.choice(np.array([INT32_MIN, INT32_MIN + 1, INT32_MAX, INT32_MAX - 1, -(1 << 30), 1 << 30, 0],
                                   np.int64), c).astype(np.int32)
    b = [0] * c if bias is None else bias.tolist()
    chans = np.indices(shape)[ax].reshape(-1).tolist()
    wide = acc_type == np.int64
    span = 300 if np.dtype(dtype).itemsize == 1 else 40000
    sums = target_sums(rng, shape, ax, mult, rshift, span, wide, extremes=wide and bias is None)
    acc = []
    for s, ch in zip(sums, chans):
        if exact32:                                  # every acc and acc + bias in int32
            s = min(max(s, INT32_MIN, INT32_MIN + b[ch]), INT32_MAX, INT32_MAX + b[ch])
        a = s - b[ch]
        acc.append(min(max(a, INT32_MIN), INT32_MAX) if acc_type == np.int32 else a)
    acc = np.array(acc, acc_type).reshape(shape)
    exact = np.asarray(acc.reshape(-1).tolist(), object).reshape(shape)
    if bias is not None:
        exact = exact + along(bias.tolist(), len(shape), ax).astype(object)
    if exact32:
        assert exact.size == 0 or (exact.min() >= INT32_MIN and exact.max() <= INT32_MAX)
    want = ref_requant(exact, mult, rshift, ax, lo, hi, zp, dtype)

    rq = native.Requantizer(mult, rshift, lo, hi, zp, dtype)
    before = acc.copy()
    got = both(lambda: rq.requant(acc, axis, bias=bias, exact32=exact32))
    check_equal(got, want, f"requant shape={shape} axis={axis} acc={acc_type.__name__} out={np.dtype(dtype)} "
                           f"lo={lo} hi={hi} zp={zp} mult={mult} rshift={rshift} bias={bias_kind} exact32={exact32}")
    np.testing.assert_array_equal(acc, before)                       # the input is not written to


@pytest.mark.parametrize("dtype", OUT_TYPES)
@pytest.mark.parametrize("clamp", ["full", "relu", "relu6"])
def test_requant_extremes(dtype, clamp, build):
    """Every edge multiplier with right shifts 0, 1, 30, 31 (one per channel, channels last and
    NCHW), on the int32 extremes and ties, int32 and int64 accumulators (int64 also beyond
    int32 and at the int64 extremes), with and without `exact32` and bias."""
    need_library()
    info = np.iinfo(dtype)
    zp = {"full": 0, "relu": int(info.min) + 3, "relu6": 0}[clamp]
    lo = int(info.min) if clamp == "full" else zp
    hi = int(info.max) if clamp != "relu6" else zp + 6
    pairs = [(m, r) for m in EDGE_MULTS for r in (0, 1, 30, 31)]
    mult = [m for m, _ in pairs]
    rshift = [r for _, r in pairs]
    c = len(pairs)
    ties = [(1 << 30) + 1, -(1 << 30) - 1, 3 << 29, -(3 << 29), 5, -5, 7, -7]
    rows32 = np.array(EDGE_I32 + ties, np.int64)
    rows64 = np.array(EDGE_I32 + ties + BEYOND + [INT64_MIN, INT64_MIN + 1, INT64_MAX], object)
    for rows, acc_type in ((rows32, np.int32), (rows64, np.int64)):
        exact = np.repeat(np.asarray(rows, object)[:, None], c, axis=1)                  # (rows, C)
        acc_last = np.array(exact.tolist(), acc_type)
        want_last = ref_requant(exact, mult, rshift, 1, lo, hi, zp, dtype)
        rq = native.Requantizer(mult, rshift, lo, hi, zp, dtype)
        for exact32 in ((False, True) if acc_type == np.int32 else (False,)):
            check_equal(both(lambda: rq.requant(acc_last, -1, exact32=exact32)), want_last, f"last {acc_type}")
            acc_nchw = np.ascontiguousarray(acc_last.T.reshape(1, c, len(rows), 1))
            check_equal(both(lambda: rq.requant(acc_nchw, 1, exact32=exact32)),
                        np.ascontiguousarray(want_last.T.reshape(1, c, len(rows), 1)), f"nchw {acc_type}")
        # one (multiplier, rshift) for the whole tensor, each pair in turn
        for m, r in pairs[::3]:
            rq1 = native.Requantizer(m, r, lo, hi, zp, dtype)
            want = ref_requant(exact, m, r, 1, lo, hi, zp, dtype)
            for exact32 in ((False, True) if acc_type == np.int32 else (False,)):
                check_equal(both(lambda: rq1.requant(acc_last, 1, exact32=exact32)), want, f"tensor m={m} r={r}")
    # saturation by the bias: int32 accumulators at the extremes plus the extreme biases
    bias = np.array([INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN] * (c // 4) + [0] * (c % 4), np.int32)
    acc = np.array([[INT32_MAX] * c, [INT32_MIN] * c, [1] * c, [-1] * c], np.int32)
    exact = np.asarray(acc.tolist(), object) + np.asarray(bias.tolist(), object)[None, :]
    rq = native.Requantizer(mult, rshift, lo, hi, zp, dtype)
    check_equal(both(lambda: rq.requant(acc, 1, bias=bias)), ref_requant(exact, mult, rshift, 1, lo, hi, zp, dtype),
                "bias saturation")


def test_requant_large_threaded(build):
    """A tensor above the real threading threshold (the threads as they run in production), NCHW
    int32 with exact32 and a ReLU clamp, and channels-last int64."""
    need_library()
    rng = np.random.default_rng(7)
    c = 32
    mult = rng.integers(1 << 29, 1 << 31, c)
    rshift = rng.integers(0, 12, c)
    acc = rng.integers(-(1 << 20), 1 << 20, (1, c, 128, 130)).astype(np.int32)     # 532480 elements
    bias = rng.integers(-(1 << 20), 1 << 20, c).astype(np.int32)
    assert acc.size >= native.PARALLEL_MIN
    exact = acc.astype(np.int64) + bias.reshape(1, c, 1, 1)
    for lo, hi, zp, dtype in ((-128, 127, -5, np.int8), (3, 255, 3, np.uint8)):
        rq = native.Requantizer(mult, rshift, lo, hi, zp, dtype)
        want = ref_requant(exact, mult, rshift, 1, lo, hi, zp, dtype)
        check_equal(rq.requant(acc, 1, bias=bias, exact32=True), want, "large nchw exact32")
        check_equal(rq.requant(acc, 1, bias=bias), want, "large nchw")
    last = np.ascontiguousarray(np.moveaxis(acc, 1, -1)).astype(np.int64) * 4096
    rq = native.Requantizer(mult, rshift, -32768, 32767, 0, np.int16)
    want = ref_requant(last + bias, mult, rshift, -1, -32768, 32767, 0, np.int16)
    check_equal(rq.requant(last, -1, bias=bias), want, "large channels-last int64")


# ---------------------------------------------------------------- Conv

def draw_requant_for(draw, rng, sums, o):
    """A Requantizer for conv sums `sums` (N, O, ...): per channel or one, multipliers in
    [2**29, 2**31) or edge values, rshift 0..20 (often fitted so that outputs are not all
    clamped), INT8/UINT8 output over its range or a ReLU clamp."""
    per_channel = draw(st.booleans())
    k = o if per_channel else 1
    u = rng.random(k)
    mult = np.where(u < 0.1, rng.choice(np.array([0, 1, 1 << 30, INT32_MAX]), k),
                    rng.integers(1 << 29, 1 << 31, k)).tolist()
    if rng.random() < 0.75:                              # fitted to the (channel's) typical sum
        mags = np.abs(np.moveaxis(sums, 1, 0).reshape(o, -1)) if per_channel else np.abs(sums).reshape(1, -1)
        rshift = [min(20, max(0, int(np.percentile(row, 75)).bit_length() - 6 + int(rng.integers(-2, 3))))
                  for row in mags]
    else:
        rshift = rng.integers(0, 21, k).tolist()
    dtype = draw(st.sampled_from([np.int8, np.uint8]))
    info = np.iinfo(dtype)
    zp = int(rng.integers(int(info.min), int(info.max) + 1))
    mode = draw(st.sampled_from(["full", "relu", "relu6"]))
    lo = int(info.min) if mode == "full" else zp
    hi = min(int(info.max), zp + int(rng.integers(1, 60))) if mode == "relu6" else int(info.max)
    return native.Requantizer(mult, rshift, lo, hi, zp, dtype), (mult, rshift, lo, hi, zp, dtype)


def draw_bias(draw, rng, o):
    kind = draw(st.sampled_from([None, "random", "large"]))
    if kind is None:
        return None, kind
    if kind == "random":
        return rng.integers(-(1 << 20), 1 << 20, o).astype(np.int32), kind
    big = np.array([INT32_MAX, INT32_MIN + 1, INT32_MAX - 1000, -(1 << 31) + 5, 1 << 30, 0], np.int64)
    return rng.choice(big, o).astype(np.int32), kind


def draw_input(draw, rng, shape):
    """Data over its type's range, or (a third of the draws) over 128 values [base, base + 127]
    with the zero point mostly at base (a ReLU's output: the GEMM's narrow kernel takes it where
    the build has one, NARROW_BUILDS)."""
    xtype = draw(st.sampled_from([np.int8, np.uint8]))
    info = np.iinfo(xtype)
    lo, hi = int(info.min), int(info.max)
    zx = draw(st.one_of(st.sampled_from([lo, hi, 0]), st.integers(lo, hi)))
    if draw(st.sampled_from(["full", "full", "narrow"])) == "narrow":
        lo = draw(st.sampled_from([0, int(info.min), int(info.max) - 127, "any"]))
        lo = int(rng.integers(int(info.min), int(info.max) - 126)) if lo == "any" else lo
        hi = lo + 127
        zx = lo if draw(st.integers(0, 3)) else zx
    x = rng.integers(lo, hi + 1, shape).astype(xtype)
    if draw(st.booleans()):                              # some extreme planes
        x.reshape(-1)[: x.size // 3] = lo if draw(st.booleans()) else hi
    return x, zx


def check_conv(conv, x, w, bias, zx, attrs, rq_params, what):
    mult, rshift, lo, hi, zp, dtype = rq_params
    sums = ref_conv_sums(x, w, bias, zx, attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"])
    want = ref_requant(sums, mult, rshift, 1, lo, hi, zp, dtype)
    if conv.kind is None:                 # declined: the caller's numpy path runs instead
        assert conv(x) is None
        return
    got = both(lambda: conv(x))
    check_equal(got, want, f"{what} x={x.shape} {x.dtype} zx={zx} w={w.shape} attrs={attrs} bias="
                           f"{None if bias is None else bias.tolist()} mult={mult} rshift={rshift} lo={lo} hi={hi} "
                           f"zp={zp} out={np.dtype(dtype)}")


@settings(SWEEP, max_examples=200)
@given(st.data())
def test_depthwise(data):
    need_library()
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 20))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    # at least one output row and column
    h = max(draw(st.integers(1, 12)), dilations[0] * (kh - 1) + 1 - pads[0] - pads[2])
    wd = max(draw(st.integers(1, 12)), dilations[1] * (kw - 1) + 1 - pads[1] - pads[3])
    # a 16-bit link (zero point 0), whose two INT8 passes the kernel sums as one
    link = draw(st.sampled_from([False, False, True]))
    if link:
        x, zx = rng.integers(-32768, 32768, (n, c, h, wd)).astype(np.int16), 0
        if draw(st.booleans()):
            x.reshape(-1)[: x.size // 3] = draw(st.sampled_from([-32768, 32767]))
    else:
        x, zx = draw_input(draw, rng, (n, c, h, wd))
    w = rng.integers(-128, 128, (c, 1, kh, kw)).astype(np.int8)
    if draw(st.booleans()):
        w.reshape(-1)[rng.integers(0, w.size, max(1, w.size // 4))] = draw(st.sampled_from([-128, 127, 0]))
    bias, _ = draw_bias(draw, rng, c)
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": c}
    sums = ref_conv_sums(x, w, bias, zx, strides, pads, dilations, c)
    rq, params = draw_requant_for(draw, rng, sums, c)
    conv = native.Conv(rq, w, bias, zx, attrs, link=link)
    assert conv.kind == "depthwise"
    check_conv(conv, x, w, bias, zx, attrs, params, "depthwise link" if link else "depthwise")
    if link:        # a depthwise link's zero point is 0: another one, or 8-bit data given to it, is
        # declined (one channel is an ungrouped conv as well: the GEMM takes any zero point)
        assert native.Conv(rq, w, bias, 5, attrs, link=True).kind == (None if c > 1 else "gemm")
        assert native.Conv(rq, w, bias, 0, attrs)(x) is None


def test_depthwise_explicit(build):
    """Padding wider than the kernel reach (outputs of bias alone), a single pixel, 5x5 dilated
    stride 3, a large bias (exact32 off, saturation), the conv reused on a second input shape,
    and one tensor above the real threading threshold (threads as in production)."""
    need_library()
    rng = np.random.default_rng(3)
    cases = [
        # (n, c, h, w, kh, kw, strides, pads, dilations, xtype, zx, bias)
        (1, 3, 1, 1, 1, 1, [1, 1], [3, 3, 3, 3], [1, 1], np.int8, -128, "random"),
        (2, 5, 1, 1, 3, 3, [1, 1], [1, 1, 1, 1], [1, 1], np.uint8, 255, None),
        (1, 4, 12, 11, 5, 5, [3, 3], [0, 3, 2, 1], [2, 2], np.uint8, 0, "large"),
        (2, 16, 9, 7, 3, 3, [2, 1], [1, 0, 1, 0], [1, 2], np.int8, 127, "large"),
        (1, 20, 12, 12, 1, 5, [1, 3], [0, 2, 0, 2], [1, 1], np.int8, 0, "random"),
    ]
    for n, c, h, wd, kh, kw, strides, pads, dilations, xtype, zx, bias_kind in cases:
        info = np.iinfo(xtype)
        x = rng.integers(int(info.min), int(info.max) + 1, (n, c, h, wd)).astype(xtype)
        w = rng.integers(-128, 128, (c, 1, kh, kw)).astype(np.int8)
        w[0] = -128
        bias = None if bias_kind is None else (
            rng.integers(-1000, 1000, c) if bias_kind == "random" else
            np.where(np.arange(c) % 2, INT32_MAX, INT32_MIN + 1)).astype(np.int32)
        mult = rng.integers(1 << 29, 1 << 31, c).tolist()
        rshift = rng.integers(4, 14, c).tolist()
        params = (mult, rshift, -128, 127, -3, np.int8)
        conv = native.Conv(native.Requantizer(*params), w, bias, zx, {"strides": strides, "pads": pads,
                                                                      "dilations": dilations, "group": c})
        assert conv.kind == "depthwise"
        assert conv.exact32 == (bias_kind != "large")
        attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": c}
        check_conv(conv, x, w, bias, zx, attrs, params, "depthwise explicit")
        x2 = rng.integers(int(info.min), int(info.max) + 1, (n, c, h + 2, wd + 1)).astype(xtype)
        check_conv(conv, x2, w, bias, zx, attrs, params, "depthwise reused")
        check_conv(conv, x, w, bias, zx, attrs, params, "depthwise reused back")
    # above the real threshold: 32 channels of 64x64 outputs, 3x3 taps
    c = 32
    x = rng.integers(0, 256, (1, c, 64, 64)).astype(np.uint8)
    w = rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8)
    bias = rng.integers(-5000, 5000, c).astype(np.int32)
    params = (rng.integers(1 << 29, 1 << 31, c).tolist(), rng.integers(8, 14, c).tolist(), 0, 255, 0, np.uint8)
    attrs = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": c}
    conv = native.Conv(native.Requantizer(*params), w, bias, 17, attrs)
    assert 64 * 64 * c * 9 >= native.PARALLEL_MIN
    sums = ref_conv_sums(x, w, bias, 17, [1, 1], [1, 1, 1, 1], [1, 1], c)
    check_equal(conv(x), ref_requant(sums, *params[:2], 1, *params[2:]), "depthwise large threaded")


@settings(SWEEP, max_examples=120)
@given(st.data())
def test_pointwise(data):
    need_library()
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 2))
    c = draw(st.one_of(st.sampled_from([1, 3, 4, 5, 8, 64, 70]), st.integers(1, 70)))
    o = draw(st.one_of(st.sampled_from([1, 7, 8, 9, 16, 40]), st.integers(1, 40)))
    h, wd = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    strides = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    x, zx = draw_input(draw, rng, (n, c, h, wd))
    w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
    if draw(st.booleans()):
        w.reshape(-1)[rng.integers(0, w.size, max(1, w.size // 4))] = draw(st.sampled_from([-128, 127]))
    bias, _ = draw_bias(draw, rng, o)
    attrs = {"strides": strides, "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
    sums = ref_conv_sums(x, w, bias, zx, strides, attrs["pads"], attrs["dilations"], 1)
    rq, params = draw_requant_for(draw, rng, sums, o)
    conv = native.Conv(rq, w, bias, zx, attrs)
    assert conv.kind == ungrouped_kind(c, o)      # 1 -> 1 channel: both
    check_conv(conv, x, w, bias, zx, attrs, params, "pointwise")


@settings(SWEEP, max_examples=120)
@given(st.data())
def test_gemm_kxk(data):
    """Ungrouped KxK convs through the im2col GEMM: any kernel, stride, padding (which adds the
    zero point) and dilation."""
    need_library()
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, c, o = draw(st.integers(1, 2)), draw(st.integers(1, 12)), draw(st.integers(1, 20))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    h, wd = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": 1}
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    assume(oh > 0 and ow > 0)
    x, zx = draw_input(draw, rng, (n, c, h, wd))
    w = rng.integers(-128, 128, (o, c, kh, kw)).astype(np.int8)
    bias, _ = draw_bias(draw, rng, o)
    sums = ref_conv_sums(x, w, bias, zx, strides, pads, dilations, 1)
    rq, params = draw_requant_for(draw, rng, sums, o)
    conv = native.Conv(rq, w, bias, zx, attrs)
    assert conv.kind == ungrouped_kind(c, o)
    check_conv(conv, x, w, bias, zx, attrs, params, "gemm kxk")


@settings(SWEEP, max_examples=120)
@given(st.data())
def test_gemm_link(data):
    """Ungrouped convs of a 16-bit link (INT16 data, any zero point; 1x1 and KxK, strided, padded,
    dilated) as the chip runs them, two INT8 passes over the high and low bytes summed in int64:
    equal to the exact sums requantized, the passes taking the narrow kernel or not."""
    need_library()
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, c, o = draw(st.integers(1, 2)), draw(st.integers(1, 40)), draw(st.integers(1, 20))
    k = draw(st.sampled_from([1, 1, 2, 3, 5]))
    kh, kw = k, draw(st.sampled_from([k, 1]))
    strides = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = [draw(st.integers(0, 2)) for _ in range(4)] if k > 1 or draw(st.booleans()) else [0, 0, 0, 0]
    dilations = [draw(st.integers(1, 2)), 1]
    h, wd = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": 1}
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    assume(oh > 0 and ow > 0)
    span = draw(st.sampled_from(["full", "small", "positive"]))      # small: the high bytes span few values
    lo, hi = {"full": (-32768, 32767), "small": (-700, 700), "positive": (0, 20000)}[span]
    x = rng.integers(lo, hi + 1, (n, c, h, wd)).astype(np.int16)
    if draw(st.booleans()):
        x.reshape(-1)[: x.size // 3] = draw(st.sampled_from([lo, hi, -32768, 32767]))
    zx = draw(st.one_of(st.just(0), st.sampled_from([-32768, 32767, -1, 255, 256]), st.integers(-32768, 32767)))
    w = rng.integers(-128, 128, (o, c, kh, kw)).astype(np.int8)
    bias, _ = draw_bias(draw, rng, o)
    sums = ref_conv_sums(x, w, bias, zx, strides, pads, dilations, 1)
    rq, params = draw_requant_for(draw, rng, sums, o)
    conv = native.Conv(rq, w, bias, zx, attrs, link=True)
    assert conv.kind == ungrouped_kind(c, o) or (c == o == 1 and zx)
    if conv.kind == "gemm":
        check_conv(conv, x, w, bias, zx, attrs, params, "gemm link")
        assert conv(x.astype(np.int8)) is None          # 8-bit data given to a link's conv: declined


def test_pointwise_explicit(build):
    """Pixel counts around the 32-pixel tile and the 64-pixel split (1, 31, 32, 33, 63, 64, 65,
    97, 400), channel counts around the 4-channel groups and 8-channel blocks, all-extreme
    inputs and weights, int8 and uint8 data through one conv, a large bias, and one GEMM
    above the real threading threshold."""
    need_library()
    rng = np.random.default_rng(11)
    shapes = [(1, 1), (1, 31), (4, 8), (3, 11), (7, 9), (8, 8), (5, 13), (1, 97), (20, 20)]
    for i, (h, wd) in enumerate(shapes):
        c, o = [1, 3, 4, 5, 17, 64, 70, 2, 33][i], [1, 7, 8, 9, 40, 16, 3, 25, 8][i]
        w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
        if i % 3 == 0:
            w[:] = -128
        bias = (np.full(o, INT32_MAX if i % 2 else INT32_MIN + 1) if i % 4 == 1 else
                rng.integers(-(1 << 16), 1 << 16, o)).astype(np.int32)
        mult = rng.integers(1 << 29, 1 << 31, o).tolist()
        mult[0] = INT32_MAX
        params = (mult, rng.integers(6, 16, o).tolist(), -128, 127, 5, np.int8)
        zx = 100
        attrs = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
        conv = native.Conv(native.Requantizer(*params), w, bias, zx, attrs)
        assert conv.kind == ungrouped_kind(c, o)
        assert conv.exact32 == (i % 4 != 1)
        for xtype in (np.uint8, np.int8, np.uint8):          # the flip switches per call
            info = np.iinfo(xtype)
            x = rng.integers(int(info.min), int(info.max) + 1, (2, c, h, wd)).astype(xtype)
            if i % 3 == 1:
                x[:] = info.min if xtype == np.int8 else info.max
            check_conv(conv, x, w, bias, zx, attrs, params, "pointwise explicit")
    # above the real threshold: 64 x 64 GEMM over 32 x 33 pixels, threads split the pixels
    c = o = 64
    x = rng.integers(-128, 128, (1, c, 32, 33)).astype(np.int8)
    w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
    bias = rng.integers(-(1 << 16), 1 << 16, o).astype(np.int32)
    params = (rng.integers(1 << 29, 1 << 31, o).tolist(), rng.integers(10, 16, o).tolist(), 0, 255, 0, np.uint8)
    attrs = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
    conv = native.Conv(native.Requantizer(*params), w, bias, -7, attrs)
    assert o * 32 * 33 * c // 8 >= native.PARALLEL_MIN
    check_conv(conv, x, w, bias, -7, attrs, params, "pointwise large threaded")


def test_conv_declines():
    """kind None (and conv(x) None) for what neither kernel takes; None for inputs it was not
    built for."""
    need_library()
    rng = np.random.default_rng(5)
    rq = native.Requantizer(1 << 30, 8, -128, 127, 0, np.int8)
    x = rng.integers(-128, 128, (1, 4, 6, 6)).astype(np.int8)
    base = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1}
    w33 = rng.integers(-128, 128, (5, 4, 3, 3)).astype(np.int8)
    w11 = rng.integers(-128, 128, (5, 4, 1, 1)).astype(np.int8)
    assert native.Conv(rq, w33, None, 0, base).kind == ungrouped_kind(4, 5)      # ungrouped: the GEMM
    assert native.Conv(rq, w11, None, 0, base).kind == ungrouped_kind(4, 5)
    huge = np.ones((5, 70000, 1, 1), np.int8)                               # int32 sums could overflow
    conv = native.Conv(rq, huge, None, 0, dict(base, pads=[0] * 4))
    assert conv.kind is None and conv(np.zeros((1, 70000, 1, 1), np.int8)) is None
    wmul = rng.integers(-128, 128, (8, 1, 3, 3)).astype(np.int8)          # depth multiplier 2
    assert native.Conv(rq, wmul, None, 0, dict(base, group=4)).kind is None
    wg = rng.integers(-128, 128, (4, 2, 3, 3)).astype(np.int8)            # grouped, not depthwise
    assert native.Conv(rq, wg, None, 0, dict(base, group=2)).kind is None
    assert native.Conv(rq, w11.astype(np.int16), None, 0, dict(base, pads=[0] * 4)).kind is None
    assert native.Conv(native.Requantizer([1 << 30] * 3, 8, -128, 127, 0, np.int8), w11, None, 0,
                       dict(base, pads=[0] * 4)).kind is None              # 3 multipliers for 5 channels
    wd = rng.integers(-128, 128, (4, 1, 3, 3)).astype(np.int8)
    dw = native.Conv(rq, wd, None, 0, dict(base, group=4))
    assert dw.kind == "depthwise"
    assert dw(x.astype(np.int16)) is None                                  # input type
    assert dw(x[:, :3]) is None                                            # channel count
    assert dw(x[0]) is None                                                # not 4-D
    too_small = native.Conv(rq, wd, None, 0, dict(base, pads=[0] * 4))
    assert too_small(x[:, :, :2, :2]) is None                              # no output pixel
    # Requantizer.requant declines
    acc = rng.integers(-1000, 1000, (1, 4, 3, 3)).astype(np.int32)
    per_channel = native.Requantizer([1 << 30] * 4, [3] * 4, -128, 127, 0, np.int8)
    assert per_channel.requant(acc.astype(np.int16), 1) is None           # accumulator type
    assert per_channel.requant(acc, 2) is None                            # 4 multipliers, 3 channels
    assert per_channel.requant(acc, 1, bias=np.zeros(3, np.int32)) is None
    assert per_channel.requant(acc, 1, bias=np.array([0, 0, 0, 1 << 31])) is None
    assert per_channel.requant(acc, 1, bias=np.zeros(4, np.float32)) is None
    assert native.Requantizer(1 << 30, 3, 0, 1, 0, np.float32).requant(acc, 1) is None
    assert native.add(x, x.astype(np.int32), 0, 0, 1, 1, 0, -128, 127, 0, np.int8) is None
    assert native.add(x, x, 0, 0, 1 << 31, 1, 0, -128, 127, 0, np.int8) is None
    assert native.add(x, x[:, :2], 0, 0, 1, 1, 0, -128, 127, 0, np.int8) is None


# ---------------------------------------------------------------- add

@settings(SWEEP, max_examples=200)
@given(st.data())
def test_add(data):
    need_library()
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=4)))
    types = [np.int8, np.uint8, np.int16]                    # int16: a 16-bit link
    ta, tb = draw(st.sampled_from(types)), draw(st.sampled_from(types))
    ia, ib = np.iinfo(ta), np.iinfo(tb)
    a = rng.integers(int(ia.min), int(ia.max) + 1, shape).astype(ta)
    b = rng.integers(int(ib.min), int(ib.max) + 1, shape).astype(tb)
    za = draw(st.integers(int(ia.min), int(ia.max)))
    zb = draw(st.integers(int(ib.min), int(ib.max)))
    mlim = draw(st.sampled_from([(1 << 15) - 1, (1 << 15) - 1, (1 << 31) - 1]))   # int32 lanes or int64
    ma = draw(st.sampled_from([-mlim, -1, 0, 1, mlim, 1 << 14, "random", "random", "random"]))
    mb = draw(st.sampled_from([-mlim, -1, 0, 1, mlim, 1 << 14, "random", "random", "random"]))
    ma = int(rng.integers(-mlim, mlim + 1)) if ma == "random" else ma
    mb = int(rng.integers(-mlim, mlim + 1)) if mb == "random" else mb
    if rng.random() < 0.7:                          # fitted: outputs not all clamped
        typical = int(np.percentile(np.abs((a.astype(np.int64) - za) * ma + (b.astype(np.int64) - zb) * mb), 75))
        r = min(31, max(0, typical.bit_length() - 6 + int(rng.integers(-2, 3))))
    else:
        r = rand_rshifts(rng, 1)[0]
    dtype = draw(st.sampled_from(OUT_TYPES))
    lo, hi, zp = draw_clamp(draw, rng, dtype)
    want = ref_add(a, b, za, zb, ma, mb, r, lo, hi, zp, dtype)
    got = both(lambda: native.add(a, b, za, zb, ma, mb, r, lo, hi, zp, dtype))
    check_equal(got, want, f"add shape={shape} {a.dtype}/{b.dtype} za={za} zb={zb} ma={ma} mb={mb} r={r} "
                           f"lo={lo} hi={hi} zp={zp} out={np.dtype(dtype)}")


def test_add_exhaustive_pairs():
    """Every pair of byte values (256 x 256), with ties at the shift (ma = mb = 1, r = 1),
    the largest multipliers, and r 0, 1, 8, 15, 31."""
    need_library()
    v = np.arange(256)
    for ta, za, tb, zb in ((np.int8, 0, np.int8, -128), (np.uint8, 128, np.int8, 3), (np.uint8, 0, np.uint8, 255)):
        ia, ib = np.iinfo(ta), np.iinfo(tb)
        a = (v[:, None] + int(ia.min) + 0 * v[None, :]).astype(ta)
        b = (v[None, :] + int(ib.min) + 0 * v[:, None]).astype(tb)
        for ma, mb in ((1, 1), (1, -1), ((1 << 15) - 1, -(1 << 15) + 1), (-(1 << 15) + 1, 12345), (3, 5)):
            for r in (0, 1, 8, 15, 31):
                for lo, hi, zp, dtype in ((-128, 127, 0, np.int8), (0, 255, 0, np.uint8), (7, 13, 7, np.uint8),
                                          (-32768, 32767, -100, np.int16)):
                    want = ref_add(a, b, za, zb, ma, mb, r, lo, hi, zp, dtype)
                    got = native.add(a, b, za, zb, ma, mb, r, lo, hi, zp, dtype)
                    check_equal(got, want, f"add pairs {ta.__name__}/{tb.__name__} ma={ma} mb={mb} r={r} out={dtype}")


def test_add_16bit_links_at_the_int32_bound():
    """16-bit links (INT16 inputs, zero point 0) with multipliers at and just past the largest the
    int32 lanes take exactly (|a| * |ma| + |b| * |mb| + 2**(r-1) < 2**31), every extreme of
    both inputs, against the int64 reference."""
    need_library()
    edge16 = np.array([-32768, -32767, -1, 0, 1, 32766, 32767], np.int16)
    a16 = np.repeat(edge16, edge16.size)
    b16 = np.tile(edge16, edge16.size)
    b8 = np.resize(np.array([-128, -1, 0, 1, 127], np.int8), a16.size)
    cases = [(a16, b16, 1 << 14, 1 << 14, 20), (a16, b16, 1 << 15, -(1 << 15) + 1, 1),   # at / past 2**31
             (a16, b16, 1 << 15, 1 << 15, 0), (a16, b8, 30731, 128, 15), (b8, a16, -(1 << 16), 3, 31),
             (a16, b16, (1 << 31) - 1, 1, 31)]
    for a, b, ma, mb, r in cases:
        for lo, hi, zp, dtype in ((-128, 127, 0, np.int8), (0, 127, 0, np.int8), (-32768, 32767, 5, np.int16)):
            want = ref_add(a, b, 0, 0, ma, mb, r, lo, hi, zp, dtype)
            got = native.add(a, b, 0, 0, ma, mb, r, lo, hi, zp, dtype)
            check_equal(got, want, f"add {a.dtype}/{b.dtype} ma={ma} mb={mb} r={r} out={np.dtype(dtype)}")


# ---------------------------------------------------------------- every build this CPU runs

ATTRS_1X1 = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}


def requant_params(rng, o, dtype, mode):
    """Per-channel requantization constants cycling through the edge multipliers and right shifts
    (0, 1, 7, 15, 30, 31, ...), the rest random; the output zero point at an extreme of `dtype`
    or random; a full, ReLU or narrow clamp."""
    info = np.iinfo(dtype)
    mult = [EDGE_MULTS[i % len(EDGE_MULTS)] if i % 3 == 0 else int(rng.integers(1 << 29, 1 << 31)) for i in range(o)]
    rshift = [[0, 1, 7, 15, 30, 31][i % 6] if i % 2 == 0 else int(rng.integers(4, 20)) for i in range(o)]
    zp = [int(info.min), int(info.max), int(rng.integers(int(info.min), int(info.max) + 1))][o % 3]
    if mode == "full":
        return mult, rshift, int(info.min), int(info.max), zp, dtype
    if mode == "relu":
        return mult, rshift, zp, int(info.max), zp, dtype
    return mult, rshift, max(int(info.min), zp - 3), min(int(info.max), zp + 20), zp, dtype


def gemm_cases():
    """Ungrouped convs on the edges of every build's GEMM: channel counts that leave a partial
    group of 4 or 2 rows (Q = 1, 3, 5, 27, 147...), output channels around tiles of 4, 5 and 8
    rows, pixel counts around tiles of 16 and 32, more pixels than one chunk (the packed input a
    thread holds at a time: about 256 KiB) in two images, all-extreme inputs and weights with
    biases that put every sum plus bias exactly at the int32 edges (exact32 on), biases that
    saturate (exact32 off), zero points at their extremes, int8 and uint8 data.
    Yields (what, x, zx, w, bias, attrs, requant params)."""
    rng = np.random.default_rng(2024)
    # 1x1 convs: (n, c, o, h, w)
    shapes = [(1, 1, 1, 1, 1), (1, 3, 5, 3, 5), (2, 5, 7, 1, 17), (1, 7, 9, 5, 5), (1, 33, 13, 7, 5),
              (1, 2, 6, 4, 6), (2, 6, 12, 1, 24), (1, 9, 17, 1, 33), (1, 70, 25, 7, 7), (1, 4, 8, 8, 8),
              (1, 13, 31, 1, 47), (1, 64, 64, 9, 11), (2, 520, 11, 3, 200)]     # the last: several chunks
    for i, (n, c, o, h, wd) in enumerate(shapes):
        for xtype in (np.uint8, np.int8):
            info = np.iinfo(xtype)
            lo_x, hi_x = int(info.min), int(info.max)
            for case in ("min", "max", "random"):
                if case == "min":        # every x - zx = +255, every w = -128: the most negative sums
                    x = np.full((n, c, h, wd), hi_x, xtype)
                    zx, w = lo_x, np.full((o, c, 1, 1), -128, np.int8)
                    s = -128 * 255 * c
                    bias = np.full(o, INT32_MIN + 1 - s, np.int64) if INT32_MIN + 1 - s <= INT32_MAX else None
                elif case == "max":      # every x - zx = -255, every w = -128: the most positive sums
                    x = np.full((n, c, h, wd), lo_x, xtype)
                    zx, w = hi_x, np.full((o, c, 1, 1), -128, np.int8)
                    bias = np.full(o, INT32_MAX - 128 * 255 * c, np.int64)
                else:
                    x = rng.integers(lo_x, hi_x + 1, (n, c, h, wd)).astype(xtype)
                    x.reshape(-1)[::3] = hi_x
                    zx = int(rng.choice([lo_x, hi_x, int(rng.integers(lo_x, hi_x + 1))]))
                    w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
                    w.reshape(-1)[::5] = 127
                    bias = rng.choice(np.array([INT32_MAX, INT32_MIN + 1, 0, -(1 << 20), 1 << 20]), o)  # some saturate
                if bias is not None:
                    bias = bias.astype(np.int32)
                dtype = (np.int8, np.uint8)[i % 2]
                params = requant_params(rng, o, dtype, ("full", "relu", "narrow")[(i + len(case)) % 3])
                yield f"1x1 {case} n={n} c={c} o={o} {h}x{wd} {np.dtype(xtype)}", x, zx, w, bias, ATTRS_1X1, params
    # KxK convs through im2col (the first two: stride-2 rows wide enough for the 16-byte gather):
    # (c, o, kh, kw, h, w, strides, pads, dilations)
    kxk = [(3, 8, 7, 7, 20, 71, [2, 2], [3, 3, 2, 2], [1, 1]), (5, 7, 1, 1, 5, 45, [2, 2], [0, 0, 0, 0], [1, 1]),
           (3, 5, 3, 3, 9, 9, [1, 1], [1, 1, 1, 1], [1, 1]),
           (5, 13, 1, 3, 6, 11, [1, 2], [0, 1, 0, 1], [1, 1]), (4, 17, 3, 3, 12, 10, [2, 2], [1, 1, 1, 1], [1, 1]),
           (2, 7, 5, 5, 11, 12, [1, 1], [2, 2, 2, 2], [2, 1]), (16, 24, 3, 3, 8, 8, [1, 1], [1, 1, 1, 1], [1, 1]),
           (1, 9, 2, 2, 7, 7, [1, 1], [0, 0, 1, 1], [1, 1]), (8, 6, 1, 1, 9, 9, [2, 2], [0, 0, 0, 0], [1, 1]),
           (64, 9, 3, 3, 24, 23, [1, 1], [1, 1, 1, 1], [1, 1])]        # several chunks of pixels in every build
    for i, (c, o, kh, kw, h, wd, strides, pads, dilations) in enumerate(kxk):
        for xtype in (np.int8, np.uint8):
            info = np.iinfo(xtype)
            x = rng.integers(int(info.min), int(info.max) + 1, (2 if i % 3 == 0 else 1, c, h, wd)).astype(xtype)
            zx = int(info.max) if i % 2 else int(rng.integers(int(info.min), int(info.max) + 1))
            w = rng.integers(-128, 128, (o, c, kh, kw)).astype(np.int8)
            if i % 2:                      # extreme: every x at the far end from zx, w = -128
                x[:] = info.min
                w[:] = -128
                bias = np.full(o, INT32_MAX - 128 * 255 * c * kh * kw, np.int32)
            else:
                bias = rng.integers(-(1 << 16), 1 << 16, o).astype(np.int32)
            attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": 1}
            params = requant_params(rng, o, (np.int8, np.uint8)[i % 2], ("full", "relu", "narrow")[i % 3])
            yield f"{kh}x{kw} c={c} o={o} {h}x{wd} {np.dtype(xtype)}", x, zx, w, bias, attrs, params


def depthwise_cases():
    """Depthwise convs on the edges of the pair-of-taps fast form: an odd tap count (1, 9, 25:
    the last tap pairs with weight 0), 2 and 6 taps, strides 1-3, dilation, rows that are not
    whole vectors, all-extreme inputs and weights with exact32 at the int32 edge, a bias that
    saturates. Yields (what, x, zx, w, bias, attrs, requant params)."""
    rng = np.random.default_rng(77)
    cases = [(1, 1, 1, 1, [1, 1], [0, 0, 0, 0], [1, 1]), (3, 3, 3, 9, [1, 1], [1, 1, 1, 1], [1, 1]),
             (5, 5, 5, 21, [2, 2], [2, 2, 2, 2], [1, 1]), (7, 1, 2, 13, [1, 1], [0, 1, 0, 0], [1, 1]),
             (4, 2, 3, 17, [1, 3], [1, 1, 1, 1], [2, 1]), (9, 3, 3, 33, [2, 2], [0, 0, 1, 1], [1, 1]),
             (2, 3, 3, 7, [3, 2], [1, 0, 1, 2], [1, 2])]
    for i, (c, kh, kw, size, strides, pads, dilations) in enumerate(cases):
        for xtype in (np.uint8, np.int8):
            info = np.iinfo(xtype)
            for case in ("extreme", "random", "saturate"):
                x = rng.integers(int(info.min), int(info.max) + 1, (1 + i % 2, c, size, size - 2 * (i % 2))).astype(xtype)
                w = rng.integers(-128, 128, (c, 1, kh, kw)).astype(np.int8)
                zx = int(rng.integers(int(info.min), int(info.max) + 1))
                if case == "extreme":      # x - zx = +255 inside, w = -128: the sums at -255 * 128 * taps
                    x[:], zx, w[:] = info.max, int(info.min), -128
                    bias = np.full(c, INT32_MIN + 1 + 255 * 128 * kh * kw, np.int64)
                elif case == "saturate":
                    bias = np.where(np.arange(c) % 2, INT32_MAX, INT32_MIN + 1)
                else:
                    bias = rng.integers(-(1 << 16), 1 << 16, c)
                attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": c}
                params = requant_params(rng, c, (np.int8, np.uint8)[i % 2], ("full", "relu", "narrow")[i % 3])
                yield f"depthwise {case} c={c} {kh}x{kw} {size} {np.dtype(xtype)}", x, zx, w, bias.astype(np.int32), \
                    attrs, params


def each_variant(make):
    """`make()` (which builds and runs the kernels) under every build this CPU runs; the results
    by build, asserted equal to each other."""
    out = {}
    for variant in VARIANTS:
        with native.using(variant) as lib:
            assert lib is not None and lib.tftpu_isa().decode() == variant
            out[variant] = make(variant)
    first = VARIANTS[0]
    for variant, got in out.items():
        assert got is not None, variant
        check_equal(got, out[first], f"{variant} against {first}")
    return out


def test_variants_listed():
    """Every x86-64 CPU runs the portable and AVX2-or-better builds it reports; the loader's
    choice is one of them."""
    assert VARIANTS and VARIANTS[-1] == "generic"
    assert native.library().tftpu_isa().decode() in VARIANTS


@pytest.mark.parametrize("kind", ["gemm", "depthwise"])
def test_every_variant_conv(kind):
    """The conv kernels of every build against the reference and against each other."""
    need_library()
    for what, x, zx, w, bias, attrs, params in (gemm_cases() if kind == "gemm" else depthwise_cases()):
        sums = ref_conv_sums(x, w, bias, zx, attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"])
        want = ref_requant(sums, *params[:2], 1, *params[2:])

        def run(variant):
            conv = native.Conv(native.Requantizer(*params), w, bias, zx, attrs)
            assert conv.kind == (kind if w.shape[:2] != (1, 1) or kind == "depthwise" else "depthwise"), what
            exact = requant.sum_bound(w, np.zeros(w.shape[0]) if bias is None else bias) < 1 << 31
            assert conv.exact32 == exact
            got = both(lambda: conv(x))
            check_equal(got, want, f"{variant}: {what} zx={zx} bias={None if bias is None else bias[:4]} "
                                   f"exact32={conv.exact32} params={params}")
            return got

        each_variant(run)


def test_every_variant_gemm_link():
    """Ungrouped convs of 16-bit links on every build: the most negative and positive sums (every
    x - zx at its extreme, weights -128) with biases at the int32 edges, a bias that saturates, a
    zero point at each end (whose two bytes the padding holds), data whose high bytes span few
    values (their pass takes the narrow kernel where the build has one), and more pixels than one
    chunk in two images."""
    need_library()
    rng = np.random.default_rng(77)
    pad3 = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1}
    s2 = {"strides": [2, 2], "pads": [0, 1, 2, 1], "dilations": [1, 1], "group": 1}
    # (what, n, c, o, k, h, w, attrs, data lo, data hi, zx, bias)
    cases = [("1x1 max sums", 1, 9, 5, 1, 3, 17, ATTRS_1X1, -32768, -32768, 32767, "edge"),
             ("3x3 min sums", 1, 4, 7, 3, 6, 6, pad3, 32767, 32767, -32768, "edge"),
             ("3x3 s2 saturating", 2, 6, 9, 3, 9, 11, s2, -32768, 32767, 300, "saturate"),
             ("1x1 small, chunks", 2, 40, 13, 1, 30, 200, ATTRS_1X1, -900, 900, 0, "random"),
             ("3x3 small", 1, 5, 8, 3, 12, 12, pad3, -300, 500, -7, "random")]
    for what, n, c, o, k, h, wd, attrs, lo, hi, zx, bias_kind in cases:
        x = rng.integers(lo, hi + 1, (n, c, h, wd)).astype(np.int16)
        w = np.full((o, c, k, k), -128, np.int8) if bias_kind == "edge" else \
            rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
        sums = ref_conv_sums(x, w, None, zx, attrs["strides"], attrs["pads"], attrs["dilations"], 1)
        if bias_kind == "edge":          # the largest |sum| plus bias lands on the int32 edge
            top = int(np.abs(sums).max())
            bias = np.full(o, INT32_MAX - top if sums.max() > 0 else INT32_MIN + 1 + top, np.int64)
        elif bias_kind == "saturate":
            bias = np.where(np.arange(o) % 2, INT32_MAX, INT32_MIN + 1)
        else:
            bias = rng.integers(-(1 << 20), 1 << 20, o)
        bias = bias.astype(np.int32)
        params = requant_params(rng, o, (np.int8, np.int16)[c % 2], ("full", "relu", "narrow")[o % 3])
        want = ref_requant(ref_conv_sums(x, w, bias, zx, attrs["strides"], attrs["pads"], attrs["dilations"], 1),
                           *params[:2], 1, *params[2:])

        def run(variant):
            conv = native.Conv(native.Requantizer(*params), w, bias, zx, attrs, link=True)
            assert conv.kind == "gemm", what
            got = both(lambda: conv(x))
            check_equal(got, want, f"{variant}: {what} zx={zx} exact32={conv.exact32} params={params}")
            return got

        each_variant(run)


NARROW_BUILDS = {"avx2", "avx512"}       # the builds whose GEMM has the vpmaddubsw kernel


def narrow_cases():
    """Ungrouped convs whose input (with the zero point, where padding holds it) spans at most 128
    values, which the narrow kernel (vpmaddubsw) of NARROW_BUILDS takes, and just wider ones,
    which it must not: ReLU outputs in [0, 127] with zero point 0, int8 and uint8; the pairs
    vpmaddubsw adds at their extremes (u = 127 against weights -128, 127 and a mixed pair:
    -32512, 32258 and -127); a range at the top of uint8 (offset 128) and at the bottom of int8
    (-128: an asymmetric ReLU), one across zero ([-100, 27]); 129 values (the data, data of 128
    values but one, last or in the middle, or data of 128 values and a zero point outside them
    that the padding reads); 1x1 and padded KxK convs,
    partial groups of 4 channels, a bias that saturates. Yields (what, x, zx, w, bias, attrs,
    requant params, narrow)."""
    rng = np.random.default_rng(321)
    pad3 = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1}
    s2 = {"strides": [2, 2], "pads": [3, 2, 3, 2], "dilations": [1, 1], "group": 1}
    # (what, xtype, data lo, data hi, zx, weights, c, o, kernel, attrs, narrow)
    cases = [
        ("relu int8", np.int8, 0, 127, 0, "random", 13, 11, 1, ATTRS_1X1, True),
        ("relu int8 3x3", np.int8, 0, 127, 0, "random", 13, 11, 3, pad3, True),
        ("relu uint8 7x7 s2", np.uint8, 0, 127, 0, "random", 3, 9, 7, s2, True),
        ("u=127, w=-128", np.int8, 127, 127, 0, -128, 9, 6, 3, pad3, True),
        ("u=127, w=127", np.int8, 127, 127, 0, 127, 9, 6, 3, pad3, True),
        ("u=127, w=-128/127 pairs", np.int8, 127, 127, 0, "pairs", 8, 6, 3, pad3, True),
        ("u=127, w=-128 1x1", np.uint8, 0, 127, 0, -128, 70, 7, 1, ATTRS_1X1, True),
        ("uint8 [128, 255]", np.uint8, 128, 255, 128, "random", 6, 5, 3, pad3, True),
        ("int8 [-128, -1]", np.int8, -128, -1, -128, "random", 6, 5, 3, pad3, True),
        ("int8 [-100, 27] w=-128", np.int8, -100, 27, -100, -128, 5, 5, 3, pad3, True),
        ("int8 [-100, 27] 1x1, zx outside", np.int8, -100, 27, 100, "random", 5, 5, 1, ATTRS_1X1, True),
        ("int8 [-1, 127]", np.int8, -1, 127, 0, "random", 6, 5, 3, pad3, False),
        ("uint8 [0, 128]", np.uint8, 0, 128, 0, "random", 6, 5, 1, ATTRS_1X1, False),
        ("int8 [0, 127], zx -1 padded", np.int8, 0, 127, -1, "random", 6, 5, 3, pad3, False),
        ("int8 full", np.int8, -128, 127, 0, "random", 6, 5, 3, pad3, False),
        ("int8 [0, 127] but the last value -1", np.int8, 0, 127, 0, "random", 40, 5, 1, ATTRS_1X1, False),
        ("uint8 [0, 127] but a middle value 128", np.uint8, 0, 127, 0, "random", 40, 5, 3, pad3, False),
    ]
    for what, xtype, lo, hi, zx, wkind, c, o, k, attrs, narrow in cases:
        for n, h, wd in ((1, 5, 7), (2, 23, 19)):
            x = rng.integers(lo, hi + 1, (n, c, h, wd)).astype(xtype)
            if lo == hi:                 # all 127 but one 0: the offset 0, every other u = 127
                x[0, 0, 0, 0] = 0
            else:
                x.reshape(-1)[::4], x.reshape(-1)[1::7] = hi, lo
            if "but" in what:            # one value out of the range, past the first blocks the scan shares out
                x.reshape(-1)[-1 if "last" in what else x.size // 2 + 1] = -1 if xtype == np.int8 else 128
            if wkind == "random":
                w = rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
                w.reshape(-1)[::3] = -128
                w.reshape(-1)[1::5] = 127
            elif wkind == "pairs":
                w = np.where(np.arange(c * k * k).reshape(c, k, k) % 2, 127, -128).astype(np.int8)[None].repeat(o, 0)
            else:
                w = np.full((o, c, k, k), wkind, np.int8)
            bias = rng.integers(-(1 << 16), 1 << 16, o)
            bias[::3] = np.where(np.arange(len(bias[::3])) % 2, INT32_MAX, INT32_MIN + 1)   # some saturate
            params = requant_params(rng, o, (np.int8, np.uint8)[n % 2], ("full", "relu", "narrow")[c % 3])
            yield f"{what} n={n} {h}x{wd}", x, zx, w, bias.astype(np.int32), attrs, params, narrow


def test_every_variant_gemm_narrow(monkeypatch):
    """The GEMM's narrow kernel (vpmaddubsw where its pairs are exact) and the wide one on the same
    inputs, under every build this CPU runs: the narrow kernel runs exactly where the input spans
    at most 128 values and the build has it, TFTPU_GEMM_NARROW=0 turns it off, and both give the
    reference's integers, whole and split among threads."""
    need_library()
    for what, x, zx, w, bias, attrs, params, narrow in narrow_cases():
        sums = ref_conv_sums(x, w, bias, zx, attrs["strides"], attrs["pads"], attrs["dilations"], 1)
        want = ref_requant(sums, *params[:2], 1, *params[2:])

        def run(variant):
            conv = native.Conv(native.Requantizer(*params), w, bias, zx, attrs)
            assert conv.kind == "gemm", what
            for allow in ("1", "0"):
                monkeypatch.setenv("TFTPU_GEMM_NARROW", allow)
                kernel = "narrow" if narrow and allow == "1" and variant in NARROW_BUILDS else "wide"
                assert conv.gemm_kernel(x) == kernel, f"{variant}: {what}"
                check_equal(both(lambda: conv(x)), want, f"{variant}: {what} ({kernel})")
            monkeypatch.delenv("TFTPU_GEMM_NARROW")
            return want

        each_variant(run)


def test_gemm_narrow_large_threaded(build):
    """A ReLU-output conv above the real threading threshold through the narrow kernel where the
    build has it (threads as in production: pixels split, then output channels split), and the same
    conv on signed data (the wide kernel)."""
    need_library()
    rng = np.random.default_rng(12)
    for c, o, h, k in ((64, 72, 30, 3), (512, 96, 7, 1)):
        w = rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
        bias = rng.integers(-5000, 5000, o).astype(np.int32)
        params = (rng.integers(1 << 29, 1 << 31, o).tolist(), rng.integers(10, 16, o).tolist(), 0, 127, 0, np.int8)
        attrs = {"strides": [1, 1], "pads": [k // 2] * 4, "dilations": [1, 1], "group": 1}
        conv = native.Conv(native.Requantizer(*params), w, bias, 0, attrs)
        assert o * h * h * c * k * k // 8 >= native.PARALLEL_MIN
        for lo, narrow in ((0, True), (-128, False)):
            x = rng.integers(lo, 128, (1, c, h, h)).astype(np.int8)
            sums = ref_conv_sums(x, w, bias, 0, [1, 1], attrs["pads"], [1, 1], 1)
            check_equal(conv(x), ref_requant(sums, *params[:2], 1, *params[2:]), f"{build} large c={c} lo={lo}")
            assert conv.gemm_kernel(x) == ("narrow" if narrow and build in NARROW_BUILDS else "wide")


def test_every_variant_exact_edges():
    """The extreme cases above do reach the edges they are meant to: the int32 extremes (plus
    one) with exact32 on, and beyond int32 (saturated) with it off."""
    seen = set()
    for what, x, zx, w, bias, attrs, _ in [*gemm_cases(), *depthwise_cases()]:
        sums = ref_conv_sums(x, w, bias, zx, attrs["strides"], attrs["pads"], attrs["dilations"], attrs["group"])
        exact32 = requant.sum_bound(w, np.zeros(w.shape[0]) if bias is None else bias) < 1 << 31
        if exact32 and sums.min() == INT32_MIN + 1:
            seen.add("int32 min + 1")
        if exact32 and sums.max() == INT32_MAX:
            seen.add("int32 max")
        if not exact32 and (sums.max() > INT32_MAX or sums.min() < INT32_MIN):
            seen.add("saturated")
    assert seen == {"int32 min + 1", "int32 max", "saturated"}


def test_every_variant_requant():
    """Requantization of every build: lengths 1..40 (the 8- and 16-lane tails), int32 extremes with
    exact32, int32 and int64 accumulators, NCHW and channels last."""
    need_library()
    rng = np.random.default_rng(8)
    for dtype in OUT_TYPES:
        for n in (1, 7, 8, 9, 15, 16, 17, 23, 31, 33, 40):
            c = 5
            params = requant_params(rng, c, dtype, ("full", "relu", "narrow")[n % 3])
            acc = rng.choice(np.array(EDGE_I32, np.int64), (1, c, n, 1))
            acc[:, :, ::2] = rng.integers(-(1 << 20), 1 << 20, acc[:, :, ::2].shape)
            bias = rng.integers(-1000, 1000, c).astype(np.int32)
            exact = np.clip(acc + bias.reshape(1, c, 1, 1), INT32_MIN, INT32_MAX)
            acc32 = (exact - bias.reshape(1, c, 1, 1)).astype(np.int32)      # acc + bias within int32
            exact = acc32.astype(np.int64) + bias.reshape(1, c, 1, 1)
            want = ref_requant(exact, *params[:2], 1, *params[2:])

            def run(variant):
                rq = native.Requantizer(*params)
                for exact32 in (True, False):
                    check_equal(both(lambda: rq.requant(acc32, 1, bias=bias, exact32=exact32)), want,
                                f"{variant}: requant n={n} exact32={exact32} {np.dtype(dtype)}")
                last = np.ascontiguousarray(np.moveaxis(acc32, 1, -1)).astype(np.int64)
                check_equal(both(lambda: rq.requant(last, -1, bias=bias)),
                            np.ascontiguousarray(np.moveaxis(want, 1, -1)), f"{variant}: requant last n={n}")
                return want

            each_variant(run)


def test_every_variant_add_quantize():
    """Add and quantize (scalar loops, compiled per build) agree across builds and with the
    references."""
    need_library()
    rng = np.random.default_rng(9)
    a = rng.integers(-128, 128, (3, 37)).astype(np.int8)
    b = rng.integers(0, 256, (3, 37)).astype(np.uint8)
    a[0], b[0] = -128, 255
    for ma, mb, r in ((1, 1, 1), ((1 << 15) - 1, -(1 << 15) + 1, 31), (12345, 321, 9)):
        want = ref_add(a, b, 127, 0, ma, mb, r, -128, 127, 3, np.int8)
        each_variant(lambda v: check_equal(native.add(a, b, 127, 0, ma, mb, r, -128, 127, 3, np.int8), want,
                                           f"{v}: add") or native.add(a, b, 127, 0, ma, mb, r, -128, 127, 3, np.int8))
    from tftpu import rounding
    near_half = np.nextafter(np.float32([0.5, -0.5, 1.5, -2.5]), np.float32(0))       # just inside the ties
    f = np.concatenate([rng.normal(0, 50, 200), np.arange(-20, 20) + 0.5, near_half, [2.0 ** 23 + 0.5],
                        [1e30, -1e30, np.inf, -np.inf, 0.0, -0.0, 3.4e38]]).astype(np.float32)
    for scale, zp, dtype in ((0.37, 3, np.int8), (1.0, 128, np.uint8), (1e-3, -7, np.int16), (1.0, 0, np.int32),
                             (1e-300, 0, np.int8)):
        with np.errstate(over="ignore", invalid="ignore"):
            want = rounding.quantize(f, scale, zp, dtype)
        each_variant(lambda v: check_equal(native.quantize(f, scale, zp, dtype), want, f"{v}: quantize")
                     or native.quantize(f, scale, zp, dtype))
    g = f.copy()
    g[7] = np.nan                                     # a NaN anywhere: declined (the numpy path decides)
    each_variant(lambda v: np.zeros(1) if native.quantize(g, 0.37, 3, np.int8) is None else None)


@settings(SWEEP, max_examples=150)
@given(st.data())
def test_every_variant_requant_sweep(data):
    """test_requant's draws on a build drawn from every build this CPU runs."""
    need_library()
    with native.using(data.draw(st.sampled_from(VARIANTS))):
        check_requant_drawn(data.draw)


@settings(SWEEP, max_examples=150)
@given(st.data())
def test_every_variant_sweep(data):
    """Random ungrouped and depthwise convs (any kernel, stride, padding, dilation; test_gemm_kxk's
    and test_depthwise's draws) on a build drawn from every build this CPU runs."""
    need_library()
    draw = data.draw
    variant = draw(st.sampled_from(VARIANTS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    depthwise = draw(st.booleans())
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 12))
    o = c if depthwise else draw(st.integers(1, 20))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    h, wd = draw(st.integers(1, 14)), draw(st.integers(1, 40))
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    assume(oh > 0 and ow > 0)
    x, zx = draw_input(draw, rng, (n, c, h, wd))
    w = rng.integers(-128, 128, (o, 1 if depthwise else c, kh, kw)).astype(np.int8)
    if draw(st.booleans()):
        w.reshape(-1)[rng.integers(0, w.size, max(1, w.size // 4))] = draw(st.sampled_from([-128, 127, 0]))
    bias, _ = draw_bias(draw, rng, o)
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": c if depthwise else 1}
    sums = ref_conv_sums(x, w, bias, zx, strides, pads, dilations, attrs["group"])
    with native.using(variant):
        rq, params = draw_requant_for(draw, rng, sums, o)
        conv = native.Conv(rq, w, bias, zx, attrs)
        assert conv.kind == ("depthwise" if depthwise else ungrouped_kind(c, o))
        check_conv(conv, x, w, bias, zx, attrs, params, f"{variant} sweep")


# ---------------------------------------------------------------- TFTPU_NATIVE=0

def test_native_off(monkeypatch):
    """With TFTPU_NATIVE=0 library() is None, and every entry point declines (None; Conv kind
    None; has_gemm False); the caches cleared again afterwards so the library comes back."""
    was_available = native.library() is not None
    monkeypatch.setenv("TFTPU_NATIVE", "0")
    native.library.cache_clear()
    try:
        assert native.library() is None
        assert native.has_gemm() is False
        acc = np.arange(24, dtype=np.int32).reshape(1, 2, 3, 4)
        assert native.Requantizer(1 << 30, 1, -128, 127, 0, np.int8).requant(acc, 1) is None
        assert native.Requantizer([1 << 30] * 2, [1] * 2, -128, 127, 0, np.int8).requant(
            acc, 1, bias=np.zeros(2, np.int32), exact32=True) is None
        x = np.zeros((1, 2, 4, 4), np.int8)
        rq = native.Requantizer(1 << 30, 1, -128, 127, 0, np.int8)
        dw = native.Conv(rq, np.ones((2, 1, 3, 3), np.int8), None, 0,
                         {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 2})
        assert dw.kind is None and dw(x) is None
        pw = native.Conv(rq, np.ones((3, 2, 1, 1), np.int8), None, 0,
                         {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1})
        assert pw.kind is None and pw(x) is None
        assert native.add(x, x, 0, 0, 1, 1, 0, -128, 127, 0, np.int8) is None
    finally:
        monkeypatch.undo()
        native.library.cache_clear()
    assert (native.library() is not None) == was_available


def test_missing_build_is_a_warning_unless_turned_off(monkeypatch):
    """No native build where one was expected (no compiler) is a warning a user sees; turned
    off on purpose (TFTPU_NATIVE=0) it is only info."""
    from absl import logging as absl_logging

    from tftpu.interp.tpu import native as tpu_native
    from tftpu.utils import native as loader

    def no_compiler(source, variant=None):
        raise loader.NativeKernelError("no C++ compiler found")

    seen = []
    monkeypatch.setattr(loader, "load_library", no_compiler)
    monkeypatch.setattr(absl_logging, "warning", lambda msg, *a: seen.append(("warning", msg % a)))
    monkeypatch.setattr(absl_logging, "info", lambda msg, *a: seen.append(("info", msg % a)))
    for env, level in (("1", "warning"), ("0", "info")):
        monkeypatch.setenv("TFTPU_NATIVE", env)
        tpu_native.library.cache_clear()
        try:
            assert tpu_native.library("generic") is None
        finally:
            tpu_native.library.cache_clear()
        assert seen[-1][0] == level and "numpy computes the same integers" in seen[-1][1]


def test_f16_conversions_equal_numpy(build):
    """float32 -> float16 (nearest, ties to even) on every float32 bit pattern class, and every
    float16 back exactly: the CPU's converter where the build has one (F16C), numpy's astype
    elsewhere; the same bits either way (signalling NaNs aside, which F16C makes quiet and no
    kernel makes)."""
    need_library()
    rng = np.random.default_rng(16)
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    nan = np.isnan(x)
    x[nan] = np.where(np.signbit(x[nan]), -np.nan, np.nan)           # quiet NaNs
    halves = np.float32(np.arange(1 << 16, dtype=np.uint16).view(np.float16)[:(1 << 15) - 1024])   # finite halves
    ties = (halves[:-1] + (halves[1:] - halves[:-1]) / 2).astype(np.float32)                        # midpoints
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 65519.99, 2.0 ** -24, 2.0 ** -25,
                           2.0 ** -25 * 1.0000001, 6.1e-5, 1e-45, -1e-45, 3.4e38])
    x = np.concatenate([x, halves, ties, -ties, specials])
    for shape in ((x.size,), (7,), (3, 5, 4099)):
        n = int(np.prod(shape))
        a = np.resize(x, shape).astype(np.float32)
        with np.errstate(over="ignore"):
            want = a.astype(np.float16)
        with np.errstate(over="ignore"):
            got = native.to_float(a, "f16")
        assert got.dtype == np.float16 and got.shape == a.shape
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), build
        back = native.widened(got)
        exact = want.astype(np.float32).view(np.uint32)
        assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), exact)
        assert n < native.CONVERT_MIN or native.library(build).tftpu_has_f16() == (build != "generic")
    sliced = np.resize(x, (64, 300))[:, ::3]                                    # not contiguous
    with np.errstate(over="ignore"):
        assert np.array_equal(native.to_float(sliced, "f16").view(np.uint16), sliced.astype(np.float16).view(np.uint16))
    assert native.to_float(x, "f32") is not None and native.widened(None) is None
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)     # each float16, signalling NaNs too
    for halfs in (every, np.resize(every, (3, 1 << 16))[:, ::5]):      # contiguous or not
        got, want = native.widened(halfs), halfs.astype(np.float32)
        nan = np.isnan(want)
        assert got.dtype == np.float32 and np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), build


def test_interpolate_equals_the_lut_formula(build):
    """A 16-bit `tpu.Lut` (`native.interpolate`) is `tpu.Lut`'s formula in int64 numpy for every
    16-bit input, over random and smooth knots, each output type and clamp; other inputs declined."""
    need_library()
    from tftpu.ir.tpu import Lut
    rng = np.random.default_rng(16)
    k, frac = Lut.KNOT_BITS, Lut.FRACTION_BITS
    x = np.arange(-32768, 32768, dtype=np.int16).reshape(2, 8, -1)
    u = x.astype(np.int64) + 32768
    i, f = u >> k, u & ((1 << k) - 1)
    for out_dtype in (np.int8, np.uint8, np.int16, np.int32):
        o = np.iinfo(out_dtype)
        top = min(o.max, (1 << 30) >> frac) << frac
        smooth = np.rint(np.tanh(np.linspace(-4, 4, Lut.KNOTS)) * top).astype(np.int32)
        for table in (rng.integers(-top, top, Lut.KNOTS).astype(np.int32), smooth):
            for lo, hi in ((o.min, o.max), (max(o.min, 0), o.max // 2)):
                got = native.interpolate(x, table, k, frac, lo, hi, out_dtype)
                t = table.astype(np.int64)
                want = np.clip(((t[i] << k) + (t[i + 1] - t[i]) * f + (1 << (k + frac - 1))) >> (k + frac), lo, hi)
                assert got is not None and got.dtype == out_dtype and got.shape == x.shape
                assert np.array_equal(got, want.astype(out_dtype)), (build, out_dtype, lo, hi)
    table = np.zeros(Lut.KNOTS, np.int32)
    assert native.interpolate(x.astype(np.int32), table, k, frac, -128, 127, np.int8) is None    # not 16-bit
    assert native.interpolate(x, table[:-1], k, frac, -128, 127, np.int8) is None                # a knot short
    assert native.interpolate(x, table.astype(np.int64), k, frac, -128, 127, np.int8) is None    # not int32


def test_a_kernel_refusing_its_arguments_is_an_internal_error():
    """A native kernel's nonzero status is tftpu's bug (arguments the build does not take), raised
    as a typed InternalError that names the kernel, not as any other exception."""
    from tftpu.errors import InternalError
    native._check(0)
    with pytest.raises(InternalError, match="native INT8 kernel: returned status 1"):
        native._check(1)


def test_lookup_equals_indexing(build):
    """An 8-bit `tpu.Lut` (`native.lookup`) is numpy's `table[x - qmin]` for every input byte,
    table type and grid; a table that some input value falls outside of is declined."""
    need_library()
    rng = np.random.default_rng(8)
    for xdtype, qmin in ((np.int8, -128), (np.uint8, 0), (np.int8, -129)):
        info = np.iinfo(xdtype)
        x = np.concatenate([np.arange(info.min, info.max + 1), rng.integers(info.min, info.max + 1, 70000 - 256 + 7)])
        x = x.astype(xdtype).reshape(1, 7, -1)
        for tdtype in (np.int8, np.uint8, np.int16, np.int32):
            t = np.iinfo(tdtype)
            table = rng.integers(t.min, t.max, 256 + (qmin == -129), dtype=np.int64).astype(tdtype)
            got = native.lookup(x, table, qmin)
            want = table[x.astype(np.int32) - qmin]
            assert got is not None and got.dtype == want.dtype and np.array_equal(got, want), (build, xdtype, tdtype)
    assert native.lookup(np.int8([5]), np.int8(np.arange(200) - 100), -128) is None        # 127 + 128 > 199
    assert native.lookup(np.int8([5]), np.int8(np.arange(256) - 128), -127) is None        # -128 + 127 < 0
    assert native.lookup(np.int16([5]), np.int8(np.arange(256) - 128), -128) is None       # 16-bit: interpolated
