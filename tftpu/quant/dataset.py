"""Calibration and evaluation inputs, read lazily: one sample in memory at a time.

`iter_samples(model, dataset)` is a re-iterable stream of input dicts (`Samples`);
`load_samples` is the same stream read into a list. `dataset` may be:

- a **directory**: its files in sorted name order (the same directory gives the same table);
- a **glob** (`"photos/*.jpg"`, `"data/**/*.png"`, recursive): the matching files, sorted;
- a **file**: an image, an `.npz` / `.npy`, or a TFRecord file (`.tfrecord`, `.tfrecords`, `.tfr`,
  GZIP-compressed with a further `.gz`);
- a **`tf.data.Dataset`**: its elements in order (a `(features, label)` pair gives its features);
- what `tftpu.compile` always took: a dict of arrays (one sample, or a batch along a new first
  axis), an array (one-input models), or a list / iterable of those (or of file paths).

Files by kind: an `.npz` holds the model's inputs by name (or one array for a one-input model),
an `.npy` one array; images (jpg, png, bmp) are decoded, resized to the input's H and W
(bilinear) and turned into `(pixel - mean) * scale` per channel, in RGB, BGR or grey order, laid
out as the input is (NCHW or NHWC, told apart by which axis has 1 or 3 channels). An array that
lacks the batch axis gets it; one with a further leading axis is a batch of samples.

TFRecords hold one `tf.train.Example` per record, in one of two conventions:

- **encoded images**: a bytes feature `image/encoded` (the key of the TF Object Detection API and
  TFDS) holding a JPEG / PNG / BMP file, preprocessed as image files are;
- **tensors**: one feature per model input, keyed by the input's name (a one-input model also
  takes an Example of a single feature under any key): a bytes feature holding one
  `tf.io.serialize_tensor(x)` (dtype and shape kept), or a float / int64 feature of the flat
  values (reshaped to the input's shape).

A `tf.data.Dataset` element is a dict by input name, a tensor (one-input models), or a string
tensor of encoded image bytes (`tf.data.Dataset.list_files(...).map(tf.io.read_file)`).

A file that cannot be read (a broken image, a truncated `.npz`, a corrupt TFRecord) stops the
stream with a `ModelFileError` naming it, unless `skip_unreadable=True`: then it is logged as a
warning, listed in `Samples.skipped`, and the stream goes on (a corrupt TFRecord skips the rest of
that file). Inputs of the wrong shape are always errors. Memory stays bounded: only the file names
of a directory or glob are listed up front, each sample is decoded when it is reached, and a
`tf.data.Dataset` is iterated, never materialised.

>>> stream = iter_samples(model, "val/*.jpg", mean=127.5, scale=1 / 127.5)   # doctest: +SKIP
>>> table = tftpu.quant.calibrate(model, stream)                            # doctest: +SKIP
>>> for name, sample in stream.items(): ...                                  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import itertools
import logging
from pathlib import Path
from typing import Iterator

import numpy as np

from tftpu.errors import InputError, ModelFileError, ShapeError, UsageError
from tftpu.ir import attrs as A
from tftpu.ir import top
from tftpu.utils.inputs import match_inputs, numeric
from tftpu.utils.npz import load_npz

__all__ = ["load_samples", "iter_samples", "stream_spec", "Samples", "IMAGE_SUFFIXES", "ARRAY_SUFFIXES",
           "TFRECORD_SUFFIXES", "IMAGE_FEATURE"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
ARRAY_SUFFIXES = (".npz", ".npy")
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")
IMAGE_FEATURE = "image/encoded"
_GLOB_CHARS = "*?["
_LOG = logging.getLogger("tftpu.dataset")


def _input_specs(model) -> dict[str, tuple[tuple, np.dtype | None]]:
    """Input name -> (shape, dtype) of a TOP model, or of a dict name -> shape (dtype unknown)."""
    if isinstance(model, dict):
        return {n: (tuple(s), None) for n, s in model.items()}
    return {op.loc: (A.shape_of(op.output.type), A.numpy_dtype(A.dtype_name(op.output.type.element_type)))
            for op in model.ops if isinstance(op, top.Input)}


def _suffix(path: Path) -> str:
    """The kind-defining suffix: `.tfrecord` for `x.tfrecord.gz` too."""
    s = path.suffix.lower()
    return Path(path.stem).suffix.lower() if s == ".gz" else s


def _known(path: Path) -> bool:
    return _suffix(path) in IMAGE_SUFFIXES + ARRAY_SUFFIXES + TFRECORD_SUFFIXES and \
        (path.suffix.lower() != ".gz" or _suffix(path) in TFRECORD_SUFFIXES)


def _channels(values, channels: int, what: str) -> np.ndarray:
    arr = np.asarray(values if values is not None else [], np.float32).reshape(-1)
    if arr.size in (0, 1):
        return np.full(channels, arr[0] if arr.size else (0.0 if what == "mean" else 1.0), np.float32)
    if arr.size != channels:
        raise UsageError(f"--{what} has {arr.size} values for {channels} channels")
    return arr


class _Preprocess:
    """How images become inputs: mean, scale and channel order (checked once)."""

    def __init__(self, mean, scale, pixel_format: str):
        if pixel_format not in ("rgb", "bgr", "gray"):
            raise UsageError(f"pixel_format {pixel_format!r}: expected rgb, bgr or gray")
        for what, values in (("mean", mean), ("scale", scale)):
            try:
                arr = np.asarray(values if values is not None else [], np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise UsageError(f"--{what} {values!r}: expected numbers, one or one per channel") from None
            if not np.all(np.isfinite(arr)) or what == "scale" and np.any(arr == 0):
                raise UsageError(f"--{what} {arr.tolist()}: expected finite numbers"
                                 + (", none 0 (a scale of 0 makes every input 0)" if what == "scale" else ""))
        self.mean, self.scale, self.pixel_format = mean, scale, pixel_format

    def image(self, data, shape: tuple, where: str) -> np.ndarray:
        """The encoded image `data` (bytes, or a path to read) as one input of `shape`."""
        import tensorflow as tf
        if len(shape) != 4 or shape[0] != 1 or not ({shape[1], shape[3]} & {1, 3}):
            raise ShapeError(f"{where}: images need a [1, C, H, W] or [1, H, W, C] input with 1 or 3 channels, "
                             f"the model's is {list(shape)}")
        nchw = shape[1] in (1, 3) and shape[3] not in (1, 3)
        c, (h, w) = (shape[1], shape[2:]) if nchw else (shape[3], shape[1:3])
        try:
            raw = tf.io.read_file(str(data)) if isinstance(data, Path) else tf.constant(data)
            img = tf.io.decode_image(raw, channels=3, expand_animations=False)
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, tf.errors.PermissionDeniedError) as exc:
            raise ModelFileError(where, f"not a readable image ({exc.message.splitlines()[0]})") from None
        img = tf.image.resize(tf.cast(img, tf.float32), (h, w), method="bilinear").numpy()
        if self.pixel_format == "bgr":
            img = img[..., ::-1]
        elif self.pixel_format == "gray" or c == 1:
            img = img @ np.float32([0.299, 0.587, 0.114])[:, None]
        img = (img - _channels(self.mean, c, "mean")) * _channels(self.scale, c, "scale")
        img = img.transpose(2, 0, 1) if nchw else img
        return np.ascontiguousarray(img[None], np.float32)


class Samples:
    """A lazy, re-iterable stream of input dicts for one model (see the module doc).

    Iterating yields input dicts; `items()` yields (name, input dict) with a name that says where
    the sample came from (a file, `file.tfrecord#7`, `dataset[3]`). `total` is the number of
    samples when it is known without reading them (files, lists, `input_num`), else None.
    `skipped` lists the unreadable files passed over on the last pass (`skip_unreadable`); each is
    logged once, on the first pass that meets it.
    A generator or iterator given as `dataset` can be read once only.
    """

    def __init__(self, model, dataset, input_num: int | None = None, mean=None, scale=None,
                 pixel_format: str = "rgb", skip_unreadable: bool = False, what: str = "dataset"):
        self.specs = _input_specs(model)
        self.names = list(self.specs)
        self.pre = _Preprocess(mean, scale, pixel_format)
        if input_num is not None and (isinstance(input_num, bool) or not isinstance(input_num, (int, np.integer))
                                      or input_num < 1):
            raise UsageError(f"input_num {input_num!r}: give a count of at least 1")
        self.input_num = input_num
        self.skip_unreadable = skip_unreadable
        self.what = what
        self.skipped: list[str] = []
        self._warned: set[str] = set()       # files whose skip was logged (once, not on every pass)
        self._once = False
        self._used = False
        self._resume = None          # (samples read by `head`, the pass they began)
        self._shard: tuple[int, int] | None = None       # (this worker, workers): `shard`
        self._args = (dataset, input_num, mean, scale, pixel_format, skip_unreadable, what)
        self._source, count = self._open(dataset)
        self.total = input_num if count is None else count if input_num is None else min(count, input_num)

    # -- sources ---------------------------------------------------------------------------------
    def _open(self, data):
        """(a callable giving a fresh iterator of (name, item) pairs, the count when known)."""
        if isinstance(data, (str, Path)):
            files = self._files(data)
            count = None if any(_suffix(p) in TFRECORD_SUFFIXES for p in files) else len(files)
            return (lambda: self._file_items(files)), count
        if _is_tf_dataset(data):
            return (lambda: self._tf_items(data)), _cardinality(data)
        if isinstance(data, (dict, np.ndarray)) or hasattr(data, "numpy"):
            return (lambda: iter([(self.what, data)])), None
        if isinstance(data, (list, tuple)):
            if not data:
                raise InputError(f"{self.what}: no samples")
            count = len(data) if all(isinstance(x, (str, Path)) and _suffix(Path(x)) not in TFRECORD_SUFFIXES
                                     for x in data) else None
            return (lambda: ((f"{self.what}[{i}]", x) for i, x in enumerate(data))), count
        try:
            it = iter(data)
        except TypeError:
            raise UsageError(f"{self.what}: expected a directory, a glob, a TFRecord file, a tf.data.Dataset, a dict "
                             f"of arrays, an array or a list of them, not {type(data).__name__}") from None
        if it is data:                   # a generator or iterator: one pass only
            self._once = True
        return (lambda: ((f"{self.what}[{i}]", x) for i, x in enumerate(it if it is data else iter(data)))), None

    def _files(self, data) -> list[Path]:
        text = str(data)
        root = Path(data)
        if root.is_dir():
            files = sorted(p for p in root.iterdir() if p.is_file() and _known(p))
            if not files:
                raise InputError(f"{root}: no images, .npz/.npy or TFRecord files in the dataset directory")
            return files
        if root.is_file():
            if not _known(root):
                raise InputError(f"{root}: not an image, .npz/.npy or TFRecord file (by its suffix)")
            return [root]
        if any(ch in text for ch in _GLOB_CHARS):
            files = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file() and _known(Path(p)))
            if not files:
                raise InputError(f"{text}: the glob matches no images, .npz/.npy or TFRecord files")
            return files
        raise InputError(f"{root}: no such dataset: give a directory, a glob, a file or a TFRecord file")

    def _file_items(self, files: list[Path]):
        for path in files:
            if _suffix(path) in TFRECORD_SUFFIXES:
                yield from self._records(path)
            else:
                yield str(path), path

    def _records(self, path: Path):
        import tensorflow as tf
        compression = "GZIP" if path.suffix.lower() == ".gz" else ""
        for i, record in _each(tf.data.TFRecordDataset(str(path), compression_type=compression)):
            if isinstance(record, Exception):
                yield f"{path}#{i}", ModelFileError(path, f"record {i}: not a readable TFRecord "
                                                          f"({record.message.splitlines()[0]})")
                return
            yield f"{path}#{i}", _Record(record.numpy())

    def _tf_items(self, dataset):
        import tensorflow as tf
        for i, element in _each(dataset):
            if isinstance(element, Exception):
                raise InputError(f"{self.what}: tf.data element {i} cannot be read "
                                 f"({element.message.splitlines()[0]}); `dataset.ignore_errors()` drops such "
                                 f"elements")
            if isinstance(element, tuple) and element:
                element = element[0]     # (features, label): the features
            yield f"{self.what}[{i}]", tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t,
                                                             element)

    # -- items -> samples ------------------------------------------------------------------------
    def _fit(self, name: str, arr, where: str) -> list[np.ndarray]:
        """`arr` as one or more inputs `name` (a batch along a new first axis splits)."""
        shape, dtype = self.specs[name]
        arr = np.asarray(arr)
        if arr.dtype.kind == "O" and not all(isinstance(x, (str, bytes, Path)) for x in arr.reshape(-1).tolist()):
            raise InputError(f"{where}: input {name!r} holds Python objects, not numbers or image paths")
        if arr.dtype.kind not in "SUObiuf":
            try:
                numeric(name, arr)
            except InputError as e:
                raise InputError(f"{where}: {e}") from None
        if arr.dtype.kind in "SUO":
            if arr.ndim == 0:
                return [self.pre.image(arr.item(), shape, where)]
            return [self.pre.image(x, shape, f"{where}[{k}]") for k, x in enumerate(arr.reshape(-1).tolist())]
        if tuple(arr.shape) == shape:
            out = [arr]
        elif arr.ndim == len(shape) + 1 and tuple(arr.shape[1:]) == shape:
            out = list(arr)
        elif shape and shape[0] == 1 and tuple(arr.shape) == shape[1:]:
            out = [arr[None]]
        elif shape and shape[0] == 1 and arr.ndim == len(shape) and tuple(arr.shape[1:]) == shape[1:]:
            out = [a[None] for a in arr]
        else:
            raise ShapeError(f"{where}: input {name!r} has shape {list(arr.shape)}, the model wants {list(shape)} "
                             f"(or a batch of them)")
        want = dtype if dtype is not None else (np.float32 if arr.dtype.kind == "f" else None)
        return [np.ascontiguousarray(a if want is None else a.astype(want, copy=False)) for a in out]

    def _arrays(self, where: str, arrays: dict) -> list[dict]:
        try:
            values = match_inputs(self.names, arrays)
        except ShapeError as exc:
            raise ShapeError(f"{where}: {exc}") from None
        columns = [self._fit(n, a, where) for n, a in zip(self.names, values)]
        if len({len(c) for c in columns}) != 1:
            raise ShapeError(f"{where}: the inputs hold different numbers of samples")
        return [dict(zip(self.names, row)) for row in zip(*columns)]

    def _decode(self, where: str, item) -> list[dict]:
        """The samples one item holds (a file, a record, an element, an in-memory value)."""
        if isinstance(item, ModelFileError):
            raise item
        if isinstance(item, (str, Path)):           # a file (a list of paths too)
            item, where = Path(item), str(item)
            if not item.is_file():
                raise ModelFileError(item, "no such file")
            if _suffix(item) in TFRECORD_SUFFIXES:
                return [s for name, rec in self._records(item) for s in self._decode(name, rec)]
            suffix = _suffix(item)
            if suffix in ARRAY_SUFFIXES:
                return self._arrays(where, load_npz(item, allow_npy=True))
            if len(self.names) != 1:
                raise UsageError(f"{item}: images can feed one-input models only; {len(self.names)} inputs here")
            return [{self.names[0]: self.pre.image(item, self.specs[self.names[0]][0], where)}]
        if isinstance(item, _Record):
            return self._arrays(where, item.arrays(self, where))
        if hasattr(item, "numpy") and not isinstance(item, dict):
            item = item.numpy()
        if isinstance(item, dict):
            return self._arrays(where, {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in item.items()})
        if isinstance(item, bytes):
            item = np.asarray(item, dtype=object)
        if isinstance(item, (tuple, list)) and len(item) == len(self.names) > 1:
            return self._arrays(where, dict(zip(self.names, item)))     # by position
        if len(self.names) != 1:
            raise UsageError(f"{where}: the model has {len(self.names)} inputs; give dicts by input name")
        return self._arrays(where, {self.names[0]: item})

    def head(self, n: int) -> list[dict]:
        """The first `n` samples, read now and kept in memory: the next pass yields them and then
        goes on with the same reading of the source, so data is read once in all (an iterator
        given as the dataset included)."""
        live = self.items()
        first = list(itertools.islice(live, n))
        self._resume = (first, live)
        return [sample for _, sample in first]

    def items(self) -> Iterator[tuple[str, dict]]:
        """(where, input dict) for each sample, in order, up to `input_num`."""
        return ((where, sample) for _, where, sample in self.indexed())

    def indexed(self) -> Iterator[tuple[int, str, dict]]:
        """(index in the whole stream, where, input dict) for each sample (of this shard), in order."""
        if self._resume is not None:
            (first, live), self._resume = self._resume, None
            yield from ((i, where, sample) for i, (where, sample) in enumerate(first))
            yield from ((i, where, sample) for i, (where, sample) in enumerate(live, len(first)))
            return
        yield from self._read()

    def spec(self) -> dict:
        """The arguments that make this stream again in another process (`stream_spec`)."""
        return stream_spec(*self._args)

    def shard(self, index: int, count: int) -> "Samples":
        """The samples of worker `index` of `count`: those whose index in the whole stream is
        `index` modulo `count` (the same split on every worker, whatever the source). An image
        file or an encoded-image record is one sample, so the other workers pass it by unread;
        other items (arrays, records of tensors) are read by each worker to count their samples.
        With `skip_unreadable`, an unreadable image file keeps its index (no sample has it), so
        with `input_num` it counts towards the number where a single process would not."""
        if not (0 <= index < count):
            raise UsageError(f"worker {index} of {count}: expected 0 <= worker < workers")
        part = Samples.__new__(Samples)
        part.__dict__.update(self.__dict__)
        part._shard, part._resume, part.skipped = (index, count), None, []
        part.total = None if self.total is None else len(range(index, self.total, count))
        return part

    def _read(self) -> Iterator[tuple[int, str, dict]]:
        if self._once and self._used:
            raise UsageError(f"{self.what}: an iterator can be read once only; pass a list, a path or a "
                             f"tf.data.Dataset to read it again")
        self._used = True
        self.skipped = []
        mine, workers = self._shard or (0, 1)
        n = 0
        for where, item in self._source():
            single = workers > 1 and _single(item)
            if single and n % workers != mine:       # another worker's image: not even read
                n += 1
            else:
                try:
                    got = self._decode(where, item)
                except ModelFileError as exc:
                    if not self.skip_unreadable:
                        raise
                    self.skipped.append(where)
                    if where not in self._warned:
                        self._warned.add(where)
                        _LOG.warning("skipping %s (skip_unreadable)", exc)
                    n += single                      # its index stays taken (see `shard`)
                    continue
                for k, sample in enumerate(got):
                    if self.input_num is not None and n >= self.input_num:
                        return
                    if n % workers == mine:
                        yield n, (where if len(got) == 1 else f"{where}[{k}]"), sample
                    n += 1
            if self.input_num is not None and n >= self.input_num:
                return
        if n == 0:
            raise InputError(f"{self.what}: no samples" + (f" ({len(self.skipped)} unreadable skipped)"
                                                           if self.skipped else ""))

    def __iter__(self) -> Iterator[dict]:
        return (sample for _, sample in self.items())


def _single(item) -> bool:
    """Whether `item` is surely one sample, known without decoding it: an image file, or a record
    holding one encoded image."""
    if isinstance(item, (str, Path)):
        return _suffix(Path(item)) in IMAGE_SUFFIXES
    return isinstance(item, _Record) and item.single()


class _Record:
    """One TFRecord record: a serialized tf.train.Example (see the module doc)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def single(self) -> bool:
        """Whether the record holds one encoded image (its Example parsed, not the image decoded)."""
        import tensorflow as tf
        from google.protobuf.message import DecodeError
        try:
            features = tf.train.Example.FromString(self.data).features.feature
        except DecodeError:
            return False
        return IMAGE_FEATURE in features and len(features[IMAGE_FEATURE].bytes_list.value) == 1

    def arrays(self, samples: Samples, where: str) -> dict:
        import tensorflow as tf
        from google.protobuf.message import DecodeError
        from tensorflow.core.framework import tensor_pb2
        try:
            features = tf.train.Example.FromString(self.data).features.feature
        except DecodeError:
            raise ModelFileError(where, "not a serialized tf.train.Example") from None
        if IMAGE_FEATURE in features:
            values = features[IMAGE_FEATURE].bytes_list.value
            if len(values) != 1:
                raise ModelFileError(where, f"{IMAGE_FEATURE!r} holds {len(values)} values, not one encoded image")
            return {samples.names[0] if len(samples.names) == 1 else IMAGE_FEATURE: np.asarray(values[0], object)}
        keys = [n for n in samples.names if n in features]
        if len(keys) != len(samples.names):
            keys = list(features) if len(samples.names) == 1 and len(features) == 1 else None
        if not keys:
            raise ShapeError(f"{where}: the Example has features {sorted(features)}; expected {IMAGE_FEATURE!r} or "
                             f"one per input {samples.names}")
        out = {}
        for name, key in zip(samples.names, keys):
            f = features[key]
            kind = f.WhichOneof("kind")
            if kind == "bytes_list":
                if len(f.bytes_list.value) != 1:
                    raise ModelFileError(where, f"feature {key!r}: expected one serialized tensor, "
                                                f"got {len(f.bytes_list.value)} values")
                try:
                    arr = tf.make_ndarray(tensor_pb2.TensorProto.FromString(f.bytes_list.value[0]))
                except (DecodeError, TypeError, ValueError) as exc:
                    raise ModelFileError(where, f"feature {key!r}: not a tf.io.serialize_tensor tensor ({exc})") \
                        from None
            elif kind in ("float_list", "int64_list"):
                flat = np.asarray(getattr(f, kind).value, np.float32 if kind == "float_list" else np.int64)
                shape = samples.specs[name][0]
                if flat.size != int(np.prod(shape)):
                    raise ShapeError(f"{where}: feature {key!r} has {flat.size} values, input {name!r} "
                                     f"{list(shape)} needs {int(np.prod(shape))}")
                arr = flat.reshape(shape)
            else:
                raise ModelFileError(where, f"feature {key!r} is empty")
            out[name] = arr
        return out


def _each(dataset):
    """(index, element) of a tf.data.Dataset; a read error ends it as (index, the tf.errors.OpError)."""
    import tensorflow as tf
    it = iter(dataset)
    for i in itertools.count():
        try:
            element = next(it)
        except StopIteration:
            return
        except tf.errors.OpError as exc:
            yield i, exc
            return
        yield i, element


def _is_tf_dataset(data) -> bool:
    cls = type(data)
    return any(c.__name__ == "DatasetV2" and c.__module__.startswith("tensorflow") for c in cls.__mro__)


def _cardinality(dataset) -> int | None:
    try:
        n = int(dataset.cardinality())
    except Exception:    # noqa: BLE001 - an unknown count is fine
        return None
    return n if n >= 0 else None


def stream_spec(dataset, input_num: int | None = None, mean=None, scale=None, pixel_format: str = "rgb",
                skip_unreadable: bool = False, what: str = "dataset") -> dict:
    """`iter_samples`'s arguments as JSON, for a worker process (`tftpu.utils.distributed`) to read
    the same stream: the dataset must be a path, a glob or a list of file paths (each worker reads
    it), not arrays or a tf.data.Dataset."""
    if isinstance(dataset, (list, tuple)) and dataset and all(isinstance(x, (str, Path)) for x in dataset):
        dataset = [str(Path(x).absolute()) for x in dataset]
    elif isinstance(dataset, Path) or (isinstance(dataset, str) and any(ch in dataset for ch in _GLOB_CHARS)):
        dataset = str(dataset) if Path(str(dataset)).is_absolute() else str(Path.cwd() / str(dataset))
    elif isinstance(dataset, str):
        dataset = str(Path(dataset).absolute())
    else:
        raise UsageError(f"{what}: worker processes read the dataset themselves: give a directory, a glob, "
                         f"TFRecord files or a list of file paths, not {type(dataset).__name__}")

    def floats(v):
        return None if v is None else np.asarray(v, np.float64).reshape(-1).tolist()
    return {"dataset": dataset, "input_num": input_num, "mean": floats(mean), "scale": floats(scale),
            "pixel_format": pixel_format, "skip_unreadable": skip_unreadable, "what": what}


def iter_samples(model, dataset, input_num: int | None = None, mean=None, scale=None, pixel_format: str = "rgb",
                 skip_unreadable: bool = False, what: str = "dataset") -> Samples:
    """A lazy stream (`Samples`) of up to `input_num` input dicts for `model` (a TOP model, or a
    dict of input name -> shape) from `dataset` (see the module doc)."""
    return Samples(model, dataset, input_num, mean, scale, pixel_format, skip_unreadable, what)


def load_samples(model, dataset, input_num: int | None = None, mean=None, scale=None,
                 pixel_format: str = "rgb", skip_unreadable: bool = False) -> list[dict[str, np.ndarray]]:
    """Up to `input_num` input dicts for `model` (a TOP model, or a dict of input name -> shape,
    as `tftpu.lite` passes for a TFLite conversion) from `dataset`, all in memory (a list); for
    thousands of images, stream them with `iter_samples` instead."""
    return list(iter_samples(model, dataset, input_num, mean, scale, pixel_format, skip_unreadable))
