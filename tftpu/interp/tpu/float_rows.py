"""Float window ops one output row at a time, global pools one image at a time.

A library's float kernel may sum in an order that depends on the shape of the call (oneDNN and
Eigen choose their blocking per shape, ISA and thread count), so an output row computed in a
slice of rows (the simulator's) and in the whole tensor (TPU inference) could differ in the last
place. Here a row is always the same call on the same values (the input rows its window reads and
the padding it reaches), whatever slice holds it: the two are bit-equal by construction.
"""

from __future__ import annotations

import numpy as np

from tftpu import geometry
from tftpu.interp.kernels._registry import aligned_empty, channels_last

ROW_OPS = ("top.Conv", "top.MaxPool", "top.AvgPool")        # sliced along H in layer groups
IMAGE_OPS = ("top.GlobalAvgPool", "top.GlobalMaxPool")     # sliced along N only


def _copy(x: np.ndarray) -> np.ndarray:
    """`x` in a fresh 64-byte-aligned buffer: every call sees its data laid out alike."""
    out = aligned_empty(x.shape, x.dtype)
    out[...] = x
    return out


def _sliceable(x, attrs) -> bool:
    """Whether an op may run on slices at all (layer groups take NCHW tensors of rank 3 or 4)."""
    return x is not None and x.ndim in (3, 4) and not channels_last(attrs)


def by_image(kernel, operands: list, attrs: dict) -> list:
    """`kernel` on each image (N slice of one) of the first operand, results joined along N."""
    x = operands[0]
    if not _sliceable(x, attrs):
        return kernel(operands, attrs)
    parts = [kernel([_copy(x[n:n + 1])] + list(operands[1:]), attrs) for n in range(x.shape[0])]
    if len(parts) == 1:
        return parts[0]
    return [np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))]


def by_rows(kernel, operands: list, attrs: dict) -> list:
    """`kernel` once per (image, output row): the input rows under that row's window, with the
    window's pad rows as the call's own top/bottom pads; results joined along N and H."""
    x = operands[0]
    if not _sliceable(x, attrs):
        return kernel(operands, attrs)
    if attrs.get("ceil_mode"):                  # layer groups slice ceil-mode pools by images only
        return by_image(kernel, operands, attrs)
    nsp = x.ndim - 2
    pads = list(attrs.get("pads") or [0] * (2 * nsp))
    k = int(attrs["kernel_shape"][0])
    s = int((attrs.get("strides") or [1])[0])
    d = int((attrs.get("dilations") or [1])[0])
    h = x.shape[2]
    span = geometry.span(k, d)
    rows = geometry.conv_out(h, k, s, d, pads[0], pads[nsp])
    images = []
    for n in range(x.shape[0]):
        outs = []
        for r in range(rows):
            start = r * s - pads[0]
            lo, hi = max(start, 0), min(start + span, h)
            p = list(pads)
            p[0], p[nsp] = lo - start, start + span - hi
            outs.append(kernel([_copy(x[n:n + 1, :, lo:hi])] + list(operands[1:]), {**attrs, "pads": p}))
        images.append([np.concatenate([o[i] for o in outs], axis=2) for i in range(len(outs[0]))])
    if len(images) == 1:
        return images[0]
    return [np.concatenate([im[i] for im in images]) for i in range(len(images[0]))]


def canonical(top_name: str, kernel):
    """`kernel` run the way every slicing agrees on (by rows or by images), or as it is."""
    if top_name in ROW_OPS:
        return lambda operands, attrs: by_rows(kernel, operands, attrs)
    if top_name in IMAGE_OPS:
        return lambda operands, attrs: by_image(kernel, operands, attrs)
    return kernel
