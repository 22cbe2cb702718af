"""Values while lowering a TOP module into a TF graph: each TOP tensor as a TF tensor stored in
some axis order (kept channels-last between NCHW ops), and the graph constants.

The state of one trace (which constants become captured tensors, the shared zero-bias
Variables) is a `Tracing` object held in a context variable for the duration of the trace, so
nothing at module level changes while a model is being lowered.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import numpy as np

NHWC = (0, 2, 3, 1)  # physical = transpose(logical NCHW, NHWC)


@dataclasses.dataclass
class Tracing:
    """What one trace of a model needs: constants of at least `capture_min_bytes` become
    captured eager tensors (not GraphDef constants); zero biases read shared Variables."""

    capture_min_bytes: int = 1 << 62
    zero_vars: dict = dataclasses.field(default_factory=dict)    # length -> zeros Variable (kept across traces)
    reads: dict = dataclasses.field(default_factory=dict)        # length -> its read in this trace


_TRACING: contextvars.ContextVar = contextvars.ContextVar("tftpu_compiled_tracing", default=None)


@contextlib.contextmanager
def tracing(state: Tracing):
    """Make `state` the current trace's state inside the block."""
    token = _TRACING.set(state)
    try:
        yield state
    finally:
        _TRACING.reset(token)


class NotLowered(Exception):
    """This op (with these attributes) has no TF lowering: run its numpy kernel instead."""


def _tf():
    import tensorflow

    return tensorflow


class Val:
    """A lowered value: its TF tensor `t`, stored as `transpose(logical, perm)` (perm None:
    logical order), its logical shape, and its numpy array when it is a constant."""

    __slots__ = ("_t", "perm", "shape", "np")

    def __init__(self, t, perm=None, shape=None, const=None):
        self._t, self.perm, self.np = t, perm, const
        self.shape = tuple(shape) if shape is not None else tuple(t.shape)

    @property
    def t(self):
        if self._t is None:  # a constant made into a tensor only where an op needs it whole
            self._t = const(self.np)
        return self._t


def _inv(p):
    return tuple(int(i) for i in np.argsort(p))


def _compose(a, b):
    """Permutation of `transpose(transpose(x, a), b)`."""
    return tuple(a[i] for i in b)


def transposed(v: Val, perm) -> object:
    """`v`'s tensor stored as `transpose(logical, perm)` (perm None: logical order)."""
    t = _tf()
    cur = v.perm or tuple(range(len(v.shape)))
    want = perm or tuple(range(len(v.shape)))
    if cur == want:
        return v.t
    rel = _compose(_inv(cur), want)
    if v.np is not None:
        return const(np.ascontiguousarray(np.transpose(v.np, want)))
    return t.transpose(v.t, rel)


def const(arr):
    """A constant of the graph: a Const node, or (`capture_weights`) for a big array an eager
    tensor the graph captures, not copied into the GraphDef (which is slow to optimise)."""
    t = _tf()
    arr = np.asarray(arr)
    state = _TRACING.get()
    if state is not None and arr.nbytes >= state.capture_min_bytes:
        with t.init_scope():
            return t.constant(arr)
    return t.constant(arr)


def pad(x, widths, value=0):
    """`tf.pad(x, widths, constant_values=value)` emitted as a PadV2 op, never a Pad op.

    TF's oneDNN graph pass merges a `Pad` into a Conv2D/_FusedConv2D it feeds
    (MklLayoutRewritePass::MergePadWithConv2D) without checking that it feeds the conv's input
    (slot 0). A Pad that is the residual operand of a remapper-fused Conv2D + BiasAdd + Add
    (+ Relu) -- a channel-padded skip connection, as in BlazeFace -- is merged as if it padded the
    conv's input: the merged node convolves the Pad's input and keeps an edge from the deleted
    Pad node, and the pass crashes the process (SIGSEGV in FillInputs) or runs a wrong graph.
    The pass merges only op type `Pad`; PadV2 runs the same kernel."""
    t = _tf()
    w = np.asarray(widths, np.int32).reshape(-1, 2)
    v = np.asarray(value).astype(x.dtype.as_numpy_dtype)
    return t.raw_ops.PadV2(input=x, paddings=t.constant(w), constant_values=t.constant(v))


def onednn_fusions() -> bool:
    """Whether TF runs its oneDNN ops here, and so its remapper fuses DepthwiseConv2dNative (not
    only Conv2D) + BiasAdd + Relu6/Add: TF turns oneDNN on by default only on CPUs with AVX512_VNNI,
    AVX512_BF16, AVX_VNNI or AMX (`TF_ENABLE_ONEDNN_OPTS` overrides); the remapper asks the same."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def conv_bias(arr):
    """A conv's bias for `tf.nn.bias_add`. All zeros (or absent: `arr` an int length), it is
    read from a zeros Variable: grappler folds away a BiasAdd of constant zeros, and without
    it the remapper cannot fuse Conv2D/DepthwiseConv2dNative + BiasAdd + Relu6/Add into one
    kernel (MobileNetV2 with BN folded into zero biases runs faster fused)."""
    t = _tf()
    if not isinstance(arr, (int, np.integer)) and arr.any():
        return const(arr)
    n = int(arr) if isinstance(arr, (int, np.integer)) else arr.shape[0]
    state = _TRACING.get()
    if state is None:  # not tracing a CompiledTop
        return const(np.zeros([n], np.float32))
    if n not in state.reads:
        if n not in state.zero_vars:
            with t.init_scope():
                state.zero_vars[n] = t.Variable(np.zeros([n], np.float32), trainable=False)
        state.reads[n] = state.zero_vars[n].read_value()
    return state.reads[n]


def logical(v: Val):
    """`v`'s tensor in logical axis order."""
    return transposed(v, None)


def f32(x):
    """A float tensor as float32 (kernels compute floats in float32)."""
    t = _tf()
    return x if x.dtype == t.float32 or not x.dtype.is_floating else t.cast(x, t.float32)


def _relu(y, limit):
    t = _tf()
    if limit is None:
        return y
    if limit < 0:
        return t.nn.relu(y)
    if limit == 6.0:
        return t.nn.relu6(y)
    return t.clip_by_value(y, np.float32(0), np.float32(limit))


def fused_relu(attrs):
    """None when no fused relu, else its limit (< 0 for none)."""
    if not attrs.get("do_relu", False):
        return None
    v = attrs.get("relu_limit", -1.0)
    return -1.0 if v is None else float(v)


def _ints(attrs, name, n, default):
    v = attrs.get(name)
    if v is None or len(v) == 0:
        return [default] * n
    if len(v) != n:
        raise NotLowered(f"{name} has {len(v)} values")
    return [int(i) for i in v]


def _nhwc_attr(attrs) -> bool:
    lay = attrs.get("layout", "NCHW") or "NCHW"
    if lay not in ("NCHW", "NHWC"):
        raise NotLowered(lay)
    return lay == "NHWC"


def _channels_last_input(x: Val, attrs):
    """(NHWC tensor, perm of the result) for a 2-D spatial op on `x`: NCHW ops read and write
    their data channels-last (result stored with perm NHWC); NHWC ops use it as is."""
    if _nhwc_attr(attrs):
        return logical(x), None
    return transposed(x, NHWC), NHWC
