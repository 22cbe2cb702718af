"""Index arithmetic of the space-to-depth (S2D) rewrite of a strided convolution.

For one spatial axis, a conv with kernel `k`, stride `s = m*b`, explicit pads `(pb, pe)` over an
input of size `H` becomes, after S2D with block `b`, a conv with kernel `K'/b`, stride `m`, VALID,
over the S2D input padded by `(begin, end)` (negative `end` crops). The kernel is zero-padded
`ph_top` before and `ph_bot` after so that every output reads exactly the original taps:

    ph_top = (-pb) mod b      ph_bot = (-(k + ph_top)) mod b      K' = k + ph_top + ph_bot
    begin  = (pb + ph_top) / b
    end    = (out - 1) * m + K'/b - begin - ceil(H / b)

The kernel gradient of the original conv is the slice `[ph_top : ph_top + k]` of the padded
kernel's gradient (TensorFlow's own pass slices at 0, which is wrong whenever ph_top > 0).

>>> plan = AxisPlan.from_padding(size=224, kernel=7, stride=2, block=2, padding="SAME")
>>> (plan.pads, plan.ph_top, plan.new_kernel, plan.begin, plan.end, plan.out)
((2, 3), 0, 4, 1, 2, 112)
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

from tftpu import geometry
from tftpu.geometry import AxisPlan  # noqa: F401  (the plan's arithmetic is shared with the TOP pass)


def same_pads(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TensorFlow's SAME padding (extra pixel at the end) for one axis."""
    return geometry.same_pads(size, kernel, stride, dilation)


def per_axis(block_size, leading: int = 0) -> tuple[int, ...]:
    """Blocks per spatial axis as given: an int blocks the last two axes (`leading` axes before
    them 1), a list or tuple of ints one each; () for anything else (a float, None, text), which
    the caller refuses with its own line."""
    if isinstance(block_size, numbers.Integral):
        return (1,) * leading + (int(block_size),) * 2
    if isinstance(block_size, (list, tuple)) and all(
            isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in block_size):
        return tuple(int(b) for b in block_size)
    return ()


def _tf():
    import tensorflow as tf

    return tf


def space_to_depth(x, blocks: Sequence[int]):
    """S2D of a channels-last tensor `[N, *spatial, C]` with one block per spatial axis.

    Channels come out ordered (r_1, ..., r_n, c), as `tf.nn.space_to_depth` for 2-D; a block of 1
    leaves its axis alone. The spatial sizes must be multiples of their blocks.
    """
    tf = _tf()
    blocks = list(blocks)
    if len(blocks) == 2 and blocks[0] == blocks[1]:
        return tf.nn.space_to_depth(x, blocks[0])
    shape = tf.shape(x)
    n = len(blocks)
    split = [shape[0]]
    for i, b in enumerate(blocks):
        split += [shape[1 + i] // b, b]
    split.append(shape[-1])
    y = tf.reshape(x, split)
    perm = [0] + [1 + 2 * i for i in range(n)] + [2 + 2 * i for i in range(n)] + [1 + 2 * n]
    y = tf.transpose(y, perm)
    merged = [shape[0]] + [shape[1 + i] // b for i, b in enumerate(blocks)] + [shape[-1] * math.prod(blocks)]
    return tf.reshape(y, merged)


def transform_kernel(kernel, plans: Sequence[AxisPlan]):
    """Original kernel `[*k, C, O]` -> S2D kernel `[*K'/b, C*prod(b), O]` (pad, reshape, transpose)."""
    tf = _tf()
    n = len(plans)
    kernel = tf.pad(kernel, [[p.ph_top, p.ph_bot] for p in plans] + [[0, 0], [0, 0]])
    c, o = kernel.shape[-2], kernel.shape[-1]
    split = []
    for p in plans:
        split += [p.new_kernel, p.block]
    y = tf.reshape(kernel, split + [c, o])
    perm = [2 * i for i in range(n)] + [2 * i + 1 for i in range(n)] + [2 * n, 2 * n + 1]
    y = tf.transpose(y, perm)
    return tf.reshape(y, [p.new_kernel for p in plans] + [c * math.prod(p.block for p in plans), o])


def untransform_kernel(s2d_kernel, plans: Sequence[AxisPlan], channels: int):
    """Inverse of `transform_kernel`, sliced back to the original kernel size.

    Applied to the gradient of the S2D kernel it gives the gradient of the original kernel.
    """
    tf = _tf()
    n = len(plans)
    o = s2d_kernel.shape[-1]
    y = tf.reshape(s2d_kernel, [p.new_kernel for p in plans] + [p.block for p in plans] + [channels, o])
    perm = []
    for i in range(n):
        perm += [i, n + i]
    y = tf.transpose(y, perm + [2 * n, 2 * n + 1])
    y = tf.reshape(y, [p.padded_kernel for p in plans] + [channels, o])
    begin = [p.ph_top for p in plans] + [0, 0]
    size = [p.kernel for p in plans] + [channels, o]
    return tf.slice(y, begin, size)


def pad_input(x, plans: Sequence[AxisPlan]):
    """Zero-pad a channels-last input `[N, *spatial, C]` so that each block divides its axis."""
    tf = _tf()
    if not any(p.size_pad for p in plans):
        return x
    return tf.pad(x, [[0, 0]] + [[0, p.size_pad] for p in plans] + [[0, 0]])


def pad_blocked(y, plans: Sequence[AxisPlan]):
    """Pad (or crop, where negative) the S2D input so a VALID conv reads the original taps."""
    tf = _tf()
    pads = [[0, 0]] + [[p.begin, max(p.end, 0)] for p in plans] + [[0, 0]]
    if any(b or e for b, e in pads):
        y = tf.pad(y, pads)
    if any(p.end < 0 for p in plans):
        sizes = [-1] + [p.begin + p.blocked_size + p.end for p in plans] + [-1]
        y = tf.slice(y, [0] * (len(plans) + 2), sizes)
    return y
