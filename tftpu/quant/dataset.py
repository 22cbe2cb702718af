"""Calibration inputs from a directory: `.npz` / `.npy` arrays, or images with preprocessing.

Files are taken in sorted name order (so the same directory gives the same table). An `.npz`
holds the model's inputs by name (or one array for a one-input model); an `.npy` one array.
Images (jpg, png, bmp) are decoded, resized to the input's H and W (bilinear) and turned into
`(pixel - mean) * scale` per channel, in RGB or BGR order, laid out as the input is (NCHW or
NHWC, told apart by which axis has 1 or 3 channels). Arrays missing the batch axis get it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tftpu.errors import InputError, ModelFileError, ShapeError, UsageError
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.utils.inputs import match_inputs
from tftpu.utils.npz import load_npz

__all__ = ["load_samples", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
_ARRAY_SUFFIXES = (".npz", ".npy")


def _input_shapes(model) -> dict[str, tuple]:
    return {op.loc: A.shape_of(op.output.type) for op in model.ops if isinstance(op, top.Input)}


def _fit(name: str, arr: np.ndarray, shape: tuple, where: Path) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.shape != tuple(shape) and arr.shape == tuple(shape[1:]) and shape and shape[0] == 1:
        arr = arr[None]
    if arr.shape != tuple(shape):
        raise ShapeError(f"{where}: input {name!r} has shape {list(arr.shape)}, the model wants {list(shape)}")
    return np.ascontiguousarray(arr.astype(np.float32) if arr.dtype.kind == "f" else arr)


def _channels(values, channels: int, what: str) -> np.ndarray:
    arr = np.asarray(values if values is not None else [], np.float32).reshape(-1)
    if arr.size in (0, 1):
        return np.full(channels, arr[0] if arr.size else (0.0 if what == "mean" else 1.0), np.float32)
    if arr.size != channels:
        raise UsageError(f"--{what} has {arr.size} values for {channels} channels")
    return arr


def _image(path: Path, shape: tuple, mean, scale, pixel_format: str) -> np.ndarray:
    import tensorflow as tf
    if len(shape) != 4 or shape[0] != 1 or not ({shape[1], shape[3]} & {1, 3}):
        raise ShapeError(f"{path}: images need a [1, C, H, W] or [1, H, W, C] input with 1 or 3 channels, "
                         f"the model's is {list(shape)}")
    nchw = shape[1] in (1, 3) and shape[3] not in (1, 3)
    c, (h, w) = (shape[1], shape[2:]) if nchw else (shape[3], shape[1:3])
    try:
        img = tf.io.decode_image(tf.io.read_file(str(path)), channels=3, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as exc:
        raise ModelFileError(path, f"not a readable image ({exc.message.splitlines()[0]})") from None
    img = tf.image.resize(tf.cast(img, tf.float32), (h, w), method="bilinear").numpy()
    if pixel_format == "bgr":
        img = img[..., ::-1]
    elif pixel_format == "gray" or c == 1:
        img = img @ np.float32([0.299, 0.587, 0.114])[:, None]
    img = (img - _channels(mean, c, "mean")) * _channels(scale, c, "scale")
    img = img.transpose(2, 0, 1) if nchw else img
    return np.ascontiguousarray(img[None], np.float32)


def load_samples(model, dataset, input_num: int | None = None, mean=None, scale=None,
                 pixel_format: str = "rgb") -> list[dict[str, np.ndarray]]:
    """Up to `input_num` input dicts for `model` (a TOP model, or a dict of input name -> shape,
    as `tftpu.lite` passes for a TFLite conversion) from the files of directory `dataset`."""
    if pixel_format not in ("rgb", "bgr", "gray"):
        raise UsageError(f"pixel_format {pixel_format!r}: expected rgb, bgr or gray")
    root = Path(dataset)
    if not root.is_dir():
        raise InputError(f"{root}: the dataset must be a directory of images or .npz/.npy files")
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES + _ARRAY_SUFFIXES)
    if input_num is not None:
        if input_num < 1:
            raise UsageError(f"input_num {input_num}: give at least 1")
        files = files[:input_num]
    if not files:
        raise InputError(f"{root}: no images or .npz/.npy files in the dataset directory")
    shapes = {n: tuple(s) for n, s in model.items()} if isinstance(model, dict) else _input_shapes(model)
    names = list(shapes)
    samples = []
    for path in files:
        suffix = path.suffix.lower()
        if suffix == ".npz":
            arrays = match_inputs(names, load_npz(path))
        elif suffix == ".npy":
            try:
                arrays = [np.load(path, allow_pickle=False)]
            except (ValueError, OSError) as exc:
                raise ModelFileError(path, f"not a readable .npy array ({exc})") from None
        else:
            if len(names) != 1:
                raise UsageError(f"{path}: images can feed one-input models only; {len(names)} inputs here")
            arrays = [_image(path, shapes[names[0]], mean, scale, pixel_format)]
        if len(arrays) != len(names):
            raise ShapeError(f"{path}: {len(arrays)} arrays for the model's {len(names)} inputs {names}")
        samples.append({n: _fit(n, a, shapes[n], path) for n, a in zip(names, arrays)})
    return samples
