"""Space-to-depth before conversion: the Keras rewrite (or the graph pass for SavedModels and
concrete functions), decided by the target's cost model unless a block size is forced.

Keras models: `tftpu.keras.space_to_depth` gives the model on S2D input. By default the image
input stays: a host layer (zero-pad H and W to a multiple of b, `tf.nn.space_to_depth`) feeds
it, so the `.tflite` has a SPACE_TO_DEPTH op before the rewritten conv (TAC can place it on the
CPU). With `s2d_input=True` the `.tflite` takes the S2D input and its metadata (`tftpu.s2d`)
records the host transform (`tftpu.data.transform(images, b)`). SavedModels and concrete
functions go through tftpu's graph pass (`tftpu.optimize`), which keeps the image input.
"""

from __future__ import annotations

from tftpu import errors

METADATA_NAME = "tftpu.s2d"


def _block(converter) -> tuple[int, bool]:
    """(block size, forced): True lets the cost model decide with block 2; an int forces it."""
    value = converter.space_to_depth
    return (2, False) if value is True else (int(value), True)


def _functional(model):
    import keras

    if isinstance(model, keras.Sequential) and getattr(model, "_functional", None) is not None:
        return model._functional
    return model


def _first_conv(model):
    """The image input tensor's shape and the first conv layer with the ZeroPadding before it."""
    from tftpu.keras import find_first_conv

    fm = _functional(model)
    if not hasattr(fm, "_nodes_by_depth") or len(fm.inputs) != 1:
        raise errors.UsageError(f"model '{model.name}': space_to_depth needs a functional or Sequential Keras "
                                f"model with one image input")
    image = fm.inputs[0]
    _, pads, node = find_first_conv(fm, image)
    op = node.operation
    while hasattr(op, "_nodes_by_depth"):          # a nested backbone holds the first conv
        _, more, node = find_first_conv(op, op.inputs[0])
        pads, op = pads + more, node.operation
    return tuple(image.shape[1:]), pads, op


def estimate(model, block: int, target_name: str) -> dict:
    """The first conv's S2D geometry and the target's cost estimate for it (as the graph pass)."""
    from tftpu.keras.space_to_depth import conv_pads
    from tftpu.passes import s2d_geometry
    from tftpu.passes.cost import ConvGeometry, Target

    shape, pads_layers, conv = _first_conv(model)
    sizes, channels = shape[:-1], shape[-1]
    if len(sizes) != 2 or any(s is None for s in shape):
        raise errors.ShapeError(f"model '{model.name}': input shape {shape}: space_to_depth needs a known "
                                f"[H, W, C] image")
    pads = conv_pads(conv, sizes, pads_layers)
    desc = (f"{conv.name}: Conv2D k={'x'.join(map(str, conv.kernel_size))} "
            f"s={'x'.join(map(str, conv.strides))} {conv.padding.upper()} C={channels}")
    info = {"conv": conv.name, "block_size": block, "kernel": list(conv.kernel_size),
            "strides": list(conv.strides), "target": target_name}
    if any(s % block for s in conv.strides):
        return {**info, "applies": False, "reason": f"{desc}: stride not divisible by block {block}"}
    plans = [s2d_geometry.AxisPlan(s, k, st, block, tuple(p))
             for s, k, st, p in zip(sizes, conv.kernel_size, conv.strides, pads)]
    target = Target.load(target_name)
    g0 = ConvGeometry(1, list(sizes), [p.out for p in plans], list(conv.kernel_size), channels, conv.filters)
    g1 = ConvGeometry(1, [p.begin + p.blocked_size + p.end for p in plans], [p.out for p in plans],
                      [p.new_kernel for p in plans], channels * block * block, conv.filters)
    est = target.s2d_estimate(g0, g1)
    pays = est["speedup"] >= target.min_speedup
    return {**info, **est, "applies": pays,
            "reason": f"{desc} -> S2D(b={block}) estimated {est['speedup']:.2f}x on target {target.name} "
                      f"(needs {target.min_speedup}x)"}


def _host_layer(block: int):
    import keras
    import tensorflow as tf

    class HostSpaceToDepth(keras.layers.Layer):
        """Zero-pad H and W at the end to a multiple of the block, then tf.nn.space_to_depth."""

        def __init__(self, block_size, **kwargs):
            super().__init__(**kwargs)
            self.block_size = block_size

        def call(self, x):
            b = self.block_size
            h, w = x.shape[1], x.shape[2]
            ph, pw = (-h) % b, (-w) % b
            if ph or pw:
                x = tf.pad(x, [[0, 0], [0, ph], [0, pw], [0, 0]])
            return tf.nn.space_to_depth(x, b)

    return HostSpaceToDepth(block, name="tftpu_host_space_to_depth")


def keras_source(model, block: int, s2d_input: bool):
    """(the model to convert, metadata for the host transform or None)."""
    import keras

    import tftpu.keras

    s2d_model = tftpu.keras.space_to_depth(model, block_size=block)
    shape = tuple(_functional(model).inputs[0].shape[1:])
    if s2d_input:
        meta = {"block_size": block, "input": s2d_model.inputs[0].name, "image_shape": list(shape),
                "s2d_shape": list(s2d_model.inputs[0].shape[1:]),
                "host_transform": f"zero-pad H and W at the end to a multiple of {block}, then "
                                  f"tf.nn.space_to_depth(block_size={block}); tftpu.data.transform(images, {block})"}
        return s2d_model, meta
    image = keras.Input(shape=shape, name=_functional(model).inputs[0].name)
    wrapped = keras.Model(image, s2d_model(_host_layer(block)(image)), name=f"{model.name}_s2d")
    return wrapped, None


def host_dataset(gen, block: int):
    """The representative dataset with the host transform applied (for an S2D-input model)."""
    import numpy as np

    from tftpu.data import transform

    def s2d_gen():
        for sample in gen():
            arrays = list(sample) if isinstance(sample, (list, tuple)) else [sample]
            if len(arrays) != 1:
                raise errors.UsageError("s2d_input with a representative dataset needs one image input")
            yield [np.asarray(transform(np.asarray(arrays[0], np.float32), block))]

    return s2d_gen


def graph_source(converter, block: int, forced: bool, stack):
    """SavedModel / concrete functions through tftpu's graph pass: (new source, report dict)."""
    kind = converter._tftpu_source[0]
    options = {"space_to_depth": {"block_size": block, "force": forced}}
    target = converter.s2d_target
    if kind == "saved_model":
        from tftpu.pipelines.saved_model import optimize_saved_model

        _, src, keys, tags = converter._tftpu_source
        out = stack.enter_context(_scratch("tftpu_s2d_")) + "/saved_model"
        reports = optimize_saved_model(src, out, target=target, pass_options=options)
        report = {k: r.to_dict() for k, r in reports.items()}
        applied = any(r.applied("space_to_depth") for r in reports.values())
        return ("saved_model", out, keys, tags), {"target": target, "block_size": block, "applies": applied,
                                                 "signatures": report}
    from tftpu.pipelines.optimize import optimize

    _, funcs, trackable = converter._tftpu_source
    new, report, applied = [], {}, False
    for i, f in enumerate(funcs):
        fast = optimize(f, target=target, pass_options=options)
        new.append(fast.concrete_function)
        report[str(i)] = fast.report.to_dict()
        applied = applied or fast.report.applied("space_to_depth")
    return ("concrete_functions", new, trackable), {"target": target, "block_size": block,
                                                    "applies": applied, "functions": report}


def _scratch(prefix):
    from tftpu.lite.options import scratch_dir

    return scratch_dir(prefix)
