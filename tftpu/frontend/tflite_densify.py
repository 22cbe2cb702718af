"""TFLite sparse tensors made dense before tf2onnx reads the model (it reads a sparse buffer as
if it were dense: "cannot reshape array of size 77 into shape (8,1,1,32)").

`densify` is TFLite's own `FormatConverter::SparseToDense`
(tensorflow/lite/kernels/internal/utils/sparsity_format_converter.cc): the dim metadata, in
traversal order, is a tree whose DENSE levels hold `dense_size` children and whose SPARSE_CSR
levels hold `array_indices[array_segments[p]:array_segments[p + 1]]` under parent `p`; its
leaves, depth first, take the stored values in order, and the block levels (`block_map`) fold
back into their original dimensions. Metadata is checked first as TFLite's verifier does
(`VerifyAndCountSparseElements`); what is wrong raises `ModelFileError` naming the tensor.

`densify_model` rewrites a `.tflite` flatbuffer: every sparse constant gets a dense buffer, and
each DENSIFY op, now a copy of a constant, is dropped (its output tensor takes that buffer).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tftpu.errors import ModelFileError

DENSE, SPARSE_CSR = 0, 1
_FLATBUFFER_LIMIT = (1 << 31) - 1   # bytes: what one flatbuffer can address
_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int8": np.int8,
           "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "int32": np.int32,
           "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64, "bool": np.bool_}


@dataclasses.dataclass(frozen=True)
class Dim:
    """One level of TFLite's `DimensionMetadata`: a DENSE size, or CSR segments and indices."""

    format: int
    dense_size: int = 0
    segments: tuple[int, ...] | None = None
    indices: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Sparsity:
    """TFLite's `SparsityParameters` as plain tuples."""

    traversal_order: tuple[int, ...]
    block_map: tuple[int, ...]
    dims: tuple[Dim, ...]


def _block_sizes(shape, sp: Sparsity, bad) -> list[int]:
    """Size of each block dimension, as the verifier and the converter both read it."""
    rank, total = len(shape), len(sp.traversal_order)
    order = sp.traversal_order
    sizes = []
    for b in range(total - rank):
        level = order.index(rank + b)          # the level that walks block dimension b
        size = sp.dims[level].dense_size
        if size <= 0:
            bad(f"block dimension {b} has size {size}")
        # TFLite's converter reads block b's size at level traversal_order[rank + b]: the same
        # level unless the block dimensions are traversed in a non-involutive order (3+ of them)
        if sp.dims[order[rank + b]].dense_size != size:
            bad(f"block dimensions traversed in the order {list(order[rank:])}, which TFLite's "
                "verifier and converter read differently")
        dim = sp.block_map[b]
        if shape[dim] % size:
            bad(f"block size {size} does not divide dimension {dim} of size {shape[dim]}")
        sizes.append(size)
    return sizes


def check(shape, sp: Sparsity, count: int, name: str = "tensor", where: str = "<tflite>") -> list[int]:
    """Check `sp` for a dense `shape` holding `count` stored values; return the block sizes."""

    def bad(reason):
        raise ModelFileError(where, f"sparse tensor {name!r}: invalid sparsity parameters: {reason}")

    shape = [int(d) for d in shape]
    rank, order = len(shape), list(sp.traversal_order)
    total = len(order)
    if any(d < 0 for d in shape):
        bad(f"dense shape {shape} has a negative dimension")
    if len(sp.dims) != total or total < rank:
        bad(f"{total} traversal levels and {len(sp.dims)} dim metadata for a rank-{rank} tensor")
    if sorted(order[:rank]) != list(range(rank)) or sorted(order[rank:]) != list(range(rank, total)):
        bad(f"traversal order {order} is not a permutation of the {rank} dimensions then the "
            f"{total - rank} block dimensions")
    blocks = list(sp.block_map)
    if len(blocks) != total - rank:
        bad(f"block map {blocks} for {total - rank} block dimensions")
    if any(not 0 <= d < rank for d in blocks) or any(a >= b for a, b in zip(blocks, blocks[1:])):
        bad(f"block map {blocks} is not increasing dimensions of a rank-{rank} tensor")
    sizes = _block_sizes(shape, sp, bad)
    expanded = shape + sizes
    for b, dim in enumerate(blocks):
        expanded[dim] //= sizes[b]
    n = 1   # nodes at the current level of the tree
    for level, (dim, meta) in enumerate(zip(order, sp.dims)):
        if meta.format == DENSE:
            if meta.dense_size != expanded[dim]:
                bad(f"level {level} is dense of size {meta.dense_size}, its dimension has {expanded[dim]}")
            n *= expanded[dim]
        elif meta.format == SPARSE_CSR:
            if meta.segments is None or meta.indices is None:
                bad(f"level {level} is sparse without array_segments and array_indices")
            seg, idx = np.asarray(meta.segments, np.int64), np.asarray(meta.indices, np.int64)
            if len(seg) != n + 1 or seg[0] != 0 or np.any(np.diff(seg) < 0):
                bad(f"level {level}: array_segments must rise from 0 in {n + 1} entries, has {len(seg)} "
                    f"starting {seg[:3].tolist()}")
            if seg[-1] != len(idx):
                bad(f"level {level}: array_segments ends at {seg[-1]}, array_indices has {len(idx)}")
            if len(idx) and (idx.min() < 0 or idx.max() >= expanded[dim]):
                bad(f"level {level}: an array index is outside 0..{expanded[dim] - 1}")
            n = len(idx)
        else:
            bad(f"level {level} has unknown format {meta.format}")
    if n != count:
        bad(f"the metadata places {n} values, the buffer holds {count}")
    return sizes


def densify(values: np.ndarray, shape, sp: Sparsity, name: str = "tensor", where: str = "<tflite>") -> np.ndarray:
    """The dense array of shape `shape` that the stored `values` and sparsity `sp` describe
    (positions not stored are 0; a position stored twice keeps its last value, as in TFLite)."""
    values = np.asarray(values).reshape(-1)
    shape = [int(d) for d in shape]
    sizes = check(shape, sp, values.size, name, where)
    rank = len(shape)
    # walk the tree level by level; children stay grouped under their parents in order, so the
    # leaves come out in the depth-first order in which TFLite's Populate takes the values
    parent = np.zeros(1, np.int64)             # Populate's prev_idx of each node
    coords: list[np.ndarray] = []              # per level: each node's index at that level
    for meta in sp.dims:
        if meta.format == DENSE:
            size = meta.dense_size
            coords = [np.repeat(c, size) for c in coords] + [np.tile(np.arange(size, dtype=np.int64), len(parent))]
            parent = (parent[:, None] * size + np.arange(size, dtype=np.int64)).reshape(-1)
        else:
            seg, idx = np.asarray(meta.segments, np.int64), np.asarray(meta.indices, np.int64)
            counts = seg[parent + 1] - seg[parent]
            child = np.repeat(seg[parent] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
            coords = [np.repeat(c, counts) for c in coords] + [idx[child]]
            parent = child
    position = [np.zeros(values.size, np.int64) for _ in range(rank)]
    for level, dim in enumerate(sp.traversal_order):
        if level < rank:
            position[dim] = coords[level]
        else:
            b = dim - rank
            position[sp.block_map[b]] = position[sp.block_map[b]] * sizes[b] + coords[level]
    flat = np.ravel_multi_index(position, shape) if rank else np.zeros(values.size, np.int64)
    last = values.size - 1 - np.unique(flat[::-1], return_index=True)[1]   # last write wins
    dense = np.zeros(int(np.prod(shape, dtype=np.int64)), values.dtype)
    dense[flat[last]] = values[last]
    return dense.reshape(shape)


def _index_vector(vector):
    return None if vector is None or vector.values is None else tuple(int(v) for v in vector.values)


def sparsity_of(params) -> Sparsity:
    """`Sparsity` of a schema `SparsityParametersT`."""
    dims = tuple(Dim(int(d.format), int(d.denseSize), _index_vector(d.arraySegments), _index_vector(d.arrayIndices))
                 for d in params.dimMetadata if d is not None) if params.dimMetadata is not None else ()
    order = tuple(int(v) for v in params.traversalOrder) if params.traversalOrder is not None else ()
    blocks = tuple(int(v) for v in params.blockMap) if params.blockMap is not None else ()
    return Sparsity(order, blocks, dims)


def has_sparse_tensors(data: bytes) -> bool:
    """Whether any tensor of the `.tflite` bytes carries sparsity parameters (cheap: no unpacking)."""
    from tftpu.tac.schema import schema
    model = schema().Model.GetRootAsModel(data, 0)
    subgraphs = model.SubgraphsLength()
    for s in range(min(subgraphs, len(data) // 4)):   # a corrupt length is not walked past the file
        sg = model.Subgraphs(s)
        if any(sg.Tensors(t).Sparsity() is not None for t in range(min(sg.TensorsLength(), len(data) // 4))):
            return True
    return False


def densify_model(src, label: str | None = None) -> bytes:
    """`.tflite` bytes of the model at `src` (path or bytes) with every sparse constant dense and
    its DENSIFY ops removed."""
    from tftpu.tac import tflite_io
    from tftpu.tac.schema import builtin_codes, schema, tensor_type_names

    data, read_label = tflite_io.load_bytes(src)
    label = label or read_label
    try:
        model = tflite_io.read(data)
    except ModelFileError as e:   # named by the file, not "<tflite bytes>"
        raise ModelFileError(label, e.reason) from None
    fb = schema()
    types = tensor_type_names()
    densify_code = builtin_codes()["DENSIFY"]
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes or []]
    total = sum(len(b.data) for b in model.buffers or [] if b.data is not None)
    for sg in model.subgraphs:
        tensors = sg.tensors or []
        for tensor in tensors:
            if tensor.sparsity is None:
                continue
            name = tensor.name.decode("utf-8", "replace") if isinstance(tensor.name, bytes) else str(tensor.name)
            dtype = _DTYPES.get(types.get(tensor.type, ""))
            if dtype is None:
                raise ModelFileError(label, f"sparse tensor {name!r}: cannot densify a {types.get(tensor.type)} tensor")
            raw = model.buffers[tensor.buffer].data if tensor.buffer > 0 else None
            if raw is None:
                raise ModelFileError(label, f"sparse tensor {name!r} is not a constant (no buffer)")
            raw = np.asarray(raw, np.uint8).tobytes()
            if len(raw) % np.dtype(dtype).itemsize:
                raise ModelFileError(label, f"sparse tensor {name!r}: {len(raw)} bytes is not a whole number "
                                            f"of {np.dtype(dtype).name} values")
            shape = [int(d) for d in tensor.shape] if tensor.shape is not None else []
            total += max(math.prod(shape), 0) * np.dtype(dtype).itemsize
            if total > _FLATBUFFER_LIMIT:   # checked before allocating anything that large
                raise ModelFileError(label, f"sparse tensor {name!r} of shape {shape}: densified, the weights "
                                            "would pass the 2 GB a TFLite flatbuffer holds")
            stored = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<"))   # flatbuffers are little-endian
            dense = densify(stored, shape, sparsity_of(tensor.sparsity), name, label)
            buffer = fb.BufferT()
            buffer.data = np.frombuffer(dense.tobytes(), np.uint8)
            model.buffers.append(buffer)
            tensor.buffer, tensor.sparsity = len(model.buffers) - 1, None
        kept = []
        for op in sg.operators or []:
            if codes[op.opcodeIndex] == densify_code and op.inputs is not None and op.outputs is not None \
                    and len(op.inputs) == 1 and len(op.outputs) == 1 and min(op.inputs[0], op.outputs[0]) >= 0:
                source, out = tensors[op.inputs[0]], tensors[op.outputs[0]]
                if source.buffer > 0 and source.sparsity is None and model.buffers[source.buffer].data is not None:
                    out.buffer = source.buffer   # DENSIFY of a dense constant: the constant itself
                    continue
            kept.append(op)
        sg.operators = kept
    return tflite_io.write(model)
