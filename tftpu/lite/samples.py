"""Representative data for `tftpu-convert --representative_data=DATA`: images, `.npz`/`.npy`
files or TFRecords streamed by `tftpu.quant.iter_samples` against the source model's input shapes
(batch 1), one sample in memory at a time."""

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


class Representative:
    """A `representative_dataset` callable over a `tftpu.quant.Samples` stream: each call reads
    the files again, one sample at a time (TensorFlow's calibrator makes one pass, tftpu's ranges
    another), with a progress bar. `samples` is the stream (its `skipped` files); `count` the
    samples the last full pass gave."""

    def __init__(self, samples, names: list[str], as_list: bool):
        self.samples, self.names, self.as_list = samples, names, as_list
        self.count = 0

    def __call__(self):
        from tftpu.utils.progress import progress

        self.count = 0
        for sample in progress(self.samples, desc="representative data", total=self.samples.total, unit="image"):
            self.count += 1
            yield [sample[n] for n in self.names] if self.as_list else dict(sample)


def dataset(converter, data, input_num=None, mean=None, scale=None, pixel_format="rgb",
            skip_unreadable=False) -> Representative:
    """A `representative_dataset` callable streaming `data` (a directory, a glob, a file or a
    TFRecord file; see `tftpu.quant.dataset`), its first `input_num` samples. The files are listed
    now; an unreadable one stops the conversion with a `ModelFileError` naming it, unless
    `skip_unreadable`."""
    from tftpu.quant.dataset import iter_samples

    shapes = input_shapes(converter)
    samples = iter_samples(shapes, data, input_num, mean, scale, pixel_format, skip_unreadable, what=str(data))
    names = list(shapes)
    return Representative(samples, names, converter._tftpu_source[0] == "keras" or len(names) == 1)
