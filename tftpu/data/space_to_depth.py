"""Host-side space-to-depth (S2D) of images in a tf.data pipeline.

`space_to_depth(dataset, block_size=2)` appends one parallel `map` that turns the images of each
element (`[N, H, W, C]` batches or `[H, W, C]` images; alone, first in a tuple, or under a dict key)
into `[N, ceil(H/b), ceil(W/b), C*b*b]`: zero-padded at the end of H and W to a multiple of b,
then blocked with the channel order of `tf.nn.space_to_depth`. The input convention of
`tftpu.keras.space_to_depth` models.

Why it is fast: a plain S2D is a 6-D transpose whose inner dimension is 3 values, which costs a
cheap pipeline 50-70% of its throughput. Here the optional float conversion (`dtype`, per-channel
`scale` and `offset`), the zero padding, the S2D permutation and the device's input layout
(`layout="NCHW"`, or `"HWCN"`: the TPU "double transpose" layout, batch last) run as a single
pass over the batch that reads uint8 and writes the blocked float tensor. Two implementations:

- `"native"`: a C++ TensorFlow kernel (`kernels/space_to_depth_op.cc`, built once on first use,
  see `tftpu.utils.native`) that converts each source row with vectorised arithmetic and moves
  it as whole runs of b*C values. Square blocks, NHWC output, uint8 or float32 input. Results
  equal TensorFlow's `cast(x) * scale + offset` bit for bit.
- `"xla"`: one reshape and one transpose in one XLA-compiled function (one loop fusion; no pad
  when H and W are multiples of b). Every case, the fused device layouts included; the
  permuting loop is not vectorised, so on a realistic JPEG pipeline it costs 6-7% of the
  throughput where the kernel costs 2-3%. (A kernel writing NCHW measured slower than XLA:
  its 6-way de-interleave does not vectorise either.)

`implementation="auto"` (the default) takes the kernel where it applies and can be built, else
XLA. Other placements measured by `benchmarks/s2d_host_pipeline.py` cost more: a uint8 S2D per
image inside the parallel crop map (`tf.transpose` or `tf.nn.space_to_depth` move 1-byte
elements one at a time; a per-image XLA call pays its launch per image), or S2D of the float
batch (a second pass over 4x the bytes).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
from absl import logging

from tftpu.errors import ShapeError, UsageError
from tftpu.passes import s2d_geometry
from tftpu.utils import native

__all__ = ["space_to_depth", "transform", "native_transform", "LAYOUTS", "IMPLEMENTATIONS"]

# Output layout -> where the blocked channel axis goes, for batched images.
LAYOUTS = ("NHWC", "NCHW", "HWCN")
IMPLEMENTATIONS = ("auto", "native", "xla")
_KERNEL = Path(__file__).with_name("kernels") / "space_to_depth_op.cc"


def _tf():
    import tensorflow as tf

    return tf


def _blocks(block_size) -> tuple[int, ...]:
    blocks = s2d_geometry.per_axis(block_size)
    if len(blocks) not in (2, 3) or any(b < 1 for b in blocks) or max(blocks) < 2:
        raise UsageError(f"block_size {block_size!r}: give an int >= 2, or one positive int per "
                         f"spatial axis (2 for images, 3 for videos) with one >= 2")
    return blocks


_DTYPES = ("float32", "bfloat16", "float16", "float64", "uint8", "int8", "uint16", "int16", "int32", "int64")


def _as_dtype(dtype):
    """TensorFlow's dtype for `dtype` (a name or a dtype); UsageError naming it if there is none."""
    tf = _tf()
    try:
        out = tf.as_dtype(dtype)
    except (TypeError, ValueError, tf.errors.NotFoundError):
        out = None
    if out is None or out.name not in _DTYPES:
        raise UsageError(f"dtype {dtype!r}: expected one of {', '.join(_DTYPES)}") from None
    return out


def _channel_constant(value, channels: int, name: str):
    """A scalar, or one value per channel (applied before blocking, so never tiled)."""
    try:
        arr = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        raise UsageError(f"{name} {value!r}: expected a number or one number per channel") from None
    if not np.isfinite(arr).all():
        raise UsageError(f"{name} {value!r}: must be finite")
    if arr.size == 1:
        return arr.reshape(())
    if arr.ndim != 1 or arr.size != channels:
        raise ShapeError(f"{name} of shape {arr.shape}: expected a scalar or {channels} per-channel values")
    return arr


def transform(images, block_size=2, *, layout: str = "NHWC", dtype=None, scale=None, offset=None,
              batched: bool | None = None):
    """S2D of an image tensor, with the optional float conversion and output layout, in TF ops.

    `images`: `[N, *spatial, C]` (batched) or `[*spatial, C]`; spatial is (H, W), or (D, H, W)
    with a 3-tuple `block_size`. Result (batched, 2-D): NHWC `[N, H', W', C*b*b]`, NCHW
    `[N, C*b*b, H', W']`, HWCN `[H', W', C*b*b, N]` with `H' = ceil(H/b)`. `dtype`, `scale` and
    `offset` give `cast(x, dtype) * scale + offset` (per-channel values allowed); the padding is
    zero in the output, after the conversion. Call it inside `tf.function(jit_compile=True)` to
    get one fused pass (as `space_to_depth` does); XLA then computes `x * scale + offset` as one
    FMA, which can differ from TF's two roundings by an ulp of `x * scale`.
    """
    tf = _tf()
    blocks = _blocks(block_size)
    n = len(blocks)
    images = tf.convert_to_tensor(images)
    rank = images.shape.rank
    if batched is None:
        batched = rank == n + 2
    if rank != n + 1 + int(batched):
        raise ShapeError(f"images of shape {images.shape}: expected rank {n + 1 + int(batched)} "
                         f"({'batched' if batched else 'unbatched'}, {n} spatial axes)")
    if layout not in LAYOUTS:
        raise UsageError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if layout != "NHWC" and n != 2:
        raise UsageError(f"layout {layout!r} is for 2-D images; 3-D blocks give NDHWC only")
    if layout == "HWCN" and not batched:
        raise UsageError("layout 'HWCN' puts the batch last: batch the dataset first")
    x = images if batched else images[None]
    channels = x.shape[-1]
    if channels is None:
        raise ShapeError(f"images of shape {images.shape}: the channel count must be known")
    if dtype is not None or scale is not None or offset is not None:
        out_dtype = _as_dtype(dtype) if dtype is not None else x.dtype
        if not out_dtype.is_floating and (scale is not None or offset is not None):
            raise UsageError(f"scale/offset need a floating dtype, got {out_dtype.name}")
        x = tf.cast(x, out_dtype)
        if scale is not None:
            x = x * tf.constant(_channel_constant(scale, channels, "scale"), out_dtype)
        if offset is not None:
            x = x + tf.constant(_channel_constant(offset, channels, "offset"), out_dtype)
    static = x.shape[1:-1]
    dyn = tf.shape(x)
    sizes = [static[i] if static[i] is not None else dyn[1 + i] for i in range(n)]
    pads = [(-s) % b for s, b in zip(sizes, blocks)]
    if any(not isinstance(p, int) or p for p in pads):
        x = tf.pad(x, [[0, 0]] + [[0, p] for p in pads] + [[0, 0]])
    blocked = [(s + p) // b for s, p, b in zip(sizes, pads, blocks)]
    split = [-1]
    for hb, b in zip(blocked, blocks):
        split += [hb, b]
    x = tf.reshape(x, split + [channels])
    # axes of the split tensor: 0 = N, 1 + 2i = blocked axis i, 2 + 2i = offset in block i, last = C
    outer = [1 + 2 * i for i in range(n)]
    inner = [2 + 2 * i for i in range(n)] + [2 * n + 1]
    perm = {"NHWC": [0] + outer + inner, "NCHW": [0] + inner + outer,
            "HWCN": outer + inner + [0]}[layout]
    x = tf.transpose(x, perm)
    depth = channels * math.prod(blocks)
    shape = {"NHWC": [-1] + blocked + [depth], "NCHW": [-1, depth] + blocked,
             "HWCN": blocked + [depth, -1]}[layout]
    x = tf.reshape(x, shape)
    return x if batched else x[0]


@functools.cache
def _native_ops():
    """(op module, None), or (None, why the kernel cannot be had); tried once per process."""
    try:
        return native.load_op_library(_KERNEL), None
    except native.NativeKernelError as exc:
        return None, str(exc)


def _native_unsupported(shape, in_dtype, blocks, layout, dtype, scale, offset) -> str | None:
    """Why the native kernel does not cover this case, or None if it does."""
    tf = _tf()
    out_dtype = _as_dtype(dtype) if dtype is not None else in_dtype
    if len(blocks) != 2 or blocks[0] != blocks[1]:
        return f"block {blocks}: the kernel takes square 2-D blocks"
    if layout != "NHWC":
        return f"layout {layout}: the kernel writes NHWC (XLA fuses the device layouts)"
    if in_dtype not in (tf.uint8, tf.float32):
        return f"{in_dtype.name} images: the kernel reads uint8 or float32"
    if out_dtype != tf.float32 and not (out_dtype == in_dtype and scale is None and offset is None):
        return f"{in_dtype.name} to {out_dtype.name}: the kernel converts to float32 only"
    if shape[-1] is None:
        return "unknown channel count"
    return None


def native_transform(images, block_size=2, *, dtype=None, scale=None, offset=None, parallel: bool = True):
    """`transform` to NHWC by the native kernel (square blocks; uint8/float32 to float32, or copies).

    Bit-equal to `transform` run by TensorFlow without XLA. `parallel` splits one batch over
    TensorFlow's intra-op threads; a parallel `tf.data` map turns it off (its calls already run
    side by side, and measured a little faster that way). Raises UsageError for a case the
    kernel does not cover and `tftpu.utils.native.NativeKernelError` if it cannot be built.
    """
    tf = _tf()
    blocks = _blocks(block_size)
    images = tf.convert_to_tensor(images)
    if images.shape.rank not in (3, 4):
        raise ShapeError(f"images of shape {images.shape}: expected [N, H, W, C] or [H, W, C]")
    reason = _native_unsupported(images.shape, images.dtype, blocks, "NHWC", dtype, scale, offset)
    if reason:
        raise UsageError(f"native space-to-depth: {reason}; use implementation='xla'")
    ops, why = _native_ops()
    if ops is None:
        raise native.NativeKernelError(why)
    channels = images.shape[-1]
    out_dtype = _as_dtype(dtype) if dtype is not None else images.dtype
    constants = [np.zeros([0], np.float32) if v is None else
                 np.asarray(_channel_constant(v, channels, name), np.float32).reshape([-1])
                 for v, name in ((scale, "scale"), (offset, "offset"))]
    batched = images.shape.rank == 4
    x = images if batched else images[None]
    x = ops.tftpu_space_to_depth(x, *constants, block_size=blocks[0], out_type=out_dtype, parallel=parallel)
    return x if batched else x[0]


def _choose(implementation, spec, blocks, layout, dtype, scale, offset) -> str:
    if implementation not in IMPLEMENTATIONS:
        raise UsageError(f"implementation {implementation!r}: expected one of {', '.join(IMPLEMENTATIONS)}")
    if implementation == "xla":
        return "xla"
    reason = _native_unsupported(spec.shape, spec.dtype, blocks, layout, dtype, scale, offset)
    if reason is None:
        ops, reason = _native_ops()
        if ops is None:
            if implementation == "native":
                raise native.NativeKernelError(reason)
            logging.warning("tftpu.data.space_to_depth falls back to XLA (slower): %s", reason)
            return "xla"
    elif implementation == "native":
        raise UsageError(f"native space-to-depth: {reason}; use implementation='xla'")
    if reason is None:
        return "native"
    logging.info("tftpu.data.space_to_depth runs on XLA: %s", reason)
    return "xla"


def _locate(spec, image_key):
    """(getter, setter) of the image component of a dataset element."""
    tf = _tf()
    if isinstance(spec, tf.TensorSpec):
        if image_key is not None:
            raise UsageError(f"image_key={image_key!r} given, but the elements are single tensors")
        return spec, (lambda e: e), (lambda e, x: x)
    if isinstance(spec, dict):
        keys = [image_key] if image_key is not None else [k for k in ("image", "images") if k in spec]
        if len(keys) != 1 or keys[0] not in spec:
            raise UsageError(f"elements are dicts with keys {sorted(spec)}: pass image_key= to name the images")
        key = keys[0]
        return spec[key], (lambda e: e[key]), (lambda e, x: {**e, key: x})
    if isinstance(spec, (tuple, list)):
        index = 0 if image_key is None else image_key
        if not isinstance(index, int) or not 0 <= index < len(spec):
            raise UsageError(f"image_key={image_key!r}: elements are tuples of {len(spec)}")
        return spec[index], (lambda e: e[index]), (lambda e, x: type(e)(
            x if i == index else v for i, v in enumerate(e)))
    raise UsageError(f"dataset elements of type {type(spec).__name__}: expected a tensor, a tuple or a dict")


def space_to_depth(dataset, block_size=2, *, layout: str = "NHWC", dtype=None, scale=None, offset=None,
                   image_key=None, implementation: str = "auto", jit_compile: bool | None = None,
                   num_parallel_calls=None, deterministic=None):
    """`dataset` with its images turned into S2D input (see `transform`) by one parallel `map`.

    Elements: images, `(images, labels, ...)` (images first, or at `image_key`), or a dict with
    key "image"/"images" (or `image_key`); batched `[N, H, W, C]` or unbatched `[H, W, C]`.
    Put it after `batch()` and pass the float conversion here (`dtype=tf.float32, scale=1/255`)
    so it fuses with the permutation. `implementation`: "auto" (the native kernel where it
    applies, NHWC output, else XLA), "native" or "xla". On the XLA path `jit_compile` (default: when H and W
    are static) compiles the transform into one pass. `num_parallel_calls` defaults to AUTOTUNE.

    >>> ds = tf.data.Dataset.from_tensor_slices(images).batch(32)  # doctest: +SKIP
    >>> ds = tftpu.data.space_to_depth(ds, 2, dtype="float32", scale=1 / 255)  # doctest: +SKIP
    """
    tf = _tf()
    blocks = _blocks(block_size)
    if not isinstance(dataset, tf.data.Dataset):
        raise UsageError(f"tftpu.data.space_to_depth takes a tf.data.Dataset, not {type(dataset).__name__}")
    if num_parallel_calls is not None and num_parallel_calls != tf.data.AUTOTUNE and (
            isinstance(num_parallel_calls, bool) or not isinstance(num_parallel_calls, int) or num_parallel_calls < 1):
        raise UsageError(f"num_parallel_calls {num_parallel_calls!r}: expected a count >= 1 or tf.data.AUTOTUNE")
    spec, get, put = _locate(dataset.element_spec, image_key)
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
        raise ShapeError(f"images {spec}: the rank must be known")
    n = len(blocks)
    if spec.shape.rank not in (n + 1, n + 2):
        raise ShapeError(f"images of shape {spec.shape}: expected [N, *spatial, C] or [*spatial, C] "
                         f"with {n} spatial axes")
    batched = spec.shape.rank == n + 2
    if jit_compile is None:
        jit_compile = spec.shape[-n - 1:].is_fully_defined()

    def blocked(images):
        return transform(images, blocks, layout=layout, dtype=dtype, scale=scale, offset=offset,
                         batched=batched)

    # Validate the arguments now, with one clear error, not inside the map's trace.
    transform(tf.zeros([1 if d is None else d for d in spec.shape], spec.dtype), blocks, layout=layout,
              dtype=dtype, scale=scale, offset=offset, batched=batched)
    if _choose(implementation, spec, blocks, layout, dtype, scale, offset) == "native":
        def fn(images):
            return native_transform(images, blocks, dtype=dtype, scale=scale, offset=offset,
                                    parallel=num_parallel_calls == 1)
    else:
        fn = tf.function(blocked, jit_compile=True) if jit_compile else blocked

    if isinstance(dataset.element_spec, (tuple, list)):
        mapper = lambda *e: put(tuple(e), fn(get(e)))  # noqa: E731
    else:
        mapper = lambda e: put(e, fn(get(e)))  # noqa: E731
    return dataset.map(mapper, num_parallel_calls=tf.data.AUTOTUNE if num_parallel_calls is None
                       else num_parallel_calls, deterministic=deterministic)
