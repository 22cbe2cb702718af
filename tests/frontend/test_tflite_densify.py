"""TFLite sparse tensors densified on import: TFLite's own SparseToDense, exactly.

References: hand-written layouts, TFLite's converter run the other way (`DenseToSparse`, the
pybind11 wrapper in ai_edge_litert), LiteRT running DENSIFY itself in small models built here,
and the real sparse mediapipe face detector.
"""

from __future__ import annotations

import numpy as np
import pytest

from tftpu.errors import ModelFileError
from tftpu.frontend.tflite_densify import DENSE, SPARSE_CSR, Dim, Sparsity, densify, densify_model, has_sparse_tensors


def csr(segments, indices):
    return Dim(SPARSE_CSR, 0, tuple(segments), tuple(indices))


def test_csr_matrix_by_hand():
    # rows dense, columns CSR: [[1 0 0 2] [0 0 0 0] [0 3 0 0]]
    sp = Sparsity((0, 1), (), (Dim(DENSE, 3), csr([0, 2, 2, 3], [0, 3, 1])))
    want = np.array([[1, 0, 0, 2], [0, 0, 0, 0], [0, 3, 0, 0]], np.float32)
    np.testing.assert_array_equal(densify(np.array([1, 2, 3], np.float32), (3, 4), sp), want)
    # the same matrix walked column-major: columns dense, rows CSR (values in column order)
    sp = Sparsity((1, 0), (), (Dim(DENSE, 4), csr([0, 1, 2, 2, 3], [0, 2, 0])))
    np.testing.assert_array_equal(densify(np.array([1, 3, 2], np.float32), (3, 4), sp), want)


def test_doubly_compressed_by_hand():
    # both levels CSR (DCSR): only rows 0 and 2 stored
    sp = Sparsity((0, 1), (), (csr([0, 2], [0, 2]), csr([0, 2, 3], [0, 3, 1])))
    want = np.array([[1, 0, 0, 2], [0, 0, 0, 0], [0, 3, 0, 0]], np.int8)
    np.testing.assert_array_equal(densify(np.array([1, 2, 3], np.int8), (3, 4), sp), want)


def test_block_sparse_by_hand():
    # 4x8 in 2x4 blocks, block rows dense, block columns CSR, blocks dense: the top-left block is zero
    dense = np.arange(1, 33, dtype=np.float32).reshape(4, 8)
    dense[:2, :4] = 0
    sp = Sparsity((0, 1, 2, 3), (0, 1), (Dim(DENSE, 2), csr([0, 1, 3], [1, 0, 1]), Dim(DENSE, 2), Dim(DENSE, 4)))
    stored = np.array([5, 6, 7, 8, 13, 14, 15, 16, 17, 18, 19, 20, 25, 26, 27, 28, 21, 22, 23, 24, 29, 30, 31, 32],
                      np.float32)
    np.testing.assert_array_equal(densify(stored, (4, 8), sp), dense)


def test_mediapipe_style_1x1_conv_weight():
    # what the face detector stores: [O, 1, 1, I] with O, 1, 1 dense and I CSR (uint8 indices)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 1, 1, 32)).astype(np.float16) * (rng.random((8, 1, 1, 32)) < 0.3)
    rows = w.reshape(8, 32)
    segments = np.concatenate([[0], np.cumsum((rows != 0).sum(1))])
    indices = np.concatenate([np.flatnonzero(r) for r in rows])
    sp = Sparsity((0, 1, 2, 3), (), (Dim(DENSE, 8), Dim(DENSE, 1), Dim(DENSE, 1), csr(segments, indices)))
    np.testing.assert_array_equal(densify(rows[rows != 0], w.shape, sp), w)


def test_repeated_position_keeps_the_last_value():
    sp = Sparsity((0,), (), (csr([0, 3], [1, 1, 0]),))
    np.testing.assert_array_equal(densify(np.array([5, 6, 7], np.float32), (3,), sp), [7, 6, 0])


def _tflite_converter_layouts():
    """(shape, traversal order, per-dimension formats, block sizes, block map) as TFLite's converter takes them."""
    d, s = DENSE, SPARSE_CSR
    yield (5,), (0,), (s,), (), ()
    yield (3, 4), (0, 1), (d, s), (), ()
    yield (3, 4), (1, 0), (d, s), (), ()
    yield (3, 4), (0, 1), (s, s), (), ()
    yield (3, 4), (1, 0), (s, d), (), ()
    yield (2, 3, 4), (2, 0, 1), (d, s, s), (), ()
    yield (2, 3, 4), (1, 2, 0), (s, d, s), (), ()
    yield (8, 1, 1, 32), (0, 1, 2, 3), (d, d, d, s), (), ()
    yield (4, 8), (0, 1, 2, 3), (d, s), (2, 4), (0, 1)
    yield (4, 8), (1, 0, 2, 3), (s, d), (2, 4), (0, 1)
    yield (4, 8), (0, 1, 3, 2), (d, s), (2, 4), (0, 1)
    yield (6, 8), (0, 1, 2), (d, s), (4,), (1,)         # 1x4 blocks, as sparse FULLY_CONNECTED weights
    yield (4, 6, 8), (2, 0, 1, 3), (s, d, s), (2,), (1,)


@pytest.mark.parametrize("layout", list(_tflite_converter_layouts()), ids=str)
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_inverse_of_tflites_dense_to_sparse(layout, density):
    """TFLite's own FormatConverter makes the sparse form; densify gives the dense array back."""
    from ai_edge_litert import format_converter_wrapper_pybind11 as fc

    shape, order, formats, block_size, block_map = layout
    kinds = {DENSE: fc.TfLiteDimensionType.TF_LITE_DIM_DENSE, SPARSE_CSR: fc.TfLiteDimensionType.TF_LITE_DIM_SPARSE_CSR}
    rng = np.random.default_rng(len(shape) * 100 + int(density * 10))
    dense = (rng.integers(1, 100, shape) * (rng.random(shape) < density)).astype(np.float32)
    if block_size:  # whole blocks zero, as the block-sparse encoders make them
        keep = rng.random(shape) < 0.5
        dense = np.where(keep, dense, 0).astype(np.float32)
    conv = fc.FormatConverterFp32(list(shape), list(order), [kinds[f] for f in formats], list(block_size),
                                  list(block_map))
    assert conv.DenseToSparse(dense.reshape(-1)) == fc.TfLiteStatus.TF_LITE_OK
    meta = conv.GetDimMetadata()
    full = [formats[order[i]] if order[i] < len(shape) else DENSE for i in range(len(order))]
    dims = tuple(Dim(DENSE, meta[2 * i][0]) if f == DENSE else csr(meta[2 * i], meta[2 * i + 1])
                 for i, f in enumerate(full))
    stored = np.array(conv.GetData(), np.float32)
    got = densify(stored, shape, Sparsity(tuple(order), tuple(block_map), dims))
    np.testing.assert_array_equal(got, dense)


# --- small .tflite models in which LiteRT runs DENSIFY itself -------------------------------------

def sparse_model(shape, sp: Sparsity, stored: np.ndarray, name: str = "w") -> bytes:
    """A model computing `x + DENSIFY(w)` for a sparse constant `w`: LiteRT's own densified `w` at x = 0."""
    from tftpu.tac import tflite_io
    from tftpu.tac.schema import builtin_codes, schema, tensor_type_codes

    fb = schema()
    types = tensor_type_codes()

    def tensor(tname, buffer, dtype="float32"):
        t = fb.TensorT()
        t.name, t.shape, t.type, t.buffer = tname.encode(), np.array(shape, np.int32), types[dtype], buffer
        return t

    def vector(values):
        v = fb.Int32VectorT()
        v.values = np.array(values, np.int32)
        return v

    params = fb.SparsityParametersT()
    params.traversalOrder, params.blockMap = np.array(sp.traversal_order, np.int32), np.array(sp.block_map, np.int32)
    params.dimMetadata = []
    for d in sp.dims:
        meta = fb.DimensionMetadataT()
        meta.format, meta.denseSize = d.format, d.dense_size
        if d.format == SPARSE_CSR:
            meta.arraySegmentsType = meta.arrayIndicesType = fb.SparseIndexVector.Int32Vector
            meta.arraySegments, meta.arrayIndices = vector(d.segments), vector(d.indices)
        params.dimMetadata.append(meta)
    dtype = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", np.dtype(np.int8): "int8"}[stored.dtype]
    w = tensor(name, 1, dtype)
    w.sparsity = params
    dense = tensor(name + "_dense", 0, dtype)
    x, y = tensor("x", 0, dtype), tensor("y", 0, dtype)
    buffers = [fb.BufferT(), fb.BufferT()]
    buffers[1].data = np.frombuffer(stored.tobytes(), np.uint8)
    ops = []
    for opname in ("DENSIFY", "ADD"):
        code = fb.OperatorCodeT()
        code.builtinCode = builtin_codes()[opname]
        code.deprecatedBuiltinCode = min(code.builtinCode, 127)
        code.version = 1
        ops.append(code)
    densify_op, add = fb.OperatorT(), fb.OperatorT()
    densify_op.opcodeIndex, densify_op.inputs, densify_op.outputs = 0, [0], [1]
    add.opcodeIndex, add.inputs, add.outputs = 1, [2, 1], [3]
    add.builtinOptionsType, add.builtinOptions = fb.BuiltinOptions.AddOptions, fb.AddOptionsT()
    sg = fb.SubGraphT()
    sg.tensors, sg.inputs, sg.outputs, sg.operators = [w, dense, x, y], [2], [3], [densify_op, add]
    model = fb.ModelT()
    model.version, model.operatorCodes, model.subgraphs, model.buffers = 3, ops, [sg], buffers
    model.description = b"sparse test model"
    return tflite_io.write(model)


def litert_run(data: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=data)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"]).copy()


LITERT_LAYOUTS = [
    ((3, 4), Sparsity((0, 1), (), (Dim(DENSE, 3), csr([0, 2, 2, 3], [0, 3, 1])))),
    ((3, 4), Sparsity((1, 0), (), (Dim(DENSE, 4), csr([0, 1, 2, 2, 3], [0, 2, 0])))),
    ((3, 4), Sparsity((0, 1), (), (csr([0, 2], [0, 2]), csr([0, 2, 3], [0, 3, 1])))),
    ((4, 8), Sparsity((0, 1, 2, 3), (0, 1), (Dim(DENSE, 2), csr([0, 1, 3], [1, 0, 1]), Dim(DENSE, 2),
                                              Dim(DENSE, 4)))),
    ((4, 8), Sparsity((1, 0, 3, 2), (0, 1), (Dim(DENSE, 2), csr([0, 1, 2], [1, 0]), Dim(DENSE, 4),
                                              Dim(DENSE, 2)))),
    ((2, 3, 4), Sparsity((2, 0, 1), (), (Dim(DENSE, 4), csr([0, 1, 1, 2, 4], [1, 0, 0, 1]),
                                         csr([0, 1, 3, 4, 6], [2, 0, 1, 1, 0, 2])))),
]


@pytest.mark.parametrize("shape,sp", LITERT_LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_same_as_litert_densify(shape, sp, dtype):
    count = 1   # leaves of the tree: dense levels multiply, a sparse level resets to its index count
    for d in sp.dims:
        count = count * d.dense_size if d.format == DENSE else len(d.indices)
    stored = (np.arange(count) + 1).astype(dtype) * dtype(0.5)
    data = sparse_model(shape, sp, stored)
    zero = np.zeros(shape, dtype)
    want = litert_run(data, zero)                   # LiteRT's DENSIFY
    np.testing.assert_array_equal(densify(stored, shape, sp), want)
    assert np.count_nonzero(want) == count
    out = densify_model(data)
    assert has_sparse_tensors(data) and not has_sparse_tensors(out)
    np.testing.assert_array_equal(litert_run(out, zero), want)   # no DENSIFY left: the constant itself
    x = np.linspace(-1, 1, int(np.prod(shape))).astype(dtype).reshape(shape)
    np.testing.assert_array_equal(litert_run(out, x), litert_run(data, x))


def test_int8_sparse_constant():
    shape, sp = LITERT_LAYOUTS[0]
    stored = np.array([-128, 7, 127], np.int8)
    np.testing.assert_array_equal(densify(stored, shape, sp), [[-128, 0, 0, 7], [0, 0, 0, 0], [0, 127, 0, 0]])


# --- bad metadata: one typed error naming the tensor ------------------------------------------------

_GOOD = Sparsity((0, 1), (), (Dim(DENSE, 3), csr([0, 2, 2, 3], [0, 3, 1])))
BAD = {
    "traversal order": Sparsity((0, 0), (), _GOOD.dims),
    "dim metadata": Sparsity((0, 1), (), _GOOD.dims[:1]),
    "dense of size": Sparsity((0, 1), (), (Dim(DENSE, 4), _GOOD.dims[1])),
    "rise from 0": Sparsity((0, 1), (), (Dim(DENSE, 3), csr([0, 2, 1, 3], [0, 3, 1]))),
    "in 4 entries": Sparsity((0, 1), (), (Dim(DENSE, 3), csr([0, 2, 3], [0, 3, 1]))),
    "ends at": Sparsity((0, 1), (), (Dim(DENSE, 3), csr([0, 2, 2, 3], [0, 3]))),
    "outside 0..3": Sparsity((0, 1), (), (Dim(DENSE, 3), csr([0, 2, 2, 3], [0, 4, 1]))),
    "without array_segments": Sparsity((0, 1), (), (Dim(DENSE, 3), Dim(SPARSE_CSR))),
    "unknown format": Sparsity((0, 1), (), (Dim(DENSE, 3), Dim(7, 4))),
    "block map": Sparsity((0, 1, 2), (), _GOOD.dims + (Dim(DENSE, 2),)),
    "does not divide": Sparsity((0, 1, 2), (1,), (Dim(DENSE, 3), Dim(DENSE, 1), Dim(DENSE, 3))),
    "has size 0": Sparsity((0, 1, 2), (1,), (Dim(DENSE, 3), Dim(DENSE, 1), Dim(DENSE, 0))),
}


@pytest.mark.parametrize("reason", sorted(BAD))
def test_bad_sparsity_names_the_tensor(reason):
    with pytest.raises(ModelFileError, match=rf"m.tflite: sparse tensor 'conv/w': invalid sparsity parameters: "
                                             rf".*{reason}") as e:
        densify(np.ones(3, np.float32), (3, 4), BAD[reason], "conv/w", "m.tflite")
    assert "\n" not in str(e.value)


def test_value_count_must_match():
    with pytest.raises(ModelFileError, match="'w'.*places 3 values, the buffer holds 4"):
        densify(np.ones(4, np.float32), (3, 4), _GOOD, "w")


def test_block_orders_tflite_reads_two_ways_are_refused():
    """With 3 block dimensions in a cyclic order, TFLite's verifier and converter disagree on the sizes."""
    dims = (Dim(DENSE, 1), Dim(DENSE, 1), Dim(DENSE, 1), Dim(DENSE, 2), Dim(DENSE, 3), Dim(DENSE, 4))
    sp = Sparsity((0, 1, 2, 4, 5, 3), (0, 1, 2), dims)
    with pytest.raises(ModelFileError, match="read differently"):
        densify(np.ones(24, np.float32), (2, 3, 4), sp, "w")


def test_bad_sparsity_in_a_model_file(tmp_path):
    """Through the front end: the model file and the tensor are named, tf2onnx never sees it."""
    from tftpu import frontend

    path = tmp_path / "bad_sparse.tflite"
    path.write_bytes(sparse_model((3, 4), BAD["outside 0..3"], np.ones(3, np.float32), name="conv/w"))
    with pytest.raises(ModelFileError, match=r"bad_sparse.tflite: sparse tensor 'conv/w': invalid sparsity "
                                             r"parameters: level 1: an array index is outside 0..3") as e:
        frontend.load(path)
    assert "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_small_sparse_model_imports(tmp_path):
    """A model with a DENSIFY imports to TOP and computes what LiteRT computes."""
    from tftpu import frontend
    from tftpu.interp.top_interpreter import run

    shape, sp = LITERT_LAYOUTS[3]
    stored = np.arange(1, 25, dtype=np.float32)
    path = tmp_path / "small_sparse.tflite"
    path.write_bytes(sparse_model(shape, sp, stored))
    top = frontend.load(path)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(run(top, {"x": x})[top.output_names[0]], litert_run(path.read_bytes(), x))


# --- the real sparse model ------------------------------------------------------------------------

def test_real_sparse_face_detector_densifies_as_litert_does():
    """Every densified weight of mediapipe's sparse face detector equals LiteRT's DENSIFY output,
    and the rewritten model (no DENSIFY left) gives LiteRT's outputs bit for bit on a photo."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from tests import material
    from tftpu.tac import tflite_io
    from tftpu.tac.schema import builtin_codes

    path = material.get("face_detection_full_range_sparse.tflite")
    original = tflite_io.read(path)
    densify_code = builtin_codes()["DENSIFY"]
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in original.operatorCodes]
    sg = original.subgraphs[0]
    densified = [op.outputs[0] for op in sg.operators if codes[op.opcodeIndex] == densify_code]
    assert len(densified) == 46
    out = densify_model(path)
    model = tflite_io.read(out)
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    assert densify_code not in [codes[op.opcodeIndex] for op in model.subgraphs[0].operators]
    assert len(model.subgraphs[0].operators) == len(sg.operators) - 46

    x = (material.image("astronaut.png", (192, 192)).astype(np.float32) / 127.5 - 1)[None]

    def invoke(**kwargs):
        interp = Interpreter(**kwargs)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        return interp, [interp.get_tensor(o["index"]).copy() for o in interp.get_output_details()]

    # TFLite's own kernels (XNNPACK would take the DENSIFY ops over and never fill their outputs)
    plain = {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    ref, want = invoke(model_path=str(path), experimental_preserve_all_tensors=True, **plain)
    for t in densified:
        tensor = model.subgraphs[0].tensors[t]
        ours = np.frombuffer(np.asarray(model.buffers[tensor.buffer].data, np.uint8).tobytes(), np.float16)
        np.testing.assert_array_equal(ours.reshape(tensor.shape), ref.get_tensor(t))
    assert [w.shape for w in want] == [(1, 2304, 16), (1, 2304, 1)]
    for options in (plain, {}):   # the same outputs, bit for bit, with and without XNNPACK
        _, want = invoke(model_path=str(path), **options)
        _, got = invoke(model_content=out, **options)
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)
    assert np.abs(want[1]).max() > 1   # real scores, not an all-zero run


def test_models_without_sparse_tensors_are_left_alone():
    from tests import material

    data = material.get("face_detection_short_range.tflite").read_bytes()
    assert not has_sparse_tensors(data)


def test_tf_converter_sparse_model(tmp_path):
    """TensorFlow's own converter (EXPERIMENTAL_SPARSITY) stores a pruned conv and FC as sparse
    tensors; imported, TOP computes what LiteRT computes, and the rewrite is LiteRT-exact."""
    import tensorflow as tf

    from tests.tac.models import convert
    from tftpu import frontend
    from tftpu.interp.top_interpreter import run

    rng = np.random.default_rng(3)
    k = (rng.standard_normal((3, 3, 8, 16)) * (rng.random((3, 3, 8, 16)) < 0.2)).astype(np.float32)
    w = (rng.standard_normal((64, 32)) * (rng.random((64, 32)) < 0.2)).astype(np.float32)

    def fn(x):
        y = tf.nn.relu(tf.nn.conv2d(x, k, 1, "SAME"))
        return tf.matmul(tf.reshape(y, [1, -1])[:, :64], w)

    data = convert(fn, [(1, 8, 8, 8)], quant="sparse")
    assert has_sparse_tensors(data)
    x = rng.standard_normal((1, 8, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(litert_run(densify_model(data), x), litert_run(data, x))
    path = tmp_path / "pruned.tflite"
    path.write_bytes(data)
    top = frontend.load(path)
    np.testing.assert_allclose(run(top, {"x": x})[top.output_names[0]], litert_run(data, x), rtol=1e-5, atol=1e-5)


def test_densified_model_past_two_gigabytes_is_refused():
    """A sparse shape that would densify past what a flatbuffer holds fails before allocating it."""
    sp = Sparsity((0, 1), (), (Dim(DENSE, 3), csr([0, 2, 2, 3], [0, 3, 1])))
    data = sparse_model((3, 1 << 28), sp, np.ones(3, np.float32), name="huge")
    with pytest.raises(ModelFileError, match=r"sparse tensor 'huge' of shape \[3, 268435456\]: .*2 GB"):
        densify_model(data)


def test_corrupt_sparse_model_file_is_named(tmp_path):
    data = bytearray(sparse_model((3, 4), _GOOD, np.ones(3, np.float32)))
    data[-40:] = b"\xff" * 40
    path = tmp_path / "cut.tflite"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"^.*cut.tflite: ") as e:
        densify_model(path)
    assert "<tflite bytes>" not in str(e.value) and "\n" not in str(e.value)
