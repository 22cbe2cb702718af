"""Data layouts and memory formats: NCHW, NHWC, the chip's lane-blocked format, and reorders.

A *layout* is how a tensor's logical axes are ordered in memory; the convert-layout pass tracks
it as a permutation `perm` of the logical axes (physical axis i holds logical axis perm[i]).
A *memory format* adds what a chip does to the bytes: NCHW, NHWC, or `lane_blocked` (channels
spread over the NPU lanes, each lane's block aligned to the EU width), as in TPU-MLIR's local
memory. Changing format is an explicit `layout.Reorder` op, counted and costed.

>>> perm_between("NCHW", "NHWC", 4)
(0, 2, 3, 1)
>>> MemoryFormat.parse("lane_blocked:64:64").lanes
64
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Perm = tuple[int, ...]

# ---------------------------------------------------------------- permutations


def identity(rank: int) -> Perm:
    """The identity permutation of `rank` axes."""
    return tuple(range(rank))


def is_identity(perm) -> bool:
    return all(i == p for i, p in enumerate(perm))


def inverse(perm) -> Perm:
    """`inverse(p)[p[i]] == i`."""
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def compose(first, then) -> Perm:
    """The single transpose equal to transposing by `first`, then by `then`."""
    return tuple(first[t] for t in then)


def relative(src, dst) -> Perm:
    """The transpose order taking a tensor laid out as `src` to `dst` (both relative to logical)."""
    pos = inverse(src)
    return tuple(pos[d] for d in dst)


def apply_perm(shape, perm) -> tuple:
    """Shape after transposing by `perm`."""
    return tuple(shape[p] for p in perm)


def only_moves_ones(shape, order) -> bool:
    """True when transposing `shape` by `order` moves only size-1 axes: a copy-free reshape."""
    moved = [a for a in order if shape[a] != 1]
    return moved == sorted(moved)


def channels_last(rank: int) -> Perm:
    """NC... -> N...C, e.g. (0, 2, 3, 1) for rank 4."""
    return (0, *range(2, rank), 1)


def channels_first(rank: int) -> Perm:
    """N...C -> NC..., e.g. (0, 3, 1, 2) for rank 4."""
    return (0, rank - 1, *range(1, rank - 1))


DATA_LAYOUTS = ("NCHW", "NHWC")
KERNEL_LAYOUTS = ("OIHW", "HWIO")


def perm_between(src: str, dst: str, rank: int) -> Perm:
    """Transpose order from data (NCHW/NHWC) or kernel (OIHW/HWIO) layout `src` to `dst`."""
    if src == dst:
        return identity(rank)
    pair = (src, dst)
    if pair == ("NCHW", "NHWC"):
        return channels_last(rank)
    if pair == ("NHWC", "NCHW"):
        return channels_first(rank)
    if pair == ("OIHW", "HWIO"):
        return (*range(2, rank), 1, 0)
    if pair == ("HWIO", "OIHW"):
        return (rank - 1, rank - 2, *range(rank - 2))
    raise ValueError(f"no transpose from layout {src} to {dst}")


def layout_of(base: str, perm) -> str | None:
    """The data layout a tensor of layout `base` has after `perm`, or None if not NCHW/NHWC."""
    rank = len(perm)
    for name in DATA_LAYOUTS:
        if base in DATA_LAYOUTS and tuple(perm) == perm_between(base, name, rank):
            return name
    return None


def perm_name(perm) -> str:
    """A short name for a permutation, e.g. "0231"."""
    return "".join(str(p) if p < 10 else f"_{p}_" for p in perm)
