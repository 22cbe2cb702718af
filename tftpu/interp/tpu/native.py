"""ctypes bindings of the fused INT8 kernels (`int8_native.cc`): requantization of INT32/INT64
sums (bias fused), depthwise and ungrouped convs with their requantization (`Conv`), element-wise
Add/Sub, float32 -> INT8 quantization, 8-bit table lookups, and float32 -> float16 rounding (by
the CPU's F16C converter, where the build has one: the float ops' F16 results and casts).

Each returns None where it does not apply (the library cannot be built, `TFTPU_NATIVE=0`, or
types it does not take); the callers then take their numpy paths, which compute the same
integers (tests/interp/test_int8_native.py holds the kernels to an independent integer
reference, tests/interp/test_int8_native_models.py whole models to the numpy paths). Large
calls share the library's own worker threads (as many as `requant.in_slabs` uses).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
from pathlib import Path

import numpy as np
from absl import logging

from tftpu import geometry
from tftpu.interp.tpu import requant
from tftpu.utils import native, threads

SOURCE = Path(__file__).with_name("int8_native.cc")
OUT_KINDS = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3}
IN_KINDS = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1}
ADD_KINDS = {**IN_KINDS, np.dtype(np.int16): 2}     # Add/Sub also read 16-bit links
ACC_KINDS = {np.dtype(np.int32): 0, np.dtype(np.int64): 1}
_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64


_VARIANT: str | None = None        # the build `using` selects; None: the one the loader chooses


@functools.cache
def library(variant: str | None = None):
    """The loaded kernel library, or None (logged once) where it cannot be built or is off;
    `variant`: that instruction-set build (`tftpu.utils.isa`) instead of the chosen one."""
    try:
        lib = native.load_library(SOURCE, variant)
    except native.NativeKernelError as exc:
        # turned off on purpose: info; no build where one was expected: a warning the user sees
        log = logging.info if not native.enabled() else logging.warning
        log("tftpu: INT8 inference without native kernels (%s); numpy computes the same integers, slower", exc)
        return None
    lib.tftpu_requant.argtypes = [_P, _I, _P, _I, _P, _P, _P, _P, _L, _L, _I]
    lib.tftpu_depthwise.argtypes = [_P, _I, _P, _P, _I, _P, _P, _P, _P, _L, _L, _I]
    lib.tftpu_add.argtypes = [_P, _I, _P, _I, _P, _I, _P, _L, _L, _I]
    lib.tftpu_gemm.argtypes = [_P, _I, _P, _P, _P, _P, _P, _I, _P, _L, _L, _L, _L, _I]
    lib.tftpu_gemm_link.argtypes = [_P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _I]
    lib.tftpu_gemm_packed_size.argtypes = [_L, _L]
    lib.tftpu_gemm_packed_size.restype = _L
    lib.tftpu_gemm_pack.argtypes = [_P, _L, _L, _P]
    lib.tftpu_gemm_pack.restype = None
    lib.tftpu_gemm_offset.argtypes = [_P, _I, _P, _P]
    lib.tftpu_gemm_offset.restype = _I
    lib.tftpu_has_gemm.argtypes = []
    lib.tftpu_quantize.argtypes = [_P, ctypes.c_double, _P, _I, _P, _I]
    lib.tftpu_lookup.argtypes = [_P, _P, _I, _P, _L, _I]
    lib.tftpu_has_f16.argtypes = []
    lib.tftpu_to_f16.argtypes = [_P, _P, _L, _I]
    lib.tftpu_from_f16.argtypes = [_P, _P, _L, _I]
    lib.tftpu_interpolate.argtypes = [_P, _P, _I, _I, _L, _L, _I, _P, _L, _I]
    lib.tftpu_set_threads.argtypes = [_I]
    lib.tftpu_set_threads.restype = None
    for fn in (lib.tftpu_requant, lib.tftpu_depthwise, lib.tftpu_add, lib.tftpu_gemm, lib.tftpu_gemm_link,
               lib.tftpu_has_gemm,
               lib.tftpu_quantize, lib.tftpu_has_f16, lib.tftpu_to_f16, lib.tftpu_from_f16,
               lib.tftpu_lookup, lib.tftpu_interpolate):
        fn.restype = _I
    lib.tftpu_set_threads(threads.pool_size())
    return lib


def _library():
    """The library the entry points use: `library()`, or the build `using` selected."""
    return library() if _VARIANT is None else library(_VARIANT)


@contextlib.contextmanager
def using(variant: str):
    """Every entry point of this module on the `variant` build (one `tftpu.utils.isa.supported()`
    names) within the block: the tests run each build this CPU can execute. A `Conv` keeps the
    build it was prepared with (its weights are packed for it)."""
    global _VARIANT
    old = _VARIANT
    _VARIANT = variant
    try:
        yield library(variant)
    finally:
        _VARIANT = old


PARALLEL_MIN = 1 << 15      # work (elements, or MACs / 8) below which a call runs on one thread


def _parts(work: int) -> int:
    """How many threads a call of `work` shares (the library's pool: the caller and workers)."""
    return threads.pool_size() if work >= PARALLEL_MIN else 1


def _check(status: int) -> None:
    if status:
        from tftpu.errors import InternalError
        raise InternalError("native INT8 kernel", f"returned status {status} (arguments it was not built for)")


class Requantizer:
    """One op's requantization constants, ready for the kernels: multiplier and right shift per
    channel (or one), clamp [lo, hi] and output zero point, output storage `dtype`."""

    def __init__(self, multiplier, rshift, lo: int, hi: int, zp: int, dtype):
        m = np.ascontiguousarray(np.asarray(multiplier, np.int64).reshape(-1), np.int32)
        r = np.ascontiguousarray(np.asarray(rshift, np.int64).reshape(-1), np.int32)
        if m.size != r.size and min(m.size, r.size) == 1:
            m, r = np.broadcast_arrays(m, r)
            m, r = np.ascontiguousarray(m), np.ascontiguousarray(r)
        self.mult, self.rshift = m, r
        self.per_channel = m.size > 1
        self.lo, self.hi, self.zp = int(lo), int(hi), int(zp)
        self.dtype = np.dtype(dtype)

    def requant(self, acc: np.ndarray, axis: int, bias=None, exact32: bool = False):
        """`acc` (int32/int64, + `bias` per channel of `axis`), saturated to int32, requantized;
        None where the kernel does not apply. `exact32`: the caller proved every sum plus bias
        lies in int32 (then int32 arithmetic is exact: the fast form)."""
        lib = _library()
        kind = ACC_KINDS.get(acc.dtype)
        if lib is None or kind is None or self.dtype not in OUT_KINDS or acc.ndim == 0:
            return None
        acc = np.ascontiguousarray(acc)
        axis %= acc.ndim
        channels = acc.shape[axis]
        outer, inner = math.prod(acc.shape[:axis]), math.prod(acc.shape[axis + 1:])
        if not self.per_channel and bias is None:      # one channel: the whole tensor is one run
            outer, channels, inner = 1, 1, acc.size
        if self.per_channel and self.mult.size != channels:
            return None
        if bias is not None:
            bias = np.asarray(bias)
            if bias.size != channels or bias.dtype.kind not in "iu" or \
                    (bias.size and (bias.min() < -(1 << 31) or bias.max() >= 1 << 31)):
                return None
            bias = np.ascontiguousarray(bias.reshape(-1), np.int32)
        out = np.empty(acc.shape, self.dtype)
        params = np.array([outer, channels, inner, self.lo, self.hi, self.zp, int(self.per_channel),
                           int(exact32 and kind == 0)], np.int64)
        units = outer if inner == 1 and channels > 1 else outer * channels
        bias_ptr = None if bias is None else bias.ctypes.data
        a, o, p, mp, rp = acc.ctypes.data, out.ctypes.data, params.ctypes.data, self.mult.ctypes.data, \
            self.rshift.ctypes.data
        okind = OUT_KINDS[self.dtype]
        _check(lib.tftpu_requant(a, kind, o, okind, p, bias_ptr, mp, rp, 0, units, _parts(acc.size)))
        return out


class Conv:
    """One INT8 conv prepared for the kernels, its weights packed and its constants ready (built
    once per op; `__call__(x)` per run): a depthwise conv (one filter per channel, any kernel,
    stride, padding and dilation) whole, or an ungrouped conv as a GEMM over its input channels
    (1x1, stride 1, unpadded) or its im2col rows (any other kernel), in the library it was
    prepared with (its weights packed for that build's GEMM).
    Input NCHW INT8/UINT8 with zero point `zx` (or, `link`, a 16-bit link: INT16, with zero point
    0 into a depthwise conv; into an ungrouped one any, as two GEMM passes over its high and low
    bytes, as the chip runs it), weight OIHW INT8, bias INT32 per output channel.
    `kind` is None where neither applies. Sums accumulate in int32 (each term is at most
    255 * 128, or 32768 * 128 from a link, and the taps are bounded here); `exact32` holds where
    every sum plus its bias fits int32 (255, or for a link 32768 + |zx|, times sum|w| plus |b| per
    channel), the kernels' fast form."""

    def __init__(self, rq: Requantizer, w: np.ndarray, bias, zx: int, attrs: dict, link: bool = False):
        self.rq, self.w, self.bias, self.zx, self.link = rq, w, bias, int(zx), link
        self.strides, self.pads, self.dilations = list(attrs["strides"]), list(attrs["pads"]), list(attrs["dilations"])
        o, cg, kh, kw = w.shape
        b = np.zeros(o, np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)
        self.kind, self.b32, self.exact32 = None, None, False
        self.lib = _library()
        if self.lib is None or w.dtype != np.int8 or rq.dtype not in OUT_KINDS or b.size != o or \
                (rq.per_channel and rq.mult.size != o) or (b.size and np.abs(b).max() >= 1 << 31):
            return
        span = 32768 + abs(self.zx) if link else 255     # the largest |x - zx|
        self.exact32 = requant.sum_bound(w, b, span) < 1 << 31
        self.b32 = np.ascontiguousarray(b, np.int32)
        self._shape, self._params = None, None
        if attrs["group"] == o and cg == 1 and kh * kw * span * 128 < 1 << 31 and not (link and self.zx):
            self.kind = "depthwise"
        elif attrs["group"] == 1 and cg * kh * kw * 255 * 128 < 1 << 31 and self.lib.tftpu_has_gemm():
            self.kind = "gemm"
            self.wpack, wsum = pack_gemm(w, self.lib)
            # the bias with the zero point's term folded in, and the weight sums: the kernel adds
            # s * sum(w) for the offset s it subtracts from the input (int8_native.cc, gemm_offset)
            self.bias2 = np.ascontiguousarray(np.stack([b - self.zx * wsum, wsum]), np.int64)

    def __call__(self, x: np.ndarray):
        """The requantized output of NCHW `x`, or None where the kernels do not take it."""
        ikind = (ADD_KINDS if self.link else IN_KINDS).get(x.dtype)
        if self.kind is None or ikind is None or x.ndim != 4 or x.shape[1] != self.w.shape[1] * (
                self.w.shape[0] if self.kind == "depthwise" else 1):
            return None
        x = np.ascontiguousarray(x)
        return self._depthwise(x, ikind) if self.kind == "depthwise" else self._gemm(x, ikind)

    def _planes(self, x):
        """A 16-bit input's high bytes (INT8: x >> 8) and low bytes (UINT8: x & 255), each NCHW."""
        b = x.view(np.uint8).reshape(*x.shape, 2)
        first, second = (0, 1) if np.little_endian else (1, 0)
        return np.ascontiguousarray(b[..., second]).view(np.int8), np.ascontiguousarray(b[..., first])

    def _out_size(self, h: int, wd: int) -> tuple[int, int]:
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.strides, self.dilations, self.pads
        kh, kw = self.w.shape[2:]
        return geometry.conv_out(h, kh, sh, dh, pt, pb), geometry.conv_out(wd, kw, sw, dw, pl, pr)

    def _depthwise(self, x, ikind):
        rq, lib = self.rq, self.lib
        n, c, h, wd = x.shape
        kh, kw = self.w.shape[2:]
        if self._shape != x.shape:
            (sh, sw), (dh, dw), (pt, pl, _, _) = self.strides, self.dilations, self.pads
            oh, ow = self._out_size(h, wd)
            if oh <= 0 or ow <= 0:
                return None
            self._params = np.array([n, c, h, wd, self.zx, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, rq.lo, rq.hi,
                                     rq.zp, int(rq.per_channel), int(self.exact32)], np.int64)
            self._shape = x.shape
        oh, ow = int(self._params[13]), int(self._params[14])
        out = np.empty((n, c, oh, ow), rq.dtype)
        args = (x.ctypes.data, ikind, self.w.ctypes.data, out.ctypes.data, OUT_KINDS[rq.dtype], self._params.ctypes.data,
                self.b32.ctypes.data, rq.mult.ctypes.data, rq.rshift.ctypes.data)
        _check(lib.tftpu_depthwise(*args, 0, c, _parts(out.size * kh * kw)))
        return out

    def _gemm(self, x, ikind):
        rq, lib = self.rq, self.lib
        n, c, h, wd = x.shape
        o, kh, kw = self.w.shape[0], *self.w.shape[2:]
        if self._shape != x.shape:
            oh, ow = self._out_size(h, wd)
            if oh <= 0 or ow <= 0:
                return None
            direct = (kh, kw) == (1, 1) and self.strides == [1, 1] and not any(self.pads)
            (sh, sw), (dh, dw), (pt, pl, _, _) = self.strides, self.dilations, self.pads
            self._params = np.array([n, c * kh * kw, oh * ow, o, 0, rq.lo, rq.hi, rq.zp, 0,
                                     int(rq.per_channel), int(self.exact32), h, wd, 0 if direct else kh, kw,
                                     sh, sw, pt, pl, dh, dw, ow, self.zx], np.int64)
            self._shape, self._out = x.shape, (n, o, oh, ow)
        self._params[4] = int(narrow_allowed())
        out = np.empty(self._out, rq.dtype)
        pixels = self._out[2] * self._out[3]
        if self.link:
            if x.dtype != np.int16:
                return None
            hi, lo = self._planes(x)
            sums = np.empty(self._out, np.int32)
            _check(lib.tftpu_gemm_link(hi.ctypes.data, lo.ctypes.data, self.wpack.ctypes.data, self.bias2.ctypes.data,
                                       rq.mult.ctypes.data, rq.rshift.ctypes.data, out.ctypes.data,
                                       OUT_KINDS[rq.dtype], self._params.ctypes.data, sums.ctypes.data,
                                       _parts(n * o * pixels * c * kh * kw // 4)))      # (two passes)
            return out
        args = (x.ctypes.data, ikind, self.wpack.ctypes.data, self.bias2.ctypes.data, rq.mult.ctypes.data,
                rq.rshift.ctypes.data, out.ctypes.data, OUT_KINDS[rq.dtype], self._params.ctypes.data)
        _check(lib.tftpu_gemm(*args, 0, pixels, 0, o, _parts(n * o * pixels * c * kh * kw // 8)))
        return out

    def gemm_kernel(self, x: np.ndarray) -> str | None:
        """Which GEMM kernel `self(x)` runs (for tests): "narrow" (vpmaddubsw, where the build
        has it and `x` with the zero point spans at most 128 values), "wide", or None where the
        GEMM does not run."""
        if self.kind != "gemm" or IN_KINDS.get(x.dtype) is None or self(x) is None:
            return None
        s = ctypes.c_int64()
        x = np.ascontiguousarray(x)
        narrow = self.lib.tftpu_gemm_offset(x.ctypes.data, IN_KINDS[x.dtype], self._params.ctypes.data,
                                            ctypes.byref(s))
        return "narrow" if narrow else "wide"


def narrow_allowed() -> bool:
    """Whether the GEMM may take its narrow kernel (vpmaddubsw on AVX2 and AVX-512BW builds without
    VNNI) where it is exact: `TFTPU_GEMM_NARROW=0` keeps the int16 one (the same integers; for
    comparisons)."""
    return os.environ.get("TFTPU_GEMM_NARROW", "1").strip().lower() not in ("0", "false", "off", "no")


def has_gemm() -> bool:
    """Whether the library has the INT8 GEMM of ungrouped convs (every build has: the portable
    loops at least; False only without a library)."""
    lib = _library()
    return lib is not None and bool(lib.tftpu_has_gemm())


def pack_gemm(w: np.ndarray, lib=None) -> tuple[np.ndarray, np.ndarray]:
    """An OIHW INT8 weight as `lib`'s GEMM takes it (the build's own layout, packed by the
    library), and the sum of each output channel's weights (int64)."""
    lib = lib or _library()
    o = w.shape[0]
    flat = np.ascontiguousarray(w.reshape(o, -1), np.int8)
    q = flat.shape[1]
    packed = np.empty(lib.tftpu_gemm_packed_size(o, q), np.uint8)
    lib.tftpu_gemm_pack(flat.ctypes.data, o, q, packed.ctypes.data)
    return packed, flat.astype(np.int64).sum(axis=1)


def add(a: np.ndarray, b: np.ndarray, za: int, zb: int, ma: int, mb: int, r: int, lo: int, hi: int, zp: int,
        dtype):
    """`((a - za) * ma + (b - zb) * mb)` shifted right by `r` (ties away from zero), plus `zp`,
    clamped to [lo, hi], for INT8/UINT8/INT16 `a`, `b` of one shape (or `b` one value), exact for |ma|, |mb| < 2**31
    and |za|, |zb| <= 2**16 (int32 lanes where the types' ranges bound the sums, else int64);
    None where it does not apply."""
    lib = _library()
    dtype = np.dtype(dtype)
    ka, kb = ADD_KINDS.get(a.dtype), ADD_KINDS.get(b.dtype)
    if lib is not None and a.shape != b.shape and b.size == 1 and a.size > 1:
        b = np.broadcast_to(b.reshape(()), a.shape)         # x + a constant (HardSigmoid's offset)
    if lib is None or ka is None or kb is None or a.shape != b.shape or dtype not in OUT_KINDS or \
            max(abs(ma), abs(mb)) >= 1 << 31 or max(abs(za), abs(zb)) > 1 << 16 or not 0 <= r <= 31:
        return None
    shape = a.shape                    # (ascontiguousarray makes a 0-d array 1-d)
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    out = np.empty(shape, dtype)
    params = np.array([a.size, za, zb, ma, mb, r, lo, hi, zp], np.int64)
    ap, bp, o, p, okind = a.ctypes.data, b.ctypes.data, out.ctypes.data, params.ctypes.data, OUT_KINDS[dtype]
    _check(lib.tftpu_add(ap, ka, bp, kb, o, okind, p, 0, a.size, _parts(a.size)))
    return out


def lookup(x: np.ndarray, table: np.ndarray, qmin: int) -> np.ndarray | None:
    """`table[x - qmin]` for 8-bit `x` (a `tpu.Lut` on an INT8/UINT8 input), or None where it
    does not apply (no library, another input type, a value of x's type outside the table)."""
    lib = _library()
    x = np.asarray(x)
    if lib is None or x.dtype not in IN_KINDS or table.ndim != 1 or table.dtype.itemsize not in (1, 2, 4):
        return None
    index = np.arange(256, dtype=np.uint8).view(x.dtype).astype(np.int64) - qmin   # each byte's entry
    if index.min() < 0 or index.max() >= table.size:
        return None
    by_byte = np.ascontiguousarray(table[index])
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, table.dtype)
    _check(lib.tftpu_lookup(x.ctypes.data, by_byte.ctypes.data, table.dtype.itemsize, out.ctypes.data, x.size,
                            _parts(x.size)))
    return out


def interpolate(x: np.ndarray, table: np.ndarray, knot_bits: int, fraction_bits: int, lo: int, hi: int,
                out_dtype) -> np.ndarray | None:
    """A 16-bit `tpu.Lut` (`tftpu.ir.tpu.Lut`'s formula over int32 knots `table`, clamped to
    [lo, hi] in `out_dtype`), or None where it does not apply (no library, another input type, a
    table of another size or type)."""
    lib = _library()
    x = np.asarray(x)
    out_dtype = np.dtype(out_dtype)
    if lib is None or x.dtype != np.int16 or out_dtype not in OUT_KINDS or table.dtype != np.int32 \
            or table.shape != ((1 << (16 - knot_bits)) + 1,):
        return None
    x, table = np.ascontiguousarray(x), np.ascontiguousarray(table)
    out = np.empty(x.shape, out_dtype)
    _check(lib.tftpu_interpolate(x.ctypes.data, table.ctypes.data, knot_bits, knot_bits + fraction_bits, lo, hi,
                                 OUT_KINDS[out_dtype], out.ctypes.data, x.size, _parts(x.size)))
    return out


CONVERT_MIN = 1 << 12        # elements below which numpy converts float16 (the call costs more)


def _f16_library():
    """The library where it converts float16 (its build has F16C), else None."""
    lib = _library()
    return lib if lib is not None and lib.tftpu_has_f16() else None


def _converted(x: np.ndarray, dtype, entry: str) -> np.ndarray | None:
    """`x` as `dtype` by the library's float16 converter `entry`; None where numpy converts it (a
    build without F16C, or too few elements to pay for the call)."""
    lib = _f16_library() if x.size >= CONVERT_MIN else None
    if lib is None:
        return None
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, dtype)
    _check(getattr(lib, entry)(x.ctypes.data, out.ctypes.data, x.size, _parts(x.size)))
    return out


def to_float(x, dtype: str) -> np.ndarray:
    """`tftpu.rounding.to_float(x, dtype)`: float values rounded to "f32", "f16" or "bf16"; float32
    to float16 by the CPU's converter where the build has one (nearest, ties to even: the same
    values, signalling NaNs made quiet)."""
    from tftpu import rounding

    x = np.asarray(x)
    if dtype == "f16" and x.dtype == np.float32:
        out = _converted(x, np.float16, "tftpu_to_f16")
        if out is not None:
            return out
    return rounding.to_float(x, dtype)


def widened(x):
    """float16 and bfloat16 arrays as float32 (exact; float16 by the CPU's converter where the
    build has one, NaNs quiet); any other array (or None) as it is."""
    if getattr(x, "dtype", None) is None:
        return x
    if x.dtype == np.float16:
        out = _converted(x, np.float32, "tftpu_from_f16")
        if out is not None:
            return out
    if x.dtype == np.float16 or x.dtype.name == "bfloat16":
        return x.astype(np.float32)
    return x


def quantized(x, scale: float, zp: int, dtype) -> np.ndarray:
    """`tftpu.rounding.quantize(x, scale, zp, dtype)`, natively where it applies (float32 `x`;
    float16 and bfloat16 widened to it exactly)."""
    from tftpu import rounding

    x = widened(np.asarray(x))
    y = quantize(x, scale, zp, dtype)
    return rounding.quantize(x, scale, zp, dtype) if y is None else y


def quantize(x: np.ndarray, scale: float, zp: int, dtype):
    """`tftpu.rounding.quantize` of float32 `x` (round half away from zero of x / scale in
    float64, plus `zp`, saturated to `dtype`), or None where it does not apply (a NaN included)."""
    lib = _library()
    dtype = np.dtype(dtype)
    if lib is None or x.dtype != np.float32 or dtype not in OUT_KINDS or not (scale > 0 and math.isfinite(scale)):
        return None
    shape = x.shape
    x = np.ascontiguousarray(x)
    info = np.iinfo(dtype)
    out = np.empty(shape, dtype)
    params = np.array([x.size, zp, info.min, info.max], np.int64)
    status = lib.tftpu_quantize(x.ctypes.data, float(scale), out.ctypes.data, OUT_KINDS[dtype], params.ctypes.data,
                                _parts(x.size))
    if status == 3:
        return None
    _check(status)
    return out
