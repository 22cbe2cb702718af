"""The kernel registry of the TOP ops (keyed by full op name, `top.Conv`), and helpers the
kernel modules share.

A kernel maps `(operands, attrs) -> results` (numpy arrays, `None` for a `top.None` operand).
FLOPs are counted by the op itself (`count_flops` on its class in `tftpu.ir`).
"""

from __future__ import annotations

import math
import weakref
from typing import Callable, Sequence

import numpy as np

Kernel = Callable[[list, dict], list]

KERNELS: dict[str, Kernel] = {}


def register(*names: str):
    """Register the decorated kernel under each full op name (`top.Conv`). The kernel always
    sees every attribute: those a caller leaves out come at the op's declared defaults."""

    def wrap(fn: Kernel) -> Kernel:
        from tftpu.ir.top import OPS_BY_NAME

        for name in names:
            if "." not in name:
                raise ValueError(f"kernel key {name!r}: use the op's full name, e.g. 'top.{name}'")
            cls = OPS_BY_NAME.get(name)
            KERNELS[name] = _with_defaults(fn, cls.defaults()) if cls is not None and cls.defaults() else fn
        return fn

    return wrap


def _with_defaults(fn: Kernel, defaults: dict) -> Kernel:
    keys = defaults.keys()

    def kernel(operands, attrs):
        return fn(operands, attrs if keys <= attrs.keys() else {**defaults, **attrs})

    kernel.__name__, kernel.__doc__, kernel.__wrapped__ = fn.__name__, fn.__doc__, fn
    return kernel


def tf():
    """TensorFlow, imported on first use so that importing the kernels stays fast."""
    import tensorflow

    return tensorflow


_NCHW_OK: list[bool] = []


def nchw_supported() -> bool:
    """Whether TF's CPU convolutions and pools accept NCHW data (they do with oneDNN, TF's
    default on x86; stock Eigen kernels are NHWC-only). Probed once per process."""
    if not _NCHW_OK:
        t = tf()
        x = np.zeros((1, 1, 2, 2), np.float32)
        try:
            t.raw_ops.DepthwiseConv2dNative(
                input=x, filter=np.zeros((1, 1, 1, 1), np.float32), strides=[1, 1, 1, 1],
                padding="VALID", data_format="NCHW")
            t.nn.max_pool2d(x, 1, 1, "VALID", data_format="NCHW")
            t.raw_ops.Conv2D(input=x, filter=np.zeros((1, 1, 1, 1), np.float32),
                             strides=[1, 1, 1, 1], padding="VALID", data_format="NCHW")
            _NCHW_OK.append(True)
        except t.errors.OpError:
            _NCHW_OK.append(False)
    return _NCHW_OK[0]


ALIGN = 64


def aligned_empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised array whose data is 64-byte aligned: TF takes such arrays as op inputs
    without copying them (an unaligned one is copied first), so numpy-made results feed the
    next TF kernel for free."""
    dtype = np.dtype(dtype)
    n = int(math.prod(shape)) * dtype.itemsize
    buf = np.empty(n + ALIGN, np.uint8)
    off = (-buf.ctypes.data) % ALIGN
    return buf[off:off + n].view(dtype).reshape(shape)


def to_numpy(t) -> np.ndarray:
    """A TF result as a read-only numpy view of its buffer (no copy; `.numpy()` copies)."""
    return np.asarray(t)


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a shape."""
    return int(math.prod(shape))


def as_f32(x: np.ndarray) -> np.ndarray:
    """`x` as float32 (no copy when it already is)."""
    return x if x.dtype == np.float32 else x.astype(np.float32)


def is_float(x: np.ndarray) -> bool:
    """Whether `x` holds floating-point values (float16/bfloat16 included)."""
    return x.dtype.kind == "f" or x.dtype.name == "bfloat16"


def relu_limit(attrs: dict) -> float:
    """The `relu_limit` attr as a float (negative means no upper limit)."""
    v = attrs.get("relu_limit", -1.0)
    return -1.0 if v is None else float(v)


def post_relu(y: np.ndarray, attrs: dict, inplace: bool = False) -> np.ndarray:
    """Apply the fused `do_relu` / `relu_limit` of an op to its result (in place when the
    kernel owns `y`)."""
    if not attrs.get("do_relu", False):
        return y
    return relu(y, relu_limit(attrs), inplace)


def relu(y: np.ndarray, limit: float = -1.0, inplace: bool = False) -> np.ndarray:
    """max(y, 0), and min(.., limit) when limit >= 0."""
    out = y if inplace and y.flags.writeable and y.dtype.kind == "f" else None
    if limit >= 0:
        return np.clip(y, 0, limit, out=out).astype(y.dtype, copy=False)
    return np.maximum(y, 0, out=out).astype(y.dtype, copy=False)


def channels_last(attrs: dict) -> bool:
    """Whether a layout-sensitive op runs on NHWC (channels-last) data."""
    layout = attrs.get("layout", "NCHW") or "NCHW"
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be NCHW or NHWC, not {layout!r}")
    return layout == "NHWC"


def channel_axis(ndim: int, attrs: dict) -> int:
    """The channel axis of an `ndim`-rank tensor under the op's layout."""
    return ndim - 1 if channels_last(attrs) else 1


def spatial_axes(ndim: int, attrs: dict) -> list[int]:
    """The spatial axes of an `ndim`-rank tensor under the op's layout."""
    return list(range(1, ndim - 1)) if channels_last(attrs) else list(range(2, ndim))


def per_channel(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """Reshape a per-channel vector (any shape of C elements) to broadcast on `axis`."""
    shape = [1] * ndim
    shape[axis] = -1
    return np.reshape(v, shape)


def ints(attrs: dict, name: str, n: int, default: int) -> list[int]:
    """An int-list attr of length `n`, defaulting to `[default] * n` when absent or empty."""
    v = attrs.get(name)
    if v is None or len(v) == 0:
        return [default] * n
    v = [int(i) for i in v]
    if len(v) != n:
        raise ValueError(f"{name} has {len(v)} values, expected {n}")
    return v


def _fingerprint(arr: np.ndarray) -> bytes:
    """Up to 64 evenly spaced elements of `arr`: catches a weight rewritten in place."""
    flat = arr.reshape(-1)
    step = max(1, flat.size // 64)
    return flat[::step][:64].tobytes()


class IdentityCache:
    """Memo of a derived value per source array, keyed by identity (weights are constant).

    Weight arrays are re-laid-out once per array object, not once per call; an entry dies with
    its array, and a sample of the array's values is re-checked on every hit, so an array edited
    in place as a whole (e.g. `w *= s`) is re-derived; `clear()` forgets everything.
    """

    def __init__(self):
        self._store: dict[tuple, tuple] = {}

    def get(self, arr: np.ndarray, key: tuple, make: Callable[[], object]):
        k = (id(arr), arr.shape, arr.dtype.str, key)
        hit = self._store.get(k)
        if hit is not None and hit[0]() is arr and hit[1] == _fingerprint(arr):
            return hit[2]
        value = make()
        try:
            ref = weakref.ref(arr, lambda _r, k=k: self._store.pop(k, None))
        except TypeError:
            return value
        self._store[k] = (ref, _fingerprint(arr), value)
        return value

    def clear(self):
        self._store.clear()


WEIGHTS = IdentityCache()


def tf_epilogue(y, bias, fused_relu: float | None):
    """Add a bias constant (TF tensor broadcasting against `y`) and the fused relu in TF,
    then hand the result to numpy: one pass over the data in TF's threads, no numpy copies."""
    raw = tf().raw_ops
    if bias is not None:
        y = raw.AddV2(x=y, y=bias)
    if fused_relu is not None:
        if fused_relu < 0:
            y = raw.Relu(features=y)
        elif fused_relu == 6.0:
            y = raw.Relu6(features=y)
        else:
            y = raw.ClipByValue(t=y, clip_value_min=np.float32(0),
                                clip_value_max=np.float32(fused_relu))
    return to_numpy(y)


def bias_const(b, shape):
    """A bias vector as a cached TF constant of `shape` (broadcasting against the result)."""
    t = tf()
    return WEIGHTS.get(b, ("bias", tuple(shape)), lambda: t.constant(as_f32(b).reshape(shape)))
