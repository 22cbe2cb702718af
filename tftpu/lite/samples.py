"""Representative data for `tftpu-convert --representative_data=DIR`: images or `.npz`/`.npy`
files read by `tftpu.quant.load_samples` against the source model's input shapes (batch 1)."""

from __future__ import annotations

from tftpu import errors


def input_shapes(converter) -> dict[str, tuple]:
    """Input name -> shape (an unknown batch taken as 1) of the converter's source model."""
    kind = converter._tftpu_source[0]
    if kind == "keras":
        tensors = list(converter._tftpu_source[1].inputs)
        shapes = {t.name: tuple(t.shape) for t in tensors}
    else:
        if kind == "saved_model":
            import tensorflow as tf

            _, path, keys, tags = converter._tftpu_source
            loaded = tf.saved_model.load(path, tags=tags)
            key = (keys or sorted(loaded.signatures))[0]
            fn = loaded.signatures[key]
        else:
            fn = converter._tftpu_source[1][0]
        specs = fn.structured_input_signature[1] or {}
        shapes = {n: tuple(specs[n].shape) for n in sorted(specs)}
    out = {}
    for name, shape in shapes.items():
        if any(d is None for d in shape[1:]):
            raise errors.ShapeError(f"input {name!r} has shape {list(shape)}: representative data needs fixed "
                                    f"dimensions other than the batch")
        out[name] = (1,) + tuple(int(d) for d in shape[1:])
    return out


def dataset(converter, directory, input_num=None, mean=None, scale=None, pixel_format="rgb"):
    """A `representative_dataset` callable over the files of `directory` (loaded once, checked)."""
    from tftpu.quant import load_samples

    shapes = input_shapes(converter)
    samples = load_samples(shapes, directory, input_num=input_num, mean=mean, scale=scale,
                           pixel_format=pixel_format)
    names = list(shapes)
    if converter._tftpu_source[0] == "keras" or len(names) == 1:
        return lambda: ([s[n] for n in names] for s in samples)
    return lambda: (dict(s) for s in samples)
