"""What tftpu adds to tf2onnx 1.17 so Keras 3 models convert: one op handler and one graph fix.

- `Erfc`: TF's exact GELU (`keras.activations.gelu`, `tf.nn.gelu`) computes
  `0.5 * x * erfc(-x / sqrt(2))`; tf2onnx has no handler for Erfc. It becomes `1 - Erf(x)`.
- Functions compiled with XLA: Keras 3 runs grouped convolutions (ConvNeXt's depthwise
  `Conv2D(groups=C)`) and 3-D NCDHW convolutions inside a nested `tf.function(jit_compile=True)`,
  which grappler does not inline, so tf2onnx left a `StatefulPartitionedCall`. The frozen graph
  loses the XLA marks before tf2onnx optimizes it, so the call is inlined like any other.

`install()` is idempotent and runs before any conversion (`tftpu.frontend.tf_export`).
"""

from __future__ import annotations

_XLA_ATTRS = ("_XlaMustCompile", "_noinline")
_installed = False


def _handle_erfc(ctx, node, **kwargs):
    """erfc(x) = 1 - erf(x), in the node's dtype."""
    import numpy as np
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.output[0]))
    node.type = "Erf"
    one = ctx.make_const(utils.make_name(f"{node.name}/one"), np.array(1, dtype))
    sub = ctx.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(f"{node.name}/erfc"))
    ctx.replace_inputs(sub, [one.output[0], node.output[0]])
    ctx.copy_shape(node.output[0], sub.output[0])
    ctx.set_dtype(sub.output[0], ctx.get_dtype(node.output[0]))


def strip_xla_marks(graph_def):
    """Drop the attributes that keep grappler from inlining XLA-compiled function calls."""
    for fdef in graph_def.library.function:
        for attr in _XLA_ATTRS:
            fdef.attr.pop(attr, None)
        for node in fdef.node_def:
            for attr in _XLA_ATTRS:
                node.attr.pop(attr, None)
    for node in graph_def.node:
        for attr in _XLA_ATTRS:
            node.attr.pop(attr, None)
    return graph_def


def install() -> None:
    """Register the Erfc handler and the XLA-call fix with tf2onnx (once per process)."""
    global _installed
    if _installed:
        return
    from tf2onnx import tf_loader
    from tf2onnx.handler import tf_op

    @tf_op("Erfc")
    class Erfc:  # noqa: F841 (registered by the decorator)
        @classmethod
        def version_9(cls, ctx, node, **kwargs):
            _handle_erfc(ctx, node, **kwargs)

    fix = tf_loader.fix_freezing_errors_part2

    def fix_and_unmark(graph_def):
        return strip_xla_marks(fix(graph_def))

    tf_loader.fix_freezing_errors_part2 = fix_and_unmark
    _installed = True
