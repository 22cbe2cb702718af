"""Re-import an edited GraphDef as a callable bound to the original variables and iterators.

The graph is imported with `tf.graph_util.import_graph_def` inside `tf.compat.v1.wrap_function`;
each placeholder that stood for a captured resource is mapped to `graph.capture(original)`, so
calling the result reads and updates the very same `tf.Variable`s and advances the same iterators.
"""

from __future__ import annotations

from tftpu.errors import ShapeError
from tftpu.graph.capture import Captured

_SCOPE = "tftpu"


def reimport(graph_def, cap: Captured):
    """A ConcreteFunction over the flat arguments of `cap` that runs `graph_def`."""
    import tensorflow as tf

    n_out = len(cap.output_names)

    def body(*flat_args):
        graph = tf.compat.v1.get_default_graph()
        input_map = dict(zip(cap.arg_names, flat_args))
        for name, outside in zip(cap.capture_names, cap.captures):
            input_map[name] = graph.capture(outside)
        try:
            elems = tf.graph_util.import_graph_def(
                graph_def, input_map=input_map,
                return_elements=cap.output_names + cap.control_output_names, name=_SCOPE)
        except ValueError as e:
            raise ShapeError(f"rewritten graph does not import: {e}".splitlines()[0]) from None
        outs, ops = elems[:n_out], elems[n_out:]
        if not ops:
            return list(outs)
        with tf.control_dependencies(ops):
            if not outs:
                return [tf.constant(0)]
            return [tf.identity(t) for t in outs]

    wrapped = tf.compat.v1.wrap_function(body, signature=list(cap.arg_specs))
    # a GradientTape sees the variables a call reads through its graph's `variables`
    wrapped.graph.variables = list(cap.variables)
    return wrapped


def pack_outputs(cap: Captured, flat):
    """Put the flat tensors a re-imported function returns back into `fn`'s output structure."""
    import tensorflow as tf

    leaves = tf.nest.flatten(cap.output_structure, expand_composites=True)
    it = iter(flat)
    graph = cap.concrete.graph
    # a traced function's outputs are graph tensors; a restored (SavedModel) one's are specs
    new = [next(it) if (isinstance(v, tf.Tensor) and v.graph is graph) or isinstance(v, tf.TensorSpec)
           else v for v in leaves]
    return tf.nest.pack_sequence_as(cap.output_structure, new, expand_composites=True)


_COUNTER = [0]


def register(graph_def, cap: Captured) -> bytes:
    """Turn `graph_def` into a runtime function (no Python op wrappers: fast for big graphs).

    The function's inputs are the flat arguments then the captures; call it eagerly with
    `tf`'s context `call_function(name, flat_args + captures, len(cap.output_names))`.
    """
    import tensorflow as tf
    from tensorflow.python.client import pywrap_tf_session as c_api
    from tensorflow.python.eager import context

    ctx = context.context()
    for fdef in graph_def.library.function:
        if not ctx.has_function(fdef.signature.name):
            ctx.add_function_def(fdef)
    _COUNTER[0] += 1
    name = f"tftpu_{cap.concrete.name.decode() if isinstance(cap.concrete.name, bytes) else cap.concrete.name}_{_COUNTER[0]}"
    graph = tf.Graph()
    with graph._c_graph.get() as c_graph:  # pylint: disable=protected-access
        buf = c_api.TF_NewBufferFromString(graph_def.SerializeToString())
        opts = c_api.TF_NewImportGraphDefOptions()
        ends = cap.arg_names + cap.capture_names + cap.output_names
        try:
            for t in ends:
                node, _, idx = t.rpartition(":")
                c_api.TF_ImportGraphDefOptionsAddReturnOutput(opts, node, int(idx))
            for op in cap.control_output_names:
                c_api.TF_ImportGraphDefOptionsAddReturnOperation(opts, op)
            try:
                results = c_api.TF_GraphImportGraphDefWithResults(c_graph, buf, opts)
            except tf.errors.OpError as e:
                raise ShapeError(f"rewritten graph does not import: {e.message}".splitlines()[0]) from None
            outputs = c_api.TF_ImportGraphDefResultsReturnOutputs(results)
            control = c_api.TF_ImportGraphDefResultsReturnOperations(results)
            c_api.TF_DeleteImportGraphDefResults(results)
        finally:
            c_api.TF_DeleteImportGraphDefOptions(opts)
            c_api.TF_DeleteBuffer(buf)
        n_in = len(cap.arg_names) + len(cap.capture_names)
        fn = c_api.TF_GraphToFunction_wrapper(c_graph, name, False, None, outputs[:n_in],
                                              outputs[n_in:], [], control, [], None, "")
    ctx.add_c_function(fn)
    c_api.TF_DeleteFunction(fn)
    return name.encode()
