"""Batched S2D sweep cases: many independent convs in one tf.function, one rewrite per group.

Each case is a function argument (the image) feeding one conv with its own kernel variable; the
function returns every conv output and every kernel gradient (of sum(conv * R), R fixed random).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Case:
    dims: int              # 2 or 3
    k: int
    s: int
    padding: str           # VALID, SAME, EXPLICIT, PAD (tf.pad then VALID)
    size: tuple            # spatial sizes
    batch: int
    channels: int
    out_channels: int
    pads: tuple = ()       # per spatial axis (begin, end) for EXPLICIT / PAD
    depth_stride: int = 0  # Conv3D: stride of D (0: same as H/W)

    def label(self):
        return (f"{self.dims}d k={self.k} s={self.s} {self.padding}{list(self.pads) if self.pads else ''} "
                f"size={self.size} n={self.batch} c={self.channels}")


def make_group(cases, seed=0):
    """(tf.function, its arguments, variables) computing all cases' outputs and kernel grads."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    xs, kernels, rs = [], [], []
    for c in cases:
        xs.append(rng.standard_normal((c.batch, *c.size, c.channels)).astype(np.float32))
        kshape = (c.k,) * c.dims + (c.channels, c.out_channels)
        kernels.append(tf.Variable(rng.standard_normal(kshape).astype(np.float32)))
        rs.append(None)

    def conv(c, x, w):
        if c.dims == 2:
            strides = [1, c.s, c.s, 1]
            if c.padding == "EXPLICIT":
                return tf.nn.conv2d(x, w, strides, [[0, 0], *map(list, c.pads), [0, 0]])
            if c.padding == "PAD":
                x = tf.pad(x, [[0, 0], *map(list, c.pads), [0, 0]])
                return tf.nn.conv2d(x, w, strides, "VALID")
            return tf.nn.conv2d(x, w, strides, c.padding)
        strides = [1, c.depth_stride or c.s, c.s, c.s, 1]
        if c.padding == "PAD":
            x = tf.pad(x, [[0, 0], *map(list, c.pads), [0, 0]])
            return tf.nn.conv3d(x, w, strides, "VALID")
        return tf.nn.conv3d(x, w, strides, c.padding)

    # fixed output cotangents, sized from an eager run of the original convs
    for i, c in enumerate(cases):
        shape = conv(c, tf.constant(xs[i]), kernels[i]).shape
        rs[i] = tf.constant(rng.standard_normal(shape).astype(np.float32))

    @tf.function
    def fn(*images):
        with tf.GradientTape() as tape:
            outs = [conv(c, x, w) for c, x, w in zip(cases, images, kernels)]
            loss = tf.add_n([tf.reduce_sum(o * r) for o, r in zip(outs, rs)])
        grads = tape.gradient(loss, kernels)
        return outs, grads

    fn.cotangents = [r.numpy() for r in rs]
    return fn, [tf.constant(x) for x in xs], kernels


def numpy_reference(case, x, w, r):
    """float64 conv output and kernel gradient of sum(conv * r), straight from the definition."""
    from numpy.lib.stride_tricks import sliding_window_view

    from tftpu.passes.s2d_geometry import same_pads

    strides = [case.s] * case.dims
    if case.dims == 3:
        strides[0] = case.depth_stride or case.s
    if case.padding == "SAME":
        pads = [same_pads(n, case.k, st) for n, st in zip(case.size, strides)]
    elif case.padding == "VALID":
        pads = [(0, 0)] * case.dims
    else:
        pads = list(case.pads)
    xp = np.pad(x.astype(np.float64), [(0, 0), *pads, (0, 0)])
    axes = tuple(range(1, 1 + case.dims))
    win = sliding_window_view(xp, (case.k,) * case.dims, axis=axes)
    win = win[(slice(None),) + tuple(slice(None, None, st) for st in strides)]
    win = win[(slice(None),) + tuple(slice(0, n) for n in r.shape[1:-1])]
    letters = "dhw"[-case.dims:]
    kl = "ijk"[: case.dims]
    spec_win = f"n{letters}c{kl}"
    out = np.einsum(f"{spec_win},{kl}co->n{letters}o", win, w.astype(np.float64))
    grad = np.einsum(f"{spec_win},n{letters}o->{kl}co", win, r.astype(np.float64))
    return out, grad


def sweep_2d():
    """k 1..8 x (s, b) in {(2,2), (4,2), (4,4)} x 4 padding forms x even/odd sizes."""
    cases = {2: [], 4: []}
    rng = np.random.default_rng(2)
    i = 0
    for k in range(1, 9):
        for s, b in ((2, 2), (4, 2), (4, 4)):
            for padding in ("VALID", "SAME", "EXPLICIT", "PAD"):
                for parity in (0, 1):
                    h = max(k, 6) + 2 * int(rng.integers(1, 4)) + parity
                    w = h + 2 * int(rng.integers(0, 2)) + (1 - parity) * int(rng.integers(0, 2))
                    pads = ()
                    if padding in ("EXPLICIT", "PAD"):
                        pads = tuple((int(rng.integers(0, 4)), int(rng.integers(0, 4))) for _ in range(2))
                    cases[b].append(Case(2, k, s, padding, (h, w), 1 + i % 3, 1 + i % 4, 2 + i % 3, pads))
                    i += 1
    return cases


def sweep_3d():
    """k 1..8 (sparser sizes) x (s, b) x VALID/SAME/PAD x parity; D blocked or not."""
    cases = {2: [], 4: []}
    rng = np.random.default_rng(3)
    i = 0
    for k in range(1, 9):
        for s, b in ((2, 2), (4, 2), (4, 4)):
            for padding in ("VALID", "SAME", "PAD"):
                parity = i % 2
                h = max(k, 5) + 1 + parity
                w = h + 1
                d = max(k, 4) + (1 - parity)
                pads = ()
                if padding == "PAD":
                    pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in range(3))
                depth_stride = s if i % 3 else 1
                cases[b].append(Case(3, k, s, padding, (d, h, w), 1 + i % 2, 1 + i % 3, 2, pads, depth_stride))
                i += 1
    return cases
